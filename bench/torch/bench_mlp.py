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

On a rack on one machine (bench/torch_netns.sh) --netns-prefix P runs the hub
under `ip netns exec Phub0` listening on --hub-host, rank r under `ip netns exec
Pw<r>`, DDP's rendezvous at --master-addr over --ifname (GLOO_SOCKET_IFNAME),
and rackhub over --transport (tcp: shared memory must not bypass the links).

Checks (--check, on by default; exit 1 and "checks passed: false" when one
fails): after the last round every mode's rank 0 saves its parameters, and
they are compared with a single-process reference that computes each rank's
gradients, sums them in rank order, scales by 1/W and applies torch.optim.SGD
(momentum) - the computation all modes promise: rackhub-sumonly bit for bit
(tests/python/test_equivalence.py's promise), rackhub (the hub's fused SGD
kernel: FMA contractions) and ddp-gloo (gloo's sum order) within --tolerance.

CPU: each rank reports its process CPU time over the timed steps / their wall
time (all its threads: torch, rackhub's client threads, gloo's); the driver
reads the hub's utime+stime from /proc/<pid>/stat and the machine's busy
share from /proc/stat around every run of a mode.

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

    model = make_mlp(torch)
    nparams = sum(p.numel() for p in model.parameters())
    lr, mom = 0.01, 0.9
    if a.mode == "ddp-gloo":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{a.master_addr}:{a.port}", rank=rank,
                                world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=mom)
    elif a.mode.startswith("rackhub"):
        import rackhub.torch as rh
        rh.init(rank=rank, size=world, hub=a.hub, tenant=a.tenant, token=a.token,
                transport=a.transport or None)
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

    x, y = rank_data(torch, rank, a.batch)
    times = []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            cpu0, wall0 = time.process_time(), time.perf_counter()
        t = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t
        if step >= a.warmup:
            times.append(dt)
    cpu_share = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    if a.save and rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], a.save)
    print("RESULT " + json.dumps({"rank": rank, "mode": a.mode, "params": nparams,
                                  "blas": blas, "gemm_gflops": best, "times": times,
                                  "cpu_share": cpu_share, "loss": loss.item()}), flush=True)
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


def make_mlp(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 1024))


def rank_data(torch, rank, batch):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(batch, 1024, generator=g), torch.randn(batch, 1024, generator=g)


def reference_params(world, steps, batch):
    """Single process: every rank's gradients, summed in rank order, * 1/W,
    torch.optim.SGD(momentum) - what every mode computes."""
    import torch
    torch.set_num_threads(1)
    model = make_mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = [rank_data(torch, r, batch) for r in range(world)]
    scale = torch.tensor(1.0 / world, dtype=torch.float32)
    for _ in range(steps):
        grads = []
        for x, y in data:
            model.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            s = grads[0][i].clone()
            for r in range(1, world):
                s += grads[r][i]
            p.grad = s * scale
        opt.step()
    return [p.detach() for p in model.parameters()]


def max_abs_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def proc_cpu_seconds(pid):
    """utime + stime of process pid (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu():
    """(idle, total) jiffies of all cores."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)


