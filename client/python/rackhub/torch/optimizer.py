"""DistributedOptimizer: data-parallel training through the hub (Horovod's
and BytePS's interface).

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = rh.DistributedOptimizer(opt, named_parameters=model.named_parameters())

The returned object is an instance of a subclass of the optimizer's class
(as Horovod does), so it IS a torch.optim.Optimizer: param_groups,
state_dict, load_state_dict and LR schedulers work on it.

Two modes:
- Local optimizer (default, Horovod's meaning): the hub averages (op=Average)
  or sums (op=Sum) the gradients in rank order, `.grad` takes the result and
  the wrapped optimizer steps on every rank.
- Hub-side optimizer (hub_optimizer=True, or a spec such as rh.SGD(lr=0.1)
  in place of a torch optimizer): the hub keeps the master parameters and
  the optimizer state and applies the update fused with the sum; every rank
  receives the updated parameters. SGD (momentum, Nesterov, weight decay),
  Adam, AdamW and Adagrad run there. A change of a group's `lr` (or another
  hyperparameter: an LR scheduler, load_state_dict) reaches the hub exactly
  from the next step (a SetOptimizer from the key's next iteration, sent on
  the first push after the change). The hub's values are initialized from
  rank 0's parameters when its keys are new; when they already hold values
  (the tenant's keys from an earlier run of the job) every rank loads them:
  the job resumes where the hub is.

How a step works:
- Every parameter is one key of the tenant, named `prefix + name` plus the
  optimizer's type and the reduction (`fc.weight:sum-only:mean`,
  `fc.weight:momentum:mean`). A hook on
  the parameter's AccumulateGrad node fires as soon as backward produced the
  gradient (after backward_passes_per_step passes) and starts its PushPull at
  once, so communication overlaps the rest of backward.
- Zero-copy for contiguous fp32 CPU tensors: the PushPull sends from `.grad`
  and receives into a spare tensor; over shared memory with zero_copy=True
  (off by default) `.grad` and the spare live in memory leased to the hub
  (Client.lease), so the hub reduces straight from the gradients autograd
  wrote, with no copy into the ring (a zero_grad(set_to_none=True) drops
  the leased gradients: later steps copy); step() then swaps storages
  (reply="swap", default; reply="copy" copies into the existing storage, use
  it if you keep references to `p.data` or `p.grad`). fp16/bf16/fp64
  parameters are converted to fp32 for the wire and back; CUDA tensors are
  staged through pinned host memory.
- compression=Compression.topk(ratio) (or "topk:RATIO"): the keys are
  declared with that top-k ratio and the library sends each chunk's largest
  entries only, keeping the rest in a residual on this worker (error
  feedback; "topk:RATIO:noef" drops it); the reply is dense as always.
- The reply never lands in the model while backward runs: step() waits for
  every ticket first. Do not modify `.grad` between backward and step(). To
  clip gradients in local mode: opt.synchronize(), clip, then
  `with opt.skip_synchronize(): opt.step()`.
- join(): every synchronize() (so every step) opens with a header round
  (agree.py, kind "optimizer_step", carrying the optimizer's join id: a
  digest of its key names) after the step's pushes are out. A rank that
  called join() sees it and pushes zeros to every key of its optimizer with
  the same join id (push_zeros), so the others' step completes with the
  joined ranks counted as zeros (Average divides by size(), as Horovod
  does). Embedding tables cannot step while a rank is joined: the active
  ranks wait for the dense keys, then raise MismatchError.
- Failures raise rackhub.RackhubError from step()/synchronize(); nothing
  waits forever. A step whose PushPull raised RolledBack (a restarted hub
  reloaded an older checkpoint) or WorkerLost (another rank died) is, with
  on_rollback="resync" (default), skipped after pulling the hub's values
  (step() returns None, `skipped_steps` counts them); with "raise" the
  exception propagates.

Embedding tables (embeddings=[nn.Embedding(..., sparse=True), ...]) are
row-sparse keys whose optimizer runs on the hub; their sparse gradients are
pushed at step() and the updated rows come back (embedding.py's docstring).

Thread use: the training loop's thread (hooks run in autograd's thread for
CPU backward, which is the caller's).
"""
import contextlib
import logging
import time
import weakref

import numpy
import torch

