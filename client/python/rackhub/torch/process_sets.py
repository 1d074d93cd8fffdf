"""Horovod's process sets: ProcessSet, global_process_set, add_process_set,
remove_process_set, and the `process_set=` argument of every collective.

How a set maps onto the hub (docs/pytorch.md, Process sets): an op over a
set runs with the set's view of the context (_context.SetView): rank() and
size() within the set (its ranks in global-rank order), and helper keys of
its own, named `__rackhub/set/<n>x<crc32 of the ranks>/...` and declared
with the set's ranks as the keys' participants, so the hub completes each
round when exactly those ranks pushed, sums them in rank order and divides
a mean by their count. The header round that opens every op (agree.py) is
a round of the set's channel key, so only its ranks take part in it. Keys
of disjoint sets complete independently: ops on disjoint sets run at the
same time. Key names depend on the ranks only, so a later job (or a set
removed and added again) finds the same keys.

Registering sets is collective over all ranks, as in Horovod: the static
sets of init(process_sets=...) and each add_process_set() / remove_process_set()
run a header round of the global set in which the ranks check they name
the same sets; ids (1, 2, ... in registration order; 0 is the global set)
therefore agree across ranks. A bad set (duplicate or out-of-range ranks,
empty, one already registered) raises ValueError on every rank (the rank
that gave it names the problem).

Thread use: the main thread registers sets; the ops' wrappers (takes_process_set)
run on any thread.
"""
import contextlib
import functools
import inspect
import zlib

import torch

from . import _context, agree
from .collectives import submit
from .handles import synchronize


class ProcessSet:
    """A set of ranks that run collectives together. Pass it to init(process_sets=...)
    or add_process_set(); process_set_id is then its id (None before, and after
    remove_process_set)."""
    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        if isinstance(ranks_or_comm, (str, bytes)) or not hasattr(ranks_or_comm, "__iter__"):
            raise ValueError("ProcessSet: a list of ranks (rackhub has no MPI communicators), "
                             f"got {type(ranks_or_comm).__name__}")
        ranks = list(ranks_or_comm)
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError(f"ProcessSet: the ranks must be integers, got {ranks!r}")
        self.ranks = sorted(ranks)
        self._view = None

    def size(self):
        """The number of ranks in the set (None if it is not registered)."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self):
        """This process's rank within the set (its position among the set's
        ranks in global-rank order; None if the set is not registered).
        ValueError if this process is not in the set."""
        if self.process_set_id is None:
            return None
        me = _context.rank()
        if me not in self.ranks:
            raise ValueError(f"ProcessSet.rank: this process (rank {me}) is not in process set "
                             f"{self.process_set_id} (ranks {self.ranks})")
        return self.ranks.index(me)

    def included(self):
        """Whether this process is in the set (None if it is not registered)."""
        return None if self.process_set_id is None else _context.rank() in self.ranks

    def invalidate(self):
        self.process_set_id = None
        self.ranks = None
        self._view = None

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm=None)"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_sets = {0: global_process_set}  # id -> the registered ProcessSet
_next_id = [1]


def _tag(ranks):
    return f"set/{len(ranks)}x{zlib.crc32(repr(list(ranks)).encode()):08x}/"


def _problem(ps, size, what):
    """What is wrong with `ps` for this job (None if nothing)."""
    if not ps.ranks:
        return f"{what}: a process set needs at least one rank"
    dup = sorted({r for i, r in enumerate(ps.ranks) if i and ps.ranks[i - 1] == r})
    if dup:
        return f"{what}: process set {ps.ranks} names rank(s) {dup} more than once"
    bad = [r for r in ps.ranks if not 0 <= r < size]
    if bad:
        return f"{what}: process set {ps.ranks}: rank(s) {bad} not in [0, {size})"
    if ps.process_set_id is not None and _sets.get(ps.process_set_id) is ps:
        return f"{what}: {ps} is registered already"
    for sid, other in _sets.items():
        if sid and other.ranks == ps.ranks:
            return f"{what}: a process set with ranks {ps.ranks} exists already (id {sid})"
    return None


def _register(ps, ctx):
    ps.process_set_id = _next_id[0]
    _next_id[0] += 1
    _sets[ps.process_set_id] = ps
    ps._view = _context.SetView(ctx, ps.ranks, _tag(ps.ranks)) if ctx.rank in ps.ranks else None


def _agree(kind, values, problem):
    """A header round of the global set: every rank names `values` (their
    digest); raises MismatchError (a ValueError) on every rank when they
    differ or a rank has a `problem`."""
    digest = zlib.crc32(repr(values).encode())

    def run():
        every, _ = agree.open_op("process_set", kind, [digest], problem=problem)
        agree.same(kind, every, 0, "process sets", mine=f"{values}")
    synchronize(submit("process_set", None, run))


def setup(ctx, process_sets):
    """init(): forgets the sets of an earlier init, registers `process_sets`
    (a list of ProcessSet or of rank lists; identical ones share an id, as in
    Horovod) after a round in which every rank checks the others name the
    same ones."""
    for sid, ps in list(_sets.items()):
        if sid:
            ps.invalidate()
    _sets.clear()
    _sets[0] = global_process_set
    _next_id[0] = 1
    global_process_set.ranks = list(range(ctx.size))
    if process_sets is None or process_sets == "dynamic":  # add/remove always work here
        return []
    if isinstance(process_sets, ProcessSet) or not hasattr(process_sets, "__iter__"):
        raise ValueError("rackhub.torch.init: process_sets: a list of ProcessSet (or of rank "
                         f"lists), got {type(process_sets).__name__}")
    sets = [ps if isinstance(ps, ProcessSet) else ProcessSet(ps) for ps in process_sets]
    problem = None
    if ctx.size != ctx.client.workers:
        problem = "rackhub.torch.init: process_sets: process sets are single-rack only"
    fresh = []
    for ps in sets:
        if ps is global_process_set or any(ps.ranks == f.ranks for f in fresh):
            continue
        problem = problem or _problem(ps, ctx.size, "rackhub.torch.init: process_sets")
        fresh.append(ps)
    _agree("init(process_sets=...)", [ps.ranks for ps in fresh], problem)
    for ps in fresh:
        _register(ps, ctx)
    for ps in sets:  # duplicates get the id of the first
        if ps.process_set_id is None:
            ps.process_set_id = next(f.process_set_id for f in fresh if f.ranks == ps.ranks)
            ps._view = next(f._view for f in fresh if f.ranks == ps.ranks)
    return sets


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) and returns
    it with its id. Collective: every rank calls it with the same ranks, in
    the same order as their other collectives. ValueError (on every rank)
    for duplicate or out-of-range ranks, an empty set, or one that exists."""
    ctx = _context.need()
    if ctx.elastic is not None:
        raise ValueError("add_process_set: not for elastic jobs (their membership changes; the "
                         "hub refuses participant sets in elastic tenants)")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps is global_process_set:
        raise ValueError("add_process_set: the global process set is always registered")
    problem = _problem(ps, ctx.size, "add_process_set")
    _agree("add_process_set", ps.ranks, problem)
    _register(ps, ctx)
    return ps


