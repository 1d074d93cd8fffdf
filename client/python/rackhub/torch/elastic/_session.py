"""The membership protocol of an elastic job (docs/elastic.md, "Python").

Ranks are slots: a process keeps the hub rank it connected with (0 ..
max_size-1, the launcher gives the lowest free one) and the hub never
renumbers them. Horovod's dense rank() is the position of the slot among
the current members (ascending), size() their count.

The membership round: every member pushes FIELDS int64s at its own place
of one small sum-only key (`__rackhub/elastic/membership/<slots>`, as
16-bit halves in fp32, so the hub's sum over the members reproduces every
member's fields bit for bit; absent slots read as zeros):

  present (1), phase, commit counter, epoch handled, epoch seen, state bytes

The reply also names the membership generation and member count of the
update (Client.key_info), checked against the present fields. The key is
one chunk (launcher tenants have 1 MiB chunks), so a round that a
membership barrier aborts is retried whole (WORKER_LOST: Pull, push again).

Phases keep the members in step: 1 a commit, 2 the reset after a failure
or a membership change, 3 the sync that follows. settle(p) repeats its
round until every member is in phase p with the same handled epoch; a
member behind (lower phase) makes the others repeat, a member ahead makes
this one move on. A commit that meets a member in another phase fails
(that member lost its step: everyone restores); so does one that meets a
member in phase 0, a commit round of a member that found its step bad
(its optimizer skipped a step, it was interrupted, a key's reply named
another membership generation): every member decides alike.

Joins are gated (the launcher, rackhub/run.py, writes these files in
RACKHUB_ELASTIC_DIR): the launcher bumps `epoch` and lists the ranks it
starts in `joiners-E`; the members see the epoch in a round, park (write
`ready-E`, wait for `connected-E-R` of every joiner or `gone-E-R` of one
that exited), and round again with the joiners. A joiner of epoch E
connects only once `ready-E` exists, so its connection never lands while
the members are inside a step that would then wait for it.

Thread use: the main thread; the rounds run on the executor's thread.
"""
import os
import time

import torch

from ... import _core
from .. import _context, rounds
from ..collectives import submit
from ..errors import HorovodInternalError
from ..handles import synchronize

FIELDS = 6
_HALVES = FIELDS * 4
COMMIT, RESET, SYNC = 1, 2, 3
COMMIT_BAD = 0  # a commit round of a member whose step was bad (below every phase)
_POLL = 0.02  # seconds between looks at the launcher's files


class Membership:
    """The elastic state of the context (_context.Context.elastic)."""

    def __init__(self, slots, control_dir, epoch):
        self.slots = slots
        self.dir = control_dir or None
        self.handled = epoch
        self.members = []
        self.generation = 0
        self.resets = 0
        # A collective's round was pushed again in, or answered by, another
        # membership than `generation` since the last commit or reset
        # (rounds.push_pull): the step's results may mix memberships, so the
        # step fails at commit, and an error they cause fails it at once
        # (run).
        self.interrupted = False

    def dense_rank(self, slot):
        return self.members.index(slot) if slot in self.members else slot

    def size(self):
        return len(self.members) if self.members else self.slots

    def slot_of(self, dense):
        if 0 <= dense < len(self.members):
            return self.members[dense]
        return f"{dense} (the job has {len(self.members)} members)"

    # ---- the launcher's files -------------------------------------------
    def _path(self, name):
        return os.path.join(self.dir, name)

    def seen_epoch(self):
        if self.dir is None:
            return self.handled
        try:
            with open(self._path("epoch")) as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError as e:
            raise HorovodInternalError(f"rackhub.torch.elastic: {self._path('epoch')}: not an "
                                       f"integer ({e})") from None

    def touch(self, name):
        tmp = self._path(f".{name}.{os.getpid()}")
        with open(tmp, "w"):
            pass
        os.replace(tmp, self._path(name))

    def wait_files(self, what, ready, timeout):
        """Polls until ready() is true; HorovodInternalError after timeout."""
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise HorovodInternalError(f"rackhub.torch.elastic: {what} within {timeout:g} s "
                                           f"(launcher directory {self.dir})")
            time.sleep(_POLL)

    def park(self, target, timeout):
        """Waits for the joiners of epochs (handled, target] to connect."""
        for e in range(self.handled + 1, target + 1):
            if self.dir is None:
                continue
            self.touch(f"ready-{e}")
            try:
                with open(self._path(f"joiners-{e}")) as f:
                    ranks = [int(x) for x in f.read().split()]
            except FileNotFoundError:
                ranks = []

            def done():
                return all(os.path.exists(self._path(f"connected-{e}-{r}")) or
                           os.path.exists(self._path(f"gone-{e}-{r}")) for r in ranks)
            self.wait_files(f"the joiners {ranks} of epoch {e} did not connect", done, timeout)
        self.handled = max(self.handled, target)


