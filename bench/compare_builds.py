#!/usr/bin/env python3
"""Before/after comparison of two rackhub builds with rackhub-bench.

Runs interleaved rounds (A, B, A, B, ...) of the same rackhub-bench cases with
the rackhub-bench (and the rackhubd beside it) of two build directories, and
prints per case the median over rounds of each build's median iteration time
and the ratio B/A. Every run verifies its parameters bit for bit (rackhub-bench
exits 1 otherwise, which fails this script).

Usage:
  bench/compare_builds.py BUILD_A BUILD_B [--rounds N] [--only NAME_PART]
e.g. bench/compare_builds.py /tmp/before/build build --rounds 5
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

CASES = [
    # name, rackhub-bench arguments, the figure compared
    ("64 MiB W=2 shm", ["--workers", "2", "--bytes", "64MiB", "--iterations", "10",
                        "--transport", "shm"], "median_ms"),
    ("64 MiB W=2 shm lease", ["--workers", "2", "--bytes", "64MiB", "--iterations", "10",
                              "--transport", "shm", "--lease"], "median_ms"),
    ("64 MiB W=4 shm", ["--workers", "4", "--bytes", "64MiB", "--iterations", "10",
                        "--transport", "shm"], "median_ms"),
    ("64 MiB W=2 tcp", ["--workers", "2", "--bytes", "64MiB", "--iterations", "10",
                        "--transport", "tcp"], "median_ms"),
    ("4 KiB W=2 tcp p50", ["--workers", "2", "--bytes", "4KiB", "--keys", "1",
                           "--iterations", "300", "--transport", "tcp"], "p50_ms"),
    ("4 KiB W=2 shm p50", ["--workers", "2", "--bytes", "4KiB", "--keys", "1",
                           "--iterations", "300", "--transport", "shm"], "p50_ms"),
]


def run(build, args, figure):
    cmd = [os.path.join(build, "bin", "rackhub-bench"), *args, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    result = json.loads(p.stdout.strip().splitlines()[-1])
    if not result.get("verified"):
        sys.exit(f"{' '.join(cmd)}: parameters not verified")
    return result[figure]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_a")
    ap.add_argument("build_b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", help="run only the cases whose name contains this")
    a = ap.parse_args()
    cases = [c for c in CASES if not a.only or a.only in c[0]]
    times = {(name, b): [] for name, _, _ in cases for b in ("a", "b")}
    for r in range(a.rounds):
        for name, args, figure in cases:
            for which, build in (("a", a.build_a), ("b", a.build_b)):
                times[(name, which)].append(run(build, args, figure))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    print(f"host: {platform.node()}, {os.cpu_count()} cores; rounds: {a.rounds}; "
          f"A = {a.build_a}, B = {a.build_b}")
    print("| case | A (ms) | B (ms) | B / A |")
    print("|---|---|---|---|")
    for name, _, _ in cases:
        ma = statistics.median(times[(name, "a")])
        mb = statistics.median(times[(name, "b")])
        print(f"| {name} | {ma:.3f} | {mb:.3f} | {mb / ma:.3f} |")


if __name__ == "__main__":
    main()
