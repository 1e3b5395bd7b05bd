#!/usr/bin/env python3
"""Sums GPU kernel times by kernel, from Nsight Compute's CSV, to set against bench/floor.py.

On a GPU machine (ncu reads one metric per kernel, a single pass, so the program runs at
nearly its own speed):

  ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \\
      build-gpu/cast bench train --task text --mechanisms cast-topk --warmup 0 --repeats 1 > ncu.csv
  python3 bench/kernel_times.py ncu.csv [--top 25]

It prints each kernel's launches, total milliseconds and share of the whole, largest first, after
one line of shares by kind: matmul (cuBLAS), attention (the attention and clustering kernels)
and other (elementwise, layout, reductions, LayerNorm, the loss, the optimizer).
Template arguments are cut from the names so that one kernel's instances add up; --exact keeps
them.
"""
import argparse
import collections
import csv
import sys


def kernel_rows(lines):
    """Yields (kernel name, nanoseconds) from ncu's CSV, skipping its log lines (==PROF== ...)."""
    header_seen = False
    table = []
    for line in lines:
        if not header_seen:
            if line.startswith('"ID"'):
                header_seen = True
                table.append(line)
            continue
        table.append(line)
    if not header_seen:
        raise SystemExit("kernel_times: no ncu CSV table found (was --csv given to ncu?)")
    for row in csv.DictReader(table):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = row["Metric Value"].replace(",", "")
        unit = row.get("Metric Unit", "ns")
        scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit)
        if scale is None:
            raise SystemExit(f"kernel_times: unknown time unit '{unit}' (use ncu --print-units base)")
        yield row["Kernel Name"], float(value) * scale


def short_name(name):
    """The kernel's name without template arguments or parameter list."""
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or name


MATMUL_WORDS = ("gemm", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "ampere_", "hopper_")
ATTENTION_WORDS = ("flash", "cluster", "topkey", "top_key", "combine", "summar", "hamming", "kmeans", "lsh",
                   "affinit", "attention", "intra", "gate", "member", "radix_select", "softmax", "slot",
                   "weight_index", "topk", "repeat_heads", "to_bf16", "planes_to_double", "column_chunk_sums",
                   "column_totals", "invert_kernel", "outside_kernel")
# kernels of the attention files whose names say nothing of it (cuda/attention/cluster_index.cu)
ATTENTION_NAMES = ("count_kernel",)


def kind(name):
    """matmul, attention or other, by the kernel's name."""
    lower = name.lower()
    if any(w in lower for w in MATMUL_WORDS):
        return "matmul"
    if any(w in lower for w in ATTENTION_WORDS) or lower.rsplit("::", 1)[-1] in ATTENTION_NAMES:
        return "attention"
    return "other"


def totals(lines, exact=False):
    """(nanoseconds by kernel, launches by kernel) from ncu's CSV lines."""
    total_ns, launches = collections.Counter(), collections.Counter()
    for name, ns in kernel_rows(lines):
        key = name if exact else short_name(name)
        total_ns[key] += ns
        launches[key] += 1
    return total_ns, launches


def self_test():
    """Checks the parser on ncu's CSV layout: log lines first, template instances summed."""
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
    def row(i, name, ns):
        return (f'"{i}","7","cast","127.0.0.1","{name}","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0",'
                f'"Command line profiler metrics","gpu__time_duration.sum","ns","{ns}"')
    lines = ["==PROF== Connected to process 7", header,
             row(0, "void cuda::flash_forward_kernel<64, 4, 8>(Params)", "1,500"),
             row(1, "void cuda::flash_forward_kernel<128, 4, 4>(Params)", "500"),
             row(2, "cuda::affine_kernel(float const*, float*, int)", "250")]
    total_ns, launches = totals(lines)
    assert total_ns == {"void cuda::flash_forward_kernel": 2000.0, "cuda::affine_kernel": 250.0}, total_ns
    assert launches["void cuda::flash_forward_kernel"] == 2, launches
    assert [kind(k) for k in ("void cuda::flash_forward_kernel", "cuda::affine_kernel", "sm90_xmma_gemm_bf16",
                              "cuda::::to_bf16_flat_kernel", "cuda::::count_kernel", "cuda::count_real_kernel")] == \
        ["attention", "other", "matmul", "attention", "attention", "other"]
    exact, _ = totals(lines, exact=True)
    assert len(exact) == 3, exact
    try:
        totals(["no table here"])
    except SystemExit as e:
        assert "no ncu CSV table" in str(e)
    else:
        raise AssertionError("a file without the table was accepted")
    print("kernel_times: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu's CSV output ('-' for standard input)")
    parser.add_argument("--top", type=int, default=25, help="rows to print")
    parser.add_argument("--exact", action="store_true", help="keep template arguments in the names")
    args = parser.parse_args()
    stream = sys.stdin if args.csv == "-" else open(args.csv, encoding="utf-8", errors="replace")
    total_ns, launches = totals(stream, args.exact)
    whole = sum(total_ns.values())
    if whole == 0:
        raise SystemExit("kernel_times: the CSV holds no kernel times")
    print(f"{sum(launches.values())} launches, {whole / 1e6:.2f} ms of kernel time in all")
    by_kind = collections.Counter()
    for key, ns in total_ns.items():
        by_kind[kind(key)] += ns
    print("by kind: " + ", ".join(f"{k} {by_kind[k] / 1e6:.2f} ms ({100 * by_kind[k] / whole:.1f}%)"
                                  for k in ("matmul", "attention", "other")))
    print(f"{'kernel':<60} {'launches':>8} {'ms':>9} {'share':>6}")
    for key, ns in total_ns.most_common(args.top):
        print(f"{key[:60]:<60} {launches[key]:>8} {ns / 1e6:>9.3f} {100 * ns / whole:>5.1f}%")


if __name__ == "__main__":
    main()
