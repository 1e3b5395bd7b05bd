#!/usr/bin/env python3
"""The floor of each CUDA kernel of a training step at the Text preset's sizes, on paper.

For each kernel: the bytes it must move (its inputs read once, its outputs written once, f32)
and the flops it must do; the floor is the larger of bytes / bandwidth and flops / peak. The
times measured on a GPU go in the last column of the table in bench/RESULTS.md.

    python3 bench/floor.py            # Markdown table for one layer and the whole step
"""
import math

# Text preset (docs/training.md): 4 layers, batch 32, N 4096, D 256, 4 heads, MLP 1024.
B, N, D, H, M, L = 32, 4096, 256, 4, 1024, 4
d = D // H
C = math.ceil(math.sqrt(N) / 8) * 8  # default clusters: ceil(sqrt(N)) rounded up to 8
KAPPA = C                            # default cluster size
TOPK = 32                            # improved clustered: keys per cluster
F = 4                                # bytes of f32

# H100 SXM (80 GB HBM3): memory bandwidth and f32 peaks from NVIDIA's data sheet.
BANDWIDTH = 3.35e12  # bytes/s
FP32 = 67e12         # flop/s, CUDA cores
TF32 = 495e12        # flop/s, tensor cores, dense

BN = B * N


def row(name, bytes_, flops, peak=FP32):
    t_mem, t_math = bytes_ / BANDWIDTH, flops / peak
    bound = "memory" if t_mem >= t_math else "compute"
    return name, bytes_, flops, max(t_mem, t_math), bound


def matmul(name, m, k, n, count=1, peak=FP32):
    """(m x k) @ (k x n), `count` times: read both operands, write the product."""
    return row(name, count * F * (m * k + k * n + m * n), count * 2 * m * k * n, peak)


def kernels():
    act = BN * D * F  # one (B, N, D) activation
    rows = []
    rows.append(row("layernorm forward", 2 * act, 8 * BN * D))
    rows.append(row("layernorm backward (input and parameter gradients)", 3 * act, 12 * BN * D))
    rows.append(matmul("QKV projection forward", BN, D, 3 * D))
    rows.append(matmul("QKV projection backward (dX, dW)", BN, 3 * D, D, 2))
    # full attention, flash-style: Q, K, V read, O and the log-sum-exp written; the backward
    # reads Q, K, V, O, dO and writes dQ, dK, dV, recomputing the scores (2.5 times the flops)
    fwd_flops = 4 * B * H * N * N * d
    rows.append(row("full attention forward (fused)", 4 * act + B * H * N * F, fwd_flops))
    rows.append(row("full attention backward (fused)", 8 * act + B * H * N * F, 2.5 * fwd_flops))
    # CAST
    aff = B * H * N * C * F
    rows.append(row("CAST affinities Q S^T and cluster softmax", act + 2 * aff, 2 * B * H * N * C * d + 5 * B * H * N * C))
    rows.append(row("CAST Top-K selection", aff + B * H * C * KAPPA * 4, B * H * N * C))
    intra = 4 * B * H * C * KAPPA * KAPPA * d
    gathered = B * H * C * KAPPA * d * F
    rows.append(row("CAST intra-cluster attention forward (fused)", 3 * gathered + gathered, intra))
    rows.append(row("CAST intra-cluster attention backward (fused)", 4 * gathered + 3 * gathered, 2.5 * intra))
    rows.append(row("CAST summaries and combine forward", aff + act + B * H * C * d * F, 4 * B * H * N * C * d))
    rows.append(row("CAST summaries and combine backward", 2 * aff + 2 * act, 8 * B * H * N * C * d))
    # clustered (centroid attention) and improved clustered
    rows.append(row("clustered: LSH hashing (63 planes)", act + BN * H * 8, 2 * B * H * N * 64 * (d + 1)))
    rows.append(row("clustered: Hamming k-means, 10 Lloyd steps", 10 * B * H * N * 12, 10 * B * H * N * C * 2))
    cen = 4 * B * H * C * N * d
    rows.append(row("clustered: centroid attention forward (fused)", 3 * act + B * H * C * d * F * 2, cen))
    rows.append(row("clustered: centroid attention backward (fused)", 5 * act, 2.5 * cen))
    rows.append(row("improved clustered: top-k keys recomputed", 3 * act + B * H * C * TOPK * 4, 4 * B * H * N * TOPK * d))
    # the rest of the block
    rows.append(matmul("output projection forward", BN, D, D))
    rows.append(matmul("output projection backward (dX, dW)", BN, D, D, 2))
    rows.append(matmul("MLP matmuls forward", BN, D, M, 2))
    rows.append(matmul("MLP matmuls backward (dX, dW)", BN, D, M, 4))
    rows.append(row("GELU forward and backward", 3 * BN * M * F, 30 * BN * M))
    rows.append(row("residual adds, dropout (forward and backward)", 8 * act, 4 * BN * D))
    return rows


def fmt_bytes(b):
    return f"{b / 1e6:,.0f} MB"


def fmt_flops(f):
    return f"{f / 1e9:,.1f} GFLOP"


