#!/usr/bin/python3
"""Per-key overhead through the PyTorch plugin: a model of ResNet-50's 161
parameter tensors (25,557,032 fp32 parameters) against one tensor of the same
total size, W ranks, hub-side SGD, in the same run, alternating round by round.

    /usr/bin/python3 bench/torch/bench_tensors.py                  # build/, 2 ranks, 3 rounds
    /usr/bin/python3 bench/torch/bench_tensors.py --rounds 5 --json

A step is what a training loop does around communication: a backward pass
that fills every .grad (loss = sum of c * p.sum(), so the gradients are
constants c), whose per-parameter hooks push each gradient as it is produced,
then DistributedOptimizer.step() waiting for every reply. A round's figure is
the slower rank's median step time; GB/s is model bytes per step. The report
gives the medians over rounds and resnet50 / one-tensor GB/s (the issue's
target: >= 0.85). The hub is started here (rackhubd from --build, 2 lanes,
unpinned); ranks use the client's default transport (shared memory on this
host).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mlp import Hub, collect  # noqa: E402  (the same private hub and rank results)


def resnet50_elements():
    """torchvision's resnet50 parameters in model.parameters() order."""
    t = []
    def conv(i, o, k):
        t.append(i * o * k * k)
    def bn(c):
        t.extend([c, c])
    conv(3, 64, 7)
    bn(64)
    inp = 64
    for layer, blocks in enumerate([3, 4, 6, 3]):
        w = 64 << layer
        for b in range(blocks):
            conv(inp, w, 1); bn(w)
            conv(w, w, 3); bn(w)
            conv(w, 4 * w, 1); bn(4 * w)
            if b == 0:
                conv(inp, 4 * w, 1); bn(4 * w)
            inp = 4 * w
    t.extend([2048 * 1000, 1000])
    return t


def rank_main(a):
    import torch
    import rackhub.torch as rh
    torch.set_num_threads(1)
    sizes = resnet50_elements()
    if a.profile == "one":
        sizes = [sum(sizes)]
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    rh.init(rank=a.rank, hub=a.hub, tenant=a.tenant, token=a.token)
    opt = rh.DistributedOptimizer(rh.SGD(lr=0.01),
                                  named_parameters=[(f"p{i}", p) for i, p in enumerate(params)])
    coeff = [float(i % 7 + 1) for i in range(len(params))]
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = sum(c * p.sum() for c, p in zip(coeff, params))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"rank": a.rank, "profile": a.profile, "tensors": len(sizes),
                                  "elements": sum(sizes), "times": times,
                                  "transport": rh.client().transport}), flush=True)
    rh.shutdown()


def run(a, hub, profile, rnd, env):
    tenant = f"tensors-{profile}-{rnd}"
    token = hub.tenant(tenant, a.world, "")
    procs = []
    for r in range(a.world):
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", "--rank", str(r),
               "--profile", profile, "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--hub", hub.data, "--tenant", tenant, "--token", token]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = collect(procs, profile)
    hub.delete(tenant)
    return max(statistics.median(r["times"]) for r in results), results[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--profile", default="resnet50", help=argparse.SUPPRESS)
    ap.add_argument("--hub", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tenant", default="", help=argparse.SUPPRESS)
    ap.add_argument("--token", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(a.build, "python") + os.pathsep + env.get("PYTHONPATH", "")
    model_bytes = sum(resnet50_elements()) * 4
    rounds = {"resnet50": [], "one": []}
    transport = ""
    with tempfile.TemporaryDirectory(prefix="rackhub-tensors-") as work:
        hub = Hub(os.path.join(a.build, "bin"), 2, work)
        try:
            for rnd in range(a.rounds):
                for profile in ("resnet50", "one"):
                    t, first = run(a, hub, profile, rnd, env)
                    transport = first["transport"]
                    rounds[profile].append(t)
                    print(f"round {rnd + 1}/{a.rounds}: {profile}: {t * 1e3:.1f} ms/step, "
                          f"{model_bytes / t / 1e9:.3f} GB/s", file=sys.stderr, flush=True)
        finally:
            hub.stop()
    med = {k: statistics.median(v) for k, v in rounds.items()}
    gbps = {k: model_bytes / v / 1e9 for k, v in med.items()}
    ratio = gbps["resnet50"] / gbps["one"]
    out = {"world": a.world, "rounds": a.rounds, "steps": a.steps, "model_bytes": model_bytes,
           "transport": transport, "resnet50_ms": med["resnet50"] * 1e3,
           "one_tensor_ms": med["one"] * 1e3, "resnet50_gbps": gbps["resnet50"],
           "one_tensor_gbps": gbps["one"], "ratio_gbps": ratio,
           "round_ms": {k: [x * 1e3 for x in v] for k, v in rounds.items()}}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"ResNet-50 tensors (161) vs one tensor, {a.world} ranks over {transport}, "
              f"medians of {a.rounds} rounds:")
        print(f"  resnet50    {med['resnet50'] * 1e3:8.1f} ms/step  {gbps['resnet50']:.3f} GB/s")
        print(f"  one tensor  {med['one'] * 1e3:8.1f} ms/step  {gbps['one']:.3f} GB/s")
        print(f"  ratio (GB/s) {ratio:.3f}  (target >= 0.85)")


if __name__ == "__main__":
    main()
