"""The engine behind DistributedOptimizer (optimizer.py, whose docstring is
the user's manual): one _Slot per parameter (its key, its pending ticket,
the host tensors the ticket reads and writes) and _Sync, which declares the
keys, loads their initial values, registers the AccumulateGrad hooks, pushes
the gradients, waits for the replies and recovers a step that failed
(resync after RolledBack / WorkerLost; push again in an elastic job).

Ownership: the optimizer object owns its _Sync (a weak reference back); the
_Sync owns its slots and hooks and removes the hooks when it goes.
Thread use: the training loop's thread (hooks run in autograd's thread for
CPU backward, which is the caller's).
"""
import logging
import time
import weakref

import numpy
import torch

from . import _context, agree, exact
from .._core import ROLLBACK_REFUSAL, RackhubError, RolledBack, WorkerLost
from .collectives import submit
from .errors import MismatchError
from .handles import synchronize as wait_op
from .embedding import DEFAULT_INIT, Tables, table_spec_of_group, tables_of
from .compression import compression_of
from .hub_specs import reduction_of, spec_of_group
from .recovery import again_after_recovery

_log = logging.getLogger("rackhub.torch")


def rolled_back(e):
    """A WorkerLost from a ROLLBACK of the tenant (an elastic member restored
    the commit, docs/elastic.md "Hub optimizers"): the step is not pushed
    again, this rank restores the commit too."""
    return ROLLBACK_REFUSAL in str(e)


def _np(t):
    return t.detach().numpy()


def _plain(t):
    """True if the library can read/write `t`'s memory directly."""
    return (t is not None and t.dtype == torch.float32 and t.device.type == "cpu"
            and t.layout == torch.strided and t.is_contiguous())


def _check_device(name, t):
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"parameter '{name}': tensors on {t.device} are not supported "
                        f"(CPU, or CUDA staged through pinned host memory)")


def key_name(prefix, name, spec, topk_ratio=0.0):
    """A parameter's key: its name, the optimizer's type, the reduction and,
    for top-k compression, the ratio (`fc.weight:sum-only:mean:topk0.01`):
    a later job with another mode, op or top-k ratio gets other keys instead
    of keys that would do something else; one with the same resumes them.
    Error feedback is not in the name: it lives on the worker, the hub's key
    is the same either way."""
    topk = f":topk{topk_ratio!r}" if topk_ratio else ""
    return f"{prefix}{name}:{spec['type']}:{spec['reduction']}{topk}"


class _Slot:
    """One parameter: its key, its pending ticket and the host tensors the
    ticket reads and writes."""
    __slots__ = ("name", "param", "key", "key_type", "spec", "spec_ticket", "spare", "stage",
                 "ticket", "sent", "passes")

    def __init__(self, name, param, key, spec, key_type):
        self.name = name
        self.param = param
        self.key = key
        self.key_type = key_type  # the optimizer type in the key's name
        self.spec = spec        # the hub spec last sent for this key (hub-side mode)
        self.spec_ticket = None  # its SetOptimizer, waited in synchronize()
        pinned = param.device.type == "cuda"
        self.spare = torch.empty(param.shape, dtype=torch.float32, pin_memory=pinned)
        self.stage = None       # host fp32 copy of a gradient that is not plain
        self.ticket = None
        self.sent = None
        self.passes = 0

    def lease(self, c, spare):
        """Puts the gradient (and, with `spare`, the reply buffer: the local
        mode swaps the two every step) in memory leased to the hub
        (Client.lease); autograd then accumulates into it in place. Only for
        float32 CPU parameters; True if done."""
        p = self.param
        if p.device.type != "cpu" or p.dtype != torch.float32 or p.numel() == 0:
            return False
        grad = torch.from_numpy(numpy.asarray(c.lease(self.key))).view(p.shape)
        if p.grad is not None:
            grad.copy_(p.grad)
        p.grad = grad
        if spare:
            self.spare = torch.from_numpy(numpy.asarray(c.lease(self.key))).view(p.shape)
        return True

    def host_grad(self):
        """The gradient as a contiguous fp32 CPU tensor (a staged copy if it
        is not one already)."""
        g = self.param.grad
        if g is None:
            return torch.zeros(self.param.shape, dtype=torch.float32)
        if g.is_sparse:
            g = g.to_dense()
        if _plain(g):
            return g
        if self.stage is None:
            self.stage = torch.empty(self.param.shape, dtype=torch.float32,
                                     pin_memory=g.device.type == "cuda")
        self.stage.copy_(g.detach().reshape(self.param.shape))
        return self.stage


