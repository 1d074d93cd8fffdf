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

Collectives: allreduce, allgather, broadcast, grouped_allreduce,
grouped_allgather, alltoall, reducescatter (each also *_async, returning a
handle for poll()/synchronize()), barrier, join, broadcast_parameters,
broadcast_object, allgather_object (collectives.py, grouped.py, scatter.py,
join.py, objects.py; handles.py runs them).

Everything here is collective (every rank calls it, in the same order)
except the getters (rank(), size(), local_rank(), cross_rank(), the build
probes, ...). A failed collective raises HorovodInternalError (which is
also the library's rackhub.RackhubError / WorkerLost / RolledBack when it
came from there); ranks whose ops do not match raise MismatchError on every
rank. DistributedOptimizer raises rackhub.RackhubError.
"""
from .._core import RackhubError, RolledBack, WorkerLost
from ._context import client, is_initialized, local_rank, local_size, rank, shutdown, size
from .collectives import (Max, Min, Product, allgather, allgather_async, allreduce,
                          allreduce_, allreduce_async, allreduce_async_, barrier, broadcast,
                          broadcast_, broadcast_async, broadcast_async_)
from .compression import Compression, Compressor
from .embedding import table_init_
from .errors import HorovodInternalError, HostsUpdatedInterrupt, MismatchError
from .grouped import (grouped_allgather, grouped_allgather_async, grouped_allreduce,
                      grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                      sparse_allreduce_async)
from .handles import poll, synchronize
from .hub_specs import SGD, Adagrad, Adam, AdamW, Adasum, Average, Sum
from .join import join
from .lifecycle import init
from .objects import (allgather_object, broadcast_object, broadcast_optimizer_state,
                      broadcast_parameters)
from .optimizer import DistributedOptimizer
from .process_sets import (ProcessSet, add_process_set, global_process_set, remove_process_set,
                           takes_process_set)
from .probes import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                     gloo_enabled, is_homogeneous, mpi_built, mpi_enabled,
                     mpi_threads_supported, nccl_built, rocm_built)
from .scatter import (alltoall, alltoall_async, grouped_reducescatter,
                      grouped_reducescatter_async, reducescatter, reducescatter_async)
from .syncbn import SyncBatchNorm
from .timeline import start_timeline, stop_timeline
from . import elastic  # noqa: E402  (hvd.elastic.run, TorchState: elastic/__init__.py)

# Every collective takes Horovod's process_set= (process_sets.py); the
# gradient of one over a set goes over the same set.
for _name in ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
              "alltoall", "reducescatter", "grouped_reducescatter",
              "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce_",
              "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_allgather_async",
              "allgather_async", "broadcast_", "broadcast_async", "broadcast_async_",
              "alltoall_async", "reducescatter_async", "grouped_reducescatter_async",
              "sparse_allreduce_async", "barrier", "broadcast_parameters",
              "broadcast_optimizer_state", "broadcast_object", "allgather_object"):
    globals()[_name] = takes_process_set(globals()[_name])
del _name

__all__ = [
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "client",
    "DistributedOptimizer", "Compression", "Compressor", "Average", "Sum", "Adasum",
    "Min", "Max", "Product",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "allgather", "allgather_async", "allgather_object",
    "barrier", "poll", "synchronize", "HorovodInternalError", "MismatchError",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_allgather", "grouped_allgather_async",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "join",
    "SyncBatchNorm", "grouped_reducescatter", "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "start_timeline", "stop_timeline",
    "SGD", "Adam", "AdamW", "Adagrad", "RackhubError", "RolledBack", "WorkerLost",
    "table_init_", "elastic", "HostsUpdatedInterrupt",
]
