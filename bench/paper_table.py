#!/usr/bin/env python3
"""The LRA paper's speed and memory table, in one command: steps per second and peak memory of
the Text-preset training step (4 layers, D 256, 4 heads, MLP 1024) at N 1K, 2K, 3K and 4K, for
our four mechanisms and for PyTorch's Transformer with the N x N ("math") attention, the CAST
and LRA papers' baseline, and with scaled_dot_product_attention, all at one precision.

  python3 bench/paper_table.py --device cuda --cast build-gpu/cast --precision bf16 --json rows.jsonl
  python3 bench/paper_table.py --rows rows.jsonl --figure paper.svg   # the table and figure again

Each row of --json is one (implementation, N): ms per step, steps per second, peak memory (ours:
`cast bench train`'s peak of the tensors; PyTorch's: torch.cuda.max_memory_allocated), or why it
did not run ("out of memory", or our memory estimate's refusal). --rows reads rows back (several
files, several precisions) and prints the table, one per precision; --figure draws steps per
second and peak memory against N, one line per implementation (an SVG, no plotting library).
--dry-run checks the calls at tiny sizes: PyTorch's side only where it is installed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_compare as pc  # noqa: E402  (the models, the timer and the precision settings)

torch = pc.torch
MECHANISMS = ["full", "cast-topk", "clustered", "iclustered"]


def ours(binary, mechanism, n, batch, precision, device, warmup, repeats):
    """One of our rows: `cast bench train` at the Text preset with length n."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.jsonl")
        run = subprocess.run([binary, "bench", "train", "--task", "text", "--length", str(n), "--batch-size",
                              str(batch), "--mechanisms", mechanism, "--precision", precision, "--device", device,
                              "--warmup", str(warmup), "--repeats", str(repeats), "--json", out],
                             capture_output=True, text=True)
        rows = [json.loads(line) for line in open(out) if line.strip()] if os.path.exists(out) else []
    row = dict(impl=f"cast {mechanism}", n=n, batch=batch, precision=precision, device=device)
    if run.returncode != 0 or not rows:
        reason = (run.stderr.strip().splitlines() or ["no result"])[-1]
        return dict(row, status="does not fit" if "does not fit" in reason else "failed", note=reason)
    ms = rows[0]["ms_per_step"]
    return dict(row, status="ok", ms_per_step=ms, steps_per_s=1000.0 / ms, peak_mib=rows[0]["peak_mib"])


if torch is not None:
    class MathAttention(pc.Attention):
        """softmax(QKᵀ/√d)V with the N x N matrix formed: the standard Transformer of the papers."""

        def forward(self, x):
            B, N, D = x.shape
            d = D // self.heads
            split = lambda t: t.view(B, N, self.heads, d).transpose(1, 2)
            q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))
            o = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, dim=-1) @ v
            return self.wo(o.transpose(1, 2).reshape(B, N, D))


def theirs(kind, n, batch, precision, device, warmup, repeats):
    """PyTorch's Text-preset step with `kind` attention ("math" or "sdpa")."""
    row = dict(impl=f"torch {kind}", n=n, batch=batch, precision=precision, device=str(device))
    try:
        step = pc.training_step("text", n, batch, device, MathAttention if kind == "math" else None)
        gpu = device.type == "cuda"
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        ms = pc.timed(step, warmup, repeats, device)
        peak = torch.cuda.max_memory_allocated() / 2 ** 20 if gpu else None
        return dict(row, status="ok", ms_per_step=ms, steps_per_s=1000.0 / ms, peak_mib=peak)
    except torch.cuda.OutOfMemoryError:
        return dict(row, status="out of memory")
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def table(rows):
    """A Markdown table per precision: steps/s and peak GiB per implementation and N."""
    lines = []
    for precision in sorted({r["precision"] for r in rows}):
        sub = [r for r in rows if r["precision"] == precision]
        ns = sorted({r["n"] for r in sub})
        impls = list(dict.fromkeys(r["impl"] for r in sub))
        lines.append(f"Precision {precision}, batch {sub[0]['batch']}: steps/s (peak GiB)")
        lines.append("")
        lines.append("| implementation | " + " | ".join(f"N {n}" for n in ns) + " |")
        lines.append("|---|" + "---|" * len(ns))
        for impl in impls:
            cells = []
            for n in ns:
                r = next((r for r in sub if r["impl"] == impl and r["n"] == n), None)
                if r is None:
                    cells.append("")
                elif r["status"] != "ok":
                    cells.append(r["status"])
                else:
                    peak = f" ({r['peak_mib'] / 1024:.2f})" if r.get("peak_mib") is not None else ""
                    cells.append(f"{r['steps_per_s']:.2f}{peak}")
            lines.append(f"| {impl} | " + " | ".join(cells) + " |")
        fits = [r["n"] for r in sub if r["impl"] == "torch math" and r["status"] == "ok"]
        if any(r["impl"] == "torch math" and r["status"] != "ok" for r in sub):
            lines.append("")
            lines.append(f"PyTorch's math attention: the largest N that fits is {max(fits) if fits else 'none'}.")
        lines.append("")
    return "\n".join(lines)