# ---------------------------------------------------------------- the flash kernels on paper
# cuda/attention/full_attention_flash.cu's tiles (Tile<D, RT, CN>: 16·RT rows per block, 8·CN streamed rows, 128
# threads) and ptxas's registers for sm_90 (scripts/kernel_report.sh), to be replaced by
# measurements. Per streamed tile, one warp issues:
#   score products (S = QKᵀ, and dP = dO Vᵀ in the backward): per 4 head columns 4·RT·CN FMAs
#     and RT + CN 128-bit shared loads;
#   accumulations (O += PV; dQ += dS K; dV += Pᵀ dO and dK += dSᵀ Q): per 4 streamed rows
#     16·RT·G FMAs (G = D/32) and RT + 4G 128-bit shared loads;
#   per score about `other` instructions besides (scale, mask test, exp, max/sum, shared store).
# Expected fraction of the FP32 peak = FMA share of the issue slots × min(1, resident warps / 16),
# the second factor for latency hiding; a warp's 128-bit loads here are mostly broadcasts (one
# wavefront each), so the shared-memory pipe (one wavefront a clock per SM) is checked too.
FLASH = [  # kernel, D, RT, CN, score products, accumulations, other instructions per score, registers
    ("forward", 32, 4, 8, 1, 1, 12, 128), ("forward", 64, 4, 8, 1, 1, 12, 144), ("forward", 128, 4, 4, 1, 1, 12, 137),
    ("dQ", 32, 4, 8, 2, 1, 10, 168), ("dQ", 64, 4, 8, 2, 1, 10, 186), ("dQ", 128, 4, 4, 2, 1, 10, 168),
    ("dK/dV", 32, 4, 8, 2, 2, 14, 171), ("dK/dV", 64, 4, 4, 2, 2, 14, 162), ("dK/dV", 128, 2, 4, 2, 2, 14, 135),
]


def flash_shared_bytes(kind, D, RT, CN):
    rows, stream, stride, pstride = 16 * RT, 8 * CN, D + 4, 8 * CN + 4
    if kind == "forward":
        floats = (rows + 2 * stream) * stride + rows * pstride + stream
    elif kind == "dQ":
        floats = (2 * rows + 2 * stream) * stride + rows * pstride + stream
    else:
        floats = (2 * rows + 2 * stream) * stride + 2 * rows * pstride + 2 * stream
    return 4 * floats


def flash_rows():
    out = []
    for kind, D, RT, CN, n_scores, n_acc, other, regs in FLASH:
        G, stream = D // 32, 8 * CN
        fma = n_scores * (D // 4) * 4 * RT * CN + n_acc * (stream // 4) * 16 * RT * G
        lds = n_scores * (D // 4) * (RT + CN) + n_acc * (stream // 4) * (RT + 4 * G)
        issue = fma / (fma + lds + other * RT * CN)
        shared = flash_shared_bytes(kind, D, RT, CN)
        warp_regs = math.ceil(regs * 32 / 256) * 256
        blocks = min(65536 // (4 * warp_regs), 233472 // (shared + 1024), 16)
        warps = 4 * blocks
        expected = min(issue, fma / (4 * lds)) * min(1.0, warps / 16)
        out.append((kind, D, f"{16 * RT}x{stream}", fma / lds, issue, regs, shared, warps, expected))
    return out


def main():
    print(f"Text preset: B {B}, N {N}, D {D}, {H} heads (d {d}), MLP {M}, {L} layers; C = kappa = {C}; "
          f"H100 SXM: {BANDWIDTH / 1e12:.2f} TB/s, {FP32 / 1e12:.0f} TFLOP/s f32 ({TF32 / 1e12:.0f} TF32)\n")
    print("| kernel (one layer) | bytes | flops | floor ms | bound | measured ms |")
    print("|---|---|---|---|---|---|")
    rows = kernels()
    for name, b, f, t, bound in rows:
        print(f"| {name} | {fmt_bytes(b)} | {fmt_flops(f)} | {1e3 * t:.3f} | {bound} | (GPU) |")
    common = [r for r in rows if not r[0].startswith(("full attention", "CAST", "clustered", "improved"))]
    by = lambda prefix: [r for r in rows if r[0].startswith(prefix)]
    mech = {"full": by("full attention"), "cast": by("CAST"), "clustered": by("clustered"),
            "iclustered": by("clustered") + by("improved")}
    print("\n| training step (4 layers, forward and backward) | floor ms | measured ms |")
    print("|---|---|---|")
    for name, extra in mech.items():
        total = L * sum(r[3] for r in common + extra)
        print(f"| {name} | {1e3 * total:.2f} | (GPU) |")
    fwd = 4 * B * H * N * N * d
    print("\n| flash kernel (sm_90) | head bound D | tile (rows x streamed) | FMA per 128-bit shared load "
          "| FMA share of issue | registers | shared KiB/block | warps/SM | expected fraction of FP32 peak "
          "| expected ms, Text full attention | measured |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, width, tile, ratio, issue, regs, shared, warps, expected in flash_rows():
        products = {"forward": 2, "dQ": 3, "dK/dV": 4}[kind]  # tile products of N·N·d each (recomputed ones too)
        ms = f"{1e3 * products * fwd / 2 / (expected * FP32):.1f}" if width == d else "-"
        print(f"| {kind} | {width} | {tile} | {ratio:.1f} | {issue:.2f} | {regs} | {shared / 1024:.1f} | {warps} | "
              f"{expected:.2f} | {ms} | (GPU) |")


if __name__ == "__main__":
    main()
