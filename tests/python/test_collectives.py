"""rackhub.torch's collectives and client options from Python, on 3 ranks
(rackhub-run with its own hub): collectives_worker.py checks every one on
every rank; this driver requires every rank to pass every check."""
import os
import re
import subprocess
import sys

import harness

harness.require_torch()


def main():
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    here = os.path.dirname(os.path.abspath(__file__))
    # A 1 s straggler timeout: a late root's collective must still complete.
    r = subprocess.run([run, "-n", "3", "--lanes", "2", "--hub-arg=--straggler-timeout-ms=1000",
                        "python3",
                        os.path.join(here, "collectives_worker.py")],
                       capture_output=True, text=True, timeout=150, cwd=here)
    print(r.stdout + r.stderr)
    totals = re.findall(r"^\[(\d)\] CHECKS (\d+) failed (\d+)", r.stdout, re.M)
    ok = r.returncode == 0 and len(totals) == 3 and all(int(f) == 0 for _, _, f in totals)
    ok &= all(int(n) >= 46 for _, n, _ in totals)
    print(f"{'ok  ' if ok else 'FAIL'} exit {r.returncode}, per rank (rank, checks, failed): "
          f"{totals}")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
