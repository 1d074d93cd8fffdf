"""rackhub-run: start N training ranks against a rackhub hub.

    rackhub-run -n 4 python3 train.py --epochs 3
    rackhub-run -n 4 --min-np 2 --max-np 8 python3 train.py   # elastic (elastic_run.py)
    python3 -m rackhub.run -n 4 python3 train.py            # the same

Without --hub it starts a private rackhubd on loopback (ephemeral ports, a
random admin token, in a temporary directory) and stops it at the end. It
creates a tenant with N workers through rackhubctl (or uses --tenant with
--token-file if the tenant exists), then starts the ranks with:

    RACKHUB_RANK, RACKHUB_LOCAL_RANK, RACKHUB_LOCAL_SIZE, RACKHUB_WORLD_SIZE, RACKHUB_HUB,
    RACKHUB_TENANT, RACKHUB_TOKEN_FILE (a 0600 file; the token is not put in
    the environment), PYTHONUNBUFFERED=1, PYTHONPATH (so `import rackhub` works),
    and RACKHUB_HUB_METRICS (http://HOST:PORT/metrics of the hub it started;
    not set with --hub or when that hub's metrics are off)

which rackhub.torch.init() reads. Every output line of a rank is prefixed
with `[rank]` (stderr lines with `[rank!]`) and written whole, so the ranks
interleave line by line. If a rank fails, the others get --grace seconds to
notice (rackhub raises WORKER_LOST in them at once) and are then terminated.
The exit code is the first failing rank's (128+signal if killed), else 0.

A bare `python`/`python3` command is replaced by the interpreter running this
launcher (the system /usr/bin/python3, which has torch): on these machines
the `python3` first on PATH is another interpreter. Give a path to override.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

try:
    from . import _build_paths
    _BUILD_BIN = _build_paths.BIN_DIR
except ImportError:  # installed without the build tree
    _BUILD_BIN = None


def _find_tool(name, explicit):
    if explicit:
        return explicit
    env = os.environ.get("RACKHUB_" + name.upper().replace("-", "_"))
    if env:
        return env
    if _BUILD_BIN and os.access(os.path.join(_BUILD_BIN, name), os.X_OK):
        return os.path.join(_BUILD_BIN, name)
    found = shutil.which(name)
    if found:
        return found
    sys.exit(f"rackhub-run: cannot find {name} (use --{name} PATH)")


def _parse(argv):
    ap = argparse.ArgumentParser(
        prog="rackhub-run", description="Start N training ranks against a rackhub hub.",
        usage="rackhub-run -n N [options] COMMAND [ARGS...]")
    ap.add_argument("-n", "--np", type=int, dest="n", help="number of ranks")
    ap.add_argument("--min-np", type=int, help="elastic job: the fewest ranks it trains with "
                    "(elastic_run.py; with --max-np)")
    ap.add_argument("--max-np", type=int, help="elastic job: the most ranks (hub ranks "
                    "0..max-np-1)")
    ap.add_argument("--max-restarts", type=int, default=3,
                    help="elastic job: restarts of failed ranks in the whole job [3]")
    ap.add_argument("--restart-backoff", type=float, default=1.0,
                    help="elastic job: seconds before the first restart, doubled per restart [1]")
    ap.add_argument("--job-dir", help="elastic job: its directory (default: a temporary one)")
    ap.add_argument("--host-discovery-script", metavar="CMD",
                    help="elastic job: a command printing HOSTNAME:SLOTS lines (this host "
                         "only); the ranks follow its slot count (elastic_discovery.py)")
    ap.add_argument("--discovery-interval", type=float, default=1.0,
                    help="seconds between runs of --host-discovery-script (default 1)")
    ap.add_argument("--add", type=int, help="add ranks to the running elastic job --job DIR")
    ap.add_argument("--job", help="the directory of the running elastic job (with --add)")
    ap.add_argument("--hub", help="data plane HOST:PORT of an existing hub (default: start one)")
    ap.add_argument("--admin", help="admin API HOST:PORT of that hub (to create the tenant)")
    ap.add_argument("--admin-token-file", help="admin token of that hub")
    ap.add_argument("--tenant", help="tenant name (default: rackhub-run-PID)")
    ap.add_argument("--token-file", help="data-plane token of an existing tenant (no creation)")
    ap.add_argument("--lanes", type=int, default=0, help="lanes of the started hub (0: one per core)")
    ap.add_argument("--chunk-bytes", help="chunk size of the created tenant (e.g. 64KiB)")
    ap.add_argument("--max-param-bytes", default="16GiB", help="quota of the created tenant")
    ap.add_argument("--hub-arg", action="append", default=[],
                    help="extra rackhubd argument for the started hub (repeatable)")
    ap.add_argument("--grace", type=float, default=10.0,
                    help="seconds the other ranks get after one failed [10]")
    ap.add_argument("--no-prefix", action="store_true", help="do not prefix output lines")
    ap.add_argument("--rackhubd", help="path of rackhubd")
    ap.add_argument("--rackhubctl", help="path of rackhubctl")
    ap.add_argument("--keep-tenant", action="store_true",
                    help="do not delete the created tenant of an existing hub at the end")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.add is not None:
        if not a.job:
            ap.error("--add needs --job DIR (the job directory the launcher printed)")
        return a
    if not a.command:
        ap.error("COMMAND is required")
    if a.n is None:
        ap.error("-n/--np is required")
    if a.n < 1:
        ap.error("-n: at least 1")
    if (a.min_np is None) != (a.max_np is None):
        ap.error("--min-np and --max-np go together")
    if a.max_np is not None and not 1 <= a.min_np <= a.n <= a.max_np <= 1024:
        ap.error(f"elastic: need 1 <= --min-np ({a.min_np}) <= -n ({a.n}) <= --max-np "
                 f"({a.max_np}) <= 1024")
    if a.host_discovery_script is not None and a.max_np is None:
        ap.error("--host-discovery-script needs --min-np and --max-np (an elastic job)")
    if not 0.05 <= a.discovery_interval <= 3600:
        ap.error(f"--discovery-interval: between 0.05 and 3600 seconds, got "
                 f"{a.discovery_interval:g}")
    if a.hub and not a.token_file and not a.admin:
        ap.error("--hub needs --admin (to create the tenant) or --tenant with --token-file")
    if a.token_file and not a.tenant:
        ap.error("--token-file needs --tenant")
    return a


class _Output:
    """Writes whole lines of every rank, prefixed, and the launcher's own
    lines, each in one write under one lock: a reader of the merged output
    (stdout and stderr into one pipe) never sees two lines run together."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.lock = threading.Lock()

    def line(self, text):
        """One line of the launcher's own on stderr ("rackhub-run: ...")."""
        with self.lock:
            sys.stderr.buffer.write(f"{text}\n".encode())
            sys.stderr.buffer.flush()

    def pump(self, stream, rank, err):
        tag = f"[{rank}{'!' if err else ''}] " if self.prefix else ""
        dst = sys.stderr.buffer if err else sys.stdout.buffer
        for line in iter(stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self.lock:
                dst.write(tag.encode() + line)
                dst.flush()
        stream.close()


def _start_hub(a, work):
    rackhubd = _find_tool("rackhubd", a.rackhubd)
    token_file = os.path.join(work, "admin.token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(os.urandom(24).hex())
    ready = os.path.join(work, "ready")
    log = open(os.path.join(work, "rackhubd.log"), "wb")
    cmd = [rackhubd, "--admin-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
           "--metrics-listen", "127.0.0.1:0",
           "--admin-token-file", token_file, "--ready-file", ready,
           "--state-dir", os.path.join(work, "state")]
    if a.lanes:
        cmd += ["--lanes", str(a.lanes)]
    cmd += a.hub_arg
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    addrs = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with open(ready) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2:
                        addrs[parts[0]] = parts[1]
        except FileNotFoundError:
            pass
        if "admin" in addrs and "data" in addrs:
            # The ready file is written whole: a metrics line is there unless
            # metrics are off (--hub-arg=--no-metrics).
            return proc, addrs["admin"], addrs["data"], addrs.get("metrics"), token_file
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    log.close()
    with open(os.path.join(work, "rackhubd.log"), errors="replace") as f:
        sys.stderr.write(f.read())
    sys.exit("rackhub-run: rackhubd did not start")


def _ctl(a, admin, admin_token, *args):
    cmd = [_find_tool("rackhubctl", a.rackhubctl), "--admin", admin, "--json"]
    if admin_token:
        cmd += ["--token-file", admin_token]
    r = subprocess.run(cmd + list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"rackhub-run: rackhubctl {' '.join(args)} failed ({r.returncode}): "
                 f"{r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def _stop(proc, sig=signal.SIGTERM, timeout=5.0):
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _first_discovery(a):
    """--host-discovery-script before the start: -n (the tenant's start
    quorum) becomes the slot count it prints, within --min-np/--max-np, so
    the job never starts ranks discovery would stop before they connected."""
    from . import elastic_discovery
    slots, problem = elastic_discovery.discover(
        a.host_discovery_script, min(max(10.0, 5 * a.discovery_interval), 60.0))
    if problem is not None:
        print(f"rackhub-run: host discovery: {problem}; starting -n {a.n} rank(s)",
              file=sys.stderr, flush=True)
        return
    target = min(max(slots, a.min_np), a.max_np)
    if target != a.n:
        print(f"rackhub-run: host discovery: {slots} slot(s): starting {target} rank(s), "
              f"not -n {a.n}", file=sys.stderr, flush=True)
        a.n = target


def main(argv=None):
    a = _parse(sys.argv[1:] if argv is None else argv)
    if a.add is not None:
        from . import elastic_run
        return elastic_run.add_request(a.job, a.add)
    # SIGTERM (a test, a scheduler) ends the job like Ctrl-C: the ranks and
    # the started hub are stopped by the `finally` below, not left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = tempfile.mkdtemp(prefix="rackhub-run.")
    hub_proc = None
    created_tenant = None
    ranks = []
    admin = a.admin
    admin_token = a.admin_token_file
    metrics = None
    try:
        if a.hub:
            hub = a.hub
        else:
            hub_proc, admin, hub, metrics, admin_token = _start_hub(a, work)
        tenant = a.tenant or f"rackhub-run-{os.getpid()}"
        if a.host_discovery_script is not None:
            _first_discovery(a)
        if a.token_file:
            token_file = a.token_file
        else:
            args = ["tenant", "create", tenant, "--workers", str(a.n),
                    "--max-param-bytes", a.max_param_bytes]
            if a.max_np is not None:
                # One chunk per membership round, channel round and key up
                # to 1 MiB: a round a membership barrier aborts is retried
                # whole (docs/elastic.md, Limits).
                args += ["--elastic", "--min-workers", str(a.min_np), "--max-workers",
                         str(a.max_np), "--chunk-bytes", a.chunk_bytes or "1MiB"]
            elif a.chunk_bytes:
                args += ["--chunk-bytes", a.chunk_bytes]
            token = json.loads(_ctl(a, admin, admin_token, *args))["token"]
            created_tenant = tenant
            token_file = os.path.join(work, "tenant.token")
            with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(token)
        print(f"rackhub-run: {a.n} ranks"
              f"{f' (elastic: {a.min_np}..{a.max_np})' if a.max_np else ''}, hub {hub}{' (started here)' if hub_proc else ''}, "
              f"tenant {tenant}", file=sys.stderr, flush=True)

        cmd = list(a.command)
        if cmd[0] in ("python", "python3"):
            cmd[0] = sys.executable
        pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = _Output(not a.no_prefix)
        pumps = []
        if a.max_np is not None:
            from . import elastic_run
            base = dict(os.environ)
            base.update(RACKHUB_HUB=hub, RACKHUB_TENANT=tenant,
                        RACKHUB_TOKEN_FILE=os.path.abspath(token_file), PYTHONUNBUFFERED="1")
            base.pop("RACKHUB_TOKEN", None)
            base.pop("RACKHUB_HUB_METRICS", None)
            if metrics:
                base["RACKHUB_HUB_METRICS"] = f"http://{metrics}/metrics"
            pp = base.get("PYTHONPATH")
            base["PYTHONPATH"] = pkg_dir + (os.pathsep + pp if pp else "")
            job_dir = os.path.abspath(a.job_dir) if a.job_dir else os.path.join(work, "job")
            os.makedirs(job_dir, exist_ok=True)
            sup = elastic_run.Supervisor(a, cmd, base, out, job_dir)
            try:
                return sup.run()
            finally:
                sup.stop()
        for r in range(a.n):
            env = dict(os.environ)
            env.update(RACKHUB_RANK=str(r), RACKHUB_LOCAL_RANK=str(r), RACKHUB_LOCAL_SIZE=str(a.n),
                       RACKHUB_WORLD_SIZE=str(a.n), RACKHUB_HUB=hub, RACKHUB_TENANT=tenant,
                       RACKHUB_TOKEN_FILE=os.path.abspath(token_file), PYTHONUNBUFFERED="1")
            env.pop("RACKHUB_TOKEN", None)
            env.pop("RACKHUB_HUB_METRICS", None)
            if metrics:
                env["RACKHUB_HUB_METRICS"] = f"http://{metrics}/metrics"
            pp = env.get("PYTHONPATH")
            env["PYTHONPATH"] = pkg_dir + (os.pathsep + pp if pp else "")
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
            ranks.append(p)
            for stream, err in ((p.stdout, False), (p.stderr, True)):
                t = threading.Thread(target=out.pump, args=(stream, r, err), daemon=True)
                t.start()
                pumps.append(t)

        first_fail = None
        fail_at = None
        while True:
            codes = [p.poll() for p in ranks]
            for r, c in enumerate(codes):
                if c not in (None, 0) and first_fail is None:
                    first_fail, fail_at = r, time.monotonic()
                    out.line(f"rackhub-run: rank {r} exited with "
                             f"{'signal ' + str(-c) if c < 0 else 'code ' + str(c)}")
            if all(c is not None for c in codes):
                break
            if fail_at is not None and time.monotonic() - fail_at > a.grace:
                out.line("rackhub-run: terminating the remaining ranks")
                for p in ranks:
                    _stop(p)
            time.sleep(0.05)
        for t in pumps:
            t.join(5)
        if first_fail is None:
            return 0
        c = ranks[first_fail].returncode
        return 128 - c if c < 0 else c
    except KeyboardInterrupt:
        for p in ranks:
            _stop(p, signal.SIGINT)
        return 130
    finally:
        for p in ranks:
            _stop(p)
        if created_tenant and hub_proc is None and not a.keep_tenant:
            try:
                _ctl(a, admin, admin_token, "tenant", "delete", created_tenant)
            except SystemExit as e:
                print(e, file=sys.stderr)
        if hub_proc is not None:
            _stop(hub_proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
