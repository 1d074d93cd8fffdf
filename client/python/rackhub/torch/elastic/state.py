"""The states of an elastic job (Horovod's horovod.torch.elastic.State,
ObjectState, TorchState): what a rank commits, restores after a failure,
and what sync() gives every member (the state of the member with the most
commits, lowest rank first among equals).

commit() is also where a membership change is noticed (the membership
round, _session.py): it raises HorovodInternalError when the step since
the last commit did not run with the membership the members agreed on
(a member died or joined while it ran: every member restores the last
commit), and HostsUpdatedInterrupt after saving when the step is good but
the membership changed or joiners wait (every member keeps its state).

A TorchState whose DistributedOptimizer runs on the hub (hub_optimizer=
True) also keeps the hub in step (docs/elastic.md, "Hub optimizers"):
commit() and sync() tell the hub the commit (it copies every chunk of the
optimizer's keys), restore() rolls the hub's chunks back to that copy and
pulls the parameters.

Thread use: the main thread.
"""
import copy
import io
import time

import torch

from ... import _core
from .. import _context, rounds
from ..collectives import submit
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from ..handles import synchronize
from ..objects import allgather_object
from . import _session
from .sampler import ElasticSampler


def _elastic():
    ctx = _context.need()
    if ctx.elastic is None:
        raise RuntimeError("rackhub.torch.elastic: this process is not part of an elastic job "
                           "(start it with rackhub-run --min-np/--max-np, or pass "
                           "max_size to rackhub.torch.init)")
    return ctx


class State:
    """The base of the states: reset callbacks, commit, the host check."""

    def __init__(self):
        self._reset_callbacks = []
        self._commits = 0
        self._synced = False  # a sync completed (this process holds a commit of the members)
        self._pulled = False  # restore() pulled the hub's keys (TorchState: pull_keys)
        self._skipped = self._optimizer_skips()

    def register_reset_callbacks(self, callbacks):
        """Functions called (in order) after every reset, before the sync."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()

    def on_hosts_updated(self, timestamp=None, update_res=None):
        """Horovod's listener hook; the membership round replaces it here."""

    def commit(self):
        """Checks the step since the last commit with the other members,
        saves the state, and raises HostsUpdatedInterrupt when the
        membership changed (a collective: every member calls it)."""
        ok, changed = self._check()
        if not ok:
            raise HorovodInternalError(
                "rackhub.torch.elastic: the membership changed during the step; every member "
                "restores its last commit")
        self.save()
        self._commits += 1
        self._hub_commit()
        _elastic().elastic.interrupted = False
        if changed:
            raise HostsUpdatedInterrupt(False)

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt when the membership changed or ranks
        wait to join (a collective, like commit(), without the save)."""
        ok, changed = self._check()
        if not ok:
            raise HorovodInternalError("rackhub.torch.elastic: the membership changed during "
                                       "the step")
        if changed:
            raise HostsUpdatedInterrupt(False)

    def _check(self):
        self._pulled = False  # steps ran since any restore()
        ctx = _elastic()
        m = ctx.elastic
        skips = self._optimizer_skips()
        good = skips == self._skipped and not m.interrupted and all(
            g in (0, m.generation) for g in self._key_generations(ctx))
        self._skipped = skips
        # A member that finds its step bad says so in the round (COMMIT_BAD),
        # so every member decides alike (none commits while another rolls
        # the hub back: docs/elastic.md, "Hub optimizers").
        fields, gen = _session.one_round(_session.COMMIT if good else _session.COMMIT_BAD,
                                         self._commits)
        if {e[1] for e in fields.values()} != {_session.COMMIT}:
            good = False  # a member lost its step or found it bad: every member restores
        waiting = max(max(e[3], e[4]) for e in fields.values()) > m.handled
        return good, gen != m.generation or waiting

    def sync(self):
        """Every member gets the state of the member with the most commits
        (the lowest rank among equals); the commit counters agree after it."""
        ctx = _elastic()
        payload = self._serialize()
        fields = _session.settle(_session.SYNC, self._commits, len(payload))
        best = max(e[2] for e in fields.values())
        owner = min(s for s, e in fields.items() if e[2] == best)
        n = fields[owner][5]
        mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
            torch.zeros(0, dtype=torch.uint8)

        def run():
            buf = mine.clone() if ctx.rank == owner else torch.zeros(n, dtype=torch.uint8)
            return rounds.exchange(buf)
        got = synchronize(submit("elastic_sync", None, run))
        if ctx.rank != owner:
            self._deserialize(bytes(got.numpy().tobytes()))
        self._commits = best
        self.save()
        self._hub_commit()
        self._synced = True
        self._skipped = self._optimizer_skips()

    def _optimizer_skips(self):
        return 0

    def _hub_commit(self):
        """Tells the hub about the commit (TorchState of a hub-side
        optimizer: docs/elastic.md, "Hub optimizers")."""

    def _key_generations(self, ctx):
        return []

    def _serialize(self):
        raise NotImplementedError

    def _deserialize(self, data):
        raise NotImplementedError

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError


class ObjectState(State):
    """State of picklable attributes: ObjectState(epoch=0, batch=0) makes
    state.epoch and state.batch; commit() saves deep copies, restore()
    puts them back, sync() gives every member the owner's values."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._names = list(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._saved = {}
        super().__init__()
        self.save()

    def _values(self):
        return {k: getattr(self, k) for k in self._names}

    def save(self):
        self._saved = copy.deepcopy({k: getattr(self, k) for k in self._names})

    def restore(self):
        for k, v in copy.deepcopy(self._saved).items():
            setattr(self, k, v)

    def _serialize(self):
        buf = io.BytesIO()
        torch.save(self._values(), buf)
        return buf.getvalue()

    def _deserialize(self, data):
        for k, v in torch.load(io.BytesIO(data), weights_only=False).items():
            setattr(self, k, v)