class Hub:
    def __init__(self, bindir, lanes, work, netns="", host="127.0.0.1"):
        self.bindir = bindir
        self.wrap = ["ip", "netns", "exec", netns] if netns else []
        self.token = os.path.join(work, "admin.token")
        with open(self.token, "w") as f:
            f.write(os.urandom(16).hex())
        ready = os.path.join(work, "ready")
        self.log = open(os.path.join(work, "rackhubd.log"), "wb")
        cmd = self.wrap + [os.path.join(bindir, "rackhubd"), "--admin-listen", "127.0.0.1:0",
               "--data-listen", f"{host}:0", "--admin-token-file", self.token,
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
        cmd = self.wrap + [os.path.join(self.bindir, "rackhubctl"), "--admin", self.admin,
               "--token-file",
               self.token, "--json", "tenant", "create", name, "--workers", str(workers)]
        if chunk_bytes:
            cmd += ["--chunk-bytes", chunk_bytes]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(r.stdout)["token"]

    def delete(self, name):
        subprocess.run(self.wrap + [os.path.join(self.bindir, "rackhubctl"), "--admin", self.admin,
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


def run_mode(a, mode, hub, rnd, env, save=""):
    """One run of `mode` on every rank: (rank results, {"hub_cpu_s", "machine_busy",
    "wall_s"})."""
    extra = ["--save", save] if save else []
    tenant = None
    if mode.startswith("rackhub"):
        tenant = f"bench-{mode}-{rnd}"
        token = hub.tenant(tenant, a.world, a.chunk_bytes)
        extra += ["--hub", hub.data, "--tenant", tenant, "--token", token]
    port = free_port()
    procs = []
    hub_cpu0 = proc_cpu_seconds(hub.proc.pid) if hub else 0.0
    idle0, total0 = machine_cpu()
    wall0 = time.perf_counter()
    for r in range(a.world):
        wrap = ["ip", "netns", "exec", f"{a.netns_prefix}w{r}"] if a.netns_prefix else []
        cmd = wrap + [sys.executable, os.path.abspath(__file__), "--rank-main", "--rank", str(r),
               "--world", str(a.world), "--mode", mode, "--port", str(port), "--steps",
               str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch), "--threads",
               str(a.threads), "--master-addr", a.master_addr, "--transport", a.transport] + extra
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = collect(procs, mode)
    idle1, total1 = machine_cpu()
    cpu = {"hub_cpu_s": (proc_cpu_seconds(hub.proc.pid) - hub_cpu0) if hub and tenant else None,
           "machine_busy": 1 - (idle1 - idle0) / max(1, total1 - total0),
           "wall_s": time.perf_counter() - wall0}
    if tenant:
        hub.delete(tenant)
    return results, cpu


def check_params(a, saved, env, work):
    """Every mode's saved parameters against the single-process reference,
    computed in a process of its own with the ranks' environment (the same
    BLAS and thread count: the same GEMM summation order)."""
    import torch
    path = os.path.join(work, "params-reference.pt")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--reference-main", "--world",
                    str(a.world), "--steps", str(a.warmup + a.steps), "--batch", str(a.batch),
                    "--save", path], env=env, check=True)
    ref = torch.load(path)
    out = {}
    for mode, path in saved.items():
        if not path:
            continue
        if not os.path.exists(path):
            out[mode] = {"max_abs_diff": float("inf"), "allowed": 0.0, "ok": False}
            continue
        diff = max_abs_diff(torch.load(path), ref)
        allowed = 0.0 if mode.startswith("rackhub-sumonly") else a.tolerance
        out[mode] = {"max_abs_diff": diff, "allowed": allowed, "ok": diff <= allowed}
    return out