def gate(control_dir, epoch, timeout):
    """A joiner of `epoch` (> 0) waits for the members to park."""
    if not control_dir or epoch <= 0:
        return
    m = Membership(0, control_dir, epoch)
    m.wait_files(f"the members did not get ready for the joiners of epoch {epoch}",
                 lambda: os.path.exists(m._path(f"ready-{epoch}")), timeout)


def connected(control_dir, epoch, slot):
    """Tells the launcher this process connected (epoch 0 too: host
    discovery shrinks nothing before the start quorum connected)."""
    if control_dir and epoch >= 0:
        Membership(0, control_dir, epoch).touch(f"connected-{epoch}-{slot}")


def _key(ctx):
    n = ctx.size * _HALVES
    k = ("elastic", n)
    if k not in ctx.keys:
        ctx.keys[k] = ctx.client.declare_key(f"__rackhub/elastic/membership/{ctx.size}", n,
                                             "fp32", {"type": "sum-only", "reduction": "sum"},
                                             False)
    return ctx.keys[k], n


def _round_run(ctx, phase, counter, length):
    """One membership round (retried after WORKER_LOST/ROLLED_BACK until the
    op timeout): returns ({slot: fields}, generation)."""
    m = ctx.elastic
    k, n = _key(ctx)
    c = ctx.client
    deadline = time.monotonic() + ctx.op_timeout
    while True:
        src = torch.zeros(n, dtype=torch.float32)
        mine = torch.tensor([1, phase, counter, m.handled, m.seen_epoch(), length],
                            dtype=torch.int64)
        src[ctx.rank * _HALVES:(ctx.rank + 1) * _HALVES] = mine.view(torch.int16).to(
            torch.float32)
        dst = torch.empty(n, dtype=torch.float32)
        try:
            c.wait(c.push_pull(k, src.numpy(), dst.numpy()))
            break
        except (_core.WorkerLost, _core.RolledBack):
            # The membership changed (or the tenant is paused): the Pull
            # returns once the hub committed the new one; push again.
            c.wait(c.pull(k, torch.empty(n, dtype=torch.float32).numpy()))
            if time.monotonic() > deadline:
                raise
    every = dst.to(torch.int16).view(torch.int64).view(ctx.size, FIELDS).tolist()
    fields = {s: e for s, e in enumerate(every) if e[0] == 1}
    info = c.key_info(k)
    if ctx.rank not in fields or info["members"] != len(fields):
        raise HorovodInternalError(
            f"rackhub.torch.elastic: the membership round names slots {sorted(fields)} but the "
            f"hub counted {info['members']} member(s) (generation "
            f"{info['membership_generation']}); is the tenant elastic?")
    return fields, info["membership_generation"]


def one_round(phase, counter=0, length=0):
    ctx = _context.need()
    return synchronize(submit("elastic_membership", None,
                              lambda: _round_run(ctx, phase, counter, length)))


def settle(phase, counter=0, length=0):
    """Rounds until every member is in `phase` with the same handled epoch
    (or a member is ahead); installs the membership; returns the last
    round's fields by slot."""
    ctx = _context.need()
    m = ctx.elastic
    while True:
        fields, gen = one_round(phase, counter, length)
        target = max(max(e[3], e[4]) for e in fields.values())
        if m.handled < target:
            m.park(target, ctx.op_timeout)
        phases = {e[1] for e in fields.values()}
        handled = {e[3] for e in fields.values()}
        if max(phases) > phase or (phases == {phase} and handled == {target}):
            m.members = sorted(fields)
            m.generation = gen
            return fields
