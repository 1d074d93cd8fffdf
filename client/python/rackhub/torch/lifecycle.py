"""rackhub.torch.init(): connects this process to the hub as one rank of the
tenant (arguments, the environment of rackhub-run or torchrun) and installs
the context (_context.py) the other modules read.

Thread use: the main thread.
"""
import os
import socket
import zlib

import torch

from .. import _core
from . import _context, collectives

# The hub's default data-plane port (rackhubd's data.listen).
DEFAULT_DATA_PORT = 7700
TRANSPORTS = ("auto", "tcp", "shm", "rdma")


def _env(*names, default=None):
    """The first of the variables that is set and not empty."""
    for name in names:
        v = os.environ.get(name)
        if v not in (None, ""):
            return v
    return default


def _int_env(what, *names, default=None):
    v = _env(*names, default=default)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"rackhub.torch.init: {what}: {names[0]}/{names[-1]} is '{v}', "
                         f"not an integer") from None


def init(rank=None, size=None, hub=None, tenant=None, token=None, token_file=None, rack=None,
         racks=None, transport=None, connect_timeout=30.0, op_timeout=None, local_rank=None,
         local_size=None, rdma_hub=None, rdma_device=None, busy_poll=False):
    """Connects this process to the hub as one rank of the tenant.

    Arguments left out come from the environment: rackhub-run's variables
    first, then torchrun's (so `torchrun ... train.py` works with only the
    RACKHUB_TENANT/TOKEN variables added):

      rank        RACKHUB_RANK, RANK                       (default 0)
      size        RACKHUB_WORLD_SIZE, WORLD_SIZE           (checked against the tenant)
      local_rank  RACKHUB_LOCAL_RANK, LOCAL_RANK
      local_size  RACKHUB_LOCAL_SIZE, LOCAL_WORLD_SIZE
      hub         RACKHUB_HUB (HOST:PORT of the data plane), else
                  MASTER_ADDR:RACKHUB_PORT (port default 7700), else 127.0.0.1:7700
      tenant      RACKHUB_TENANT (required)
      token       RACKHUB_TOKEN or the file RACKHUB_TOKEN_FILE (required)
      rack        RACKHUB_RACK (default 0): the rack of this worker (multi-rack
                  tenants: every rack's workers talk to their own rack's hub)
      racks       RACKHUB_RACKS (default 1): the tenant's racks. With racks,
                  `rank` is the rank within the rack; rank() and size() are
                  global (rack * workers_per_rack + rank; racks * workers)
      transport   RACKHUB_TRANSPORT: auto (default: shared memory when the hub
                  is on this host, else RDMA when a device reaches it, else
                  TCP), tcp, shm or rdma (these two fail init when unusable)
      op_timeout  RACKHUB_OP_TIMEOUT seconds (default 120): how long one
                  operation may take, reconnects included
    rdma_hub (RACKHUB_RDMA_HUB) is the hub's RDMA listener (default: the
    hub's host, port 7702); rdma_device picks a verbs device; busy_poll
    spins on the shared-memory ring / completion queue instead of sleeping.
    When neither launcher gave local_rank/local_size, the ranks compute them
    here from their host names (init is then a collective: every rank calls it).
    """
    if _context.is_initialized():
        raise RuntimeError("rackhub.torch.init: already initialized (call shutdown() first)")
    rank = int(rank) if rank is not None else _int_env("rank", "RACKHUB_RANK", "RANK", default="0")
    if size is None:
        size = _int_env("size", "RACKHUB_WORLD_SIZE", "WORLD_SIZE")
    if local_rank is None:
        local_rank = _int_env("local_rank", "RACKHUB_LOCAL_RANK", "LOCAL_RANK")
    if local_size is None:
        local_size = _int_env("local_size", "RACKHUB_LOCAL_SIZE", "LOCAL_WORLD_SIZE")
    if not hub:
        hub = _env("RACKHUB_HUB")
        master = _env("MASTER_ADDR")
        if not hub and master:
            hub = f"{master}:{_env('RACKHUB_PORT', default=str(DEFAULT_DATA_PORT))}"
        hub = hub or f"127.0.0.1:{DEFAULT_DATA_PORT}"
    tenant = tenant or _env("RACKHUB_TENANT")
    if not tenant:
        raise ValueError("rackhub.torch.init: tenant: not given and RACKHUB_TENANT not set")
    if token is None:
        token_file = token_file or _env("RACKHUB_TOKEN_FILE")
        if token_file:
            with open(token_file) as f:
                token = f.read().strip()
        else:
            token = _env("RACKHUB_TOKEN")
    if not token:
        raise ValueError("rackhub.torch.init: token: not given and neither RACKHUB_TOKEN "
                         "nor RACKHUB_TOKEN_FILE set")
    rack = int(rack) if rack is not None else _int_env("rack", "RACKHUB_RACK", default="0")
    racks = int(racks) if racks is not None else _int_env("racks", "RACKHUB_RACKS", default="1")
    if racks < 1 or not 0 <= rack < racks:
        raise ValueError(f"rackhub.torch.init: rack: {rack} not in [0, racks={racks})")
    transport = transport or _env("RACKHUB_TRANSPORT", default="auto")
    if transport not in TRANSPORTS:
        raise ValueError(f"rackhub.torch.init: transport: one of {', '.join(TRANSPORTS)}, "
                         f"got '{transport}'")
    if op_timeout is None:
        op_timeout = float(_env("RACKHUB_OP_TIMEOUT", default="120"))
    rdma_hub = rdma_hub or _env("RACKHUB_RDMA_HUB", default="")
    c = _core.Client(hub, tenant, token, rank, rack, float(connect_timeout), float(op_timeout),
                     True, transport, rdma_hub, rdma_device or "", bool(busy_poll))
    workers = c.workers  # per rack
    if size is not None and int(size) != workers * racks:
        c.close()
        raise ValueError(f"rackhub.torch.init: size: {size} given but tenant '{tenant}' has "
                         f"{workers} workers" + (f" in each of {racks} racks" if racks > 1 else ""))
    if not 0 <= rank < workers:
        c.close()
        raise ValueError(f"rackhub.torch.init: rank: {rank} not in [0, {workers})")
    ctx = _context.Context(c, rack * workers + rank, racks * workers, hub, tenant)
    ctx.op_timeout = float(op_timeout)
    _context.install(ctx)
    try:
        if local_rank is None or local_size is None:
            local_rank, local_size = _local_from_hosts(ctx)
    except BaseException:
        _context.shutdown()
        raise
    if not 0 <= local_rank < local_size:
        _context.shutdown()
        raise ValueError(f"rackhub.torch.init: local_rank: {local_rank} not in "
                         f"[0, {local_size})")
    ctx.local_rank, ctx.local_size = local_rank, local_size


def _local_from_hosts(ctx):
    """(local rank, local size) from every rank's host name: the ranks on
    this host, numbered by global rank (Horovod's definition)."""
    h = zlib.crc32(socket.gethostname().encode()) & 0xFFFFFF  # exact in fp32
    mine = torch.zeros(ctx.size, dtype=torch.float32)
    mine[ctx.rank] = float(h + 1)  # 0 = "not this rank"
    every = collectives.allreduce(mine, name="__rackhub_hosts", op=collectives.Sum)
    same = [r for r in range(ctx.size) if int(every[r].item()) == h + 1]
    return same.index(ctx.rank), len(same)