def cpu_summary(uses, steps):
    med = statistics.median
    hub = [u["hub_cpu_s"] for u in uses if u["hub_cpu_s"] is not None]
    return {
        "hub_cpu_s_per_step": round(med(hub) / steps, 4) if hub else None,
        "hub_cores": round(med(u["hub_cpu_s"] / u["wall_s"] for u in uses), 3) if hub else None,
        "rank_cpu_share": [round(med(u["rank_cpu_share"][r] for u in uses), 3)
                           for r in range(len(uses[0]["rank_cpu_share"]))],
        "machine_busy": round(med(u["machine_busy"] for u in uses), 3),
    }


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
    ap.add_argument("--netns-prefix", default="",
                    help="hub in namespace <P>hub0, rank r in <P>w<r> (bench/torch_netns.sh)")
    ap.add_argument("--hub-host", default="127.0.0.1", help="the hub's data-plane address")
    ap.add_argument("--master-addr", default="127.0.0.1", help="DDP's rendezvous (rank 0's IP)")
    ap.add_argument("--ifname", default="", help="GLOO_SOCKET_IFNAME for ddp-gloo")
    ap.add_argument("--transport", default="", help="rackhub.torch.init(transport=) [auto]")
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip the parameter checks against the single-process reference")
    ap.add_argument("--tolerance", type=float, default=1e-5,
                    help="max |difference| of rackhub and ddp-gloo parameters from the reference")
    ap.add_argument("--save", default="", help=argparse.SUPPRESS)
    # rank process
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reference-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--hub", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tenant", default="", help=argparse.SUPPRESS)
    ap.add_argument("--token", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a)
    if a.reference_main:
        import torch
        torch.save(reference_params(a.world, a.steps, a.batch), a.save)
        return 0

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
    if a.ifname:
        env["GLOO_SOCKET_IFNAME"] = a.ifname
    env["OPENBLAS_NUM_THREADS"] = str(a.threads)
    env["OMP_NUM_THREADS"] = str(a.threads)
    alt = subprocess.run(["update-alternatives", "--query", "libblas.so.3-x86_64-linux-gnu"],
                         capture_output=True, text=True).stdout
    system_blas = next((l.split(": ", 1)[1] for l in alt.splitlines() if l.startswith("Value:")),
                       "?")
    work = tempfile.mkdtemp(prefix="rackhub-torch-bench.")
    hub = (Hub(bindir, a.lanes, work, a.netns_prefix and a.netns_prefix + "hub0", a.hub_host)
           if any(m.startswith("rackhub") for m in modes) else None)
    per_mode = {m: [] for m in modes}
    info, cpu = {}, {m: [] for m in modes}
    saved = {}
    try:
        for rnd in range(a.rounds):
            for mode in modes:
                last = rnd == a.rounds - 1 and a.check and mode != "local"
                saved[mode] = os.path.join(work, f"params-{mode}.pt") if last else ""
                res, use = run_mode(a, mode, hub, rnd, env, saved[mode])
                med = max(statistics.median(r["times"]) for r in res)
                per_mode[mode].append(med)
                use["rank_cpu_share"] = [r["cpu_share"] for r in res]
                cpu[mode].append(use)
                info[mode] = res
                if not a.json:
                    print(f"round {rnd + 1}/{a.rounds} {mode:16s} {1000 * med:8.1f} ms/step  "
                          f"(GEMM {', '.join('%.0f' % r['gemm_gflops'] for r in res)} GFLOP/s)",
                          flush=True)
    finally:
        if hub:
            hub.stop()
    checks = check_params(a, saved, env, work) if a.check else {}
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
        "netns_prefix": a.netns_prefix, "transport": a.transport or "auto",
        "cpu": {m: cpu_summary(v, a.warmup + a.steps) for m, v in cpu.items()},
        "param_checks": checks,
        "checks_passed": all(c["ok"] for c in checks.values()),
    }
    if "ddp-gloo" in per_mode:
        base = statistics.median(per_mode["ddp-gloo"])
        summary["ratio_to_ddp_gloo"] = {m: round(statistics.median(v) / base, 3)
                                        for m, v in per_mode.items()}
    code = 0 if summary["checks_passed"] else 1
    if a.json:
        print(json.dumps(summary, indent=1))
        return code
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
    print("CPU (median over rounds): hub CPU s per step, hub cores busy, ranks' CPU share of "
          "their timed steps, machine busy (all cores)")
    for m, c in summary["cpu"].items():
        hub_s = "-" if c["hub_cpu_s_per_step"] is None else f"{c['hub_cpu_s_per_step']:.3f}"
        hub_c = "-" if c["hub_cores"] is None else f"{c['hub_cores']:.2f}"
        print(f"{m:16s} hub {hub_s:>6s} s/step {hub_c:>5s} cores   ranks "
              f"{' '.join('%.0f%%' % (100 * x) for x in c['rank_cpu_share'])}   machine "
              f"{100 * c['machine_busy']:.0f}%")
    for m, c in checks.items():
        print(f"params after {a.warmup + a.steps} steps, {m}: max |diff| from the reference "
              f"{c['max_abs_diff']:.3g} (allowed {c['allowed']:.3g}): {'ok' if c['ok'] else 'FAIL'}")
    print(f"checks passed: {str(summary['checks_passed']).lower()}")
    return code


if __name__ == "__main__":
    sys.exit(main())
