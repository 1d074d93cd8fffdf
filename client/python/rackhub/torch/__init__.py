"""rackhub.torch: data-parallel PyTorch training through a rackhub hub, with
Horovod's (and BytePS's) interface. A Horovod script runs on rackhub by
changing its import and its launcher:

    import rackhub.torch as hvd                 # was: import horovod.torch as hvd
    hvd.init()                                  # rank, size, hub, tenant, token from the env
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.none,
                                   backward_passes_per_step=1, op=hvd.Average)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()         # gradients are pushed while backward runs
        opt.step()                              # waits for the hub, steps
        ...
    # launch: rackhub-run -n 4 python3 train.py   (or torchrun with RACKHUB_TENANT/TOKEN set)

With hub_optimizer=True (or a hub spec, rh.SGD(lr=...), in place of the torch
optimizer) the optimizer runs on the hub instead: it keeps the master
parameters and the optimizer state, and every rank receives the updated
parameters (rackhub.torch.optimizer's docstring).

Embedding tables: DistributedOptimizer(..., embeddings=[emb, ...]) with
nn.Embedding/nn.EmbeddingBag(sparse=True) modules makes their weights
row-sparse hub keys (rackhub.torch.embedding's docstring); table_init_()
writes a table's initial values into a local tensor.

Compression: DistributedOptimizer(..., compression="topk:0.01") (or
Compression.topk(0.01)) pushes each chunk's largest 1 % of gradient entries
and keeps the rest on the worker for the next step (error feedback;
"topk:0.01:noef" drops it); "fp16"/"bf16" halve the push. The reply stays
dense (hub_specs.Compression's docstring).

Everything here is collective (every rank calls it, in the same order)
except the getters (rank(), size(), local_rank(), local_size(), ...).
Failures raise rackhub.RackhubError (RolledBack, WorkerLost: subclasses).
"""
from .._core import RackhubError, RolledBack, WorkerLost
from ._context import client, is_initialized, local_rank, local_size, rank, shutdown, size
from .collectives import (allgather, allgather_object, allreduce, allreduce_, broadcast,
                          broadcast_, broadcast_object, broadcast_optimizer_state,
                          broadcast_parameters)
from .hub_specs import SGD, Adagrad, Adam, AdamW, Adasum, Average, Compression, Sum
from .embedding import table_init_
from .lifecycle import init
from .optimizer import DistributedOptimizer

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "client",
    "DistributedOptimizer", "Compression", "Average", "Sum", "Adasum",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "broadcast",
    "broadcast_", "allreduce", "allreduce_", "allgather", "allgather_object",
    "SGD", "Adam", "AdamW", "Adagrad", "RackhubError", "RolledBack", "WorkerLost",
    "table_init_",
]
