"""rackhub.torch: data-parallel PyTorch training through a rackhub hub.

Usage (the Horovod/BytePS pattern):

    import rackhub.torch as rh
    rh.init()                                   # rank, size, hub, tenant, token from the env
    model = Net()
    # (a) the optimizer runs on the hub: every rank gets the updated parameters
    opt = rh.DistributedOptimizer(model.named_parameters(),
                                  optimizer=rh.SGD(lr=0.05, momentum=0.9))
    # (b) sum-only: the hub averages the gradients, a local torch.optim steps
    opt = rh.DistributedOptimizer(model.named_parameters(),
                                  optimizer=torch.optim.Adam(model.parameters(), lr=1e-3))
    rh.broadcast_parameters(model)              # every rank starts from rank 0's values
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()         # gradients are pushed while backward runs
        opt.step()                              # waits for the hub, updates the model

How it works:
- Every parameter is one key of the tenant (named `prefix + name`). A hook on
  the parameter's gradient accumulator (the AccumulateGrad node) fires as
  soon as backward has produced that parameter's gradient and starts its
  PushPull at once, so communication overlaps the rest of backward.
- Zero-copy: the PushPull sends straight from `p.grad`'s memory and receives
  into a spare tensor of the same shape (contiguous fp32 CPU tensors; others
  are copied to one first). The tensors are held by the binding until the
  ticket completes.
- The reply is NOT written into `p.data` while backward runs: the hub may
  answer a layer's push before backward finished the layers below it, and a
  tensor saved by autograd could alias the parameter. step() waits for every
  ticket and then swaps storages (reply="swap", default): the parameter (or,
  in sum-only mode, `p.grad`) takes the spare tensor's storage with
  `p.data = spare` (O(1), no copy) and the old storage becomes the next
  spare. reply="copy" copies into the existing storage instead (use it if
  you keep references to `p.data` elsewhere).
- Do not modify `.grad` between backward and step() (it is being sent). To
  clip gradients in sum-only mode, call `opt.synchronize()` (waits; `.grad`
  then holds the averaged gradients), clip, then `opt.step()`.
- A failure (hub gone for longer than op_timeout, timeout) raises
  rackhub.RackhubError from step()/synchronize(); nothing waits forever.
- Hub restart or a lost rank: the client reconnects by itself. When a step's
  push_pull raises rackhub.RolledBack (the restarted hub reloaded an older
  checkpoint) or rackhub.WorkerLost (another rank died), the optimizer (with
  on_rollback="resync", the default) pulls every key into the model's
  parameters, logs a warning, skips that step (the gradients are dropped)
  and training continues with the next batch; after WorkerLost it backs off
  a little, as pushes keep failing until the lost rank is back. With
  on_rollback="raise" the exception propagates instead.
"""
import logging
import os
import time

import torch

from . import _core
from ._core import RackhubError, RolledBack, WorkerLost

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "client",
    "DistributedOptimizer", "broadcast_parameters", "allreduce",
    "SGD", "Adam", "AdamW", "Adagrad", "RackhubError", "RolledBack", "WorkerLost",
]

_log = logging.getLogger("rackhub.torch")

_ctx = None


class _Context:
    def __init__(self, client, rank, size, hub, tenant):
        self.client = client
        self.rank = rank
        self.size = size
        self.hub = hub
        self.tenant = tenant
        self.broadcasts = 0
        self.allreduce_keys = {}


def _env(name, default=None):
    v = os.environ.get(name)
    return v if v not in (None, "") else default


def init(rank=None, size=None, hub=None, tenant=None, token=None, token_file=None,
         connect_timeout=30.0, op_timeout=None):
    """Connects this process to the hub as one rank of the tenant.

    Arguments left out are read from the environment rackhub-run sets:
    RACKHUB_RANK, RACKHUB_WORLD_SIZE, RACKHUB_HUB (data plane HOST:PORT),
    RACKHUB_TENANT, RACKHUB_TOKEN or RACKHUB_TOKEN_FILE, RACKHUB_OP_TIMEOUT
    (seconds, default 120). The world size is the tenant's worker count; a
    given `size` must agree with it.
    """
    global _ctx
    if _ctx is not None:
        raise RuntimeError("rackhub.torch.init: already initialized (call shutdown() first)")
    rank = int(rank if rank is not None else _env("RACKHUB_RANK", "0"))
    size_s = size if size is not None else _env("RACKHUB_WORLD_SIZE")
    hub = hub or _env("RACKHUB_HUB", "127.0.0.1:7700")
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
    if op_timeout is None:
        op_timeout = float(_env("RACKHUB_OP_TIMEOUT", "120"))
    c = _core.Client(hub, tenant, token, rank, 0, float(connect_timeout), float(op_timeout))
    workers = c.workers
    if size_s is not None and int(size_s) != workers:
        c.close()
        raise ValueError(f"rackhub.torch.init: size: {size_s} given but tenant '{tenant}' has "
                         f"{workers} workers")
    if not 0 <= rank < workers:
        c.close()
        raise ValueError(f"rackhub.torch.init: rank: {rank} not in [0, {workers})")
    _ctx = _Context(c, rank, workers, hub, tenant)


