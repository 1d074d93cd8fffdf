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
CPU backward, which is the caller's). The engine (slots, hooks, pushes,
recovery) is engine.py; this module is the optimizer class users get.
"""
import contextlib

import torch

from . import process_sets
from .compression import Compression, compression_of
from .embedding import DEFAULT_INIT
from .engine import _Sync
from .hub_specs import Average, HubOptimizer


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
