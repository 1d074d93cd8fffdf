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
from . import _context, collectives, process_sets as _process_sets, timeline
from .handles import Executor

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
         local_size=None, rdma_hub=None, rdma_device=None, busy_poll=False, *, comm=None,
         process_sets=None, max_size=None):
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
    init is a collective (every rank calls it): the ranks exchange their host
    names, which give local_rank/local_size when no launcher gave them, and
    cross_rank(), cross_size(), is_homogeneous().

    process_sets: Horovod's static process sets (a list of ProcessSet or of
    rank lists; "dynamic" or None: none), registered with ids 1, 2, ...
    after a round in which the ranks check that they name the same sets
    (process_sets.py); add_process_set()/remove_process_set() work either way.
    max_size (RACKHUB_ELASTIC_MAX_SIZE, set by rackhub-run --max-np): an
    elastic job (docs/elastic.md, "Python"): `rank` may be any hub rank below
    max_size, `size` is not checked, and init ends with the membership round
    (rackhub.torch.elastic; rank() and size() are then the dense rank among
    the members and their count).

    Called again while initialized, init does nothing (as in Horovod, its
    arguments are ignored); after shutdown() it connects anew. Horovod's
    comm (an MPI communicator) is refused: rackhub has no MPI.
    """
    if _context.is_initialized():
        return
    if comm is not None:
        raise ValueError("rackhub.torch.init: comm: rackhub has no MPI; the ranks are the "
                         "tenant's workers (rank, size or the launcher's environment)")
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
    if max_size is None:
        max_size = _int_env("max_size", "RACKHUB_ELASTIC_MAX_SIZE")
    if max_size is not None:
        if process_sets not in (None, "dynamic"):
            raise ValueError("rackhub.torch.init: process_sets: not for elastic jobs (their "
                             "membership changes; the hub refuses participant sets in elastic "
                             "tenants)")
        if racks > 1 or rack != 0:
            # The hub side is built (docs/elastic.md, "Across racks"); this
            # module's membership rounds, ranks and launcher are one hub's.
            raise ValueError(f"rackhub.torch.init: racks: rackhub.torch.elastic runs on one "
                             f"rack's hub; rack {rack} of {racks} racks given (elastic jobs "
                             f"across racks are C++/C clients for now: docs/elastic.md, "
                             f"Limits)")
        return _init_elastic(int(max_size), rank, hub, tenant, token, transport,
                             float(connect_timeout), float(op_timeout), local_rank, local_size,
                             rdma_hub, rdma_device, busy_poll)
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
    ctx.executor = Executor(on_done=lambda op: timeline.record(op, ctx.rank))
    _context.install(ctx)
    try:
        local_rank, local_size = _topology(ctx, local_rank, local_size)
    except BaseException:
        _context.shutdown()
        raise
    ctx.forming = False  # every rank has arrived: one not connected from now on has left
    if not 0 <= local_rank < local_size:
        _context.shutdown()
        raise ValueError(f"rackhub.torch.init: local_rank: {local_rank} not in "
                         f"[0, {local_size})")
    ctx.local_rank, ctx.local_size = local_rank, local_size
    try:
        _process_sets.setup(ctx, process_sets)
    except BaseException:
        _context.shutdown()
        raise


def _init_elastic(max_size, rank, hub, tenant, token, transport, connect_timeout, op_timeout,
                  local_rank, local_size, rdma_hub, rdma_device, busy_poll):
    """init of an elastic job: a joiner waits for the members to park (the
    launcher's files, elastic/_session.py), connects with its hub rank
    (slot), then takes part in the membership round."""
    from .elastic import _session
    if not 0 <= rank < max_size:
        raise ValueError(f"rackhub.torch.init: rank: {rank} not in [0, max_size={max_size})")
    control = _env("RACKHUB_ELASTIC_DIR")
    epoch = _int_env("epoch", "RACKHUB_ELASTIC_EPOCH", default="0")
    _session.gate(control, epoch, op_timeout)
    c = _core.Client(hub, tenant, token, rank, 0, connect_timeout, op_timeout, True, transport,
                     rdma_hub, rdma_device or "", bool(busy_poll))
    ctx = _context.Context(c, rank, max_size, hub, tenant)
    ctx.op_timeout = op_timeout
    ctx.elastic = _session.Membership(max_size, control, epoch)
    ctx.executor = Executor(on_done=lambda op: timeline.record(op, ctx.rank))
    ctx.local_rank = 0 if local_rank is None else local_rank
    ctx.local_size = 1 if local_size is None else local_size
    ctx.cross_rank, ctx.cross_size, ctx.homogeneous = 0, 1, True
    _context.install(ctx)
    try:
        _process_sets.setup(ctx, None)  # forgets an earlier init's sets
        _session.connected(control, epoch, rank)
        _session.settle(_session.RESET)
    except BaseException:
        _context.shutdown()
        raise


def _topology(ctx, local_rank, local_size):
    """Every rank's host (a digest of its name) and launcher-given local
    rank: returns (local rank, local size), computed from the hosts (the
    ranks on this host, numbered by global rank: Horovod's definition) when
    not given; sets the context's cross_rank, cross_size (the ranks with
    this local rank, numbered by global rank) and homogeneous."""
    host = zlib.crc32(socket.gethostname().encode())
    given = local_rank is not None and local_size is not None
    mine = torch.tensor([[host, local_rank if given else -1]], dtype=torch.int64)
    every = collectives.allgather(mine, name="__rackhub_hosts").tolist()
    same = [r for r in range(ctx.size) if every[r][0] == host]
    if not given:
        local_rank, local_size = same.index(ctx.rank), len(same)
        locals_ = [[r2 for r2 in range(ctx.size) if every[r2][0] == every[r][0]].index(r)
                   for r in range(ctx.size)]
    else:
        locals_ = [e[1] for e in every]
    peers = [r for r in range(ctx.size) if locals_[r] == locals_[ctx.rank]]
    ctx.cross_rank, ctx.cross_size = peers.index(ctx.rank), len(peers)
    per_host = {}
    for h, _ in every:
        per_host[h] = per_host.get(h, 0) + 1
    ctx.homogeneous = len(set(per_host.values())) == 1
    return local_rank, local_size
