#!/usr/bin/env python3
"""The difference of two variants' mean test accuracy with Welch's 95% interval.

Reads the results-<setting>.json files that `cast compare --vary` writes (the first variant is
the baseline, the second the change) and prints one Markdown row per file: both means ± sample
standard deviations, the difference with the half-width of its interval, Welch's degrees of
freedom and the step times. Standard library only.

    scripts/welch_intervals.py runs/results/fm28-p4-ablations/results-*.json
    scripts/welch_intervals.py --self-test
"""
import json
import math
import sys
from statistics import mean, variance


def student_t_cdf(t, dof):
    # The density integrated from 0 by Simpson's rule: exact enough for a quantile to 3 digits.
    log_norm = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    density = lambda x: math.exp(log_norm - (dof + 1) / 2 * math.log1p(x * x / dof))
    steps = 2000
    h = abs(t) / steps
    area = density(0) + density(abs(t))
    for i in range(1, steps):
        area += (4 if i % 2 else 2) * density(i * h)
    half = area * h / 3
    return 0.5 + half if t >= 0 else 0.5 - half


def student_t_quantile(p, dof):
    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if student_t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def welch(a, b):
    """Difference b - a of the means, the 95% half-width, and Welch's degrees of freedom."""
    va, vb = variance(a) / len(a), variance(b) / len(b)  # squared standard errors of the means
    if va + vb == 0:
        raise ValueError("every seed gave the same accuracy in both variants: no spread to weigh")
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return mean(b) - mean(a), student_t_quantile(0.975, dof) * math.sqrt(va + vb), dof


def check(condition, message):
    # Not assert: a self-test must not vanish under python -O.
    if not condition:
        sys.exit(f"welch_intervals: self-test failed: {message}")


def self_test():
    # Student's t table, two-sided 95%.
    for dof, table in ((1, 12.706), (2, 4.303), (3, 3.182), (10, 2.228), (30, 2.042)):
        got = student_t_quantile(0.975, dof)
        check(abs(got - table) < 1e-3, f"t quantile at {dof} dof: {got}, table {table}")
    # Equal spreads and sizes: Welch's dof is 2(n - 1), the difference the means' difference.
    diff, half, dof = welch([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    check(abs(diff - 1.0) < 1e-12 and abs(dof - 4.0) < 1e-12, f"difference {diff}, dof {dof}")
    check(abs(half - 2.776 * math.sqrt(2 / 3)) < 1e-3, f"half-width {half}")
    # Unequal spreads: dof from the Welch–Satterthwaite formula, worked by hand.
    _, _, dof = welch([0.0, 2.0], [0.0, 0.0, 6.0])
    va, vb = 2.0 / 2, 12.0 / 3
    check(abs(dof - (va + vb) ** 2 / (va**2 / 1 + vb**2 / 2)) < 1e-12, f"dof {dof}")
    # No spread at all: refused by name, not a division by zero.
    try:
        welch([87.0, 87.0], [87.0, 87.0])
        check(False, "equal seeds everywhere were not refused")
    except ValueError:
        pass
    print("welch_intervals: self-test passed")


def main(paths):
    if paths == ["--self-test"]:
        return self_test()
    if not paths:
        sys.exit("usage: scripts/welch_intervals.py results-<setting>.json ...")
    rows = [row(path) for path in paths]  # every file read before a line is printed
    print("| change (baseline → changed) | baseline test % | changed test % | difference, 95% interval | Welch dof | step ms |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


def row(path):
    try:
        with open(path) as f:
            variants = json.load(f)["variants"]
        if len(variants) != 2:
            sys.exit(f"{path}: {len(variants)} variants, expected a baseline and one change")
        base, change = ([100 * r["summary"]["test_accuracy"] for r in v["runs"]] for v in variants)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{path}: cannot read a cast compare result ({e})")
    if len(base) < 2 or len(change) < 2:
        sys.exit(f"{path}: an interval needs at least two seeds per variant")
    try:
        diff, half, dof = welch(base, change)
    except ValueError as e:
        sys.exit(f"{path}: {e}")
    mean_sd = lambda v: f"{100 * v['test_accuracy']['mean']:.2f} ± {100 * v['test_accuracy']['sd']:.2f}"
    return (f"| {variants[0]['variant']} → {variants[1]['variant']} | {mean_sd(variants[0])} | "
            f"{mean_sd(variants[1])} | {diff:+.2f} ± {half:.2f} | {dof:.1f} | "
            f"{variants[0]['step_ms_mean']:.0f} → {variants[1]['step_ms_mean']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
