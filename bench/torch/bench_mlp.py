#!/usr/bin/python3
"""Time per training step of a 25M-parameter MLP (1024-4096-4096-1024,
batch 32 per rank, fp32, CPU) with W ranks: rackhub vs. torch DDP (gloo),
in the same run, alternating modes round by round.

    /usr/bin/python3 bench/torch/bench_mlp.py                    # build/bin, 2 ranks, 5 rounds
    /usr/bin/python3 bench/torch/bench_mlp.py --build build-py --rounds 3 --json

Modes:
  rackhub          server-side SGD-momentum on the hub (DistributedOptimizer(spec))
  rackhub-sumonly  the hub averages, local torch.optim.SGD(momentum) steps
  rackhub-lease, rackhub-sumonly-lease
                   the same with DistributedOptimizer(zero_copy=True): the
                   hub reads the gradients in memory leased to it instead of
                   a copy in the shared-memory ring (not in the default
                   --modes; for the zero-copy A/B)
  ddp-gloo         torch.nn.parallel.DistributedDataParallel, gloo, local SGD(momentum)
  local            the same ranks with no communication (compute floor)

BLAS: Debian picks libblas.so.3 through update-alternatives; the reference
BLAS is ~20x slower than OpenBLAS. Every rank process of every mode runs with
LD_LIBRARY_PATH=<--blas-dir> (default /usr/lib/x86_64-linux-gnu/openblas-pthread,
from libopenblas0-pthread) so both sides use OpenBLAS whatever the system
alternative says, and reports the libblas it loaded and a measured SGEMM
GFLOP/s. OPENBLAS_NUM_THREADS and torch threads = --threads (default 1: two
ranks and the hub share the machine's cores).

Step time = wall time of zero_grad + forward + backward + optimizer step on
each rank, median over the timed steps; a round's figure is the slower rank's
median; the report gives the median over rounds and the ratio to ddp-gloo.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODES = ["rackhub", "rackhub-sumonly", "ddp-gloo", "local"]


# ---------------------------------------------------------------------------
# Rank process

def rank_main(a):
    import torch
    torch.set_num_threads(a.threads)
    rank, world = a.rank, a.world
    blas = sorted({line.split()[-1] for line in open("/proc/self/maps")
                   if "blas" in line and line.split()[-1].startswith("/")})
    m = torch.randn(1024, 1024)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(5):
            m @ m
        best = max(best, 5 * 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 1024))
    nparams = sum(p.numel() for p in model.parameters())
    lr, mom = 0.01, 0.9
    if a.mode == "ddp-gloo":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                                world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=mom)
    elif a.mode.startswith("rackhub"):
        import rackhub.torch as rh
        rh.init(rank=rank, size=world, hub=a.hub, tenant=a.tenant, token=a.token)
        net = model
        zero_copy = a.mode.endswith("-lease")
        if a.mode.removesuffix("-lease") == "rackhub":
            opt = rh.DistributedOptimizer(rh.SGD(lr=lr, momentum=mom),
                                          named_parameters=model.named_parameters(),
                                          zero_copy=zero_copy)
        else:
            rh.broadcast_parameters(model)
            opt = rh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=mom),
                                          named_parameters=model.named_parameters(),
                                          zero_copy=zero_copy)
    else:
        net = model
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=mom)

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(a.batch, 1024, generator=g)
    y = torch.randn(a.batch, 1024, generator=g)
    times = []
    for step in range(a.warmup + a.steps):
        t = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t
        if step >= a.warmup:
            times.append(dt)
    print("RESULT " + json.dumps({"rank": rank, "mode": a.mode, "params": nparams,
                                  "blas": blas, "gemm_gflops": best, "times": times,
                                  "loss": loss.item()}), flush=True)
    if a.mode == "ddp-gloo":
        import torch.distributed as dist
        dist.destroy_process_group()
    elif a.mode.startswith("rackhub"):
        import rackhub.torch as rh
        rh.shutdown()


# ---------------------------------------------------------------------------
# Driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    def __init__(self, bindir, lanes, work):
        self.bindir = bindir
        self.token = os.path.join(work, "admin.token")
        with open(self.token, "w") as f:
            f.write(os.urandom(16).hex())
        ready = os.path.join(work, "ready")
        self.log = open(os.path.join(work, "rackhubd.log"), "wb")
        cmd = [os.path.join(bindir, "rackhubd"), "--admin-listen", "127.0.0.1:0",
               "--data-listen", "127.0.0.1:0", "--admin-token-file", self.token,
               "--ready-file", ready, "--no-pin-lanes", "--in-memory",
               "--metrics-listen", "127.0.0.1:0"]
        if lanes:
            cmd += ["--lanes", str(lanes)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        addrs = {}
        for _ in range(400):
            if os.path.exists(ready):
                addrs = dict(l.split() for l in open(ready) if len(l.split()) == 2)
                if "data" in addrs and "admin" in addrs:
                    break
            time.sleep(0.05)
        else:
            sys.exit("rackhubd did not start")
        self.admin, self.data = addrs["admin"], addrs["data"]

    def tenant(self, name, workers, chunk_bytes):
        cmd = [os.path.join(self.bindir, "rackhubctl"), "--admin", self.admin, "--token-file",
               self.token, "--json", "tenant", "create", name, "--workers", str(workers)]
        if chunk_bytes:
            cmd += ["--chunk-bytes", chunk_bytes]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(r.stdout)["token"]

    def delete(self, name):
        subprocess.run([os.path.join(self.bindir, "rackhubctl"), "--admin", self.admin,
                        "--token-file", self.token, "tenant", "delete", name],
                       capture_output=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def collect(procs, what):
    """Waits for rank processes; their RESULT lines, or exits naming `what`."""
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        res = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not res:
            sys.exit(f"{what}: a rank failed (exit {p.returncode}):\n{out}")
        results.append(res[0])
    return results


def run_mode(a, mode, hub, rnd, env):
    extra = []
    tenant = None
    if mode.startswith("rackhub"):
        tenant = f"bench-{mode}-{rnd}"
        token = hub.tenant(tenant, a.world, a.chunk_bytes)
        extra = ["--hub", hub.data, "--tenant", tenant, "--token", token]
    port = free_port()
    procs = []
    for r in range(a.world):
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", "--rank", str(r),
               "--world", str(a.world), "--mode", mode, "--port", str(port), "--steps",
               str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch), "--threads",
               str(a.threads)] + extra
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = collect(procs, mode)
    if tenant:
        hub.delete(tenant)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build dir [build]")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--chunk-bytes", default="", help="tenant chunk size (default: the hub's)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--blas-dir", default="/usr/lib/x86_64-linux-gnu/openblas-pthread",
                    help="prepended to LD_LIBRARY_PATH of every rank ('' = system choice)")
    ap.add_argument("--json", action="store_true")
    # rank process
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--hub", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tenant", default="", help=argparse.SUPPRESS)
    ap.add_argument("--token", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a)

    modes = a.modes.split(",")
    bindir = os.path.join(a.build, "bin")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(a.build, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if a.blas_dir:
        if not os.path.exists(os.path.join(a.blas_dir, "libblas.so.3")):
            sys.exit(f"--blas-dir: no libblas.so.3 in {a.blas_dir} "
                     f"(apt-get install libopenblas0-pthread)")
        env["LD_LIBRARY_PATH"] = a.blas_dir + (
            os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["OPENBLAS_NUM_THREADS"] = str(a.threads)
    env["OMP_NUM_THREADS"] = str(a.threads)
    alt = subprocess.run(["update-alternatives", "--query", "libblas.so.3-x86_64-linux-gnu"],
                         capture_output=True, text=True).stdout
    system_blas = next((l.split(": ", 1)[1] for l in alt.splitlines() if l.startswith("Value:")),
                       "?")
    work = tempfile.mkdtemp(prefix="rackhub-torch-bench.")
    hub = Hub(bindir, a.lanes, work) if any(m.startswith("rackhub") for m in modes) else None
    per_mode = {m: [] for m in modes}
    info = {}
    try:
        for rnd in range(a.rounds):
            for mode in modes:
                res = run_mode(a, mode, hub, rnd, env)
                med = max(statistics.median(r["times"]) for r in res)
                per_mode[mode].append(med)
                info[mode] = res
                if not a.json:
                    print(f"round {rnd + 1}/{a.rounds} {mode:16s} {1000 * med:8.1f} ms/step  "
                          f"(GEMM {', '.join('%.0f' % r['gemm_gflops'] for r in res)} GFLOP/s)",
                          flush=True)
    finally:
        if hub:
            hub.stop()
    first = next(iter(info.values()))[0]
    summary = {
        "model": "MLP 1024-4096-4096-1024", "params": first["params"], "batch_per_rank": a.batch,
        "world": a.world, "threads_per_rank": a.threads, "hub_lanes": a.lanes,
        "rounds": a.rounds, "timed_steps": a.steps, "warmup_steps": a.warmup,
        "system_libblas_alternative": system_blas, "LD_LIBRARY_PATH": env.get("LD_LIBRARY_PATH", ""),
        "rank_blas_loaded": first["blas"],
        "gemm_gflops": {m: [round(r["gemm_gflops"], 1) for r in info[m]] for m in modes},
        "median_ms_per_step": {m: round(1000 * statistics.median(v), 2)
                               for m, v in per_mode.items()},
        "per_round_ms": {m: [round(1000 * x, 2) for x in v] for m, v in per_mode.items()},
    }
    if "ddp-gloo" in per_mode:
        base = statistics.median(per_mode["ddp-gloo"])
        summary["ratio_to_ddp_gloo"] = {m: round(statistics.median(v) / base, 3)
                                        for m, v in per_mode.items()}
    if a.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"\nmodel {summary['model']} ({summary['params']} parameters), batch {a.batch}/rank, "
          f"{a.world} ranks x {a.threads} thread(s), hub lanes {a.lanes}")
    print(f"system libblas.so.3 alternative: {system_blas}")
    print(f"ranks run with LD_LIBRARY_PATH={summary['LD_LIBRARY_PATH'] or '(unset)'}; "
          f"libblas loaded: {', '.join(first['blas'])}")
    print(f"{'mode':16s} {'median ms/step':>15s} {'vs ddp-gloo':>12s}   per round")
    for m, v in per_mode.items():
        ratio = summary.get("ratio_to_ddp_gloo", {}).get(m)
        print(f"{m:16s} {1000 * statistics.median(v):15.1f} "
              f"{(f'{ratio:.2f}x' if ratio else '-'):>12s}   "
              f"{' '.join(f'{1000 * x:.1f}' for x in v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
