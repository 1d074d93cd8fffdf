"""Top-k gradient compression through DistributedOptimizer(compression=...):
2 ranks (real processes) train the MLP of common.py through a real hub (2
lanes), one tenant, one scenario after the other in the same processes
(compression_worker.py), and the results are compared here:

  - "topk:1.0" (every entry sent, so every chunk goes dense) is
    bit-identical to "none", with a local torch.optim.SGD(momentum) and with
    the hub's SGD-momentum; "none" is bit-identical to the single-process
    reference of test_equivalence.py (rank-order sum, times 1/W);
  - Compression.topk(0.05) (error feedback) and "topk:0.05:noef" are
    bit-identical to a reference that does top-k here, in Python: per chunk
    of the key (chunks of 2560 elements, where 0.05 * 2560 is exactly 128:
    k must come from the ratio as given, not from a float of it, which
    sends 129), the k = ceil(ratio * n) entries (exact rationals) of
    largest magnitude (ties: lowest index) of the gradient plus the residual
    (EF) or of the gradient alone (noef), the rest kept in the residual; the
    hub sums the ranks' sparse contributions in rank order;
  - "topk:0.01" trains: with a local torch.optim.Adam (lr 0.01) the
    held-out loss falls below LOSS_RATIO x where it started over LONG_STEPS
    steps (measured with 2560-element chunks: 0.565 -> 0.301; dense 0.198; with the
    default 8192-element chunks 0.323, "topk:0.01:noef" 0.514;
    with SGD-momentum lr 0.05 this regression learns slowly, dense 0.565 ->
    0.447 in 120 steps);
  - every rank's weights are bit-identical within a scenario;
  - on every rank (compression_worker.py): bad compression strings raise
    ValueError naming the accepted forms, allreduce refuses top-k,
    key_info() of each key shows its topk_ratio (and updates /
    slowest_iteration 0: a sync tenant), key names carry ":topkRATIO".
Usage: test_compression.py
"""
import json
import math
import os
import sys
from fractions import Fraction

import harness

harness.require_torch()
import torch  # noqa: E402

from common import data, local_optimizer, loss_of, make_model  # noqa: E402

WORLD, STEPS, LONG_STEPS = 2, 10, 120
LOSS_RATIO = 0.7  # topk:0.01 must bring the held-out loss below 0.7 x its start


CHUNK_BYTES = 10240  # 2560 elements: 0.05 * 2560 = 128 exactly (a float ratio gave 129)


def topk_count(ratio, n):
    """The documented k = ceil(R * n) of the ratio R as written (its decimal
    text), in exact rational arithmetic: independent of the library's
    TopKCount (doubles with a tolerance) and of any float rounding."""
    k = math.ceil(Fraction(repr(ratio)) * n)
    return min(max(k, 1), n)


def topk_chunk(x, k):
    """Indices of the k largest |x| (IEEE bits with the sign cleared; ties:
    lowest index), as aggregation::SelectTopK."""
    key = x.view(torch.int32) & 0x7fffffff
    _, order = torch.sort(key, descending=True, stable=True)
    return order[:k]


def compress(g, residual, ratio, ef, chunk):
    """What one rank sends for gradient g (flat fp32), as a dense tensor;
    updates residual in place (EF)."""
    sent = torch.zeros_like(g)
    for first in range(0, g.numel(), chunk):
        n = min(chunk, g.numel() - first)
        sl = slice(first, first + n)
        x = residual[sl] + g[sl] if ef else g[sl].clone()
        k = topk_count(ratio, n)
        if 4 + 8 * k >= 4 * n:  # the sparse form is not smaller: sent dense
            sent[sl] = x
            residual[sl] = 0.0
            continue
        idx = topk_chunk(x, k)
        sent[sl][idx] = x[idx]
        if ef:
            x[idx] = 0.0
            residual[sl] = x
    return sent


def reference(seed, steps, topk=None, ef=True, chunk=8192):
    """Rank 0's initial values, torch.optim.SGD(momentum) on the mean of the
    ranks' (compressed) gradients summed in rank order."""
    torch.set_num_threads(1)
    model = make_model(seed)
    opt = local_optimizer("momentum", model.parameters())
    scale = torch.tensor(1.0 / WORLD, dtype=torch.float32)
    params = list(model.parameters())
    residual = [[torch.zeros(p.numel()) for p in params] for _ in range(WORLD)]
    for step in range(steps):
        grads = []
        for r in range(WORLD):
            model.zero_grad(set_to_none=True)
            x, y = data(seed, r, step)
            loss_of(model, x, y).backward()
            g = [p.grad.detach().reshape(-1).clone() for p in params]
            if topk is not None:
                g = [compress(gi, residual[r][i], topk, ef, chunk) for i, gi in enumerate(g)]
            grads.append(g)
        for i, p in enumerate(params):
            s = grads[0][i].clone()
            for r in range(1, WORLD):
                s += grads[r][i]
            p.grad = (s * scale).reshape(p.shape)
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def max_diff(a, b):
    return max((a[n] - b[n]).abs().max().item() for n in a)


