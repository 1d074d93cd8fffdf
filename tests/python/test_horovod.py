"""A Horovod training script (horovod_train.py: only its import line and the
launcher differ from Horovod) runs through rackhub-run against a real hub
with 2 ranks; its final weights equal a single-process reference as the
existing tests define it (sum-only/local optimizer: bitwise; hub-side
optimizer: 1e-6 absolute). Per mode:
  - one job of STEPS steps, broadcast from root 1 (local mode; hub-side mode
    initializes the hub from rank 0, so root 0 there);
  - a job that stops at STOP and checkpoints through state_dict, then a
    second job on the SAME tenant that resumes from the checkpoint: its
    final weights equal the uninterrupted reference too.
The reference: per step, each rank's gradient accumulated over 2 backward
passes, summed in rank order, times 1/W; torch.optim.SGD(momentum) with
StepLR (the learning rate halves every 3 steps, so a rate that reached the
hub one step late would be far off).
Usage: test_horovod.py
"""
import os
import subprocess
import sys

import harness

harness.require_torch()
import torch  # noqa: E402

from common import data, loss_of, make_model  # noqa: E402
import horovod_train as ht  # noqa: E402

WORLD, STEPS, STOP = 2, 8, 5
TOL = {"local": 0.0, "hub": 1e-6}


def reference(seed, root):
    torch.set_num_threads(1)
    model = make_model(seed + 1000 * root)
    opt = torch.optim.SGD(model.parameters(), lr=ht.LR, momentum=ht.MOMENTUM)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=ht.STEP_SIZE, gamma=ht.GAMMA)
    scale = torch.tensor(1.0 / WORLD, dtype=torch.float32)
    for step in range(STEPS):
        grads = []
        for r in range(WORLD):
            model.zero_grad(set_to_none=True)
            for p in range(ht.PASSES):
                x, y = data(seed, r + 100 * p, step)
                loss_of(model, x, y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            s = grads[0][i].clone()
            for r in range(1, WORLD):
                s += grads[r][i]
            p.grad = s * scale
        opt.step()
        sched.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def launch(hub, tenant, token_file, args):
    run = os.path.join(os.environ["RACKHUB_BIN_DIR"], "rackhub-run")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([run, "-n", str(WORLD), "--hub", hub.data, "--tenant", tenant,
                        "--token-file", token_file, "python3",
                        os.path.join(here, "horovod_train.py")] + args,
                       capture_output=True, text=True, timeout=150, cwd=here)
    print(r.stdout + r.stderr)
    return r.returncode == 0


def compare(what, prefix, ref, tol):
    ranks = [torch.load(f"{prefix}.{r}.pt") for r in range(WORLD)]
    same = all(torch.equal(ranks[0][n], ranks[r][n]) for r in range(1, WORLD) for n in ref)
    diff = max((ranks[0][n] - ref[n]).abs().max().item() for n in ref)
    good = same and diff <= tol
    print(f"{'ok  ' if good else 'FAIL'} {what}: ranks bit-identical: {same}; "
          f"max|rank - reference| = {diff:.3g} (tolerance {tol:g})")
    return good


def main():
    hub = harness.Hub(lanes=2)
    ok = True
    try:
        for mode in ("local", "hub"):
            root = 1 if mode == "local" else 0
            ref = reference(7, root)
            for job in ("whole", "resumed"):
                tenant = f"hvd-{mode}-{job}"
                token_file = os.path.join(hub.dir, tenant + ".token")
                with open(token_file, "w") as f:
                    f.write(hub.create_tenant(tenant, WORLD))
                out = os.path.join(hub.dir, f"{mode}-{job}")
                base = ["--mode", mode, "--steps", str(STEPS), "--root", str(root), "--out", out]
                if job == "whole":
                    good = launch(hub, tenant, token_file, base)
                else:
                    ckpt = os.path.join(hub.dir, f"{mode}.ckpt")
                    good = launch(hub, tenant, token_file, base + ["--stop-at", str(STOP),
                                                                   "--checkpoint", ckpt])
                    # A second job on the same tenant resumes from the checkpoint.
                    good = good and launch(hub, tenant, token_file, base + ["--resume", ckpt])
                if not good:
                    print(f"FAIL {mode}/{job}: a job failed\n--- rackhubd log\n" + hub.log_text())
                    ok = False
                    continue
                ok &= compare(f"{mode}/{job} (root {root})", out, ref, TOL[mode])
    finally:
        hub.stop()
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
