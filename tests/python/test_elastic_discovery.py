"""rackhub-run --host-discovery-script (docs/elastic.md, "Host discovery"):
an elastic job of elastic_worker.py (-n 2, --min-np 2, --max-np 4) whose
discovery script is `cat HOSTS`, a file the test rewrites; every wait is for
a line of the launcher's log or a committed step (test_elastic.Job, bounded
by 50 s each).

  localhost:2                 the job runs with ranks 0,1
  localhost:3                 grows: rank 2 starts and joins (steps 0,1,2)
  localhost:1 + 127.0.0.1:1   shrinks: rank 2 is stopped with SIGTERM (0,1)
  localhost:x                 an error line naming the line; the size stays
  node-elsewhere.example:4    an error naming the host; the size stays
  (no file: cat fails)        an error with the exit code; the size stays
  HOSTNAME:9                  grows to --max-np 4 (ranks 2, 3 join)

Then the job stops and must exit 0 (the stopped rank is no failure); every
committed step equals, bit for bit, the single-process reference of its
members (test_elastic.check_against_reference), and the memberships are
0,1 / 0,1,2 / 0,1 / 0,1,2,3. After each error the test waits for a step of
the same members with no rank started or stopped in between.
"""
import os
import socket
import sys

import harness

harness.require_torch()

from test_elastic import STEP, Job, Verdict, check_against_reference  # noqa: E402


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def step_after(members):
    def pred(line):
        m = STEP.match(line)
        return bool(m) and m.group(4) == members
    return pred


def log(text):
    return lambda line: line.startswith("rackhub-run: ") and text in line


def keeps_size(job, error, members):
    """Waits for the error line, then a step of `members` after it with no
    rank started or stopped in between."""
    i = job.wait_index(log(error), f"the log line {error!r}")
    assert "keeping" in job.lines[i], job.lines[i]
    j = job.wait_index(step_after(members), f"a step of {members} after {error!r}", i)
    between = [x for x in job.lines[i:j] if x and ("starting rank" in x or "stopping" in x)]
    assert not between, f"the job changed size after {error!r}: {between}"
    return j


def main():
    transport = sys.argv[1] if len(sys.argv) > 1 else "tcp"
    hosts_dir = os.path.realpath(os.environ.get("TMPDIR", "/tmp"))
    hosts = os.path.join(hosts_dir, f"rackhub-discovery-{os.getpid()}.hosts")
    write(hosts, "localhost:2\n")
    job = Job(transport, n=2, max_np=4, extra=(
        "--host-discovery-script", f"cat {hosts}", "--discovery-interval", "0.2"))
    with Verdict(job, cleanup=lambda: os.path.exists(hosts) and os.unlink(hosts)) as verdict:
        i = job.wait_index(step_after("0,1"), "a step of ranks 0,1")
        write(hosts, "localhost:3\n")
        i = job.wait_index(log("host discovery: 3 slot(s): starting rank(s) [2]"),
                           "rank 2 started by discovery", i)
        i = job.wait_index(step_after("0,1,2"), "a step of ranks 0,1,2", i)
        write(hosts, "localhost:1\n127.0.0.1:1\n")
        i = job.wait_index(log("stopping rank(s) [2] with SIGTERM"), "the shrink", i)
        i = job.wait_index(log("rank 2 stopped (host discovery)"), "rank 2 stopped", i)
        i = job.wait_index(step_after("0,1"), "a step of ranks 0,1 after the shrink", i)
        write(hosts, "localhost:x\n")
        keeps_size(job, "host discovery: line 1 'localhost:x': not HOSTNAME:SLOTS", "0,1")
        write(hosts, "localhost:1\nnode-elsewhere.example:4\n")
        keeps_size(job, "host 'node-elsewhere.example' is not this machine", "0,1")
        os.unlink(hosts)
        keeps_size(job, "exited with code 1", "0,1")
        write(hosts, f"{socket.gethostname()}:9\n")
        i = job.wait_index(log("9 slot(s) (within --min-np 2 and --max-np 4: 4)"),
                           "the clamp to --max-np", i)
        job.wait_index(step_after("0,1,2,3"), "a step of ranks 0,1,2,3", i)
        stop = job.stop_after(5)
        code = job.finish()
        assert code == 0, f"rackhub-run exited with {code}"
        sequence, _, _ = check_against_reference(job.steps(), stop)
        print("\n".join(x for x in job.lines if x and ("host discovery" in x or "stopped" in x)))
        print(f"memberships (first step, members): {sequence}")
        assert [s[1] for s in sequence] == ["0,1", "0,1,2", "0,1", "0,1,2,3"], sequence
    return verdict.code


if __name__ == "__main__":
    sys.exit(main())
