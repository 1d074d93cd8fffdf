"""The elastic launcher's supervisor under host discovery
(client/python/rackhub/elastic_run.py; docs/elastic.md, "Host discovery"),
with real child processes and a real discovery script (`cat FILE`, a file
the test rewrites); no hub: these are the launcher's own decisions.

Every wait is for a line of the supervisor's log (its stderr, read by a
thread), bounded by 30 s as a failure bound. The log comes from one thread
in order, so "line X comes before line Y" is a deterministic check.

  start      -n 2, the children connect only once the test says so, and
             discovery wants 1 slot: no rank is stopped by then (a later
             poll's error line comes first); once they connected, rank 1 is.
  restarts   --max-restarts 0, rank 1 fails: discovery at 2 slots does not
             start it again (the slot is held by a rank with no restart
             left); at 3 slots exactly one rank starts.
  cancel     rank 2 fails with a restart due in an hour; discovery at 1 slot
             cancels that restart and stops rank 1 only (never the last
             running rank); the job then ends with exit code 0.
  first      run.py's discovery before the start: -n becomes the script's
             count within --min-np/--max-np; a failing script keeps -n.
  output     the launcher's own lines and its ranks' stdout and stderr lines,
             written at once from many threads into one pipe (a reader's
             view of `rackhub-run ... 2>&1`), never run together: every line
             arrives whole, each exactly once (a launcher line once ran into
             a rank's line, and the elastic kill loop then missed that line).
"""
import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WAIT_S = 30.0


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def child():
    """A rank: epoch 0 of a rank listed in `fail` exits 3 at once; others
    write connected-E-R once `go` exists, then exit 0 once `stop` does."""
    d = os.environ["RACKHUB_ELASTIC_DIR"]
    rank, epoch = os.environ["RACKHUB_RANK"], os.environ["RACKHUB_ELASTIC_EPOCH"]
    fail = os.path.join(d, "..", "fail")
    if epoch == "0" and os.path.exists(fail) and rank in open(fail).read().split():
        sys.exit(3)
    while not os.path.exists(os.path.join(d, "..", "go")):
        time.sleep(0.01)
    write(os.path.join(d, f"connected-{epoch}-{rank}"), "")
    while not os.path.exists(os.path.join(d, "..", "stop")):
        time.sleep(0.01)
    sys.exit(0)


def driver(argv):
    """Runs elastic_run.Supervisor: JOBDIR N MIN MAX MAX_RESTARTS BACKOFF HOSTS."""
    from rackhub import elastic_run
    from rackhub.run import _Output
    job, n, lo, hi, restarts, backoff, hosts = argv
    a = argparse.Namespace(n=int(n), min_np=int(lo), max_np=int(hi),
                           max_restarts=int(restarts), restart_backoff=float(backoff),
                           host_discovery_script=f"cat {hosts}", discovery_interval=0.05)
    sup = elastic_run.Supervisor(a, [sys.executable, os.path.abspath(__file__), "--child"],
                                 dict(os.environ), _Output(True), job)
    try:
        code = sup.run()
    finally:
        sup.stop()
    print(f"supervisor exit {code}", file=sys.stderr, flush=True)


class Run:
    """One supervisor process and its log."""

    def __init__(self, n, lo, hi, restarts, backoff, hosts_text, fail=""):
        self.base = tempfile.mkdtemp(prefix="rackhub-supervisor-")
        self.job = os.path.join(self.base, "job")
        self.hosts = os.path.join(self.base, "hosts")
        write(self.hosts, hosts_text)
        write(os.path.join(self.base, "fail"), fail)
        self.lines, self.q = [], queue.Queue()
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--driver", self.job, str(n), str(lo),
             str(hi), str(restarts), str(backoff), self.hosts],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stderr:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def wait(self, text, what):
        """Index of the first log line (from the start) containing `text`."""
        deadline = time.monotonic() + WAIT_S
        while True:
            for i, line in enumerate(self.lines):
                if line is not None and text in line:
                    return i
            if self.lines and self.lines[-1] is None:
                raise AssertionError(f"{what}: the supervisor ended without {text!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{what}: no {text!r} within {WAIT_S:g} s")
            try:
                self.lines.append(self.q.get(timeout=left))
            except queue.Empty:
                pass

    def touch(self, name):
        write(os.path.join(self.base, name), "")

    def finish(self):
        self.touch("go")
        self.touch("stop")
        i = self.wait("supervisor exit", "the end of the job")
        self.p.wait(WAIT_S)
        return self.lines[i]

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def dump(self):
        return "\n".join(x for x in self.lines if x is not None)


def case_start(runs):
    r = Run(2, 1, 2, 0, 1, "localhost:2\n")
    runs.append(r)
    try:
        write(r.hosts, "localhost:1\n")
        r.wait("host discovery: 1 slot(s)", "discovery at 1 slot")
        # A later poll's line: a stop by the first one would come before it.
        write(r.hosts, "localhost:x\n")
        later = r.wait("not HOSTNAME:SLOTS", "a discovery after the one at 1 slot")
        before = [x for x in r.lines[:later] if "stopping" in x]
        assert not before, f"stopped ranks before they connected: {before}"
        write(r.hosts, "localhost:1\n")
        r.touch("go")
        r.wait("stopping rank(s) [1] with SIGTERM", "the shrink after the start")
        r.wait("rank 1 stopped (host discovery)", "rank 1's exit")
        assert os.path.exists(os.path.join(r.job, "connected-0-1")), \
            "rank 1 was stopped before it connected"
        end = r.finish()
        assert end == "supervisor exit 0", end
    finally:
        r.kill()


