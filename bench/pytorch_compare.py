#!/usr/bin/env python3
"""The same full-attention layer and Transformer training step in PyTorch, timed the way
`cast bench` times ours (CUDA events, median after warm-up, peak memory), for the comparison
in bench/RESULTS.md. fp32 with TF32 allowed; attention through scaled_dot_product_attention,
PyTorch's fastest kernel for that precision.

Not yet run: written without a GPU. Usage on a GPU machine with PyTorch:
  python3 bench/pytorch_compare.py attention [--lengths 1024,2048,4096,8192,16384]
  python3 bench/pytorch_compare.py train [--length 4096 --batch 32]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def timed(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**20


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
    def __init__(self, dim, heads, mlp):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim, eps=1e-6), torch.nn.LayerNorm(dim, eps=1e-6)
        self.attention = Attention(dim, heads)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, mlp), torch.nn.GELU(), torch.nn.Linear(mlp, dim))
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        x = x + self.drop(self.attention(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class Model(torch.nn.Module):  # the LRA Text preset: 4 layers, D 256, 4 heads, MLP 1024, CLS pooling
    def __init__(self, vocab=257, length=4096, dim=256, heads=4, mlp=1024, layers=4, classes=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, dim))
        self.register_buffer("pos", torch.randn(length, dim) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, mlp) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim, eps=1e-6)
        self.head = torch.nn.Sequential(torch.nn.Linear(dim, mlp), torch.nn.ReLU(), torch.nn.Linear(mlp, classes))

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h)[:, 0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["attention", "train"])
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = torch.device("cuda")
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: fp32, TF32 allowed")
    if args.what == "attention":
        print(f"{'mechanism':<12} {'N':>6} {'forward ms':>12} {'fwd+bwd ms':>16} {'peak MiB':>12}")
        layer = Attention(256, 4).to(device)
        for n in (int(v) for v in args.lengths.split(",")):
            x = torch.randn(args.batch, n, 256, device=device, requires_grad=True)
            dout = torch.randn_like(x)

            def forward():
                with torch.no_grad():
                    layer(x)

            def both():
                layer(x).backward(dout)
                x.grad = None
                layer.zero_grad(set_to_none=True)

            tf, _ = timed(forward, args.warmup, args.repeats)
            tb, peak = timed(both, args.warmup, args.repeats)
            print(f"{'torch-full':<12} {n:>6} {tf:>12.3f} {tb:>16.3f} {peak:>12.1f}")
    else:
        model = Model(length=args.length).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.1)
        tokens = torch.randint(1, 257, (args.train_batch, args.length), device=device)
        labels = torch.randint(0, 2, (args.train_batch,), device=device)

        def step():
            loss = F.cross_entropy(model(tokens), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        ms, peak = timed(step, args.warmup, max(5, args.repeats // 2))
        print(f"{'mechanism':<12} {'ms/step':>10} {'steps/s':>10} {'peak MiB':>12}")
        print(f"{'torch-full':<12} {ms:>10.2f} {1000 / ms:>10.3f} {peak:>12.1f}")


if __name__ == "__main__":
    main()
