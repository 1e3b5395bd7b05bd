#!/usr/bin/env python3
"""The floor of one attention layer's forward+backward on this CPU, step by step, beside the time
`cast bench attention` measures.

Each step's floor is the larger of its bytes over the memory bandwidth and its flops over the
sgemm rate, both measured here by `cast bench gemm` (on the same threads). The layer is the one
`cast bench attention` times: batch 1, D 256, 4 heads (head width 64), the QKV and output
projections included; CAST with C clusters of kappa tokens (default C = kappa = ceil(sqrt N)
rounded up to 8, as nn::default_clusters).

    python3 bench/cpu_floor.py [--cast build/cast] [--lengths 1024,4096,16384] [--threads 2]
                               [--clusters 64 --cluster-size 64] [--no-measure]
"""
import argparse
import json
import math
import os
import subprocess
import tempfile

F = 4  # bytes of f32
D, H = 256, 4
d = D // H


def default_clusters(n):
    return math.ceil(math.sqrt(n) / 8) * 8


def cast_steps(n, c, kappa):
    """(step, bytes, flops) of one CAST Top-K layer, forward then backward."""
    act = n * D * F                  # one (N, D) activation
    aff = H * n * c * F              # one affinity matrix (H, N, C)
    gathered = H * c * kappa * d * F  # one gathered (H, C, kappa, d) operand
    intra = 4 * H * c * kappa * kappa * d  # scores and weighted values of every cluster
    proj_flops, proj_bytes = 2 * n * D * 4 * D, 2 * act + 4 * act + 4 * D * D * F  # QKV and output projections
    return [
        ("projections forward (QKV, output)", proj_bytes, proj_flops),
        ("1-2 affinities Q S^T, K S^T and cluster softmax", 2 * (act + 2 * aff), 2 * (2 * H * n * c * d + 5 * H * n * c)),
        ("3 Top-K selection", 2 * aff + H * c * kappa * 4, H * n * c),
        ("4-5 gather and intra-cluster attention forward", 3 * gathered + gathered, intra),
        ("6-7 summaries and combine forward", 2 * aff + 2 * act + H * c * d * F, 4 * H * n * c * d),
        ("projections backward (dX, dW)", 2 * proj_bytes, 2 * proj_flops),
        ("1-2 affinities backward", 2 * (act + 3 * aff), 2 * (4 * H * n * c * d + 5 * H * n * c)),
        ("4-5 intra-cluster attention backward", 4 * gathered + 3 * gathered, 2.5 * intra),
        ("6-7 summaries and combine backward", 2 * aff + 2 * act, 8 * H * n * c * d),
    ]


def full_steps(n):
    act = n * D * F
    fwd = 4 * H * n * n * d
    proj_flops, proj_bytes = 2 * n * D * 4 * D, 2 * act + 4 * act + 4 * D * D * F
    return [
        ("projections forward (QKV, output)", proj_bytes, proj_flops),
        ("flash attention forward", 4 * act + H * n * F, fwd),
        ("projections backward (dX, dW)", 2 * proj_bytes, 2 * proj_flops),
        ("flash attention backward (scores recomputed)", 8 * act + H * n * F, 2.5 * fwd),
    ]


def run_json(cmd, threads):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.jsonl")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run(cmd + ["--json", out], check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cast", default=os.path.join(os.path.dirname(__file__), "..", "build", "cast"))
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--clusters", type=int, default=0)
    ap.add_argument("--cluster-size", type=int, default=0)
    ap.add_argument("--no-measure", action="store_true", help="the floors only, no cast bench attention")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if not os.access(args.cast, os.X_OK):
        raise SystemExit(f"cpu_floor.py: {args.cast} is not an executable cast binary (scripts/build.sh cast builds it)")

    gemm = run_json([args.cast, "bench", "gemm", "--repeats", "5", "--warmup", "1"], args.threads)
    gflops = max(r["gflops"] for r in gemm if "gemm" in r)
    bandwidth = next(r["bandwidth_gbps"] for r in gemm if "bandwidth_gbps" in r)
    print(f"{args.threads} threads: sgemm {gflops:.1f} GFLOP/s, memory bandwidth {bandwidth:.1f} GB/s "
          f"(cast bench gemm)\n")

    measured = {}
    if not args.no_measure:
        cmd = [args.cast, "bench", "attention", "--device", "cpu", "--lengths", args.lengths, "--mechanisms",
               "full,cast-topk", "--repeats", "3", "--warmup", "1", "--clusters", str(args.clusters),
               "--cluster-size", str(args.cluster_size)]
        for r in run_json(cmd, args.threads):
            measured[(r["mechanism"], r["n"])] = r["forward_backward_ms"]

    def floor_ms(b, f):
        return 1e3 * max(b / (bandwidth * 1e9), f / (gflops * 1e9))

    print("| N | mechanism | step | bytes | GFLOP | floor ms | bound |")
    print("|---|---|---|---|---|---|---|")
    totals = []
    for n in lengths:
        c = args.clusters or default_clusters(n)
        kappa = args.cluster_size or default_clusters(n)
        for name, steps in (("full", full_steps(n)), (f"cast-topk (C {c}, kappa {kappa})", cast_steps(n, c, kappa))):
            total = 0.0
            for step, b, f in steps:
                ms = floor_ms(b, f)
                total += ms
                bound = "memory" if b / bandwidth >= f / gflops else "compute"
                print(f"| {n} | {name} | {step} | {b / 1e6:,.1f} MB | {f / 1e9:.3f} | {ms:.2f} | {bound} |")
            totals.append((n, name.split(" ")[0], total))

    print("\n| N | mechanism | floor ms | measured fwd+bwd ms | measured / floor |")
    print("|---|---|---|---|---|")
    for n, name, total in totals:
        m = measured.get((name, n))
        print(f"| {n} | {name} | {total:.1f} | {m:.1f} | {m / total:.2f} |" if m is not None
              else f"| {n} | {name} | {total:.1f} | - | - |")


if __name__ == "__main__":
    main()
