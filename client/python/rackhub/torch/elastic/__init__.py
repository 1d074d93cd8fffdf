"""rackhub.torch.elastic: Horovod's elastic training API on an elastic
rackhub tenant (docs/elastic.md, "Python"). A Horovod Elastic script runs
with its import and its launcher changed:

    import rackhub.torch as hvd
    hvd.init()
    model, opt = Net(), torch.optim.SGD(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                ...  # forward, backward, opt.step()
                state.commit()
            state.batch = 0

    state = hvd.elastic.TorchState(model, opt, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])
    train(state)
    # launch: rackhub-run -n 4 --min-np 2 --max-np 8 python3 train.py

run(func) calls func(state). When a member dies (the hub's WORKER_LOST,
raised as HorovodInternalError) or commit() finds that the step did not run
with the agreed membership, every member restores its last commit; when
commit() finds a new membership or ranks waiting to join, it raises
HostsUpdatedInterrupt after saving and every member keeps its state. Then
run resets (a membership round that also admits the joiners), calls the
state's reset callbacks, syncs (every member takes the state of the member
with the most commits) and calls func again.

ElasticSampler (sampler.py): Horovod's sampler of the indices not yet
processed this epoch, split over the current members; a TorchState keyword
argument (sampler=s) saves, restores and re-splits it.

rank() and size() in an elastic job: size() is the current member count;
rank() is this process's position among the members in the order of their
hub ranks (dense, 0..size()-1; it may change at a reset when a rank below
it leaves or joins). The hub rank the process connected with never
changes: members() lists the members' hub ranks, slot() is this one's.
"""
import functools

from ... import _core
from .. import _context
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from . import _session
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
           "HostsUpdatedInterrupt", "members", "generation", "slot", "resets"]


def _membership():
    ctx = _context.need()
    if ctx.elastic is None:
        raise RuntimeError("rackhub.torch.elastic: not an elastic job (rackhub-run --min-np/"
                           "--max-np, or rackhub.torch.init(max_size=...))")
    return ctx.elastic


def members():
    """The hub ranks of the current members, ascending."""
    return list(_membership().members)


def generation():
    """The hub's membership generation of the current members."""
    return _membership().generation


def slot():
    """This process's hub rank (fixed for its lifetime)."""
    _membership()
    return _context.need().rank


def resets():
    """How many resets this process went through."""
    return _membership().resets


def _reset(state):
    m = _membership()
    if isinstance(state, TorchState):
        state.pull_keys(again=False)
    _session.settle(_session.RESET, state._commits)
    m.resets += 1
    m.interrupted = False


def run(func):
    """Decorator: func(state, *args, **kwargs) runs until it returns; after a
    failure or a membership change the state is restored (failure) or kept
    (HostsUpdatedInterrupt), the members reset and sync, and func is called
    again. Other exceptions propagate, unless a collective of the step was
    pushed again in a new membership (its results may mix memberships): then
    they fail the step like HorovodInternalError."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        _membership()
        while True:
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except (HorovodInternalError, _core.WorkerLost, _core.RolledBack):
                state.restore()
            except HostsUpdatedInterrupt:
                pass
            except Exception:
                # What a collective whose rounds spanned a membership change
                # can cause (an object that does not unpickle, a tensor of
                # the old member count) fails the step like a lost member;
                # anything else propagates.
                if not _membership().interrupted:
                    raise
                state.restore()
            while True:  # a failure during the reset: reset again
                try:
                    _reset(state)
                    break
                except (HorovodInternalError, _core.WorkerLost, _core.RolledBack):
                    state.restore()
            state.on_reset()
    return wrapper
