"""One rank of the Python tests: runs scenarios (JSON list in argv[1]) one
after the other in this process (torch is imported once), each on its own
tenant, and saves the final parameters of each to OUT_DIR/NAME.rank.pt.
Usage: worker.py SCENARIOS RANK SIZE HUB [RACK RACKS] (with racks, RANK is
within the rack and the files are named by global rank).

Scenario fields: name, kind (momentum | adam | sumonly-adam | sumonly-sgd-copy
| kill), tenant, token, steps, seed, out; kill: victim, kill_step.
"""
import json
import os
import signal
import sys
import time

import torch

import rackhub
import rackhub.torch as rh
from common import data, local_optimizer, loss_of, make_model, LR

torch.set_num_threads(1)  # deterministic gradients, identical in the reference


def run(sc, rank, size, hub, rack=0, racks=1):
    rh.init(rank=rank, size=size, hub=hub, tenant=sc["tenant"], token=sc["token"],
            op_timeout=60, rack=rack, racks=racks)
    rank = rh.rank()  # global: rack * workers per rack + rank in the rack
    # Different initial values per rank: the broadcast must make them rank 0's.
    model = make_model(sc["seed"] + rank)
    kind = sc["kind"]
    if kind in ("momentum", "adam", "kill"):
        spec = (rh.SGD(lr=LR["momentum"], momentum=0.9) if kind in ("momentum", "kill")
                else rh.Adam(lr=LR["adam"]))
        # kill: the survivors must see the failure (no automatic resync).
        opt = rh.DistributedOptimizer(spec, named_parameters=model.named_parameters(),
                                      on_rollback="raise" if kind == "kill" else "resync")
    else:
        rh.broadcast_parameters(model)
        local = local_optimizer(kind, model.parameters())
        opt = rh.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                      reply="copy" if kind.endswith("-copy") else "swap")
    losses = []
    for step in range(sc["steps"]):
        x, y = data(sc["seed"], rank, step)
        opt.zero_grad()
        loss = loss_of(model, x, y)
        if kind == "kill" and rank == sc["victim"] and step == sc["kill_step"]:
            def die(_grad):
                # fc1 is the last layer backward reaches: the other layers'
                # gradients are already on their way to the hub.
                with open(sc["out"] + ".killed", "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            model.fc1.weight.register_hook(die)
        try:
            loss.backward()
            t0 = time.time()
            opt.step()
        except rackhub.RackhubError as e:
            print("RESULT " + json.dumps({"raised": type(e).__name__, "code": e.code,
                                          "wire": e.wire, "time": time.time(),
                                          "waited": time.time() - t0, "step": step,
                                          "message": str(e)}), flush=True)
            rh.shutdown()
            return
        losses.append(loss.item())
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
               f"{sc['out']}.{rank}.pt")
    print(f"{sc['name']}: rank {rank} loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    rh.shutdown()


def main():
    scenarios = json.loads(open(sys.argv[1]).read())
    rank, size, hub = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    # Tenants spanning racks: RACK RACKS follow (rank is then within the rack).
    rack, racks = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else (0, 1)
    for sc in scenarios:
        run(sc, rank, size, hub, rack, racks)


if __name__ == "__main__":
    main()
