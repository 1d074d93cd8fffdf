"""The DLRM demo (deploy/demo-dlrm.sh) end to end, without its bootstrap and
build: build/bin/rackhub-run -n W python3 tests/python/dlrm_demo.py trains
the DLRM-style model with W workers through a private hub (embedding tables
as row-sparse keys), then the same model in one process. Checks: exit code
0, one table row per epoch for both runs, the training loss falls and the
held-out AUC rises over the epochs (rackhub run), both final AUCs reach
dlrm_demo.MIN_AUC and differ by at most dlrm_demo.AUC_TOLERANCE.

    dlrm_demo_test.py [WORKERS] [--no-prefetch]     (RACKHUB_BIN_DIR: rackhub-run's directory)

Exit code 77 (skipped, with the reason) if python3-torch or python3-sklearn is
missing."""
import os
import re
import subprocess
import sys
import time

SKIP = 77  # CTest SKIP_RETURN_CODE


def require(module, package):
    try:
        __import__(module)
    except ImportError as e:
        print(f"SKIPPED: {package} is not installed for {sys.executable} ({e}); "
              f"install it with: apt-get install {package}")
        sys.exit(SKIP)


def main():
    require("torch", "python3-torch")
    require("sklearn", "python3-sklearn")
    args = sys.argv[1:]
    workers = int(args.pop(0)) if args and args[0].isdigit() else 2
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import dlrm_demo
    import dlrm_model
    run = os.path.join(os.environ.get("RACKHUB_BIN_DIR") or sys.exit("RACKHUB_BIN_DIR not set"),
                       "rackhub-run")
    cmd = [run, "-n", str(workers), "python3", os.path.join(here, "dlrm_demo.py")] + args
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=here)
    secs = time.monotonic() - t0
    print(r.stdout + r.stderr)

    ok = True

    def check(cond, what):
        nonlocal ok
        print(f"{'ok  ' if cond else 'FAIL'} {what}")
        ok &= bool(cond)

    check(r.returncode == 0, f"rackhub-run exit code {r.returncode} ({secs:.1f} s)")
    rows = re.findall(r"^\[0\] +(\d+) +(\S+) +(\S+) +\S+$", r.stdout, re.M)
    n = dlrm_model.EPOCHS
    check(len(rows) == 2 * n, f"{len(rows)} table rows for 2 runs of {n} epochs")
    if len(rows) == 2 * n:
        loss = [float(x[1]) for x in rows[:n]]
        auc = [float(x[2]) for x in rows[:n]]
        check(loss[-1] < loss[0], f"training loss through rackhub {loss[0]} -> {loss[-1]}")
        check(auc[-1] > auc[0], f"held-out AUC through rackhub {auc[0]} -> {auc[-1]}")
    m = re.search(r"^\[0\] held-out AUC: (\d+) workers through rackhub (\S+) \| one process "
                  r"(\S+) \| Bayes-optimal (\S+)", r.stdout, re.M)
    check(m, "rank 0 printed both held-out AUCs")
    if m:
        dist, single, bayes = float(m.group(2)), float(m.group(3)), float(m.group(4))
        lo, tol = dlrm_demo.MIN_AUC, dlrm_demo.AUC_TOLERANCE
        check(int(m.group(1)) == workers, f"{m.group(1)} workers")
        check(dist >= lo, f"{workers} workers through rackhub: AUC {dist} >= {lo} "
                          f"(Bayes-optimal {bayes})")
        check(single >= lo, f"one process: AUC {single} >= {lo}")
        check(abs(dist - single) <= tol, f"|{dist} - {single}| <= {tol}")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
