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
--discovery-interval seconds and follows the slot count it prints (within
--min-np/--max-np): more slots start ranks (as --add does, unless a rank
already exited 0: the job is ending), fewer stop the highest running ranks
with SIGTERM (their exit is not a failure and not restarted). A failing
script or unreadable output is logged and the job keeps its size.

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


def _log(msg):
    print(f"rackhub-run: {msg}", file=sys.stderr, flush=True)


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
        self.stopping = set()  # ranks stopped by host discovery (SIGTERM)
        self.finishing = False  # a rank exited 0: the job is ending, no growth
        self.next_discovery = 0.0
        self.discovered = None  # the last slot count or problem logged
        os.makedirs(os.path.join(job_dir, "requests"), exist_ok=True)
        _write(os.path.join(job_dir, "epoch"), "0\n")

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
            _log(f"{why}: only {len(free)} free rank(s) below --max-np {self.a.max_np}")
        if not free:
            return
        self.epoch += 1
        e = self.epoch
        _write(os.path.join(self.dir, f"joiners-{e}"), " ".join(map(str, free)) + "\n")
        _write(os.path.join(self.dir, "epoch"), f"{e}\n")
        if len(self.running) < self.a.min_np:  # the members are paused: nobody parks
            _write(os.path.join(self.dir, f"ready-{e}"), "")
        _log(f"{why}: starting rank(s) {free} (epoch {e})")
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
                self.stopping.discard(rank)
                self.last_code.pop(rank, None)
                _log(f"rank {rank} stopped (host discovery)")
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
                _log(f"rank {rank} exited with {what}; restart {self.restarts} of "
                     f"{self.a.max_restarts} in {delay:g} s")
            else:
                _log(f"rank {rank} exited with {what}; no restart left (--max-restarts "
                     f"{self.a.max_restarts})")

    def requests(self):
        req = os.path.join(self.dir, "requests")
        for name in sorted(os.listdir(req)):
            path = os.path.join(req, name)
            try:
                with open(path) as f:
                    k = int(f.read().strip())
            except (OSError, ValueError) as e:
                _log(f"ignoring request {name}: {e}")
                k = 0
            os.unlink(path)
            if k > 0:
                self.start_batch(k, f"--add {k}")

    def discover(self):
        """Host discovery (--host-discovery-script): grows or shrinks the
        running ranks to the slots the script prints, within --min-np and
        --max-np; a failure is logged and the job keeps its size."""
        a = self.a
        now = time.monotonic()
        if a.host_discovery_script is None or now < self.next_discovery:
            return
        self.next_discovery = now + a.discovery_interval
        slots, problem = elastic_discovery.discover(a.host_discovery_script,
                                                    max(10.0, 5 * a.discovery_interval))
        current = len(self.running) - len(self.stopping) + len(self.due)
        if problem is not None:
            if self.discovered != problem:
                _log(f"host discovery: {problem}; keeping {current} rank(s)")
            self.discovered = problem
            return
        target = min(max(slots, a.min_np), a.max_np)
        if self.discovered != slots:
            bound = (f" (within --min-np {a.min_np} and --max-np {a.max_np}: {target})"
                     if target != slots else "")
            _log(f"host discovery: {slots} slot(s){bound}; {current} rank(s) running")
            self.discovered = slots
        if target > current and not self.finishing:
            self.start_batch(target - current, f"host discovery: {slots} slot(s)")
        elif target < current:
            live = sorted(r for r in self.running if r not in self.stopping)
            victims = live[max(0, len(live) - (current - target)):]  # restarts due count too
            _log(f"host discovery: {slots} slot(s); stopping rank(s) {victims} with SIGTERM")
            for r in victims:
                self.stopping.add(r)
                try:
                    os.killpg(self.running[r][0].pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def run(self):
        _log(f"elastic job directory {self.dir} (add ranks: rackhub-run --add K --job "
             f"{self.dir})")
        for r in range(self.a.n):
            self.spawn(r, 0)
        while True:
            self.reap()
            self.requests()
            self.discover()
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
