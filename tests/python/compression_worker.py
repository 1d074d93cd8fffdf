"""One rank of test_compression.py: runs the scenarios (JSON list in argv[1])
one after the other on one tenant, each with a fresh model and its own
DistributedOptimizer(compression=...), and saves each one's final
parameters (and, with eval, its held-out losses) to OUT.rank.pt. Then
checks what does not need the other rank's results: bad compression
strings, key_info of the keys the scenarios declared. Prints
"CHECK ok|FAIL what" lines and "RESULT {json}"; exits 1 if a check failed.

Scenario fields: name, mode (local | hub), compression (a string, or
{"topk": ratio, "error_feedback": bool} for the Compression.topk object),
kind (local mode: common.local_optimizer's, default momentum), steps, seed,
out, eval (held-out loss before every step and after the last).
Usage: compression_worker.py SCENARIOS.json RANK WORLD HUB TENANT TOKEN
"""
import json
import sys

import torch

import rackhub.torch as rh
from rackhub.torch.compression import compression_of
from common import data, local_optimizer, loss_of, make_model, LR

torch.set_num_threads(1)  # deterministic gradients, identical in the reference

failures = []


def check(what, ok, detail=""):
    print(f"CHECK {'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""),
          flush=True)
    if not ok:
        failures.append(what)


def raises(what, fn, exc=ValueError, needle=None):
    try:
        fn()
    except exc as e:
        good = needle is None or needle in str(e)
        check(what, good, f"{type(e).__name__}: {e}")
        return
    except Exception as e:  # noqa: BLE001  (the wrong type is the failure reported)
        check(what, False, f"raised {type(e).__name__}: {e}")
        return
    check(what, False, "did not raise")


def compression_arg(c):
    if isinstance(c, dict):
        return rh.Compression.topk(c["topk"], error_feedback=c.get("error_feedback", True))
    return c


def held_out(seed):
    """A fixed held-out set (ranks 50.. of the data generator)."""
    xs, ys = zip(*(data(seed, 50 + i, 0) for i in range(8)))
    return torch.cat(xs), torch.cat(ys)


def run(sc, rank):
    model = make_model(sc["seed"] + rank)  # the broadcast (or the hub) makes them rank 0's
    comp = compression_arg(sc["compression"])
    prefix = sc["name"] + "/"
    if sc["mode"] == "hub":
        opt = rh.DistributedOptimizer(rh.SGD(lr=LR["momentum"], momentum=0.9),
                                      named_parameters=model.named_parameters(),
                                      compression=comp, prefix=prefix)
    else:
        rh.broadcast_parameters(model)
        opt = rh.DistributedOptimizer(local_optimizer(sc.get("kind", "momentum"),
                                                      model.parameters()),
                                      named_parameters=model.named_parameters(),
                                      compression=comp, prefix=prefix)
    x_ev, y_ev = held_out(sc["seed"])
    losses = []
    for step in range(sc["steps"]):
        if sc.get("eval"):
            with torch.no_grad():
                losses.append(loss_of(model, x_ev, y_ev).item())
        x, y = data(sc["seed"], rank, step)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
    if sc.get("eval"):
        with torch.no_grad():
            losses.append(loss_of(model, x_ev, y_ev).item())
    check(f"{sc['name']}: no step skipped", opt.skipped_steps == 0, str(opt.skipped_steps))
    out = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save({"params": out, "losses": losses}, f"{sc['out']}.{rank}.pt")
    del opt  # takes its hooks off (the model is dropped too)


def check_keys(c, scenarios):
    """key_info of every key the scenarios declared: topk_ratio as declared,
    updates/slowest_iteration 0 (a sync tenant)."""
    names = [n for n, _ in make_model(0).named_parameters()]
    for sc in scenarios:
        comp = compression_of(compression_arg(sc["compression"]))
        typ = "momentum" if sc["mode"] == "hub" else "sum-only"
        suffix = f":topk{comp.topk_ratio!r}" if comp.topk_ratio else ""
        for n in names:
            key_name = f"{sc['name']}/{n}:{typ}:mean{suffix}"
            key = c.find_key(key_name)
            if key is None:
                check(f"key {key_name} exists", False)
                continue
            info = c.key_info(key)
            want = comp.topk_ratio  # as declared, not rounded to a float
            ok = (info["topk_ratio"] == want and info["updates"] == 0
                  and info["slowest_iteration"] == 0 and info["dtype"] == "fp32"
                  and info["next_iteration"] == sc["steps"])
            if not ok or n == names[0]:
                check(f"key_info({key_name})", ok,
                      f"topk_ratio {info['topk_ratio']!r} (want {want!r}), updates "
                      f"{info['updates']}, slowest_iteration {info['slowest_iteration']}, "
                      f"next_iteration {info['next_iteration']}")


def check_refusals(c):
    model = make_model(0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad in ("topk", "topk:", "topk:0", "topk:-0.1", "topk:1.5", "topk:nan", "topk:abc",
                "topk:0.01:ef", "topk:0.01:noef:x", "fp8", "", "TOPK:0.1", 0.01, None):
        raises(f"compression={bad!r} refused", lambda b=bad: rh.DistributedOptimizer(
            sgd, named_parameters=model.named_parameters(), compression=b),
            needle="'topk:RATIO:noef'")
    raises("Compression.topk(0) refused", lambda: rh.Compression.topk(0))
    raises("Compression.topk(2.0) refused", lambda: rh.Compression.topk(2.0))
    raises("allreduce(compression='topk:0.5') refused",
           lambda: rh.allreduce(torch.ones(4), compression="topk:0.5"), needle="collectives")
    raises("declare_key(topk_ratio=1.5) refused",
           lambda: c.declare_key("bad-topk", 16, topk_ratio=1.5), needle="topk_ratio")
    check("'topk:0.01' == Compression.topk(0.01)",
          compression_of("topk:0.01") == rh.Compression.topk(0.01))
    check("'topk:0.01:noef' == Compression.topk(0.01, error_feedback=False)",
          compression_of("topk:0.01:noef") == rh.Compression.topk(0.01, error_feedback=False))
    check("'fp16' is Compression.fp16", compression_of("fp16") is rh.Compression.fp16)
    check("repr", repr(rh.Compression.topk(0.01, False)) ==
          "rackhub.torch.Compression.topk(0.01, error_feedback=False)",
          repr(rh.Compression.topk(0.01, False)))
    # A key declared with top-k, straight through the binding.
    k = c.declare_key("direct-topk", 100, topk_ratio=0.25, error_feedback=False)
    info = c.key_info(k)
    check("declare_key(topk_ratio=0.25): key_info", info["topk_ratio"] == 0.25 and
          info["updates"] == 0 and info["slowest_iteration"] == 0, str(info))
    info = c.key_info(c.declare_key("direct-dense", 100))
    check("declare_key(): key_info topk_ratio 0", info["topk_ratio"] == 0.0, str(info))


def main():
    scenarios = json.load(open(sys.argv[1]))
    rank, world, hub, tenant, token = (int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                       sys.argv[5], sys.argv[6])
    rh.init(rank=rank, size=world, hub=hub, tenant=tenant, token=token, op_timeout=60)
    print(f"chunk_elements {rh.client().chunk_elements}", flush=True)
    for sc in scenarios:
        run(sc, rank)
        print(f"scenario {sc['name']} done", flush=True)
    check_keys(rh.client(), scenarios)
    check_refusals(rh.client())
    rh.shutdown()
    print("RESULT " + json.dumps({"rank": rank, "failures": failures}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