def figure(rows, path):
    """Steps per second and peak memory against N, one line per implementation, per precision."""
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f"]
    panels = [("steps_per_s", "steps per second"), ("peak_mib", "peak memory (GiB)")]
    precisions = sorted({r["precision"] for r in rows})
    w, h, left, top = 360, 240, 60, 40
    width, height = left + len(panels) * (w + 70), top + len(precisions) * (h + 90) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">', f'<rect width="{width}" height="{height}" fill="white"/>']
    for pi, precision in enumerate(precisions):
        sub = [r for r in rows if r["precision"] == precision and r["status"] == "ok"]
        impls = list(dict.fromkeys(r["impl"] for r in rows if r["precision"] == precision))
        ns = sorted({r["n"] for r in rows if r["precision"] == precision})
        y0 = top + pi * (h + 90)
        for qi, (key, label) in enumerate(panels):
            x0 = left + qi * (w + 70)
            values = [r[key] / (1024 if key == "peak_mib" else 1) for r in sub if r.get(key) is not None]
            top_value = max(values) * 1.1 if values else 1.0
            out.append(f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle">{label}, {precision}</text>')
            out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
            for k in range(5):
                v = top_value * k / 4
                y = y0 + h - h * k / 4
                out.append(f'<text x="{x0 - 4}" y="{y + 4}" text-anchor="end">{v:.3g}</text>')
            xs = {n: x0 + (w * (i + 0.5) / len(ns)) for i, n in enumerate(ns)}
            for n, x in xs.items():
                out.append(f'<text x="{x}" y="{y0 + h + 14}" text-anchor="middle">N {n}</text>')
            for ii, impl in enumerate(impls):
                pts = [(xs[r["n"]], y0 + h - h * (r[key] / (1024 if key == "peak_mib" else 1)) / top_value)
                       for r in sorted(sub, key=lambda r: r["n"]) if r["impl"] == impl and r.get(key) is not None]
                colour = colours[ii % len(colours)]
                if pts:
                    out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                               + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
                for x, y in pts:
                    out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>')
                if qi == 0:
                    out.append(f'<text x="{x0 + 6}" y="{y0 + h + 30 + 12 * (ii // 3)}" dx="{120 * (ii % 3)}" '
                               f'fill="{colour}">{impl}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cast", default=os.path.join(os.path.dirname(__file__), "..", "build", "cast"))
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--lengths", default="1024,2048,3072,4096")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS), help="ours: a comma-separated subset")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="append the rows to this file")
    parser.add_argument("--rows", nargs="*", help="read rows from these files instead of measuring")
    parser.add_argument("--figure", help="draw the rows into this SVG")
    parser.add_argument("--dry-run", action="store_true", help="check the calls: PyTorch's side only where installed")
    args = parser.parse_args()
    if args.rows:
        rows = [json.loads(line) for path in args.rows for line in open(path) if line.strip()]
        rows = [r for r in rows if "impl" in r]  # a session's bench.jsonl holds other rows too
    else:
        if not os.path.isfile(args.cast):
            parser.error(f"--cast: {args.cast} is not a file (build it first)")
        have_torch = torch is not None and (args.device == "cpu" or torch.cuda.is_available())
        if not have_torch and not args.dry_run:
            raise SystemExit("PyTorch with CUDA is not available here (--dry-run times our side alone)")
        pc.PRECISION = args.precision
        device = None
        if have_torch:
            torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
            torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
            torch.manual_seed(0)
            device = torch.device(args.device)
        rows = []
        for n in (int(v) for v in args.lengths.split(",")):
            for mechanism in args.mechanisms.split(","):
                rows.append(ours(args.cast, mechanism, n, args.batch, args.precision, args.device, args.warmup,
                                 args.repeats))
            if have_torch:
                for kind in ("math", "sdpa"):
                    rows.append(theirs(kind, n, args.batch, args.precision, device, args.warmup, args.repeats))
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    if not rows:
        raise SystemExit("no rows")
    print(table(rows))
    if args.figure:
        figure(rows, args.figure)
        print(f"figure: {args.figure}")
    failed = [r for r in rows if r["status"] == "failed"]
    for r in failed:
        print(f"{r['impl']} at N {r['n']} failed: {r.get('note', '')}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
