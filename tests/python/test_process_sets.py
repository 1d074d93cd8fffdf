"""Horovod's process sets on 3 ranks (rackhub-run with its own hub, 2
lanes): process_sets_worker.py checks every op within a set against a
single-process reference over the set's ranks' inputs, dynamic sets and
the errors; this driver requires every rank to pass every check.
Usage: test_process_sets.py"""
import os
import re
import subprocess
import sys

import harness

harness.require_torch()

WORLD = 3
MIN_CHECKS = 40  # every rank runs at least this many (ranks 0 and 2 more)


def main():
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([run, "-n", str(WORLD), "--lanes", "2", "python3",
                        os.path.join(here, "process_sets_worker.py")],
                       capture_output=True, text=True, timeout=300, cwd=here)
    print(r.stdout + r.stderr)
    totals = re.findall(r"^\[(\d+)\] CHECKS (\d+) failed (\d+)", r.stdout, re.M)
    ok = r.returncode == 0 and len(totals) == WORLD and all(int(f) == 0 for _, _, f in totals)
    ok &= all(int(n) >= MIN_CHECKS for _, n, _ in totals)
    print(f"{'PASSED' if ok else 'FAILED'}: exit {r.returncode}, per rank (rank, checks, "
          f"failed): {totals}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
