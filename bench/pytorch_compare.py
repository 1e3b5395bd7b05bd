#!/usr/bin/env python3
"""cast against PyTorch on the same machine, in one run, interleaved.

Times the same work in both, with the same thread count:
  * one full-attention layer forward+backward (B 1, D 256, 4 heads; PyTorch through
    scaled_dot_product_attention, its fastest attention), at N 1024 and 4096;
  * one CAST Top-K layer forward+backward at the same sizes (C = κ = ⌈√N⌉ to a multiple of 8),
    PyTorch's written in eager ops from docs/attention.md and first checked against
    `cast layer` on the same inputs (f64: the output and every gradient);
  * one `listops-short` training step (the `cast train` default model, full attention:
    2 layers, D 64, 4 heads, MLP 128, batch 32, 48 tokens + CLS, AdamW);
  * one Text-preset training step (4 layers, D 256, 4 heads, MLP 1024) at N 1024, batch 4;
  * optionally (--fast-transformers) clustered and improved clustered attention at N 4096
    against the authors' fast-transformers library.
Our side runs `cast bench` (median after warm-up, in-process clock); PyTorch's side is timed
the same way. Rounds alternate between the two so that a change in machine load hits both;
the figure reported is the median over rounds. fp32 everywhere. On a GPU (--device cuda) the
same script times CUDA with events.

Setup (PyPI, into bench/.venv; never needed by the build or the tests):
  bench/setup_torch.sh [--fast-transformers]
  bench/.venv/bin/python bench/pytorch_compare.py [--threads 2] [--rounds 3]
On a GPU (bench/gpu_session.sh runs this, with the machine's own PyTorch):
  python3 bench/pytorch_compare.py --device cuda --cast build-gpu/cast --work layer,text-step \
      --lengths 1024,4096 --text-length 4096 --text-batch 32
Both sides run at --precision: fp32 (the default: no TF32 on either side), tf32 (PyTorch's
allow_tf32, our --precision tf32) or bf16 (PyTorch's torch.autocast in bf16 around each forward,
our --precision bf16); --tf32 is --precision tf32. --work sdpa also times PyTorch's
scaled_dot_product_attention alone (forward, and forward+backward) at --lengths, head width 64,
65536 / N heads, in TFLOPS as `cast bench flash` counts them (4 N^2 d forward, 10 N^2 d backward).
--dry-run: tiny sizes, one round; our side runs as asked, PyTorch's only where it is installed
(the README's test command checks this script's calls this way, without PyTorch).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # --dry-run times our side alone
    torch = None


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


PRECISION = "fp32"  # set by main from --precision


def autocast(device):
    """The forward's context at PRECISION: torch.autocast in bf16, else nothing."""
    import contextlib
    if PRECISION == "bf16" and device is not None:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def timed(fn, warmup, repeats, device):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


