"""rackhub-run --min-np/--max-np: the supervisor of an elastic job
(docs/elastic.md, "Launcher"; run.py starts the hub and the tenant).

    rackhub-run -n 4 --min-np 2 --max-np 8 python3 train.py
    rackhub-run --add 2 --job DIR          # two more ranks for the running job

It starts -n ranks (hub ranks 0..n-1) of an elastic tenant (start quorum n,
--min-np, --max-np), each with RACKHUB_ELASTIC_MAX_SIZE, RACKHUB_ELASTIC_DIR
(the job directory) and RACKHUB_ELASTIC_EPOCH. A rank that fails (exit code
other than 0, or a signal) is restarted after a back-off (--restart-backoff
doubling per restart, at most --max-restarts restarts in the job, each
logged); a request of `rackhub-run --add K --job DIR` (a file in
DIR/requests) starts K more. Every new process takes the lowest hub rank
below --max-np that no running process holds. New processes of one batch
form an epoch E: the supervisor writes joiners-E (their ranks) and then
epoch; the members park at their next commit and write ready-E, which the
new processes wait for before they connect (rackhub.torch.elastic's
_session.py). A new process that exits before it connected gets gone-E-R so
nobody waits for it. DIR/pid-R holds the pid of rank R's process (the
demo and the tests kill ranks with it). When fewer than --min-np ranks run (the hub has paused
the tenant), the supervisor writes ready-E itself.

--host-discovery-script CMD (elastic_discovery.py) runs CMD every
--discovery-interval seconds on a thread of its own and follows the slot
count it prints (within --min-np/--max-np; run.py runs it once before the
start, and -n becomes that count): more slots start ranks (as --add does,
unless a rank already exited 0: the job is ending; a slot whose rank failed
with no restart left is not refilled), fewer first cancel restarts that are
due, then stop the highest running ranks with SIGTERM (SIGKILL after
_STOP_GRACE_S; their exit is not a failure and not restarted), never the
last running one, and none before every rank of the start has connected
(the tenant's start quorum needs them). A failing script or unreadable
output is logged and the job keeps its size.

The job ends when no process runs and none is due: exit code 0 when every
rank's last process exited 0, else the code of the first rank whose last
process failed (128+signal if killed).
"""
import os
import signal
import subprocess
import sys
import threading
import time

from . import elastic_discovery

_STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL for a rank host discovery stops


