"""The process's connection to the hub, once lifecycle.init() made it: rank(),
size(), local_rank(), local_size(), client(), shutdown(). One rank per
process (the Horovod model); every other module of rackhub.torch reads the
context through need(). The context holds the executor that runs the
collectives (handles.py, made by lifecycle.init). This module imports no
other module of the package.

Process sets (process_sets.py): an op over a process set runs with a
SetView as its context: rank and size within the set, the set's helper
keys. viewing(view) makes need() return it on the calling thread (the
executor's thread sets the view its op was submitted under).

Thread use: install() and shutdown() from the main thread; the getters from any.
"""
import contextlib
import threading

_ctx = None
_local = threading.local()  # .view: the SetView of the op this thread runs, or None


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
        # True during init()'s first collective: a rank the hub finds "not
        # connected" has not arrived yet (it may still be starting), so its
        # round waits for it, until op_timeout, instead of failing.
        self.forming = True
        # The key name tag and participant ranks of the helper keys (rounds.key):
        # none for the global set; a SetView's are its set's.
        self.key_tag = ""
        self.participants = []
        # Elastic jobs (elastic/): the membership (elastic._session.Membership);
        # None otherwise. `rank`/`size` above are then the hub rank (slot) and
        # the slot count (max ranks); rank()/size() below are dense.
        self.elastic = None


class SetView:
    """The context as an op over a process set sees it: `rank` and `size`
    within the set (its ranks in global-rank order), the set's helper keys
    (named with `key_tag`, declared with the set's ranks as participants, so
    the hub sums exactly them), everything else the process's context."""

    def __init__(self, base, ranks, key_tag):
        self._base = base
        self.ranks = list(ranks)
        self.rank = self.ranks.index(base.rank)
        self.size = len(self.ranks)
        self.key_tag = key_tag
        self.participants = list(ranks)
        self.keys = {}

    def __getattr__(self, name):
        return getattr(self._base, name)


def view():
    """The SetView this thread's op runs under (None: the global set)."""
    return getattr(_local, "view", None)


@contextlib.contextmanager
def viewing(v):
    """need() returns `v` (a SetView, or None for the process's context) on
    this thread inside the block."""
    before = getattr(_local, "view", None)
    _local.view = v
    try:
        yield v
    finally:
        _local.view = before


def keeps_view(function):
    """Class decorator for the collectives' autograd Functions: backward runs
    under the view forward ran under, so the gradient of an op over a
    process set goes over the same set (as in Horovod), whenever
    loss.backward() runs."""
    forward, backward = function.forward, function.backward

    def forward_in_view(fctx, *args):
        fctx.rackhub_view = view()
        return forward(fctx, *args)

    def backward_in_view(fctx, *grads):
        with viewing(fctx.rackhub_view):
            return backward(fctx, *grads)

    function.forward = staticmethod(forward_in_view)
    function.backward = staticmethod(backward_in_view)
    return function


def install(ctx):
    """Makes `ctx` the process's context (lifecycle.init)."""
    global _ctx
    if _ctx is not None:
        raise RuntimeError("rackhub.torch.init: already initialized (call shutdown() first)")
    _ctx = ctx


def need():
    if _ctx is None:
        raise RuntimeError("rackhub.torch: call rackhub.torch.init() first")
    v = getattr(_local, "view", None)
    return v if v is not None and v._base is _ctx else _ctx


def is_initialized():
    return _ctx is not None


def rank():
    """This process's rank in [0, size()). In an elastic job: its position
    among the current members (ascending hub ranks; docs/elastic.md)."""
    c = _base()
    return c.rank if c.elastic is None else c.elastic.dense_rank(c.rank)


def size():
    """The number of ranks (the tenant's workers); in an elastic job the
    current member count."""
    c = _base()
    return c.size if c.elastic is None else c.elastic.size()


def dense(ctx):
    """(rank, size) of the ranks an op of context `ctx` (a Context or a
    SetView) runs over, as Horovod counts them: the set's, or in an elastic
    job this process's position among the current members and their count
    (ctx.rank/ctx.size are then the hub slot and the slot count). What
    Average divides by and what reducescatter's shares split over."""
    if ctx.elastic is None:
        return ctx.rank, ctx.size
    return ctx.elastic.dense_rank(ctx.rank), ctx.elastic.size()


def _base():
    if _ctx is None:
        raise RuntimeError("rackhub.torch: call rackhub.torch.init() first")
    return _ctx


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