def remove_process_set(process_set):
    """Unregisters a process set (collective, as add_process_set); the
    object and its id can no longer be used. Returns True; False for the
    global process set, which cannot be removed (Horovod's answer).
    ValueError for a set that is not registered."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"remove_process_set: a ProcessSet, got {type(process_set).__name__}")
    sid = process_set.process_set_id
    if sid == 0:
        return False
    if sid is None or _sets.get(sid) is None:
        raise ValueError(f"remove_process_set: {process_set} is not registered (removed "
                         f"already, or never added)")
    _context.need()
    _agree("remove_process_set", [sid, _sets[sid].ranks], None)
    removed = _sets.pop(sid)
    for ps in (removed, process_set):
        ps.invalidate()
    return True


def process_sets():
    """The registered process sets, by id."""
    return [_sets[k] for k in sorted(_sets)]


def scope(process_set, what):
    """The block in which `what` runs over `process_set`: need() returns the
    set's view there (for the global set, the context as it is). ValueError
    for an object that is not a registered ProcessSet, or when this rank is
    not in the set."""
    if process_set is None or process_set is global_process_set:
        return contextlib.nullcontext()
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set: a ProcessSet, got "
                         f"{type(process_set).__name__}")
    sid = process_set.process_set_id
    if sid == 0:
        return contextlib.nullcontext()
    registered = _sets.get(sid) if sid is not None else None
    if registered is None or registered.ranks != process_set.ranks:
        raise ValueError(f"{what}: process_set: {process_set} is not registered (pass it to "
                         f"init(process_sets=...) or add_process_set(); a removed set cannot "
                         f"be used)")
    ctx = _context.need()
    if registered._view is None or ctx.rank not in registered.ranks:
        raise ValueError(f"{what}: this process (rank {ctx.rank}) is not in process set {sid} "
                         f"(ranks {registered.ranks})")
    return _context.viewing(registered._view)


def takes_process_set(fn):
    """`fn` with Horovod's keyword `process_set=global_process_set`: run in
    that set's scope, with its `root_rank` (a global rank, as in Horovod)
    turned into the rank within the set. The gradient of an op with one
    runs over the same set (_context.keeps_view)."""
    sig = inspect.signature(fn)
    has_root = "root_rank" in sig.parameters
    what = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args, process_set=global_process_set, **kwargs):
        if process_set is None or process_set is global_process_set or (
                isinstance(process_set, ProcessSet) and process_set.process_set_id == 0):
            return fn(*args, **kwargs)
        with scope(process_set, what) as view:
            if has_root:
                bound = sig.bind(*args, **kwargs)
                root = bound.arguments.get("root_rank", sig.parameters["root_rank"].default)
                if isinstance(root, int) and not isinstance(root, bool):
                    if root not in view.ranks:
                        raise ValueError(f"{what}: root_rank {root} is not in process set "
                                         f"{process_set.process_set_id} (ranks {view.ranks}); "
                                         f"root_rank is a global rank")
                    bound.arguments["root_rank"] = view.ranks.index(root)
                args, kwargs = bound.args, bound.kwargs
            return fn(*args, **kwargs)
    return wrapper
