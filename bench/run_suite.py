#!/usr/bin/python3
"""rackhub benchmark suite: rackhub push_pull vs torch.distributed gloo all_reduce.

Run with Debian's interpreter (it has python3-torch and python3-matplotlib):

  /usr/bin/python3 bench/run_suite.py                 # uses build/
  /usr/bin/python3 bench/run_suite.py --build build-cmp --rounds 3

For every configuration it runs `<build>/bin/rackhub-bench --compare gloo --json`
(R interleaved rounds of rackhub then gloo) and writes, into bench/results/:

  e2e-<date>.md          machine, commands, table of medians + ratio, targets
  e2e-<date>.json        every raw JSON line
  e2e-<date>-time.png    median iteration time vs size, rackhub and gloo
  e2e-<date>-gbps.png    GB/s of model per worker vs size

Plots need matplotlib (skipped with a note otherwise). When
<build>/bin/rackhub-kernel-bench exists, its medians (5 repetitions) are
tabled too. Exit code: 0 when every run produced numbers, 1 otherwise.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20

# The comparison matrix (targets are checked on it) and the size sweep (plots).
MATRIX_SIZES = [4, 64]
MATRIX_WORKERS = [2, 4]
MATRIX_DTYPES = ["fp32", "bf16"]
SWEEP_SIZES = [1, 4, 16, 64]
SWEEP_WORKERS = 2
SWEEP_DTYPE = "fp32"


def iterations_for(size_mib):
    return 20 if size_mib <= 4 else 10


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_description(torch_version):
    lscpu = {}
    for line in sh(["lscpu"]).splitlines():
        key, _, value = line.partition(":")
        lscpu[key.strip()] = value.strip()
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
    except OSError:
        pass
    flags = set(lscpu.get("Flags", "").split())
    simd = [f for f in ["avx2", "avx512f", "avx512bw", "avx512_bf16", "f16c"] if f in flags]
    load = os.getloadavg()
    rows = [
        ("CPU", f"{lscpu.get('Model name', '?')} ({lscpu.get('Vendor ID', '?')})"
                + (f", {lscpu['Hypervisor vendor']} guest" if "Hypervisor vendor" in lscpu
                   else "")),
        ("cores (nproc)", sh(["nproc"]).strip()),
        ("threads per core", lscpu.get("Thread(s) per core", "?")),
        ("caches", f"L2 {lscpu.get('L2 cache', '?')}, L3 {lscpu.get('L3 cache', '?')}"),
        ("SIMD", " ".join(simd) or "none of avx2/avx512"),
        ("memory", f"{mem_kib / (1 << 20):.1f} GiB"),
        ("kernel", platform.release()),
        ("torch (gloo)", torch_version or "not importable"),
        ("load average at start", f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"),
    ]
    return rows


def git_state():
    commit = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).strip() or "?"
    dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"]).strip()
    return commit + (" + uncommitted changes" if dirty else "")


def run_compare(bench, size_mib, workers, dtype, rounds, extra):
    cmd = [bench, "--compare", "gloo", "--json", "--workers", str(workers),
           "--bytes", f"{size_mib}MiB", "--dtype", dtype,
           "--iterations", str(iterations_for(size_mib)), "--rounds", str(rounds)] + extra
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    sys.stderr.write(p.stderr)
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    try:
        result = json.loads(line)
    except json.JSONDecodeError:
        result = {"error": f"exit {p.returncode}, no JSON: {p.stderr.strip()[-300:]}"}
    result["exit_code"] = p.returncode
    result["command"] = " ".join(shlex.quote(c) for c in cmd)
    result["elapsed_s"] = round(elapsed, 1)
    result["size_mib"] = size_mib
    return result


def run_kernel_bench(path, min_time):
    # With the default min time (0.5 s per benchmark and repetition) the whole
    # kernel suite takes ~6 min on 2 cores; the medians barely move with less.
    cmd = [path, "--benchmark_format=json", "--benchmark_repetitions=5",
           "--benchmark_report_aggregates_only=true"]
    if min_time:
        cmd.append(f"--benchmark_min_time={min_time}")
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        data = json.loads(p.stdout)
    except json.JSONDecodeError:
        return cmd, None, f"exit {p.returncode}: {p.stderr.strip()[-500:]}"
    rows = [b for b in data.get("benchmarks", []) if b.get("aggregate_name") == "median"]
    return cmd, rows, None


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def plot(results, out_dir, stem, notes):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker as ticker
    except ImportError as e:
        notes.append(f"plots skipped: matplotlib is not importable ({e})")
        return []
    sweep = sorted((r for r in results if r.get("workers") == SWEEP_WORKERS
                    and r.get("dtype") == SWEEP_DTYPE and r.get("median_ms") is not None
                    and r["size_mib"] in SWEEP_SIZES), key=lambda r: r["size_mib"])
    if not sweep:
        notes.append("plots skipped: no sweep results")
        return []
    sizes = [r["size_mib"] for r in sweep]
    files = []
    title = f"W={SWEEP_WORKERS}, {SWEEP_DTYPE}, loopback, {os.cpu_count()} cores"
    for kind, ylabel, rh_key, gl_key in [
            ("time", "median iteration time (ms)", "median_ms", "gloo_median_ms"),
            ("gbps", "GB/s of model per worker", "gbps_per_worker", "gloo_gbps_per_worker")]:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        ax.plot(sizes, [r[rh_key] for r in sweep], "o-", label="rackhub push_pull (sgd on hub)")
        gl = [(r["size_mib"], r[gl_key]) for r in sweep if r.get(gl_key) is not None]
        if gl:
            ax.plot([s for s, _ in gl], [v for _, v in gl], "s--",
                    label="torch gloo all_reduce")
        ax.set_xscale("log", base=2)
        if kind == "time":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            values = [r[rh_key] for r in sweep] + [v for _, v in gl]
            if max(values) / min(values) < 20:  # less than ~a decade: label minor ticks too
                ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%g"))
                ax.tick_params(axis="y", which="minor", labelsize=7)
            else:
                ax.yaxis.set_minor_formatter(ticker.NullFormatter())
            ax.margins(y=0.15)
        else:
            ax.set_ylim(bottom=0, top=1.15 * max(
                [r[rh_key] for r in sweep] + [v for _, v in gl]))
        ax.set_xticks(sizes)
        ax.set_xticklabels([f"{s} MiB" for s in sizes])
        ax.set_xlabel("model size (fp32 bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{'Iteration time' if kind == 'time' else 'Throughput'} vs size ({title})")
        ax.grid(True, which="both", alpha=0.3)
        for s, v in zip(sizes, [r[rh_key] for r in sweep]):
            ax.annotate(f"{v:.3g}", (s, v), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=8)
        for s, v in gl:
            ax.annotate(f"{v:.3g}", (s, v), textcoords="offset points", xytext=(0, -13),
                        ha="center", fontsize=8)
        ax.legend()
        fig.tight_layout()
        name = f"{stem}-{kind}.png"
        fig.savefig(os.path.join(out_dir, name))
        plt.close(fig)
        files.append(name)
    return files


def check_targets(by_key):
    """The "Speed" issue's targets, on the 64 MiB results."""
    rows = []

    def ratio_row(label, w, limit):
        r = by_key.get((64, w, "fp32"))
        v = r.get("ratio_to_gloo") if r else None
        rows.append((label, f"<= {limit}", fmt(v, ".3f"),
                     "-" if v is None else ("met" if v <= limit else "NOT met")))

    ratio_row("64 MiB W=2 fp32: rackhub / gloo time", 2, 1.0)
    ratio_row("64 MiB W=4 fp32: rackhub / gloo time", 4, 0.8)
    for w in MATRIX_WORKERS:
        f, b = by_key.get((64, w, "fp32")), by_key.get((64, w, "bf16"))
        v = b["median_ms"] / f["median_ms"] if f and b and f.get("median_ms") and \
            b.get("median_ms") is not None else None
        rows.append((f"64 MiB W={w}: rackhub bf16 / rackhub fp32 time", "<= 0.6",
                     fmt(v, ".3f"), "-" if v is None else ("met" if v <= 0.6 else "NOT met")))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="build dir (relative to the repo) [build]")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per config [5]")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--date", default=datetime.date.today().isoformat(),
                    help="date in the file names [today]")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 round, small sizes only (results not meant to be kept)")
    ap.add_argument("--kernel-min-time", default="0.05",
                    help="--benchmark_min_time for rackhub-kernel-bench, seconds; '' = its "
                         "default (0.5, ~6 min) [0.05]")
    ap.add_argument("--bench-arg", action="append", default=[],
                    help="extra argument for rackhub-bench (repeatable), e.g. --bench-arg=--no-verify")
    args = ap.parse_args()

    build = args.build if os.path.isabs(args.build) else os.path.join(REPO, args.build)
    bench = os.path.join(build, "bin", "rackhub-bench")
    if not os.access(bench, os.X_OK):
        sys.exit(f"run_suite: {bench} not found; build it first "
                 f"(cmake --build {args.build} --target rackhub-bench rackhubd)")
    os.makedirs(args.out, exist_ok=True)
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None

    global MATRIX_SIZES, SWEEP_SIZES
    if args.quick:
        MATRIX_SIZES, SWEEP_SIZES = [1], [1, 4]
        args.rounds = 1

    configs = [(s, w, d) for s in MATRIX_SIZES for w in MATRIX_WORKERS for d in MATRIX_DTYPES]
    configs += [(s, SWEEP_WORKERS, SWEEP_DTYPE) for s in SWEEP_SIZES
                if (s, SWEEP_WORKERS, SWEEP_DTYPE) not in configs]
    started = time.monotonic()
    results = []
    for i, (s, w, d) in enumerate(configs):
        sys.stderr.write(f"run_suite: [{i + 1}/{len(configs)}] {s} MiB, W={w}, {d}\n")
        results.append(run_compare(bench, s, w, d, args.rounds, args.bench_arg))
    kernel = None
    kernel_path = os.path.join(build, "bin", "rackhub-kernel-bench")
    if os.access(kernel_path, os.X_OK):
        sys.stderr.write("run_suite: rackhub-kernel-bench\n")
        kernel = run_kernel_bench(kernel_path, args.kernel_min_time)
    total_s = time.monotonic() - started

    stem = f"e2e-{args.date}"
    notes = []
    pngs = plot(results, args.out, stem, notes)
    by_key = {(r["size_mib"], r.get("workers"), r.get("dtype")): r for r in results}
    failed = [r for r in results if r.get("median_ms") is None]
    gloo_errors = sorted({r["gloo_error"] for r in results if r.get("gloo_error")})
    gloo_notes = sorted({r["gloo_note"] for r in results if r.get("gloo_note")})

    md = [f"# rackhub end-to-end benchmark, {args.date}", ""]
    md += ["rackhub push_pull (synchronous, sgd applied on the hub, every iteration verified bit "
           "for bit unless noted) against torch.distributed gloo all_reduce of the same model, "
           "both with W local processes on loopback. See [bench/README.md](../README.md) for "
           "what the numbers mean.", ""]
    md += ["## Machine", "", "| | |", "|---|---|"]
    md += [f"| {k} | {v} |" for k, v in machine_description(torch_version)]
    md += [f"| rackhub commit | {git_state()} |",
           f"| suite wall time | {total_s / 60:.1f} min |", ""]
    md += ["## Commands", "", "```sh",
           f"/usr/bin/python3 bench/run_suite.py --build {args.build} --rounds {args.rounds}"
           + "".join(f" --bench-arg={shlex.quote(a)}" for a in args.bench_arg)
           + (" --quick" if args.quick else "")
           + (f" --kernel-min-time={args.kernel_min_time}" if kernel else ""),
           "# which ran, for each configuration:"]
    md += [r["command"].replace(REPO + "/", "") for r in results]
    if kernel:
        md.append(" ".join(kernel[0]).replace(REPO + "/", ""))
    md += ["```", ""]
    md += ["## rackhub vs gloo", "",
           f"Each row: {args.rounds} interleaved rounds of [rackhub I iterations, gloo I "
           "iterations] (+2 warm-up each); an iteration's time is the slowest rank's; "
           "columns are medians of the per-round medians. GB/s = model bytes (fp32 size) / "
           "median time, per worker. ratio = rackhub / gloo (< 1: rackhub faster).", "",
           "| size | W | dtype | I | rackhub ms | gloo ms | ratio | rackhub GB/s | gloo GB/s "
           "| gloo dtype | verified | rackhub round medians | gloo round medians |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|---|"]
    for r in results:
        md.append(
            f"| {r['size_mib']} MiB | {r.get('workers', '?')} | {r.get('dtype', '?')} "
            f"| {r.get('iterations', '?')} | {fmt(r.get('median_ms'))} "
            f"| {fmt(r.get('gloo_median_ms'))} | {fmt(r.get('ratio_to_gloo'), '.3f')} "
            f"| {fmt(r.get('gbps_per_worker'), '.3f')} "
            f"| {fmt(r.get('gloo_gbps_per_worker'), '.3f')} | {r.get('gloo_dtype') or '-'} "
            f"| {str(r.get('verified', '-')).lower()} "
            f"| {' '.join(f'{v:.1f}' for v in r.get('round_median_ms', []))} "
            f"| {' '.join(f'{v:.1f}' for v in r.get('gloo_round_median_ms', []))} |")
    md.append("")
    for n in gloo_notes:
        md += [f"Note: {n}.", ""]
    for e in gloo_errors:
        md += [f"**gloo unavailable**: {e}", ""]
    for r in failed:
        md += [f"**failed** ({r['size_mib']} MiB): {r.get('error', 'no median')} "
               f"(exit {r['exit_code']})", ""]
    md += ["## Targets (\"Speed\" issue)", "", "| target | limit | measured | |",
           "|---|---|---:|---|"]
    md += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in check_targets(by_key)]
    md.append("")
    if pngs:
        md += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    if kernel:
        cmd, rows, err = kernel
        md += ["## Aggregation kernels (rackhub-kernel-bench, median of 5)", ""]
        if err:
            md += [f"rackhub-kernel-bench failed: {err}", ""]
        else:
            counters = sorted({k for b in rows for k, v in b.items()
                               if isinstance(v, (int, float)) and k not in (
                                   "real_time", "cpu_time", "iterations", "repetitions",
                                   "repetition_index", "threads", "family_index",
                                   "per_family_instance_index", "run_type")})
            md += ["| benchmark | real time | cpu time | " + " | ".join(counters) + " |",
                   "|---|---:|---:|" + "---:|" * len(counters)]
            for b in rows:
                unit = b.get("time_unit", "ns")
                cells = []
                for k in counters:
                    v = b.get(k)
                    if v is None:
                        cells.append("-")
                    elif k == "bytes_per_second":
                        cells.append(f"{v / 1e9:.2f} GB/s")
                    elif k == "items_per_second":
                        cells.append(f"{v / 1e9:.3f} G/s")
                    else:
                        cells.append(f"{v:.4g}")
                md.append(f"| {b.get('run_name', b['name'])} | {b['real_time']:.4g} {unit} "
                          f"| {b['cpu_time']:.4g} {unit} | " + " | ".join(cells) + " |")
            md.append("")
    else:
        md += [f"(rackhub-kernel-bench not built in {args.build}: kernel results skipped)", ""]
    for n in notes:
        md += [f"Note: {n}", ""]
    md += [f"Raw results: [{stem}.json]({stem}.json).", ""]

    with open(os.path.join(args.out, f"{stem}.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(args.out, f"{stem}.json"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(os.path.join(args.out, f"{stem}.md"))
    for p in pngs:
        print(os.path.join(args.out, p))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