if torch is not None:  # the models exist only where PyTorch does
    class Attention(torch.nn.Module):  # projections without bias, as in cast
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x):
            B, N, D = x.shape
            split = lambda t: t.view(B, N, self.heads, D // self.heads).transpose(1, 2)
            o = F.scaled_dot_product_attention(split(self.wq(x)), split(self.wk(x)), split(self.wv(x)))
            return self.wo(o.transpose(1, 2).reshape(B, N, D))


    class Block(torch.nn.Module):  # pre-LN, GELU MLP, as cast's Transformer
        def __init__(self, dim, heads, mlp, dropout):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(dim, eps=1e-6), torch.nn.LayerNorm(dim, eps=1e-6)
            self.attention = Attention(dim, heads)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, mlp), torch.nn.GELU(), torch.nn.Linear(mlp, dim))
            self.drop = torch.nn.Dropout(dropout)

        def forward(self, x):
            x = x + self.drop(self.attention(self.norm1(x)))
            return x + self.drop(self.mlp(self.norm2(x)))


    class Model(torch.nn.Module):  # cast's encoder: token + sinusoidal positions, CLS pooling, MLP head
        def __init__(self, vocab, length, dim, heads, mlp, layers, classes, dropout):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, dim)
            self.cls = torch.nn.Parameter(torch.zeros(1, 1, dim))
            self.register_buffer("pos", torch.randn(length, dim) * 0.02)
            self.blocks = torch.nn.ModuleList(Block(dim, heads, mlp, dropout) for _ in range(layers))
            self.drop = torch.nn.Dropout(dropout)
            self.norm = torch.nn.LayerNorm(dim, eps=1e-6)
            self.head = torch.nn.Sequential(torch.nn.Linear(dim, mlp), torch.nn.ReLU(), torch.nn.Linear(mlp, classes))

        def forward(self, tokens):
            h = self.embed(tokens) + self.pos[: tokens.shape[1]]
            h = self.drop(torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1))
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h)[:, 0])


    class CastAttention(torch.nn.Module):
        """CAST (Top-K, softmax, summaries on, W = A_g, per-head clustering) in eager PyTorch ops,
        written from docs/attention.md's seven steps; no padding (the benchmark has none)."""

        def __init__(self, dim, heads, clusters, kappa):
            super().__init__()
            self.heads, self.clusters, self.kappa = heads, clusters, kappa
            d = dim // heads
            self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
            self.surrogates = torch.nn.Parameter(torch.randn(heads, clusters, d) / d ** 0.5)
            self.gate = torch.nn.Linear(dim, heads)

        def forward(self, x):
            B, N, D = x.shape
            H, C, K, d = self.heads, self.clusters, self.kappa, D // self.heads
            split = lambda t: t.view(B, N, H, d).transpose(1, 2)  # (B, H, N, d)
            q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))
            s = self.surrogates.unsqueeze(0)  # (1, H, C, d)
            a_q = torch.softmax(q @ s.transpose(-1, -2) / d ** 0.5, dim=-1)  # steps 1-2: (B, H, N, C)
            a_k = torch.softmax(k @ s.transpose(-1, -2) / d ** 0.5, dim=-1)
            g = torch.sigmoid(self.gate(x)).transpose(1, 2).unsqueeze(-1)  # step 3: (B, H, N, 1)
            a_g = a_k + g * (a_q - a_k)
            with torch.no_grad():  # step 4: each cluster's K tokens of largest affinity, in position order
                members = torch.topk(a_g.transpose(-1, -2), K, dim=-1).indices.sort(dim=-1).values  # (B, H, C, K)
            rows = members.reshape(B, H, C * K, 1).expand(-1, -1, -1, d)
            gather = lambda t: t.gather(2, rows).view(B, H, C, K, d)
            qc, kc, vc = gather(q), gather(k), gather(v)
            r_intra = torch.softmax(qc @ kc.transpose(-1, -2) / d ** 0.5, dim=-1) @ vc  # step 5: (B, H, C, K, d)
            p = a_k / a_k.sum(dim=2, keepdim=True)  # step 6: normalised over tokens
            r_inter = p.transpose(-1, -2) @ v  # (B, H, C, d)
            w = a_g  # step 7: O = W R_inter + the members' W (R_intra - R_inter) added at their tokens
            w_slot = w.gather(2, members.reshape(B, H, C * K, 1).expand(-1, -1, -1, C))  # (B, H, C·K, C)
            w_slot = w_slot.view(B, H, C, K, C).diagonal(dim1=2, dim2=4).permute(0, 1, 3, 2)  # W[I_c[p], c]
            extra = (w_slot.unsqueeze(-1) * (r_intra - r_inter.unsqueeze(3))).reshape(B, H, C * K, d)
            o = (w @ r_inter).scatter_add(2, rows, extra)
            return self.wo(o.transpose(1, 2).reshape(B, N, D))


PRESETS = {  # as train::preset in train/trainer.cpp
    "listops-short": dict(vocab=16, length=48, dim=64, heads=4, mlp=128, layers=2, classes=10, dropout=0.0,
                          batch=32, lr=2e-3, weight_decay=0.01),
    "text": dict(vocab=257, length=4096, dim=256, heads=4, mlp=1024, layers=4, classes=2, dropout=0.1,
                 batch=32, lr=0.05, weight_decay=0.1),
}


def time_layer(layer, n, device, warmup, repeats):
    """Forward+backward of one attention layer on x (1, n, 256)."""
    layer = layer.to(device)
    x = torch.randn(1, n, 256, device=device, requires_grad=True)
    dout = torch.randn_like(x)

    def both():
        with autocast(device):
            y = layer(x)
        y.backward(dout)
        x.grad = None
        layer.zero_grad(set_to_none=True)

    return timed(both, warmup, repeats, device)


