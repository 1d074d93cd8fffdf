"""Elastic recovery time: from a worker's kill -9 to the survivors' next
completed iteration (docs/elastic.md, "Bench").

    python3 bench/elastic_bench.py [--kills 30] [--transport tcp|shm] [--out FILE.md]

rackhub-run --min-np 2 --max-np 8 runs 4 ranks of tests/python/elastic_worker.py
(a small model, a commit after every step, each step printed with its wall
time) on a hub it starts (--straggler-timeout-ms, default 10000). Each
round: wait until a step with 4 members is committed, sleep a random 0..20
ms (so the kill lands at a random point: during the step's rounds or
between steps), SIGKILL a random rank other than 0, take the wall time,
wait for the survivors' first step committed after it with 3 members: the
recovery time is that step's commit time minus the kill time. Then
rackhub-run --add 1 restores 4 members for the next round.

A stall is a kill after which the hub's straggler timeout removed a rank
(the known case of docs/elastic.md, Limits: a stale retry waits for the
straggler timeout; the removed rank's process fails) or whose recovery took
more than SLOW (2 s); stalls are counted and shown separately, never
dropped (--log keeps the job's output around each). Prints a table and
p50/p99; --out writes it as Markdown with the machine and the command.
Exit 1 if a round failed (no recovery within 3 x the straggler timeout).
"""
import argparse
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SLOW = 2.0  # seconds: a recovery slower than this counts as a stall
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "tests", "python", "elastic_worker.py")
STEP = re.compile(r"^\[(\d+)\] STEP (\d+) gen (\d+) members ([\d,]+) loss \S+ params \S+ "
                  r"at (\S+)$")


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1)))))
    return xs[k]


class Job:
    def __init__(self, a):
        self.dir = tempfile.mkdtemp(prefix="rackhub-elastic-bench.")
        self.job = os.path.join(self.dir, "job")
        self.run = a.rackhub_run
        env = dict(os.environ, RACKHUB_TRANSPORT=a.transport,
                   PYTHONPATH=os.path.join(HERE, "..", "tests", "python") + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
        self.p = subprocess.Popen(
            [self.run, "-n", "4", "--min-np", "2", "--max-np", "8", "--lanes", "2",
             "--job-dir", self.job, "--max-restarts", "0",
             f"--hub-arg=--straggler-timeout-ms", f"--hub-arg={a.straggler_ms}",
             "python3", WORKER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env)
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)
            self.cv.notify_all()

    def wait_step(self, pred, timeout, start=0):
        """(index, match) of the first STEP line from index `start` with pred."""
        deadline = time.monotonic() + timeout
        i = start
        with self.cv:
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    if line is None:
                        return None, None
                    m = STEP.match(line)
                    if m and pred(m):
                        return i, m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, None
                self.cv.wait(left)

    def stop(self):
        with self.cv:  # a step every rank is still before (they move in lock step)
            steps = [int(m.group(2)) for m in (STEP.match(x) for x in self.lines if x) if m]
        with open(os.path.join(self.job, ".stop"), "w") as f:
            f.write(f"{max(steps, default=0) + 20}\n")
        os.replace(os.path.join(self.job, ".stop"), os.path.join(self.job, "stop-at"))
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--transport", default="tcp", choices=("tcp", "shm"))
    ap.add_argument("--straggler-ms", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rackhub-run", default=os.path.join(os.environ.get("RACKHUB_BIN_DIR", ""),
                                                          "rackhub-run"))
    ap.add_argument("--out", help="write the results as Markdown here")
    ap.add_argument("--log", help="append the job's output around each stall here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    job = Job(a)
    limit = 3 * a.straggler_ms / 1000.0 + 30
    times, rows, failed = [], [], None
    pos = 0
    try:
        for k in range(a.kills):
            i, m = job.wait_step(lambda m: len(m.group(4).split(",")) == 4, limit, pos)
            if m is None:
                failed = f"round {k}: no step with 4 members"
                break
            time.sleep(rng.uniform(0, 0.020))
            members = [int(x) for x in m.group(4).split(",")]
            victim = rng.choice([r for r in members if r != 0])
            with open(os.path.join(job.job, f"pid-{victim}")) as f:
                pid = int(f.read())
            with job.cv:
                mark = len(job.lines)
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            want = ",".join(str(r) for r in members if r != victim)
            i, m = job.wait_step(lambda m: m.group(4) == want and float(m.group(5)) > t_kill,
                                 limit, mark)
            if m is None:
                failed = f"round {k}: the survivors {want} completed no step"
                break
            dt = float(m.group(5)) - t_kill
            with job.cv:
                between = [x for x in job.lines[mark:i] if x]
            # A stall: the hub's straggler timeout removed a rank (its process
            # fails: the launcher logs its exit code), or the recovery took
            # longer than SLOW seconds for another reason (both are shown).
            stalled = any("exited with code" in x for x in between) or dt > SLOW
            times.append(dt)
            rows.append((k, victim, want, dt, stalled))
            print(f"kill {k}: rank {victim}, survivors {want}: {dt * 1000:.1f} ms"
                  f"{'  STALL' if stalled else ''}", flush=True)
            if stalled and a.log:
                with open(a.log, "a") as f:
                    f.write(f"--- kill {k} (rank {victim}, {dt * 1000:.1f} ms):\n"
                            + "\n".join(between) + "\n")
            pos = i
            r = subprocess.run([job.run, "--add", "1", "--job", job.job], capture_output=True,
                               text=True)
            if r.returncode != 0:
                failed = f"rackhub-run --add: {r.stderr}"
                break
    finally:
        job.stop()
    ok_times = [t for (_, _, _, t, s) in rows if not s]
    stalls = sum(1 for r in rows if r[4])
    summary = (f"{len(rows)} kills: {len(ok_times)} recovered without a stall, {stalls} stalled "
               f"(a rank removed by the straggler timeout, {a.straggler_ms} ms, or a recovery "
               f"over {SLOW:g} s)\n"
               f"recovery without stalls: p50 {percentile(ok_times, 50) * 1000:.1f} ms, "
               f"p99 {percentile(ok_times, 99) * 1000:.1f} ms, max "
               f"{max(ok_times, default=float('nan')) * 1000:.1f} ms\n"
               f"all kills: p50 {percentile(times, 50) * 1000:.1f} ms, p99 "
               f"{percentile(times, 99) * 1000:.1f} ms")
    print(summary)
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"# Elastic recovery: kill -9 to the survivors' next iteration\n\n"
                    f"Machine: {platform.node()}, {os.cpu_count()} cores, "
                    f"{platform.platform()}, Python {platform.python_version()}\n\n"
                    f"Command: `python3 bench/elastic_bench.py --kills {a.kills} --transport "
                    f"{a.transport} --straggler-ms {a.straggler_ms} --seed {a.seed}`\n\n"
                    f"```\n{summary}\n```\n\n| kill | rank | survivors | ms | stall |\n"
                    f"|---|---|---|---|---|\n")
            for k, v, w, dt, s in rows:
                f.write(f"| {k} | {v} | {w} | {dt * 1000:.1f} | {'yes' if s else ''} |\n")
            if failed:
                f.write(f"\nFAILED: {failed}\n")
    if failed:
        print(f"FAILED: {failed}")
        print("\n".join(x for x in job.lines[-200:] if x))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
