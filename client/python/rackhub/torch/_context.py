"""The process's connection to the hub, once lifecycle.init() made it: rank(),
size(), local_rank(), local_size(), client(), shutdown(). One rank per
process (the Horovod model); every other module of rackhub.torch reads the
context through need(). The context holds the executor that runs the
collectives (handles.py, made by lifecycle.init). This module imports no
other module of the package.

Thread use: install() and shutdown() from the main thread; the getters from any.
"""

_ctx = None


class Context:
    def __init__(self, client, rank, size, hub, tenant):
        self.client = client
        self.rank = rank
        self.size = size
        self.hub = hub
        self.tenant = tenant
        self.op_timeout = 120.0
        self.local_rank = None
        self.local_size = None
        self.cross_rank = None
        self.cross_size = None
        self.homogeneous = None
        self.executor = None  # handles.Executor
        self.keys = {}  # (purpose, name, ...) -> key id of the helper keys of collectives
        # DistributedOptimizer engines by their join id (weak references), for
        # a joined rank that pushes zeros for the others' steps (join.py).
        self.optimizers = {}
        # Elastic jobs (elastic/): the membership (elastic._session.Membership);
        # None otherwise. `rank`/`size` above are then the hub rank (slot) and
        # the slot count (max ranks); rank()/size() below are dense.
        self.elastic = None


def install(ctx):
    """Makes `ctx` the process's context (lifecycle.init)."""
    global _ctx
    if _ctx is not None:
        raise RuntimeError("rackhub.torch.init: already initialized (call shutdown() first)")
    _ctx = ctx


def need():
    if _ctx is None:
        raise RuntimeError("rackhub.torch: call rackhub.torch.init() first")
    return _ctx


def is_initialized():
    return _ctx is not None


def rank():
    """This process's rank in [0, size()). In an elastic job: its position
    among the current members (ascending hub ranks; docs/elastic.md)."""
    c = need()
    return c.rank if c.elastic is None else c.elastic.dense_rank(c.rank)


def size():
    """The number of ranks (the tenant's workers); in an elastic job the
    current member count."""
    c = need()
    return c.size if c.elastic is None else c.elastic.size()


def local_rank():
    """This process's rank among the ranks on its host."""
    return need().local_rank


def local_size():
    """The number of ranks on this host."""
    return need().local_size


def client():
    """The underlying rackhub.Client."""
    return need().client


def shutdown():
    """Closes the connection: collectives not yet finished fail with
    HorovodInternalError. Idempotent; init() may be called again after it."""
    global _ctx
    ctx = _ctx
    if ctx is not None:
        if ctx.executor is not None:
            ctx.executor.close("shut down (rackhub.torch.shutdown())",
                               before_join=ctx.client.close)
        else:
            ctx.client.close()
        _ctx = None