from . import _context, agree, exact, process_sets
from .._core import ROLLBACK_REFUSAL, RackhubError, RolledBack, WorkerLost
from .collectives import submit
from .errors import MismatchError
from .handles import synchronize as wait_op
from .embedding import DEFAULT_INIT, Tables, table_spec_of_group, tables_of
from .compression import Compression, compression_of
from .hub_specs import Average, HubOptimizer, reduction_of, spec_of_group

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
        deadline = time.monotonic() + self.ctx.op_timeout
        while True:
            c.wait(c.pull(s.key, _np(torch.empty(s.param.shape, dtype=torch.float32))))
            try:
                c.wait(c.push_pull(s.key, _np(s.sent), _np(s.spare)))
                return
            except WorkerLost as e:
                if rolled_back(e) or time.monotonic() >= deadline:
                    raise

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


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods of the returned optimizer (copied into a subclass of the
    wrapped optimizer's class by DistributedOptimizer())."""

    def __init__(self, params, base, named_parameters, compression, backward_passes_per_step,
                 op, hub, prefix, reply, on_rollback, embeddings, embedding_init,
                 embedding_coalesce, zero_copy):
        super(self.__class__, self).__init__(params)
        for p, st in base.state.items():  # e.g. loaded from a checkpoint before wrapping
            self.state[p] = st
        self._rackhub = _Sync(self, named_parameters, compression, backward_passes_per_step, op,
                              hub, prefix, reply, on_rollback, embeddings, embedding_init,
                              embedding_coalesce, zero_copy)
        self._rackhub_sync_next_step = True

    @property
    def hub_optimizer(self):
        """True if the hub runs the optimizer (the parameters come from it)."""
        return self._rackhub.hub

    @property
    def skipped_steps(self):
        return self._rackhub.skipped_steps

    @property
    def transport(self):
        return self._rackhub.c.transport

    def synchronize(self):
        """Pushes the gradients no hook pushed yet (parameters backward did
        not reach) and waits for every reply. With a local optimizer `.grad`
        then holds the reduced gradients. Raises RackhubError on failure."""
        self._rackhub.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """`with opt.skip_synchronize(): opt.step()` after a manual
        synchronize() (e.g. to clip the reduced gradients in between)."""
        self._rackhub_sync_next_step = False
        try:
            yield
        finally:
            self._rackhub_sync_next_step = True

    def step(self, closure=None):
        """Waits for the hub and updates the model (hub-side: the hub's
        parameters; local: the wrapped optimizer steps on the reduced
        gradients). Returns None for a step skipped after a rollback."""
        sync = self._rackhub
        loss = None
        if closure is not None and sync.hub:
            with torch.enable_grad():
                loss = closure()
        if self._rackhub_sync_next_step:
            sync.synchronize()
        elif not sync.synchronized:
            raise RuntimeError("rackhub: step() inside skip_synchronize() without a "
                               "synchronize() before it")
        try:
            if sync.skip_step:
                sync.skip_step = False
                return None
            if not sync.hub:
                loss = super(self.__class__, self).step(closure)
            return loss
        finally:
            sync.synchronized = False

    def zero_grad(self, set_to_none=False):
        if any(s.ticket is not None for s in self._rackhub.slots):
            raise RuntimeError("rackhub: zero_grad() while gradients are being sent; "
                               "call step() (or synchronize()) first")
        super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    def _tables(self):
        if self._rackhub.tables is None:
            raise RuntimeError("rackhub: this optimizer has no embeddings (embeddings=...)")
        return self._rackhub.tables

    def prefetch(self, module, ids):
        """Asks the next step's reply for the rows `ids` of the table of
        `module` (its nn.Embedding/EmbeddingBag or its name): the next batch's
        forward then pulls nothing. May be called several times per step."""
        self._tables().prefetch(module, ids)

    def pull_tables(self, modules=None):
        """Makes every row of the tables' local weights (or of `modules`')
        the hub's current value (e.g. before saving or comparing them)."""
        self._tables().pull_tables(modules)

    def table_init_of(self, module):
        """(mode, scale, seed) the table of `module` was declared with:
        table_init_(w, seed, scale) reproduces its initial values."""
        return self._tables().table(module).init

    def table_stats(self):
        """{name: rows pulled by forward pre-hooks so far} (0 when every
        batch's rows came with prefetch)."""
        return {t.name: t.pulled_rows for t in self._tables().tables}

    def set_learning_rate(self, lr):
        """Sets every group's lr (hub-side: the hub uses it from the next step)."""
        for g in self.param_groups:
            g["lr"] = lr


_METHODS = {k: v for k, v in _DistributedOptimizer.__dict__.items()
            if k not in ("__dict__", "__weakref__", "__module__", "__qualname__")}


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, *,
                         hub_optimizer=False, prefix="", reply="swap", on_rollback="resync",
                         embeddings=None, embedding_init=DEFAULT_INIT, embedding_coalesce=True,
                         zero_copy=False, process_set=None):
    """Wraps `optimizer` for data-parallel training through the hub (see the
    module docstring).

    optimizer: a torch.optim.Optimizer, or a hub spec (rh.SGD(lr=...),
      rh.Adam(...), rh.AdamW, rh.Adagrad, or a dict) which implies
      hub_optimizer=True and needs named_parameters.
    named_parameters: model.named_parameters() (same names on every rank;
      they name the keys). Default: names by position in the param groups.
    compression: rh.Compression.none (fp32 on the wire), .fp16, .bf16, or
      .topk(ratio, error_feedback=True) (each chunk's largest ceil(ratio * n)
      gradient entries, the rest kept on this worker for the next step;
      embedding tables then go fp32); or the strings "none", "fp16", "bf16",
      "topk:RATIO", "topk:RATIO:noef". Anything else: ValueError.
    backward_passes_per_step: gradients accumulate locally over this many
      backward passes; the Nth pushes them.
    op: rh.Average (mean over the ranks) or rh.Sum.
    gradient_predivide_factor (1.0 only), num_groups, groups, sparse_as_dense:
      Horovod's; accepted for its scripts. Every parameter is its own key
      (no fusion groups to set) and sparse gradients are sent dense (except
      those of embeddings=, which go to row-sparse tables).
    hub_optimizer (keyword): run the optimizer on the hub (SGD, Adam, AdamW,
      Adagrad).
    prefix: prepended to the key names (several models on one tenant).
    reply, on_rollback: see the module docstring.
    embeddings (keyword): nn.Embedding / nn.EmbeddingBag modules built with
      sparse=True (a list, or a dict name -> module) whose weights become
      row-sparse table keys with the optimizer running on the hub;
      embedding_init, embedding_coalesce: their initial values and whether
      duplicate ids are summed before the push (rackhub.torch.embedding's
      docstring).
    zero_copy (keyword): over shared memory, keep each float32 CPU
      parameter's .grad (and the local mode's reply buffer) in memory leased
      to the hub (Client.lease), so backward writes the gradients where the
      hub reads them: no copy into the ring (module docstring). Off by
      default: on the 2-core test VM it measured no faster
      (bench/results/zero-copy-2026-11-27.md).
    process_set (keyword): Horovod's; the gradients are reduced over that
      set's ranks only (Average divides by its size), through keys of its
      own; every rank of the set wraps the same optimizer, a rank outside
      it gets a ValueError. Not with embeddings=.
    """
    if gradient_predivide_factor != 1.0:
        raise ValueError("gradient_predivide_factor: only 1.0 (the hub sums in rank order, "
                         "then scales once)")
    compression = compression_of(compression)  # a bad one raises before anything is set up
    if isinstance(optimizer, (dict, str)):
        if named_parameters is None:
            raise TypeError("named_parameters: needed with a hub spec "
                            "(DistributedOptimizer(rh.SGD(...), model.named_parameters()))")
        named_parameters = list(named_parameters)
        spec = {"type": optimizer} if isinstance(optimizer, str) else optimizer
        base = HubOptimizer([p for _, p in named_parameters if p.requires_grad], spec)
        hub_optimizer = True
    elif isinstance(optimizer, torch.optim.Optimizer):
        base = optimizer
    else:
        raise TypeError("optimizer: a torch.optim.Optimizer or a hub spec (rackhub.torch.SGD/"
                        f"Adam/AdamW/Adagrad), got {type(optimizer).__name__}")
    cls = type(type(base).__name__, (type(base),), dict(_METHODS))
    with process_sets.scope(process_set, "DistributedOptimizer"):
        return cls(base.param_groups, base, named_parameters, compression,
                   backward_passes_per_step, op, bool(hub_optimizer), prefix, reply, on_rollback,
                   embeddings, embedding_init, embedding_coalesce, bool(zero_copy))
