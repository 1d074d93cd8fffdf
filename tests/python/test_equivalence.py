"""W ranks (real processes) train the same MLP through a real hub with
server-side SGD-momentum, server-side Adam, and sum-only + local torch.optim
(Adam with reply='swap', SGD-momentum with reply='copy'). The final weights of
every rank must equal a single-process reference that computes the same
per-rank gradients, averages them in rank order and applies torch.optim's
SGD/Adam.

Tolerances (max |difference| over all weights, weights are O(0.1)):
  - all ranks of a scenario hold bit-identical weights;
  - sum-only: 0 (bitwise: same rank-order sum, same local optimizer code);
  - server-side momentum/Adam: 1e-6 absolute (the hub's fused kernels
    may contract a*b+c into an FMA and Adam evaluates sqrt(v/bc2) as
    sqrt(v*(1/bc2)): last-bit differences per step).
Usage: test_equivalence.py WORLD
"""
import json
import os
import sys

import harness

harness.require_torch()
import torch  # noqa: E402

from common import data, local_optimizer, loss_of, make_model  # noqa: E402

STEPS = 10
TOL = {"momentum": 1e-6, "adam": 1e-6, "sumonly-adam": 0.0, "sumonly-sgd-copy": 0.0}


def reference(kind, seed, world):
    torch.set_num_threads(1)
    model = make_model(seed)  # rank 0's initial values
    opt = local_optimizer(kind, model.parameters())
    scale = torch.tensor(1.0 / world, dtype=torch.float32)
    for step in range(STEPS):
        grads = []
        for r in range(world):
            model.zero_grad(set_to_none=True)
            x, y = data(seed, r, step)
            loss_of(model, x, y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            s = grads[0][i].clone()
            for r in range(1, world):
                s += grads[r][i]           # rank order, like the hub
            p.grad = s * scale
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def main():
    world = int(sys.argv[1])
    hub = harness.Hub(lanes=2)
    ok = True
    try:
        kinds = ["momentum", "adam", "sumonly-adam", "sumonly-sgd-copy"]
        scenarios = []
        for i, kind in enumerate(kinds):
            tenant = f"eq-{kind}-w{world}"
            scenarios.append({"name": kind, "kind": kind, "tenant": tenant,
                              "token": hub.create_tenant(tenant, world), "steps": STEPS,
                              "seed": 10 + i, "out": os.path.join(hub.dir, kind)})
        spec = os.path.join(hub.dir, "scenarios.json")
        with open(spec, "w") as f:
            json.dump(scenarios, f)
        here = os.path.dirname(os.path.abspath(__file__))
        procs = [harness.spawn([os.path.join(here, "worker.py"), spec, str(r), str(world),
                                hub.data]) for r in range(world)]
        results = harness.collect(procs, timeout=120)
        for r, (code, out) in enumerate(results):
            print(f"--- rank {r} (exit {code})\n{out.rstrip()}")
            ok &= code == 0
        if not ok:
            print("FAILED: a rank failed\n--- rackhubd log\n" + hub.log_text())
            return 1
        for sc in scenarios:
            ranks = [torch.load(f"{sc['out']}.{r}.pt") for r in range(world)]
            ref = reference(sc["kind"], sc["seed"], world)
            same = all(torch.equal(ranks[0][n], ranks[r][n]) for r in range(1, world)
                       for n in ref)
            diff = max((ranks[0][n] - ref[n]).abs().max().item() for n in ref)
            moved = max((ref[n] - make_model(sc["seed"]).state_dict()[n]).abs().max().item()
                        for n in ref)
            good = same and diff <= TOL[sc["kind"]] and moved > 1e-3
            ok &= good
            print(f"{'ok  ' if good else 'FAIL'} W={world} {sc['kind']:17s} ranks bit-identical: "
                  f"{same}; max|rank - reference| = {diff:.3g} (tolerance {TOL[sc['kind']]:g}); "
                  f"max weight change {moved:.3g}")
    finally:
        hub.stop()
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
