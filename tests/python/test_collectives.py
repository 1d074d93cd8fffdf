"""rackhub.torch's collectives and client options from Python, on 3 ranks
(rackhub-run with its own hub): collectives_worker.py checks every one on
every rank, late_rank_worker.py a root later than the straggler timeout and a
rank that left; this driver requires every rank to pass every check."""
import os
import re
import subprocess
import sys

import harness

harness.require_torch()


def job(worker, min_checks, *hub_args):
    """Runs `worker` on 3 ranks under rackhub-run (its own hub); True if every
    rank exited 0 having passed at least `min_checks` checks and failed none."""
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([run, "-n", "3", "--lanes", "2"]
                       + [f"--hub-arg={a}" for a in hub_args]
                       + ["python3", os.path.join(here, worker)],
                       capture_output=True, text=True, timeout=300, cwd=here)
    print(r.stdout + r.stderr)
    totals = re.findall(r"^\[(\d)\] CHECKS (\d+) failed (\d+)", r.stdout, re.M)
    ok = r.returncode == 0 and len(totals) == 3 and all(int(f) == 0 for _, _, f in totals)
    ok &= all(int(n) >= min_checks for _, n, _ in totals)
    print(f"{'ok  ' if ok else 'FAIL'} {worker}: exit {r.returncode}, per rank "
          f"(rank, checks, failed): {totals}")
    return ok


def main():
    # Every collective with the hub's default straggler timeout (30 s): no
    # ordinary round can be aborted by a loaded machine.
    ok = job("collectives_worker.py", 44)
    # Lateness and a rank that left, with a 1 s straggler timeout.
    ok &= job("late_rank_worker.py", 4, "--straggler-timeout-ms=1000")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
