"""A training script written for Horovod (the call sequence of Horovod's
PyTorch examples: init, DistributedOptimizer with named_parameters,
broadcast_parameters, broadcast_optimizer_state, an LR scheduler,
backward_passes_per_step=2, a metric allreduce, checkpoints through
state_dict with a resume broadcast), run on rackhub: only the import line
and the launcher (rackhub-run) differ from the Horovod version.

Usage (under rackhub-run): horovod_train.py --mode local|hub --steps N
  [--stop-at K --checkpoint FILE] [--resume FILE] [--root R] --out PREFIX
The final parameters go to PREFIX.RANK.pt. Data and model: common.py.
"""
import argparse

import torch

import rackhub.torch as hvd  # was: import horovod.torch as hvd

from common import data, loss_of, make_model

PASSES = 2       # backward_passes_per_step
LR, MOMENTUM = 0.05, 0.9
STEP_SIZE, GAMMA = 3, 0.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["local", "hub"], required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--stop-at", type=int, default=None)
    ap.add_argument("--checkpoint")
    ap.add_argument("--resume")
    ap.add_argument("--root", type=int, default=0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)

    hvd.init()
    torch.manual_seed(a.seed + 1000 * hvd.rank())  # different per rank: the broadcast fixes it
    model = make_model(a.seed + 1000 * hvd.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    resume_from, scheduler_state = 0, None
    if a.resume and hvd.rank() == a.root:
        ckpt = torch.load(a.resume)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        resume_from, scheduler_state = ckpt["step"], ckpt["scheduler"]
    resume_from = hvd.broadcast_object(resume_from, root_rank=a.root, name="resume_from")

    # Horovod: broadcast the initial state from the root.
    hvd.broadcast_parameters(model.state_dict(), root_rank=a.root)
    hvd.broadcast_optimizer_state(optimizer, root_rank=a.root)

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.none,
                                         backward_passes_per_step=PASSES, op=hvd.Average,
                                         hub_optimizer=a.mode == "hub")
    assert isinstance(optimizer, torch.optim.SGD) and isinstance(optimizer, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)
    if resume_from:
        scheduler.load_state_dict(hvd.broadcast_object(scheduler_state, root_rank=a.root))

    stop = a.stop_at if a.stop_at is not None else a.steps
    for step in range(resume_from, stop):
        optimizer.zero_grad()
        for p in range(PASSES):
            x, y = data(a.seed, hvd.rank() + 100 * p, step)
            loss = loss_of(model, x, y)
            loss.backward()
        optimizer.step()
        scheduler.step()
        avg = hvd.allreduce(loss.detach(), name="avg_loss")
        if hvd.rank() == 0:
            print(f"step {step} loss {avg.item():.5f} lr {scheduler.get_last_lr()[0]:g}",
                  flush=True)
    if a.checkpoint and hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": stop}, a.checkpoint)
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
               f"{a.out}.{hvd.rank()}.pt")
    print(f"rank {hvd.rank()} of {hvd.size()} (local {hvd.local_rank()} of "
          f"{hvd.local_size()}): done", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