def add_request(job_dir, count):
    """rackhub-run --add K --job DIR: asks the supervisor of DIR for K ranks."""
    req = os.path.join(job_dir, "requests")
    if not os.path.isdir(req):
        sys.exit(f"rackhub-run: --job {job_dir}: not the directory of a running elastic job "
                 f"(no requests/ in it)")
    if count < 1:
        sys.exit("rackhub-run: --add: at least 1")
    tmp = os.path.join(job_dir, f".add-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(f"{count}\n")
    os.replace(tmp, os.path.join(req, f"add-{time.time_ns()}-{os.getpid()}"))
    print(f"rackhub-run: asked for {count} more rank(s) in {job_dir}", file=sys.stderr)
    return 0


def _write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Supervisor:
    def __init__(self, a, cmd, base_env, out, job_dir):
        self.a, self.cmd, self.base_env, self.out, self.dir = a, cmd, base_env, out, job_dir
        self.running = {}   # hub rank -> (Popen, epoch)
        self.last_code = {}  # hub rank -> exit code of its last process
        self.first_fail = None
        self.epoch = 0
        self.restarts = 0
        self.due = []        # (monotonic time, reason) of restarts
        self.adds = 0
        self.pumps = []
        self.stopping = {}  # rank -> SIGKILL time: ranks stopped by host discovery
        self.finishing = False  # a rank exited 0: the job is ending, no growth
        self.exhausted = 0  # ranks that failed with no restart left
        self.next_discovery = time.monotonic() + a.discovery_interval
        self.discovery = None  # [thread, result] of the discovery running
        self.discovered = None  # the last slot count or problem logged
        os.makedirs(os.path.join(job_dir, "requests"), exist_ok=True)
        _write(os.path.join(job_dir, "epoch"), "0\n")

    def log(self, msg):
        """A line of the launcher's, never run together with a rank's."""
        self.out.line(f"rackhub-run: {msg}")

    def spawn(self, rank, epoch):
        env = dict(self.base_env)
        env.update(RACKHUB_RANK=str(rank), RACKHUB_LOCAL_RANK=str(rank),
                   RACKHUB_LOCAL_SIZE=str(self.a.max_np),
                   RACKHUB_ELASTIC_MAX_SIZE=str(self.a.max_np), RACKHUB_ELASTIC_DIR=self.dir,
                   RACKHUB_ELASTIC_EPOCH=str(epoch))
        env.pop("RACKHUB_WORLD_SIZE", None)
        p = subprocess.Popen(self.cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        self.running[rank] = (p, epoch)
        _write(os.path.join(self.dir, f"pid-{rank}"), f"{p.pid}\n")
        for stream, err in ((p.stdout, False), (p.stderr, True)):
            t = threading.Thread(target=self.out.pump, args=(stream, rank, err), daemon=True)
            t.start()
            self.pumps.append(t)

    def start_batch(self, count, why):
        free = [r for r in range(self.a.max_np) if r not in self.running][:count]
        if len(free) < count:
            self.log(f"{why}: only {len(free)} free rank(s) below --max-np {self.a.max_np}")
        if not free:
            return
        self.epoch += 1
        e = self.epoch
        _write(os.path.join(self.dir, f"joiners-{e}"), " ".join(map(str, free)) + "\n")
        _write(os.path.join(self.dir, "epoch"), f"{e}\n")
        if len(self.running) < self.a.min_np:  # the members are paused: nobody parks
            _write(os.path.join(self.dir, f"ready-{e}"), "")
        self.log(f"{why}: starting rank(s) {free} (epoch {e})")
        for r in free:
            self.spawn(r, e)

    def reap(self):
        for rank, (p, epoch) in list(self.running.items()):
            c = p.poll()
            if c is None:
                continue
            del self.running[rank]
            self.last_code[rank] = c
            if epoch > 0 and not os.path.exists(os.path.join(self.dir,
                                                             f"connected-{epoch}-{rank}")):
                _write(os.path.join(self.dir, f"gone-{epoch}-{rank}"), "")
            if rank in self.stopping:  # host discovery shrank the job: not a failure
                del self.stopping[rank]
                self.last_code.pop(rank, None)
                self.log(f"rank {rank} stopped (host discovery)")
                continue
            if c == 0:
                self.finishing = True
                continue
            what = f"signal {-c}" if c < 0 else f"code {c}"
            if self.restarts < self.a.max_restarts:
                delay = self.a.restart_backoff * (2 ** self.restarts)
                self.restarts += 1
                self.due.append((time.monotonic() + delay, rank,
                                 f"rank {rank} exited with {what}"))
                self.log(f"rank {rank} exited with {what}; restart {self.restarts} of "
                         f"{self.a.max_restarts} in {delay:g} s")
            else:
                self.exhausted += 1
                self.log(f"rank {rank} exited with {what}; no restart left (--max-restarts "
                         f"{self.a.max_restarts})")

    def requests(self):
        req = os.path.join(self.dir, "requests")
        for name in sorted(os.listdir(req)):
            path = os.path.join(req, name)
            try:
                with open(path) as f:
                    k = int(f.read().strip())
            except (OSError, ValueError) as e:
                self.log(f"ignoring request {name}: {e}")
                k = 0
            os.unlink(path)
            if k > 0:
                self.start_batch(k, f"--add {k}")

    def discover(self):
        """Host discovery (--host-discovery-script): grows or shrinks the
        running ranks to the slots the script prints, within --min-np and
        --max-np; a failure is logged and the job keeps its size. The
        script runs on a thread of its own; this applies its last result."""
        a = self.a
        if a.host_discovery_script is None:
            return
        now = time.monotonic()
        if self.discovery is None:
            if now < self.next_discovery:
                return
            result = []
            timeout = min(max(10.0, 5 * a.discovery_interval), 60.0)
            t = threading.Thread(target=lambda: result.append(elastic_discovery.discover(
                a.host_discovery_script, timeout)), daemon=True)
            t.start()
            self.discovery = (t, result)
            return
        t, result = self.discovery
        if t.is_alive():
            return
        self.discovery = None
        self.next_discovery = time.monotonic() + a.discovery_interval
        slots, problem = result[0]
        current = len(self.running) - len(self.stopping) + len(self.due)
        if problem is not None:
            if self.discovered != problem:
                self.log(f"host discovery: {problem}; keeping {current} rank(s)")
            self.discovered = problem
            return
        target = min(max(slots, a.min_np), a.max_np)
        if self.discovered != slots:
            bound = (f" (within --min-np {a.min_np} and --max-np {a.max_np}: {target})"
                     if target != slots else "")
            failed = (f"; {self.exhausted} slot(s) held by ranks that failed with no restart "
                      f"left" if self.exhausted else "")
            self.log(f"host discovery: {slots} slot(s){bound}; {current} rank(s) running{failed}")
            self.discovered = slots
        if target > current + self.exhausted and not self.finishing:
            self.start_batch(target - current - self.exhausted,
                             f"host discovery: {slots} slot(s)")
        elif target < current:
            self.shrink(current - target, slots)

    def shrink(self, excess, slots):
        """Host discovery wants `excess` fewer ranks: cancels restarts that
        are due, then stops the highest running ranks (never the last one,
        and none while a rank of the start has not connected yet)."""
        if self.due:
            self.due.sort()
            cancelled, self.due = self.due[len(self.due) - min(excess, len(self.due)):], \
                self.due[:len(self.due) - min(excess, len(self.due))]
            for d in cancelled:  # no longer wanted: its failure does not fail the job
                self.last_code.pop(d[1], None)
            excess -= len(cancelled)
            self.log(f"host discovery: {slots} slot(s); cancelled the restart of rank(s) "
                     f"{sorted(d[1] for d in cancelled)}")
        if excess <= 0:
            return
        starting = [r for r, (p, e) in self.running.items()
                    if e == 0 and p.poll() is None and
                    not os.path.exists(os.path.join(self.dir, f"connected-0-{r}"))]
        if starting:
            return  # the start quorum needs them; the next discovery shrinks
        live = sorted(r for r, (p, _) in self.running.items()
                      if r not in self.stopping and p.poll() is None)
        victims = live[max(1, len(live) - excess):]
        if not victims:
            return
        self.log(f"host discovery: {slots} slot(s); stopping rank(s) {victims} with SIGTERM")
        for r in victims:
            self.stopping[r] = time.monotonic() + _STOP_GRACE_S
            try:
                os.killpg(self.running[r][0].pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def escalate(self):
        """SIGKILL for a rank that outlived its SIGTERM by _STOP_GRACE_S."""
        now = time.monotonic()
        for r, deadline in list(self.stopping.items()):
            if r in self.running and deadline is not None and now > deadline:
                self.stopping[r] = None
                self.log(f"rank {r} did not stop within {_STOP_GRACE_S:g} s of SIGTERM: SIGKILL")
                try:
                    os.killpg(self.running[r][0].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def run(self):
        self.log(f"elastic job directory {self.dir} (add ranks: rackhub-run --add K --job "
                 f"{self.dir})")
        for r in range(self.a.n):
            self.spawn(r, 0)
        while True:
            self.reap()
            self.requests()
            self.discover()
            self.escalate()
            now = time.monotonic()
            ready = [d for d in self.due if d[0] <= now]
            if ready:
                self.due = [d for d in self.due if d[0] > now]
                for d in ready:  # replaced: its failure does not fail the job
                    self.last_code.pop(d[1], None)
                self.start_batch(len(ready), "; ".join(d[2] for d in ready))
            if not self.running and not self.due:
                break
            time.sleep(0.05)
        for t in self.pumps:
            t.join(5)
        for rank in sorted(self.last_code):
            c = self.last_code[rank]
            if c != 0:
                return 128 - c if c < 0 else c
        return 0

    def stop(self, sig=signal.SIGTERM):
        for p, _ in self.running.values():
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        for p, _ in self.running.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