def _need():
    if _ctx is None:
        raise RuntimeError("rackhub.torch: call rackhub.torch.init() first")
    return _ctx


def is_initialized():
    return _ctx is not None


def rank():
    return _need().rank


def size():
    return _need().size


def client():
    """The underlying rackhub.Client."""
    return _need().client


def shutdown():
    """Closes the connection (pending operations fail). Idempotent."""
    global _ctx
    if _ctx is not None:
        _ctx.client.close()
        _ctx = None


# ---------------------------------------------------------------------------
# Server-side optimizer specs (the hub's formulas match torch.optim's).

def SGD(lr, momentum=0.0, weight_decay=0.0, nesterov=False, reduction="mean"):
    """torch.optim.SGD semantics (dampening 0): v = m*v + g + wd*p; p -= lr*v."""
    t = "nesterov" if nesterov else ("momentum" if momentum else "sgd")
    spec = {"type": t, "lr": lr, "weight_decay": weight_decay, "reduction": reduction}
    if momentum:
        spec["momentum"] = momentum
    return spec


def Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, reduction="mean"):
    """torch.optim.Adam semantics (L2 weight decay folded into the gradient)."""
    return {"type": "adam", "lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps,
            "weight_decay": weight_decay, "reduction": reduction}


def AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, reduction="mean"):
    return {"type": "adamw", "lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps,
            "weight_decay": weight_decay, "reduction": reduction}


def Adagrad(lr=1e-2, eps=1e-10, weight_decay=0.0, initial_accumulator_value=0.0,
            reduction="mean"):
    return {"type": "adagrad", "lr": lr, "eps": eps, "weight_decay": weight_decay,
            "initial_accumulator": initial_accumulator_value, "reduction": reduction}


def _spec_of(optimizer):
    if isinstance(optimizer, str):
        return {"type": optimizer}
    if isinstance(optimizer, dict):
        spec = dict(optimizer)
        if spec.get("type") == "sum-only":
            raise ValueError("optimizer: for sum-only pass a local torch.optim optimizer")
        for k in [k for k, v in spec.items() if v == 0 and k != "type"]:
            del spec[k]  # 0 = unused / the hub's default
        return spec
    raise TypeError("optimizer: a torch.optim.Optimizer (sum-only mode) or a server-side "
                    "spec (rackhub.torch.SGD/Adam/AdamW/Adagrad or a dict)")


def _plain(t):
    """True if the library can read/write `t`'s memory directly."""
    return (t.dtype == torch.float32 and t.device.type == "cpu" and t.layout == torch.strided
            and t.is_contiguous())


class _Slot:
    __slots__ = ("name", "param", "key", "spare", "ticket", "sent", "passes")

    def __init__(self, name, param, key):
        self.name = name
        self.param = param
        self.key = key
        self.spare = torch.empty(param.shape, dtype=torch.float32)
        self.ticket = None
        self.sent = None
        self.passes = 0


