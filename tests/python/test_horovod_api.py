"""Horovod's torch API beyond the basics on W ranks (2 or 3; rackhub-run
with its own hub): horovod_api_worker.py checks every function against a
single-process reference on every rank; this driver requires every rank to
pass every check. Usage: test_horovod_api.py W"""
import os
import re
import subprocess
import sys

import harness

harness.require_torch()

MIN_CHECKS = 100


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([run, "-n", str(world), "--lanes", "2", "python3",
                        os.path.join(here, "horovod_api_worker.py")],
                       capture_output=True, text=True, timeout=600, cwd=here)
    print(r.stdout + r.stderr)
    totals = re.findall(r"^\[(\d+)\] CHECKS (\d+) failed (\d+)", r.stdout, re.M)
    ok = r.returncode == 0 and len(totals) == world and all(int(f) == 0 for _, _, f in totals)
    ok &= all(int(n) >= MIN_CHECKS for r_, n, _ in totals if r_ != "0") and \
        all(int(n) >= MIN_CHECKS + 2 for r_, n, _ in totals if r_ == "0")
    print(f"{'PASSED' if ok else 'FAILED'}: exit {r.returncode}, per rank (rank, checks, "
          f"failed): {totals}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