class _Sync:
    """The engine behind the optimizer: slots, hooks, pushes, waits."""

    def __init__(self, opt, named, compression, passes, op, hub, prefix, reply, on_rollback,
                 embeddings=None, embedding_init=DEFAULT_INIT, embedding_coalesce=True,
                 zero_copy=False):
        ctx = _context.need()
        if on_rollback not in ("resync", "raise"):
            raise ValueError("on_rollback: 'resync' or 'raise'")
        if reply not in ("swap", "copy"):
            raise ValueError("reply: 'swap' or 'copy'")
        if int(passes) < 1:
            raise ValueError(f"backward_passes_per_step: {passes} is not >= 1")
        self.ctx = ctx
        self.c = ctx.client
        # Weak: the optimizer owns this engine; when the user drops the
        # optimizer, the engine goes too and takes its hooks off the model.
        self._opt = weakref.ref(opt)
        self.hub = hub
        self.reply = reply
        self.on_rollback = on_rollback
        self.passes = int(passes)
        self.reduction = reduction_of(op)
        self.compression = compression_of(compression)
        self.dtype = self.compression.wire  # top-k: fp32 values (tables: fp32 rows)
        self.synchronized = False
        self.skip_step = False
        self.skipped_steps = 0
        self.lost_streak = 0
        group_of = self.groups()
        if named is None:
            named = [(f"param.{gi}.{pi}", p) for gi, g in enumerate(opt.param_groups)
                     for pi, p in enumerate(g["params"])]
        else:
            named = list(named)
            if named and not (isinstance(named[0], tuple) and len(named[0]) == 2):
                raise TypeError("named_parameters: an iterable of (name, parameter), "
                                "e.g. model.named_parameters()")
        # Embedding tables (embedding.py): row-sparse keys, not dense slots.
        self.tables = None
        if embeddings is not None and ctx.participants:
            raise ValueError("embeddings: embedding tables sum every rank's rows; they cannot "
                             "be reduced over a process set (process_set=)")
        if embeddings is not None:
            pairs = tables_of(embeddings, {id(p): n for n, p in named})
            self.tables = Tables(self.c, opt, group_of, pairs, prefix, self.reduction,
                                 self.dtype, embedding_init, embedding_coalesce)
        table_ids = self.tables.weights() if self.tables else set()
        self.slots = []
        seen = set()
        for name, p in named:
            if not p.requires_grad or id(p) in table_ids:
                continue
            if name in seen:
                raise ValueError(f"named_parameters: duplicate name '{name}'")
            seen.add(name)
            if p not in group_of:
                raise ValueError(f"named_parameters: '{name}' is not a parameter of the "
                                 f"optimizer")
            _check_device(name, p)
            spec = spec_of_group(opt, group_of[p]) if hub else {"type": "sum-only"}
            spec = dict(spec, reduction=self.reduction)
            comp = self.compression
            # Over a process set (ctx is its view): keys of the set's own,
            # reduced over its ranks (process_sets.py).
            extra = {"participants": ctx.participants} if ctx.participants else {}
            key = self.c.declare_key(key_name(ctx.key_tag + prefix, name, spec,
                                              comp.topk_ratio), p.numel(),
                                     self.dtype, spec, hub, topk_ratio=comp.topk_ratio,
                                     error_feedback=comp.error_feedback, **extra)
            # Hub-side: the first push of every key sends the group's spec
            # (an existing key keeps the optimizer it was declared with).
            self.slots.append(_Slot(name, p, key, None if hub else spec, spec["type"]))
        # The join id: a digest of the key names (the same optimizer over the
        # same parameters on every rank has the same one).
        self.join_id = agree.crc(tuple(sorted(self.c.key_info(s.key)["name"]
                                              for s in self.slots)))
        ctx.optimizers[self.join_id] = weakref.ref(self)
        names = {id(s.param) for s in self.slots} | table_ids
        unnamed = [p for p in group_of if p.requires_grad and id(p) not in names]
        if unnamed:
            raise ValueError(f"named_parameters: {len(unnamed)} parameter(s) of the optimizer "
                             f"have no name (pass every parameter the optimizer holds)")
        if hub:
            self.load_initial()
        # Zero copy (shared memory, float32 on the wire): gradients in leased
        # memory the hub reads in place.
        self.leased = 0
        if zero_copy and self.c.transport == "shm" and self.dtype == "fp32" and \
                not self.compression.topk_ratio:
            self.leased = sum(s.lease(self.c, spare=not hub) for s in self.slots)
        self.grad_accs = []
        self.hooks = []
        for slot in self.slots:
            self.register_hook(slot)

    @property
    def opt(self):
        return self._opt()

    def groups(self):
        """parameter -> its param group, now (load_state_dict replaces the
        group dicts)."""
        ids = [id(g) for g in self.opt.param_groups]
        if ids != getattr(self, "_group_ids", None):
            self._group_ids = ids
            self._group_of = {p: g for g in self.opt.param_groups for p in g["params"]}
        return self._group_of

    # -- set-up --------------------------------------------------------------

    def load_initial(self):
        """Rank 0 supplies the keys' initial values, the others pull them;
        keys that already hold values are pulled by every rank (resume)."""
        c = self.c
        resumed = []
        if self.ctx.rank == 0:
            tickets = [(s, c.init(s.key, _np(self.host_param(s)))) for s in self.slots]
            for s, t in tickets:
                try:
                    c.wait(t)
                except RackhubError as e:
                    if e.wire != "INVALID_ARGUMENT" or "already initialized" not in str(e):
                        raise
                    resumed.append(s)
            if resumed:
                _log.warning("rackhub: %d of %d key(s) already hold values on the hub (an "
                             "earlier run of this job): training resumes from them",
                             len(resumed), len(self.slots))
        self.pull_into_params(self.slots if self.ctx.rank else resumed)

    def host_param(self, s):
        p = s.param.data
        return p if _plain(p) else p.detach().to(device="cpu", dtype=torch.float32).contiguous()

    def pull_into_params(self, slots):
        c = self.c
        tickets = []
        for s in slots:
            dst = s.param.data if _plain(s.param.data) else torch.empty(s.param.shape,
                                                                          dtype=torch.float32)
            tickets.append((s, c.pull(s.key, _np(dst)), dst))
        with torch.no_grad():
            for s, t, dst in tickets:
                c.wait(t)
                if dst is not s.param.data:
                    s.param.data.copy_(dst)

    def register_hook(self, slot):
        p = slot.param
        # The AccumulateGrad node of p: its hook runs once backward has summed
        # every contribution to p's gradient into p.grad. Keep a reference:
        # autograd holds it only weakly.
        with torch.enable_grad():
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
        me = weakref.ref(self)  # the node must not keep this optimizer alive

        def hook(*_):
            sync = me()
            if sync is None:
                return
            slot.passes += 1
            if slot.passes >= sync.passes:
                sync.push(slot)

        self.hooks.append(acc.register_hook(hook))
        self.grad_accs.append(acc)

    def __del__(self):
        # A later DistributedOptimizer over the same parameters must not see
        # this one's hooks.
        for h in getattr(self, "hooks", []):
            h.remove()
        if getattr(self, "tables", None) is not None:
            self.tables.remove_hooks()

    # -- data path -----------------------------------------------------------

    def push(self, slot):
        if slot.ticket is not None:
            raise RuntimeError(
                f"rackhub: gradient of '{slot.name}' produced again before step(); "
                f"call step() after each backward (or set backward_passes_per_step)")
        c = self.c
        if self.hub:
            group = self.groups()[slot.param]
            spec = dict(spec_of_group(self.opt, group), reduction=self.reduction)
            if spec != slot.spec:  # an LR scheduler or load_state_dict changed the group
                if spec["type"] != slot.key_type:
                    raise ValueError(f"parameter '{slot.name}': the optimizer's type changed "
                                     f"from {slot.key_type} to {spec['type']}; the hub keeps "
                                     f"a key's type (use a new DistributedOptimizer)")
                slot.spec_ticket = c.set_optimizer(slot.key, spec,
                                                   c.key_info(slot.key)["next_iteration"])
                slot.spec = spec
        self.synchronized = False
        g = slot.host_grad()
        slot.sent = g
        slot.ticket = c.push_pull(slot.key, _np(g), _np(slot.spare))

    def synchronize(self):
        if self.synchronized:
            return
        for s in self.slots:
            if s.ticket is None:
                self.push(s)
        joined = self.step_round()
        tables = self.tables
        if joined and tables is not None:
            for s in self.slots:  # the joined ranks pushed zeros for these
                t, s.ticket = s.ticket, None
                s.passes = 0
                self.c.wait(t)
            raise MismatchError(f"DistributedOptimizer: rank(s) {joined} called join(); an "
                                f"optimizer with embedding tables cannot step while a rank is "
                                f"joined (its dense keys were reduced, its tables were not)")
        if tables is not None:
            try:  # every table's push in flight at once, with the dense ones
                tables.push_all(self.table_spec)
            except BaseException:
                tables.wait_all(Exception)
                raise
        rolled = []
        try:
            for s in self.slots:
                if s.spec_ticket is not None:  # a refused hyperparameter change raises here
                    t, s.spec_ticket = s.spec_ticket, None
                    self.c.wait(t)
            for s in self.slots:
                t, s.ticket = s.ticket, None
                try:
                    self.c.wait(t)
                except WorkerLost as e:
                    if self.ctx.elastic is None or s.sent is None:
                        rolled.append((s, e))  # wait for the others first
                    elif rolled_back(e):
                        # A member restored the commit: so does this rank (the
                        # elastic run catches it), the rest of its pushes are
                        # forgotten (its ROLLBACK fails them on the hub).
                        raise
                    else:
                        self.push_again(s)
                except RolledBack as e:
                    rolled.append((s, e))
        finally:
            for s in self.slots:
                s.passes = 0
                if s.ticket is not None:  # a wait raised: forget the rest
                    s.ticket = None
            if tables is not None:  # waited even when a dense wait raised
                rolled += tables.wait_all((RolledBack, WorkerLost))
        if rolled:
            for s in self.slots:
                s.sent = None
            if tables is not None:
                tables.drop_step()
            if self.on_rollback == "raise":
                raise rolled[0][1]
            self.resync(rolled)
            self.synchronized = True
            return
        self.lost_streak = 0
        with torch.no_grad():
            for s in self.slots:
                self.take_reply(s)
                s.sent = None
        if tables is not None:
            tables.take_replies()
        self.synchronized = True

    def push_again(self, s):
        """An elastic job (rackhub.torch.elastic): after WORKER_LOST, Pull the
        key (it returns once the hub committed the new membership) and push
        the same gradient again, until it completes (the client contract of
        docs/elastic.md; the commit then sees the reply's new generation)."""
        c = self.c
        n = s.param.numel()
        c.wait(c.pull(s.key, _np(torch.empty(n, dtype=torch.float32))))
        again_after_recovery(c, lambda: c.wait(c.push_pull(s.key, _np(s.sent), _np(s.spare))),
                             s.key, n, self.ctx.op_timeout, WorkerLost, give_up=rolled_back)

    def step_round(self):
        """The step's header round (join(), above): returns the ranks that
        are joined. Raises MismatchError on every rank when the ranks step
        different optimizers or run another collective at this point."""
        if self.ctx.size == 1:
            return []

        # The op must not hold this engine (the executor may keep it a while;
        # the engine goes with its optimizer).
        fields = [self.join_id, len(self.slots), int(self.tables is not None)]

        def run():
            every, _ = agree.open_op("optimizer_step", None, fields, joinable=True)
            agree.same("optimizer_step", every, 0,
                       "optimizers (DistributedOptimizer over other parameters or key names)",
                       mine=f"join id {fields[0]}")
            return [r for r, e in enumerate(every) if e is None]

        try:
            # Submitted under the optimizer's process set (its view), if any.
            view = self.ctx if isinstance(self.ctx, _context.SetView) else None
            with _context.viewing(view):
                handle = submit("optimizer_step", None, run)
            return wait_op(handle)
        except BaseException:
            for s in self.slots:  # their pushes cannot be matched: forget them
                s.ticket = None
                s.passes = 0
            raise

    def push_zeros(self):
        """A joined rank's part in the others' step: -0.0 (nothing, the
        identity of IEEE addition) to every key (join.py). The replies are
        dropped: a joined rank's model is not updated (as in Horovod)."""
        c = self.c
        if any(s.ticket is not None for s in self.slots):
            raise RuntimeError("rackhub: join() while this rank's DistributedOptimizer has "
                               "gradients in flight; call step() before join()")
        zeros = [torch.full(s.param.shape, exact.NOTHING, dtype=torch.float32)
                 for s in self.slots]
        tickets = [c.push_pull(s.key, _np(z), _np(s.spare)) for s, z in zip(self.slots, zeros)]
        for t in tickets:
            c.wait(t)

    def table_spec(self, t):
        """The hub spec of table `t`'s param group now."""
        return dict(table_spec_of_group(self.opt, self.groups()[t.weight]),
                    reduction=self.reduction)

    def take_reply(self, s):
        """The reply (in s.spare) becomes the parameter (hub-side) or the
        gradient (local optimizer)."""
        p = s.param
        current = p.data if self.hub else p.grad
        if self.reply == "swap" and _plain(p.data) and (current is None or _plain(current)):
            if self.hub:
                p.data = s.spare
            else:
                p.grad = s.spare
            if current is not None and current.shape == p.shape:
                s.spare = current
            elif _plain(s.sent) and s.sent.shape == p.shape and s.sent is not p.grad \
                    and s.sent is not s.stage:
                s.spare = s.sent
            else:
                s.spare = torch.empty(p.shape, dtype=torch.float32)
        elif current is None:
            p.grad = s.spare.to(device=p.device, dtype=p.dtype, copy=True)
        else:
            current.copy_(s.spare.view(current.shape), non_blocking=True)

    def resync(self, rolled):
        """After RolledBack / WorkerLost: every key's values from the hub
        (into the parameters in hub-side mode; sum-only keys are pulled into
        scratch tensors, which clears their resync marks); the step is
        skipped."""
        c = self.c
        first = rolled[0][1]
        lost = any(isinstance(e, WorkerLost) for _, e in rolled)
        _log.warning("rackhub: step skipped, resynchronizing %d key(s) with the hub after %s "
                     "(%s); %d key(s) affected", len(self.slots), type(first).__name__,
                     first, len(rolled))
        if lost and self.ctx.elastic is None:
            # Pushes fail with WORKER_LOST until the lost rank is back (an
            # elastic job goes on without it: rackhub.torch.elastic).
            self.lost_streak += 1
            time.sleep(min(0.05 * (2 ** min(self.lost_streak, 5)), 1.0))
        if self.hub and self.ctx.rank == 0 and any(
                isinstance(e, RolledBack) and e.iteration == 0 for _, e in rolled):
            # A hub restarted without a checkpoint has the keys but maybe not
            # their values (the ranks > 0 would wait for rank 0's INIT):
            # supply them again; "already initialized" is fine.
            for s in self.slots:
                try:
                    c.wait(c.init(s.key, _np(self.host_param(s))))
                except RackhubError as e:
                    if e.wire != "INVALID_ARGUMENT":
                        raise
        if self.hub:
            self.pull_into_params(self.slots)
        else:
            scratch = [(torch.empty(s.param.shape, dtype=torch.float32), s) for s in self.slots]
            for t in [c.pull(s.key, _np(buf)) for buf, s in scratch]:
                c.wait(t)
        self.skip_step = True
        self.skipped_steps += 1
