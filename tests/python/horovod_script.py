"""A Horovod training script that goes beyond DistributedOptimizer: only its
import line and launcher differ from Horovod's (test_horovod_script.py runs
it under rackhub-run and compares with a single-process reference).

Uneven data (rank r has BASE + r batches), a SyncBatchNorm, gradients
averaged by hand: the first two with allreduce_async_ (in flight while the
rest go through one grouped_allreduce_), then synchronize; a rank out of
data calls join() (its zeros count in the others' averages, and it gives no
rows to their SyncBatchNorm statistics). Then ranks 0 and 1 average their
first layer's weights over a process set. Each rank saves its parameters and
BatchNorm statistics to OUT/rank<R>.pt, with what join() returned and the
process set's average.
Usage: horovod_script.py OUT"""
import os
import sys

import torch

import rackhub.torch as hvd  # was: import horovod.torch as hvd

BASE, IN, HIDDEN, OUT, BATCH, LR = 3, 6, 8, 2, 4, 0.1


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), hvd.SyncBatchNorm(HIDDEN),
                               torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, IN, generator=g)
    return x, torch.sin(x[:, :OUT]) + 0.1 * torch.randn(BATCH, OUT, generator=g)


def main():
    torch.set_num_threads(1)
    hvd.init()
    model = make_model()
    if hvd.rank() != 0:  # different initial values: the broadcast must fix them
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for step in range(BASE + hvd.rank()):
        x, y = batch(hvd.rank(), step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        handles = [hvd.allreduce_async_(g, name=f"grad{i}") for i, g in enumerate(grads[:2])]
        hvd.grouped_allreduce_(grads[2:])
        for h in handles:
            hvd.synchronize(h)
        opt.step()
    last = hvd.join()
    # A process set: ranks 0 and 1 average their first layer's weights.
    pair = hvd.add_process_set([0, 1])
    pair_mean = None
    if hvd.rank() in pair.ranks:
        pair_mean = hvd.allreduce(model[0].weight.detach(), op=hvd.Average, process_set=pair)
    hvd.remove_process_set(pair)
    torch.save({"state": {k: v.clone() for k, v in model.state_dict().items()}, "last": last,
                "pair_mean": pair_mean},
               os.path.join(sys.argv[1], f"rank{hvd.rank()}.pt"))
    hvd.shutdown()


if __name__ == "__main__":
    main()