class TorchState(ObjectState):
    """TorchState(model, optimizer, **kwargs): the model's and the
    optimizer's state dicts plus ObjectState's attributes. A rackhub
    DistributedOptimizer is checked at commit (a skipped step or a reply of
    another membership fails it) and its keys are pulled at each reset.
    A keyword argument that is an ElasticSampler (sampler=s) is kept by its
    state_dict(): saved at commit, restored after a failure; at a sync every
    member takes the union of the members' processed indices of the epoch
    and the sampler splits the rest over the new membership."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._model_saved = None
        self._opt_saved = None
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        self._samplers_saved = {}
        for k, v in self._samplers.items():
            setattr(self, k, v)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in self._samplers})

    def _engine(self):
        return getattr(self.optimizer, "_rackhub", None)

    def _hub_engine(self):
        eng = self._engine()
        return eng if eng is not None and eng.hub else None

    def _hub_commit(self):
        """A hub-side optimizer: the hub copies every key's chunks (their
        parameters, optimizer state and version) as commit number _commits.
        Every member sends it after the step's replies and before its next
        push (the hub copies each chunk once, at the version the members
        have)."""
        eng = self._hub_engine()
        if eng is not None:
            eng.c.wait(eng.c.commit_elastic(self._commits))

    def _hub_rollback(self):
        """After a failure: every key of a hub-side optimizer back to the
        hub's copy of commit _commits (chunks already there stay; every
        member asks alike), then its parameters pulled. A rollback that
        meets a recovery of the tenant (WORKER_LOST) is asked again once a
        Pull, held until the recovery ends, returns."""
        eng = self._hub_engine()
        if eng is None or not self._synced:
            # Before its first sync a process has no commit of its own (a
            # joiner's counter is not the members' yet): the members that
            # synced ask, and with none nothing has been stepped.
            return
        c = eng.c
        deadline = time.monotonic() + _elastic().op_timeout
        while True:
            try:
                c.wait(c.rollback_elastic(self._commits))
                break
            except _core.WorkerLost:
                if time.monotonic() > deadline:
                    raise
                s = eng.slots[0]
                c.wait(c.pull(s.key, torch.empty(s.param.shape, dtype=torch.float32).numpy()))
        self.pull_keys()
        self._pulled = True  # the reset that follows need not pull again

    def _optimizer_skips(self):
        eng = self._engine()
        return eng.skipped_steps if eng is not None else 0

    def _key_generations(self, ctx):
        eng = self._engine()
        if eng is None:
            return []
        return [ctx.client.key_info(s.key)["membership_generation"] for s in eng.slots]

    def pull_keys(self, again=True):
        """After a reset: Pull every key of the DistributedOptimizer (clears
        the hub's resync marks of an aborted step; hub-side optimizers: the
        parameters are the hub's). again=False: not when the rollback of
        restore() pulled them and nothing was pushed since."""
        eng = self._engine()
        pulled, self._pulled = self._pulled, False
        if eng is None or (pulled and not again):
            return
        for s in eng.slots:
            s.ticket = None
            s.passes = 0
            s.sent = None
        if eng.hub:
            eng.pull_into_params(eng.slots)
            return
        c = eng.c
        bufs = [torch.empty(s.param.shape, dtype=torch.float32) for s in eng.slots]
        for t in [c.pull(s.key, b.numpy()) for s, b in zip(eng.slots, bufs)]:
            c.wait(t)

    def _values(self):
        v = super()._values()
        if self.model is not None:
            v["__model"] = self.model.state_dict()
        if self.optimizer is not None:
            v["__optimizer"] = self.optimizer.state_dict()
        for k, sampler in self._samplers.items():
            v[f"__sampler/{k}"] = sampler.state_dict()
        return v

    def save(self):
        super().save()
        if self.model is not None:
            self._model_saved = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._opt_saved = copy.deepcopy(self.optimizer.state_dict())
        self._samplers_saved = {k: s.state_dict() for k, s in self._samplers.items()}

    def restore(self):
        super().restore()
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._opt_saved is not None:
            self.optimizer.load_state_dict(self._opt_saved)
        for k, saved in self._samplers_saved.items():
            self._samplers[k].load_state_dict(saved)
        self._hub_rollback()

    def sync(self):
        """State.sync(), then every sampler takes the union of the members'
        processed indices of its epoch (indices a member recorded with
        record_indices) and splits the rest over the members."""
        mine = {k: (s.epoch, s.processed_indices) for k, s in self._samplers.items()}
        super().sync()
        if not self._samplers:
            return
        every = allgather_object(mine)
        for k, sampler in self._samplers.items():
            for theirs in every:
                epoch, done = theirs.get(k, (None, ()))
                if epoch == sampler.epoch:
                    sampler.processed_indices |= set(done)
            sampler.reset()
        self.save()

    def _deserialize(self, data):
        got = torch.load(io.BytesIO(data), weights_only=False)
        model, opt = got.pop("__model", None), got.pop("__optimizer", None)
        for k, sampler in self._samplers.items():
            saved = got.pop(f"__sampler/{k}", None)
            if saved is not None:
                sampler.load_state_dict(saved)
        for k, v in got.items():
            setattr(self, k, v)
        if model is not None and self.model is not None:
            self.model.load_state_dict(model)
        if opt is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(opt)