def torch_layer(n, device, warmup, repeats):
    return time_layer(Attention(256, 4), n, device, warmup, repeats)


def training_step(task, length, batch, device, attention=None):
    """One training step of the task's preset model at `length` (forward, backward, AdamW), as a
    callable; `attention`, a class like Attention, replaces each block's attention (same weights)."""
    p = dict(PRESETS[task])
    p["length"] = length
    model = Model(**{k: p[k] for k in ("vocab", "length", "dim", "heads", "mlp", "layers", "classes", "dropout")})
    if attention is not None:
        for block in model.blocks:
            replaced = attention(p["dim"], p["heads"])
            replaced.load_state_dict(block.attention.state_dict())
            block.attention = replaced
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=(0.9, 0.98), eps=1e-9,
                            weight_decay=p["weight_decay"])
    tokens = torch.randint(1, p["vocab"], (batch, length), device=device)
    labels = torch.randint(0, p["classes"], (batch,), device=device)

    def step():
        with autocast(device):
            loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def torch_step(task, length, batch, device, warmup, repeats):
    return timed(training_step(task, length, batch, device), warmup, repeats, device)


def torch_sdpa(lengths, device, warmup, repeats, d=64, tokens=65536):
    """PyTorch's scaled_dot_product_attention alone: (ms, TFLOPS) forward and backward per N."""
    dtype = torch.bfloat16 if PRECISION == "bf16" else torch.float32
    rows = []
    for n in lengths:
        h = max(1, tokens // n)
        q, k, v = (torch.randn(1, h, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v), warmup, repeats, device)

        def both():
            F.scaled_dot_product_attention(q, k, v).backward(dout)
            q.grad = k.grad = v.grad = None

        bwd = timed(both, warmup, repeats, device) - fwd
        flops = h * n * n * d
        rows.append((n, h, fwd, 4 * flops / fwd / 1e9, bwd, 10 * flops / bwd / 1e9))
    return rows


def torch_clustered(n, improved, device, warmup, repeats):
    from fast_transformers.attention import ClusteredAttention, ImprovedClusteredAttention
    from fast_transformers.masking import FullMask, LengthMask
    B, H, D = 1, 4, 256
    clusters = default_clusters(n)
    inner = (ImprovedClusteredAttention(clusters, iterations=10, bits=63, topk=32, attention_dropout=0.0) if improved
             else ClusteredAttention(clusters, iterations=10, bits=63, attention_dropout=0.0))
    layer = Attention(D, H).to(device)  # the same projections as cast's layer around it
    x = torch.randn(B, n, D, device=device, requires_grad=True)
    dout = torch.randn_like(x)
    mask = FullMask(N=n, M=n, device=device)
    lengths = LengthMask(torch.full((B,), n, dtype=torch.int64, device=device), max_len=n)

    def both():
        split = lambda t: t.view(B, n, H, D // H)
        o = inner(split(layer.wq(x)), split(layer.wk(x)), split(layer.wv(x)), mask, lengths, lengths)
        layer.wo(o.reshape(B, n, D)).backward(dout)
        x.grad = None
        layer.zero_grad(set_to_none=True)

    return timed(both, warmup, repeats, device)


def default_clusters(n):
    """cast's default C = κ: ⌈√N⌉ rounded up to a multiple of 8."""
    return (int(n ** 0.5 + 0.999) + 7) // 8 * 8


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().cpu().numpy().tobytes()
        dtype = {torch.float32: "F32", torch.float64: "F64"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def read_safetensors(path):
    import numpy
    raw = open(path, "rb").read()
    size = int.from_bytes(raw[:8], "little")
    header, body = json.loads(raw[8:8 + size]), raw[8 + size:]
    kinds = {"F32": numpy.float32, "F64": numpy.float64, "I32": numpy.int32}
    return {name: torch.from_numpy(numpy.frombuffer(body[m["data_offsets"][0]:m["data_offsets"][1]],
                                                    dtype=kinds[m["dtype"]]).reshape(m["shape"]).copy())
            for name, m in header.items() if name != "__metadata__"}


def check_cast_layer(binary, n=256, dim=256, heads=4):
    """The eager CAST layer must equal `cast layer` on the same inputs (f64) before it is timed."""
    torch.manual_seed(1)
    C = default_clusters(n)
    layer = CastAttention(dim, heads, C, C).double()
    x = torch.randn(1, n, dim, dtype=torch.float64, requires_grad=True)
    dout = torch.randn_like(x)
    out = layer(x)
    out.backward(dout)
    inputs = {"x": x, "dout": dout, "surrogates": layer.surrogates, "gate_w": layer.gate.weight.t(),
              "gate_b": layer.gate.bias}
    inputs.update({name: getattr(layer, name).weight.t() for name in ("wq", "wk", "wv", "wo")})
    with tempfile.TemporaryDirectory() as folder:
        src, dst = os.path.join(folder, "in.safetensors"), os.path.join(folder, "out.safetensors")
        write_safetensors(src, inputs)
        subprocess.run([binary, "layer", "--in", src, "--out", dst, "--attention", "cast", "--heads", str(heads),
                        "--clusters", str(C), "--cluster-size", str(C), "--dtype", "f64"], check=True,
                       stdout=subprocess.DEVNULL)
        got = read_safetensors(dst)
    want = {"out": out, "grad.x": x.grad, "grad.surrogates": layer.surrogates.grad,
            "grad.gate_w": layer.gate.weight.grad.t(), "grad.gate_b": layer.gate.bias.grad}
    want.update({f"grad.{name}": getattr(layer, name).weight.grad.t() for name in ("wq", "wk", "wv", "wo")})
    for name, w in want.items():
        error = (got[name] - w.detach()).abs().max().item() / max(w.abs().max().item(), 1e-300)
        if not error < 1e-9:
            raise SystemExit(f"the PyTorch CAST layer differs from cast layer in {name}: relative error {error:.2e}")
    return len(want)


def torch_cast_layer(n, device, warmup, repeats):
    C = default_clusters(n)
    return time_layer(CastAttention(256, 4, C, C), n, device, warmup, repeats)


def ours(binary, threads, argv):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run([binary, "bench", *argv, "--json", out.name], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in open(out.name) if line.strip()]
    if not rows:
        raise SystemExit(f"cast bench {' '.join(argv)} wrote no result")
    return rows[0].get("forward_backward_ms", rows[0].get("ms_per_step"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cast", default=os.path.join(os.path.dirname(__file__), "..", "build", "cast"))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", default="1024,4096", help="full attention layer: sequence lengths")
    parser.add_argument("--work", default="layer,cast-layer,short-step,text-step",
                        help="comma-separated: layer (full attention layer), cast-layer (CAST Top-K layer, "
                             "PyTorch's in eager ops), short-step (listops-short training step), text-step "
                             "(Text-preset training step)")
    parser.add_argument("--text-length", type=int, default=1024, help="text-step: sequence length")
    parser.add_argument("--text-batch", type=int, default=4, help="text-step: batch size")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                        help="both sides: fp32, tf32 (allow_tf32) or bf16 (autocast; our --precision bf16)")
    parser.add_argument("--tf32", action="store_true", help="the same as --precision tf32")
    parser.add_argument("--fast-transformers", action="store_true", help="also clustered / improved clustered")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the calls: one round, PyTorch's side only where it is installed")
    args = parser.parse_args()
    work_kinds = args.work.split(",")
    unknown = sorted(set(work_kinds) - {"layer", "cast-layer", "short-step", "text-step", "sdpa"})
    if unknown:
        parser.error(f"--work: unknown {', '.join(unknown)} (layer, cast-layer, short-step, text-step, sdpa)")
    if args.tf32:
        args.precision = "tf32"
    if args.precision != "fp32" and args.device != "cuda":
        parser.error(f"--precision {args.precision}: the CPU runs fp32 only")
    global PRECISION
    PRECISION = args.precision
    if not os.path.isfile(args.cast):
        parser.error(f"--cast: {args.cast} is not a file (build it first: scripts/build.sh)")
    have_torch = torch is not None and (args.device == "cpu" or torch.cuda.is_available())
    if not have_torch and not args.dry_run:
        raise SystemExit(f"PyTorch{'' if torch is None else ' with CUDA'} is not available here "
                         "(bench/setup_torch.sh installs it; --dry-run times our side alone)")
    if args.dry_run:
        args.rounds = 1
    if have_torch:
        torch.set_num_threads(args.threads)
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
        torch.manual_seed(0)
    device = torch.device(args.device) if have_torch else None
    r, w = str(args.repeats), "1"
    common = ["--repeats", r, "--warmup", w, "--device", args.device, "--precision", args.precision]
    work = []  # (label, ours argv, theirs callable)
    if "layer" in work_kinds:
        for n in (int(v) for v in args.lengths.split(",")):
            work.append((f"full attention layer fwd+bwd, N {n}",
                         ["attention", "--mechanisms", "full", "--lengths", str(n)] + common,
                         lambda n=n: torch_layer(n, device, 1, args.repeats)))
    if "cast-layer" in work_kinds:
        if have_torch:
            print(f"the PyTorch CAST layer equals cast layer (f64, N 256): {check_cast_layer(args.cast)} tensors")
        for n in (int(v) for v in args.lengths.split(",")):
            work.append((f"CAST Top-K layer fwd+bwd, N {n} (PyTorch: eager ops)",
                         ["attention", "--mechanisms", "cast-topk", "--lengths", str(n)] + common,
                         lambda n=n: torch_cast_layer(n, device, 1, args.repeats)))
    if "short-step" in work_kinds:
        work.append(("listops-short training step (full attention)",
                     ["train", "--task", "listops-short", "--mechanisms", "full"] + common,
                     lambda: torch_step("listops-short", 48, 32, device, 1, args.repeats)))
    if "text-step" in work_kinds:
        L, B = args.text_length, args.text_batch
        work.append((f"Text-preset training step, N {L}, batch {B} (full)",
                     ["train", "--task", "text", "--length", str(L), "--batch-size", str(B), "--mechanisms", "full"]
                     + common,
                     lambda: torch_step("text", L, B, device, 1, args.repeats)))
    if args.fast_transformers:
        for name, improved in (("clustered", False), ("iclustered", True)):
            work.append((f"{name} attention fwd+bwd, N 4096 (vs fast-transformers)",
                         ["attention", "--mechanisms", name, "--lengths", "4096"] + common,
                         lambda improved=improved: torch_clustered(4096, improved, device, 1, args.repeats)))
    results = {label: ([], []) for label, _, _ in work}
    for _ in range(args.rounds):
        for label, argv, theirs in work:
            results[label][0].append(ours(args.cast, args.threads, argv))
            if have_torch:
                results[label][1].append(theirs())
    load = os.getloadavg()[0]
    version = torch.__version__ if have_torch else "(not installed: our side only)"
    if "sdpa" in work_kinds and have_torch:
        print(f"PyTorch {version} scaled_dot_product_attention at {args.precision}, head width 64, 65536 / N heads:")
        print(f"{'N':>6} {'heads':>6} {'fwd ms':>9} {'fwd TFLOPS':>11} {'bwd ms':>9} {'bwd TFLOPS':>11}")
        for n, h, f, ft, b, bt in torch_sdpa([int(v) for v in args.lengths.split(",")], device, 2, args.repeats):
            print(f"{n:>6} {h:>6} {f:>9.3f} {ft:>11.1f} {b:>9.3f} {bt:>11.1f}")
    print(f"cast vs PyTorch {version} on {args.device}, {args.threads} threads, precision {args.precision}, "
          f"median of {args.rounds} interleaved rounds (each a median of {args.repeats} runs); "
          f"load average {load:.2f}{'; DRY RUN' if args.dry_run else ''}")
    print(f"{'work':<58} {'cast ms':>10} {'torch ms':>10} {'cast/torch':>11}")
    ratios = []
    for label, (mine, theirs) in results.items():
        a = statistics.median(mine)
        if theirs:
            b = statistics.median(theirs)
            ratios.append(a / b)
            print(f"{label:<58} {a:>10.1f} {b:>10.1f} {a / b:>10.2f}x")
        else:
            print(f"{label:<58} {a:>10.1f} {'-':>10} {'-':>11}")
    print(f"{len(results)} comparisons" + (f", cast/torch from {min(ratios):.2f}x to {max(ratios):.2f}x" if ratios else ""))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