class DistributedOptimizer:
    """Data-parallel optimizer over the hub.

    named_parameters: model.named_parameters() (same names on every rank).
    optimizer: a server-side spec (rackhub.torch.SGD(...), Adam(...), AdamW,
      Adagrad, or a dict with the hub's fields) -> the hub keeps the master
      parameters and the optimizer state; or a local torch.optim.Optimizer ->
      sum-only mode: the hub averages the gradients and that optimizer steps
      on every rank (like Horovod/BytePS).
    dtype: wire type of the gradients/parameters ('fp32', 'fp16', 'bf16').
    prefix: prepended to the key names (several models on one tenant).
    backward_passes_per_step: gradients are accumulated over this many
      backward passes before they are pushed.
    reply: 'swap' (default, zero-copy) or 'copy'; see the module docstring.
    on_rollback: 'resync' (default): a step whose push_pull raised RolledBack
      or WorkerLost pulls the hub's parameters into the model, logs a
      warning and is skipped (step() returns None, `skipped_steps` counts
      them); 'raise': the exception propagates from step()/synchronize().

    Server-side mode initializes the hub's keys from rank 0's parameters and
    loads them on the other ranks here (a broadcast).
    """

    def __init__(self, named_parameters, optimizer, dtype="fp32", prefix="",
                 backward_passes_per_step=1, reply="swap", on_rollback="resync"):
        ctx = _need()
        if on_rollback not in ("resync", "raise"):
            raise ValueError("on_rollback: 'resync' or 'raise'")
        self._on_rollback = on_rollback
        self._skip_step = False
        self.skipped_steps = 0
        self._lost_streak = 0
        self._client = ctx.client
        if reply not in ("swap", "copy"):
            raise ValueError("reply: 'swap' or 'copy'")
        self._reply = reply
        self._passes = int(backward_passes_per_step)
        if isinstance(optimizer, torch.optim.Optimizer):
            self.local_optimizer = optimizer
            spec = {"type": "sum-only"}
        else:
            self.local_optimizer = None
            spec = _spec_of(optimizer)
        self.server_side = self.local_optimizer is None
        self._spec = spec
        named = list(named_parameters)
        if named and not isinstance(named[0], tuple):
            raise TypeError("named_parameters: an iterable of (name, parameter), "
                            "e.g. model.named_parameters()")
        self._slots = []
        self._by_param = {}
        seen = set()
        for name, p in named:
            if not p.requires_grad:
                continue
            if name in seen:
                raise ValueError(f"named_parameters: duplicate name '{name}'")
            seen.add(name)
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError(f"parameter '{name}': only fp32 CPU parameters are supported "
                                f"(got {p.dtype} on {p.device})")
            key = self._client.declare_key(prefix + name, p.numel(), dtype, spec,
                                           self.server_side)
            slot = _Slot(name, p, key)
            self._slots.append(slot)
            self._by_param[p] = slot
        if self.local_optimizer is not None:
            covered = {p for g in self.local_optimizer.param_groups for p in g["params"]}
            missing = [s.name for s in self._slots if s.param not in covered]
            if missing:
                raise ValueError(f"optimizer: does not own parameters {missing[:5]}")
        if self.server_side:
            self._load_initial()
        self._grad_accs = []
        for slot in self._slots:
            self._register_hook(slot)
        self._synchronized = False

    # -- set-up --------------------------------------------------------------

    def _load_initial(self):
        """Rank 0 supplies the keys' initial values; the others pull them."""
        c = self._client
        tickets = []
        with torch.no_grad():
            for s in self._slots:
                p = s.param
                if _ctx.rank == 0:
                    src = p.data if _plain(p.data) else p.data.contiguous().float()
                    tickets.append((s, c.init(s.key, src.data_ptr(), src.numel(), src), None))
                else:
                    dst = p.data if _plain(p.data) else torch.empty(p.shape)
                    tickets.append((s, c.pull(s.key, dst.data_ptr(), dst.numel(), dst), dst))
            for s, t, dst in tickets:
                c.wait(t)
                if dst is not None and dst is not s.param.data:
                    s.param.data.copy_(dst)

    def _register_hook(self, slot):
        p = slot.param
        # The AccumulateGrad node of p: its hook runs once backward has summed
        # every contribution to p's gradient into p.grad. Keep a reference:
        # autograd holds it only weakly.
        with torch.enable_grad():
            acc = p.expand_as(p).grad_fn.next_functions[0][0]

        def hook(*_):
            slot.passes += 1
            if slot.passes >= self._passes:
                self._push(slot)

        acc.register_hook(hook)
        self._grad_accs.append(acc)

    # -- data path -----------------------------------------------------------

    def _push(self, slot):
        if slot.ticket is not None:
            raise RuntimeError(
                f"rackhub: gradient of '{slot.name}' produced again before step(); "
                f"call step() after each backward (or set backward_passes_per_step)")
        g = slot.param.grad
        if g is None:
            g = torch.zeros(slot.param.shape)
        elif not _plain(g):
            g = g.detach().to(torch.float32).contiguous()
            if g.is_sparse:
                g = g.to_dense()
        out = slot.spare
        slot.sent = g
        slot.ticket = self._client.push_pull(slot.key, g.data_ptr(), g.numel(), out.data_ptr(),
                                             out.numel(), (g, out))

    def synchronize(self):
        """Pushes the gradients no hook pushed yet (parameters backward did
        not reach) and waits for every reply. In sum-only mode `.grad` then
        holds the averaged gradients. Raises RackhubError on failure."""
        if self._synchronized:
            return
        for s in self._slots:
            if s.ticket is None:
                self._push(s)
        c = self._client
        rolled = []
        try:
            for s in self._slots:
                t, s.ticket = s.ticket, None
                try:
                    c.wait(t)
                except (RolledBack, WorkerLost) as e:
                    rolled.append((s, e))  # wait for the others first
        finally:
            for s in self._slots:
                s.passes = 0
        if rolled:
            if self._on_rollback == "raise":
                for s in self._slots:
                    s.sent = None
                raise rolled[0][1]
            self._resync(rolled)
            self._synchronized = True
            return
        self._lost_streak = 0
        with torch.no_grad():
            for s in self._slots:
                target_is_grad = not self.server_side
                if self._reply == "swap":
                    if target_is_grad:
                        old = s.param.grad
                        s.param.grad = s.spare
                    else:
                        old = s.param.data
                        s.param.data = s.spare
                    if old is not None and _plain(old) and old.shape == s.param.shape:
                        s.spare = old
                    elif _plain(s.sent) and s.sent.shape == s.param.shape \
                            and s.sent is not s.param.grad:
                        s.spare = s.sent
                    else:
                        s.spare = torch.empty(s.param.shape)
                else:
                    if target_is_grad:
                        if s.param.grad is None:
                            s.param.grad = s.spare.clone()
                        else:
                            s.param.grad.copy_(s.spare)
                    else:
                        s.param.data.copy_(s.spare)
                s.sent = None
        self._synchronized = True

    def _resync(self, rolled):
        """After RolledBack / WorkerLost: every key's parameters from the hub
        into the model (server-side mode; sum-only mode pulls into scratch
        tensors, which only clears the keys' resync marks); the step is
        skipped."""
        c = self._client
        first = rolled[0][1]
        lost = any(isinstance(e, WorkerLost) for _, e in rolled)
        _log.warning("rackhub: step skipped, resynchronizing %d key(s) with the hub after %s "
                     "(%s); %d key(s) affected", len(self._slots), type(first).__name__,
                     first, len(rolled))
        if lost:
            # Pushes fail with WORKER_LOST until the lost rank is back.
            self._lost_streak += 1
            time.sleep(min(0.05 * (2 ** min(self._lost_streak, 5)), 1.0))
        with torch.no_grad():
            if self.server_side and _ctx.rank == 0 and any(
                    isinstance(e, RolledBack) and e.iteration == 0 for _, e in rolled):
                # A hub restarted without a checkpoint has the keys but maybe
                # not their values (the ranks > 0 would wait for rank 0's
                # INIT): supply them again; "already initialized" is fine.
                for s in self._slots:
                    p = s.param
                    src = p.data if _plain(p.data) else p.data.contiguous().float()
                    try:
                        c.wait(c.init(s.key, src.data_ptr(), src.numel(), src))
                    except RackhubError as e:
                        if e.wire != "INVALID_ARGUMENT":
                            raise
            tickets = []
            for s in self._slots:
                s.sent = None
                p = s.param
                into_param = self.server_side and _plain(p.data)
                dst = p.data if into_param else torch.empty(p.shape)
                tickets.append((s, c.pull(s.key, dst.data_ptr(), dst.numel(), dst), dst))
            for s, t, dst in tickets:
                c.wait(t)
                if self.server_side and dst is not s.param.data:
                    s.param.data.copy_(dst)
        self._skip_step = True
        self.skipped_steps += 1

    def step(self, closure=None):
        """Waits for the hub and updates the model (server-side: the hub's
        parameters; sum-only: the local optimizer steps on the averaged
        gradients). `closure` is passed to the local optimizer."""
        loss = None
        if closure is not None and self.server_side:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        if self._skip_step:
            self._skip_step = False
            self._synchronized = False
            return None
        if self.local_optimizer is not None:
            loss = self.local_optimizer.step(closure)
        self._synchronized = False
        return loss

    def zero_grad(self, set_to_none=False):
        if any(s.ticket is not None for s in self._slots):
            raise RuntimeError("rackhub: zero_grad() while gradients are being sent; "
                               "call step() (or synchronize()) first")
        if self.local_optimizer is not None:
            self.local_optimizer.zero_grad(set_to_none=set_to_none)
            return
        for s in self._slots:
            g = s.param.grad
            if g is None:
                continue
            if set_to_none:
                s.param.grad = None
            else:
                g.detach_()
                g.zero_()

    def set_learning_rate(self, lr):
        """Server-side mode: changes the hub's learning rate from the next
        update on (every key; the optimizer type stays)."""
        if not self.server_side:
            for g in self.local_optimizer.param_groups:
                g["lr"] = lr
            return
        c = self._client
        ts = []
        for s in self._slots:
            it = c.key_info(s.key)["next_iteration"]
            ts.append(c.set_optimizer(s.key, {"type": self._spec["type"], "lr": lr}, it))
        for t in ts:
            c.wait(t)

    # Convenience: the local optimizer's interface in sum-only mode.
    @property
    def param_groups(self):
        if self.local_optimizer is None:
            return [{"params": [s.param for s in self._slots], **self._spec}]
        return self.local_optimizer.param_groups

    def state_dict(self):
        if self.local_optimizer is None:
            raise NotImplementedError("server-side optimizer state lives on the hub")
        return self.local_optimizer.state_dict()

    def load_state_dict(self, state):
        if self.local_optimizer is None:
            raise NotImplementedError("server-side optimizer state lives on the hub")
        self.local_optimizer.load_state_dict(state)


