"""Shared helpers of the Python/PyTorch tests: a real rackhubd on ephemeral
loopback ports (--ready-file), tenants created with rackhubctl, ranks as real
processes of the system interpreter. Paths come from the environment CTest
sets: RACKHUB_BIN_DIR (rackhubd, rackhubctl) and PYTHONPATH (build/python)."""
import json
import os
import subprocess
import sys
import tempfile
import time

SKIP = 77  # CTest SKIP_RETURN_CODE


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: python3-torch is not installed for {sys.executable} ({e}); "
              f"install it with: apt-get install python3-torch")
        sys.exit(SKIP)


class Hub:
    def __init__(self, lanes=2, extra=()):
        self.bin = os.environ.get("RACKHUB_BIN_DIR") or sys.exit("RACKHUB_BIN_DIR not set")
        self.dir = tempfile.mkdtemp(prefix="rackhub-pytest.")
        self.admin_token = os.path.join(self.dir, "admin.token")
        with open(self.admin_token, "w") as f:
            f.write(os.urandom(16).hex())
        ready = os.path.join(self.dir, "ready")
        self.log = open(os.path.join(self.dir, "rackhubd.log"), "wb")
        self.proc = subprocess.Popen(
            [os.path.join(self.bin, "rackhubd"), "--admin-listen", "127.0.0.1:0",
             "--data-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--admin-token-file", self.admin_token,
             "--ready-file", ready, "--lanes", str(lanes), "--no-pin-lanes",
             "--state-dir", os.path.join(self.dir, "state")] + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        addrs = {}
        while time.monotonic() < deadline and self.proc.poll() is None:
            if os.path.exists(ready):
                with open(ready) as f:
                    addrs = dict(line.split() for line in f if len(line.split()) == 2)
                if "admin" in addrs and "data" in addrs:
                    break
            time.sleep(0.05)
        if "data" not in addrs:
            self.stop()
            raise RuntimeError("rackhubd did not start:\n" + self.log_text())
        self.admin, self.data = addrs["admin"], addrs["data"]

    def log_text(self):
        with open(os.path.join(self.dir, "rackhubd.log"), errors="replace") as f:
            return f.read()

    def create_tenant(self, name, workers, token_file=None, extra=()):
        """Creates the tenant (with the data-plane token in `token_file` when
        given: a tenant spanning racks has one token on every hub; `extra`
        rackhubctl arguments, e.g. --chunk-bytes)."""
        more = (["--tenant-token-file", token_file] if token_file else []) + list(extra)
        r = subprocess.run(
            [os.path.join(self.bin, "rackhubctl"), "--admin", self.admin, "--token-file",
             self.admin_token, "--json", "tenant", "create", name, "--workers", str(workers)]
            + more, capture_output=True, text=True, check=True)
        return json.loads(r.stdout)["token"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def spawn(args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen([sys.executable] + args, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def collect(procs, timeout):
    """Waits for every process; returns their (returncode, output)."""
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n<killed by the test: timeout>"
        results.append((p.returncode, out))
    return results
