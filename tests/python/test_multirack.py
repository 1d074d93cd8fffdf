"""A PyTorch job spanning two racks: two rackhubd hubs (static topology,
hierarchical exchange), 2 ranks per rack, each rank on its own rack's hub.
The hub-optimizer scenarios (SGD-momentum, Adam) start from rank 0's
parameters: the plugin declares the keys init = from_client and global rank
0 (rank 0 of rack 0) INITs them; the other rack's hub gets the values through
each chunk's home hub. The sum-only scenario broadcasts rank 0's parameters
and runs torch.optim locally.

Every rank starts from other values (make_model(seed + rank)), so all four
must end bit-identical, and equal a single-process reference that starts
from rank 0's values and sums the gradients as the hubs do: each rack's two
ranks in order, then the two rack sums in rack order. Tolerances as in
test_equivalence.py (hub kernels: 1e-6; sum-only: bitwise).
"""
import json
import os
import socket
import sys
import tempfile

import harness

harness.require_torch()
import torch  # noqa: E402

from common import data, local_optimizer, loss_of, make_model  # noqa: E402

STEPS = 10
RACKS, PER_RACK = 2, 2
TOL = {"momentum": 1e-6, "adam": 1e-6, "sumonly-adam": 0.0}


_port_locks = []  # open until exit: the ports stay reserved


def free_port():
    """A hub-link port (the other hubs must know it beforehand): below the
    kernel's ephemeral range, which it never assigns by itself, reserved among
    concurrently running tests by an flock on /tmp/rackhub-test-ports/<port>
    (the same scheme as tests/support/etcd_cluster.cc), and free right now."""
    import fcntl
    import random
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low_ephemeral = int(f.read().split()[0])
    os.makedirs("/tmp/rackhub-test-ports", mode=0o1777, exist_ok=True)
    for _ in range(2000):
        port = random.randint(10000, low_ephemeral - 1)
        fd = os.open(f"/tmp/rackhub-test-ports/{port}", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:
            os.close(fd)
            continue
        _port_locks.append(fd)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def reference(kind, seed):
    torch.set_num_threads(1)
    model = make_model(seed)  # rank 0's initial values
    opt = local_optimizer(kind, model.parameters())
    world = RACKS * PER_RACK
    scale = torch.tensor(1.0 / world, dtype=torch.float32)
    for step in range(STEPS):
        grads = []
        for r in range(world):
            model.zero_grad(set_to_none=True)
            x, y = data(seed, r, step)
            loss_of(model, x, y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            total = None
            for rack in range(RACKS):  # the hubs' order
                s = grads[rack * PER_RACK][i].clone()
                for r in range(1, PER_RACK):
                    s += grads[rack * PER_RACK + r][i]
                total = s if total is None else total + s
            p.grad = total * scale
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def main():
    interhub = [f"127.0.0.1:{free_port()}" for _ in range(RACKS)]
    racks = ",".join(f"127.0.0.1:0={a}" for a in interhub)
    secret = os.path.join(tempfile.mkdtemp(prefix="rackhub-pytest."), "hub.secret")
    with open(secret, "w") as f:  # one secret for the hub links of both hubs
        f.write(os.urandom(24).hex())
    hubs = []
    ok = True
    try:
        for rack in range(RACKS):
            hubs.append(harness.Hub(lanes=2, extra=["--racks", racks, "--rack", str(rack),
                                                    "--hub-secret-file", secret]))
        token_file = os.path.join(hubs[0].dir, "tenant.token")
        with open(token_file, "w") as f:
            f.write(os.urandom(20).hex())
        kinds = ["momentum", "adam", "sumonly-adam"]
        scenarios = []
        for i, kind in enumerate(kinds):
            tenant = f"mr-{kind}"
            tokens = {h.create_tenant(tenant, PER_RACK, token_file) for h in hubs}
            assert len(tokens) == 1, tokens
            scenarios.append({"name": kind, "kind": kind, "tenant": tenant,
                              "token": tokens.pop(), "steps": STEPS, "seed": 30 + i,
                              "out": os.path.join(hubs[0].dir, kind)})
        spec = os.path.join(hubs[0].dir, "scenarios.json")
        with open(spec, "w") as f:
            json.dump(scenarios, f)
        here = os.path.dirname(os.path.abspath(__file__))
        world = RACKS * PER_RACK
        procs = [harness.spawn([os.path.join(here, "worker.py"), spec, str(r), str(world),
                                hubs[rack].data, str(rack), str(RACKS)])
                 for rack in range(RACKS) for r in range(PER_RACK)]
        results = harness.collect(procs, timeout=150)
        for g, (code, out) in enumerate(results):
            print(f"--- rank {g} (rack {g // PER_RACK}, exit {code})\n{out.rstrip()}")
            ok &= code == 0
        if not ok:
            for rack, h in enumerate(hubs):
                print(f"FAILED: a rank failed\n--- rackhubd of rack {rack}\n" + h.log_text())
            return 1
        for sc in scenarios:
            ranks = [torch.load(f"{sc['out']}.{g}.pt") for g in range(world)]
            ref = reference(sc["kind"], sc["seed"])
            same = all(torch.equal(ranks[0][n], ranks[g][n]) for g in range(1, world)
                       for n in ref)
            diff = max((ranks[0][n] - ref[n]).abs().max().item() for n in ref)
            moved = max((ref[n] - make_model(sc["seed"]).state_dict()[n]).abs().max().item()
                        for n in ref)
            good = same and diff <= TOL[sc["kind"]] and moved > 1e-3
            ok &= good
            print(f"{'ok  ' if good else 'FAIL'} {RACKS} racks x {PER_RACK} {sc['kind']:13s} "
                  f"ranks bit-identical: {same}; max|rank - reference| = {diff:.3g} "
                  f"(tolerance {TOL[sc['kind']]:g}); max weight change {moved:.3g}")
        log = hubs[1].log_text()
        if "connected to rack 0's hub" not in log:
            ok = False
            print("FAIL: rack 1's hub never linked to rack 0's (not a hierarchical run)")
    finally:
        for h in hubs:
            h.stop()
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