# ---------------------------------------------------------------------------
# Broadcast and allreduce.

def _tensors_of(obj):
    if isinstance(obj, torch.nn.Module):
        return list(obj.state_dict(keep_vars=True).items())
    if isinstance(obj, dict):
        return list(obj.items())
    return list(obj)


def broadcast_parameters(params, root_rank=0):
    """Makes every rank's tensors equal to rank 0's, bit for bit.

    params: an nn.Module (its state_dict: parameters and buffers), a dict
    name -> tensor, or an iterable of (name, tensor). Every rank must call it
    with the same names, shapes and dtypes. Any dtype is carried as raw bytes.
    One key (named __rackhub_broadcast/N) per call: rank 0 Inits it, the
    others Pull it. Only root_rank=0 is supported (the hub takes initial
    values from rank 0).
    """
    ctx = _need()
    if root_rank != 0:
        raise ValueError("broadcast_parameters: root_rank: only 0 is supported")
    items = [(n, t) for n, t in _tensors_of(params) if isinstance(t, torch.Tensor)]
    if not items:
        return
    sizes = []
    for _, t in items:
        nbytes = t.numel() * t.element_size()
        sizes.append((nbytes + 3) // 4)
    total = sum(sizes)
    ctx.broadcasts += 1
    c = ctx.client
    key = c.declare_key(f"__rackhub_broadcast/{ctx.broadcasts}", total, "fp32",
                        {"type": "sum-only"}, True)
    flat = torch.zeros(total, dtype=torch.float32)
    raw = flat.view(torch.uint8)
    if ctx.rank == 0:
        off = 0
        for (_, t), n in zip(items, sizes):
            b = t.detach().contiguous().view(-1).view(torch.uint8) if t.numel() else None
            if b is not None:
                raw[off * 4: off * 4 + b.numel()].copy_(b)
            off += n
        c.wait(c.init(key, flat.data_ptr(), total, flat))
    else:
        c.wait(c.pull(key, flat.data_ptr(), total, flat))
        off = 0
        with torch.no_grad():
            for (name, t), n in zip(items, sizes):
                nb = t.numel() * t.element_size()
                if nb:
                    src = raw[off * 4: off * 4 + nb].clone().view(t.dtype).view(t.shape)
                    t.data.copy_(src)
                off += n


def allreduce(tensor, name, op="mean"):
    """Averages (op='mean') or sums (op='sum') a float tensor over the ranks,
    in rank order; returns a new fp32 tensor. `name` identifies the
    reduction; reusing a name reuses its key (same size every time)."""
    ctx = _need()
    if op not in ("mean", "sum"):
        raise ValueError("allreduce: op: 'mean' or 'sum'")
    src = tensor.detach().to(torch.float32).contiguous().view(-1)
    c = ctx.client
    k = (name, op)
    if k not in ctx.allreduce_keys:
        ctx.allreduce_keys[k] = c.declare_key(f"__rackhub_allreduce/{op}/{name}", src.numel(),
                                              "fp32", {"type": "sum-only", "reduction": op},
                                              False)
    out = torch.empty_like(src)
    c.wait(c.push_pull(ctx.allreduce_keys[k], src.data_ptr(), src.numel(), out.data_ptr(),
                       out.numel(), (src, out)))
    return out.view(tensor.shape)