def case_restarts(runs):
    r = Run(2, 1, 4, 0, 1, "localhost:2\n", fail="1")
    runs.append(r)
    try:
        r.touch("go")
        r.wait("rank 1 exited with code 3; no restart left", "rank 1's failure")
        write(r.hosts, "localhost:x\n")
        r.wait("not HOSTNAME:SLOTS", "a discovery after the failure")
        write(r.hosts, "localhost:2\n")
        two = r.wait("held by ranks that failed with no restart left",
                     "discovery at 2 slots after the failure")
        write(r.hosts, "localhost:3\n")
        three = r.wait("host discovery: 3 slot(s): starting rank(s) [1] (epoch 1)",
                       "discovery at 3 slots")
        starts = [x for x in r.lines[two:three] if "starting" in x]
        assert not starts, f"a rank with no restart left was started again: {starts}"
        end = r.finish()
        # rank 1's last process (epoch 1) exited 0: the job succeeded.
        assert end == "supervisor exit 0", end
    finally:
        r.kill()


def case_cancel(runs):
    r = Run(3, 1, 3, 5, 3600, "localhost:3\n", fail="2")
    runs.append(r)
    try:
        r.touch("go")
        r.wait("rank 2 exited with code 3; restart 1 of 5 in 3600 s", "rank 2's failure")
        write(r.hosts, "localhost:1\n")
        c = r.wait("host discovery: 1 slot(s); cancelled the restart of rank(s) [2]",
                   "the cancelled restart")
        s = r.wait("host discovery: 1 slot(s); stopping rank(s) [1] with SIGTERM",
                   "the shrink")
        assert c < s, r.dump()
        r.wait("rank 1 stopped (host discovery)", "rank 1's exit")
        end = r.finish()
        assert end == "supervisor exit 0", f"{end}\n{r.dump()}"
        stopped = [x for x in r.lines if x and "stopping rank(s)" in x]
        assert stopped == [r.lines[s]], f"rank 0 must keep running: {stopped}"
    finally:
        r.kill()


def case_first(runs):
    from rackhub.run import _first_discovery
    for script, n, want in (("echo localhost:2", 4, 2), ("echo localhost:9", 2, 4),
                            ("echo localhost:1", 3, 2), ("exit 1", 3, 3),
                            ("echo node-elsewhere.example:4", 3, 3)):
        a = argparse.Namespace(host_discovery_script=script, discovery_interval=1.0, n=n,
                               min_np=2, max_np=4)
        _first_discovery(a)
        assert a.n == want, f"{script!r} with -n {n}: -n became {a.n}, want {want}"


OUTPUT_RANKS, OUTPUT_LINES = 4, 2000


def output_writer():
    """The `output` case's launcher: its _Output pumps OUTPUT_RANKS
    children's stdout and stderr while this thread writes launcher lines."""
    from rackhub.run import _Output
    out = _Output(True)
    code = ("import sys\n"
            "r = sys.argv[1]\n"
            f"for i in range({OUTPUT_LINES}):\n"
            "    print(f'out {r} {i} ' + 'x' * (i % 300), flush=True)\n"
            "    print(f'err {r} {i}', file=sys.stderr, flush=True)\n")
    procs, pumps = [], []
    for r in range(OUTPUT_RANKS):
        p = subprocess.Popen([sys.executable, "-c", code, str(r)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        procs.append(p)
        for stream, err in ((p.stdout, False), (p.stderr, True)):
            t = threading.Thread(target=out.pump, args=(stream, r, err))
            t.start()
            pumps.append(t)
    i = 0  # launcher lines all the while the children write
    while i < OUTPUT_LINES or any(p.poll() is None for p in procs):
        out.line(f"rackhub-run: launcher line {i} " + "y" * (i % 200))
        i += 1
    for t in pumps:
        t.join()


def case_output(runs):
    del runs  # no supervisor log here
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--output-writer"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert r.returncode == 0, f"the writer exited with {r.returncode}: {r.stdout[-2000:]!r}"
    got = r.stdout.decode().split("\n")
    launcher = [int(x.split()[3]) for x in got if x.startswith("rackhub-run: launcher line ")]
    n = max(launcher) + 1
    want = {f"rackhub-run: launcher line {i} " + "y" * (i % 200) for i in range(n)}
    for k in range(OUTPUT_RANKS):
        want |= {f"[{k}] out {k} {i} " + "x" * (i % 300) for i in range(OUTPUT_LINES)}
        want |= {f"[{k}!] err {k} {i}" for i in range(OUTPUT_LINES)}
    assert got[-1] == "", f"the output does not end with a whole line: {got[-1][:200]!r}"
    got = got[:-1]
    bad = [x for x in got if x not in want]
    assert not bad, f"{len(bad)} line(s) run together or cut, e.g. {bad[0][:300]!r}"
    assert len(got) == len(want) and set(got) == want, \
        f"{len(got)} lines, want {len(want)} distinct lines once each"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child()
    if len(sys.argv) > 1 and sys.argv[1] == "--output-writer":
        return output_writer()
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        return driver(sys.argv[2:])
    ok = True
    for name, case in (("first", case_first), ("start", case_start),
                       ("restarts", case_restarts), ("cancel", case_cancel),
                       ("output", case_output)):
        runs = []
        try:
            case(runs)
            print(f"{name}: ok")
        except AssertionError as e:
            ok = False
            print(f"{name}: FAIL: {e}")
            if runs:
                print(f"--- the supervisor's log:\n{runs[-1].dump()}")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
