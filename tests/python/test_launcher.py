"""rackhub-run end to end: starts its own hub, creates the tenant, runs the
example (client/examples/torch_train.py) with 2 ranks; output lines carry the
rank prefix, every rank ends with the same parameters, loss goes down. Then a
rank that fails makes rackhub-run exit with that rank's code."""
import os
import re
import subprocess
import sys

import harness

harness.require_torch()


def main():
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    example = os.environ["RACKHUB_EXAMPLE"]
    r = subprocess.run([run, "-n", "2", "--lanes", "2", "python3", example, "--steps", "120",
                        "--log-every", "40"], capture_output=True, text=True, timeout=120)
    print(r.stdout + r.stderr)
    ok = r.returncode == 0
    sums = re.findall(r"^\[(\d)\] rank \d: done, parameter checksum (\S+)$", r.stdout, re.M)
    losses = [float(x) for x in re.findall(r"^\[0\] step +\d+ +loss (\S+)", r.stdout, re.M)]
    ok &= len(sums) == 2 and sums[0][1] == sums[1][1] and {s[0] for s in sums} == {"0", "1"}
    ok &= len(losses) >= 2 and losses[-1] < losses[0]
    print(f"{'ok  ' if ok else 'FAIL'} example: checksums {sums}, losses {losses}")

    bad = subprocess.run([run, "-n", "2", "--lanes", "1", "--grace", "5", "python3", "-c",
                          "import os, sys; print('hello'); "
                          "sys.exit(3 if os.environ['RACKHUB_RANK'] == '1' else 0)"],
                         capture_output=True, text=True, timeout=60)
    good = bad.returncode == 3 and "[0] hello" in bad.stdout and "[1] hello" in bad.stdout
    print(bad.stdout + bad.stderr)
    print(f"{'ok  ' if good else 'FAIL'} failing rank: rackhub-run exit code {bad.returncode}")
    ok &= good
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
