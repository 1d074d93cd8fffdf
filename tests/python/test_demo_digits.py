"""The main demo (deploy/demo.sh) end to end, without its bootstrap and build:
build/bin/rackhub-run -n 3 python3 client/examples/digits_cnn.py trains the
digits CNN with 3 workers through a private hub, then the same model in one
process. Checks: rackhub-run exits 0, rank 0 printed one table row per epoch,
the training loss went down, and both held-out accuracies reach THRESHOLD.

    test_demo_digits.py EXAMPLE [EPOCHS]     (RACKHUB_BIN_DIR: rackhub-run's directory)

Exit code 77 (skipped, with the reason) if python3-torch or python3-sklearn is
missing."""
import os
import re
import subprocess
import sys
import time

SKIP = 77        # CTest SKIP_RETURN_CODE
THRESHOLD = 95.0  # held-out accuracy in %, both runs (docs/demos.md's claim)
WORKERS = 3


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
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    example = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) == 3 else None
    run = os.path.join(os.environ.get("RACKHUB_BIN_DIR") or sys.exit("RACKHUB_BIN_DIR not set"),
                       "rackhub-run")
    cmd = [run, "-n", str(WORKERS), "python3", example]
    if epochs:
        cmd += ["--epochs", str(epochs)]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    secs = time.monotonic() - t0
    print(r.stdout + r.stderr)

    ok = True

    def check(cond, what):
        nonlocal ok
        print(f"{'ok  ' if cond else 'FAIL'} {what}")
        ok &= bool(cond)

    check(r.returncode == 0, f"rackhub-run exit code {r.returncode} ({secs:.1f} s)")
    # Rank 0's table rows: the distributed run's, then the reference's.
    rows = re.findall(r"^\[0\] +(\d+) +(\S+) +(\S+) % +\S+ +\S+$", r.stdout, re.M)
    n = epochs or (len(rows) // 2)
    check(n > 0 and len(rows) == 2 * n, f"{len(rows)} table rows for 2 runs of {n} epochs")
    if rows and n:
        losses = [float(row[1]) for row in rows[:n]]
        check(losses[-1] < losses[0], f"training loss {losses[0]} -> {losses[-1]}")
    m = re.search(r"^\[0\] held-out accuracy: (\d+) workers through rackhub (\S+) % \| "
                  r"one process (\S+) %$", r.stdout, re.M)
    check(m, "rank 0 printed both held-out accuracies")
    if m:
        dist, single = float(m.group(2)), float(m.group(3))
        check(int(m.group(1)) == WORKERS, f"{m.group(1)} workers")
        check(dist >= THRESHOLD, f"{WORKERS} workers through rackhub: {dist} % >= {THRESHOLD} %")
        check(single >= THRESHOLD, f"one process: {single} % >= {THRESHOLD} %")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