def main():
    hub = harness.Hub(lanes=2)
    ok = True

    def report(what, good, detail=""):
        nonlocal ok
        ok &= bool(good)
        print(f"{'ok  ' if good else 'FAIL'} {what}" + (f": {detail}" if detail else ""))

    try:
        tenant = "compression"
        token = hub.create_tenant(tenant, WORLD, extra=["--chunk-bytes", str(CHUNK_BYTES)])
        d = hub.dir
        sc = [
            {"name": "local-none", "mode": "local", "compression": "none", "steps": STEPS},
            {"name": "local-topk1", "mode": "local", "compression": "topk:1.0", "steps": STEPS},
            {"name": "hub-none", "mode": "hub", "compression": "none", "steps": STEPS},
            {"name": "hub-topk1", "mode": "hub", "compression": "topk:1.0", "steps": STEPS},
            {"name": "local-topk5-ef", "mode": "local", "compression": {"topk": 0.05},
             "steps": STEPS},
            {"name": "local-topk5-noef", "mode": "local", "compression": "topk:0.05:noef",
             "steps": STEPS},
            {"name": "long-none", "mode": "local", "compression": "none",
             "kind": "sumonly-adam", "steps": LONG_STEPS, "eval": True},
            {"name": "long-topk1pc", "mode": "local", "compression": "topk:0.01",
             "kind": "sumonly-adam", "steps": LONG_STEPS, "eval": True},
        ]
        for s in sc:
            s["seed"] = 31
            s["out"] = os.path.join(d, s["name"])
        spec = os.path.join(d, "scenarios.json")
        with open(spec, "w") as f:
            json.dump(sc, f)
        here = os.path.dirname(os.path.abspath(__file__))
        procs = [harness.spawn([os.path.join(here, "compression_worker.py"), spec, str(r),
                                str(WORLD), hub.data, tenant, token]) for r in range(WORLD)]
        results = harness.collect(procs, timeout=150)
        chunk = None
        for r, (code, out) in enumerate(results):
            print(f"--- rank {r} (exit {code})\n{out.rstrip()}")
            ok &= code == 0
            for line in out.splitlines():
                if line.startswith("chunk_elements "):
                    chunk = int(line.split()[1])
        report("the reference's k of 0.05 on a chunk of 2560 is 128",
               topk_count(0.05, 2560) == 128 and chunk == CHUNK_BYTES // 4, f"chunk {chunk}")
        if not ok or chunk is None:
            print("FAILED: a rank failed\n--- rackhubd log\n" + hub.log_text())
            return 1
        print("---")

        res = {}
        for s in sc:
            ranks = [torch.load(f"{s['out']}.{r}.pt") for r in range(WORLD)]
            same = all(torch.equal(ranks[0]["params"][n], ranks[r]["params"][n])
                       for r in range(1, WORLD) for n in ranks[0]["params"])
            report(f"{s['name']}: ranks bit-identical", same)
            res[s["name"]] = ranks[0]

        def p(name):
            return res[name]["params"]

        ref = reference(31, STEPS)
        report("local none == single-process reference (bitwise)",
               max_diff(p("local-none"), ref) == 0.0, f"{max_diff(p('local-none'), ref):.3g}")
        for mode in ("local", "hub"):
            diff = max_diff(p(f"{mode}-topk1"), p(f"{mode}-none"))
            report(f"{mode}: topk:1.0 == none (bitwise)", diff == 0.0, f"max diff {diff:.3g}")
        for name, ef in (("local-topk5-ef", True), ("local-topk5-noef", False)):
            r = reference(31, STEPS, topk=0.05, ef=ef, chunk=chunk)
            diff = max_diff(p(name), r)
            report(f"{name} == Python top-k reference (bitwise, chunk {chunk})", diff == 0.0,
                   f"max diff {diff:.3g}; vs dense {max_diff(p(name), ref):.3g}")
        diff = max_diff(p("local-topk5-ef"), p("local-topk5-noef"))
        report("error feedback changes the result", diff > 0, f"max diff {diff:.3g}")
        dense, topk = res["long-none"]["losses"], res["long-topk1pc"]["losses"]
        report(f"topk:0.01: held-out loss falls below {LOSS_RATIO} x its start over "
               f"{LONG_STEPS} steps", topk[-1] < LOSS_RATIO * topk[0],
               f"{topk[0]:.4f} -> {topk[-1]:.4f} (dense: {dense[0]:.4f} -> {dense[-1]:.4f}; "
               f"every 20 steps: {', '.join(f'{v:.3f}' for v in topk[::20])})")
    finally:
        hub.stop()
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
