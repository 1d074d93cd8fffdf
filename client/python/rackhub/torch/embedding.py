"""Embedding tables as row-sparse hub keys: DistributedOptimizer(...,
embeddings=[...]).

    emb = torch.nn.Embedding(1_000_000, 64, sparse=True)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    opt = rh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  embeddings=[emb], embedding_init=("random", 0.01, 7))
    for ids, next_ids, y in batches:
        opt.zero_grad()
        loss_fn(model(ids), y).backward()
        opt.prefetch(emb, next_ids)           # optional: the reply brings next step's rows
        opt.step()

Contract:
- Each module (nn.Embedding / nn.EmbeddingBag built with sparse=True, fp32
  CPU weight, no max_norm / padding_idx) becomes one table key of rows x dim,
  named `prefix + name + ":table:" + type + ":" + reduction` (name: the
  weight's name in named_parameters, a dict key + ".weight", or
  "table.I"). Its weight is not a dense key; the local optimizer never steps
  it (its .grad is None when the wrapped optimizer steps).
- The hub runs the table's optimizer, translated from the weight's param
  group: SGD -> sgd / momentum / nesterov (lazy: only touched rows and their
  momentum change), Adam and SparseAdam -> adam, AdamW -> adamw (lazy moments,
  bias correction by the table's update count, as SparseAdam), Adagrad ->
  ROW-WISE AdaGrad (one accumulator per row, s += mean(d*d) over the row, as
  DLRM/FBGEMM; not torch's element-wise Adagrad). Anything else raises
  ValueError naming it. A hyperparameter change of the group reaches the hub
  from the next step (SetOptimizer), as for dense hub-side keys.
- Initial values: embedding_init=("random", scale, seed) (default
  ("random", 0.01, 0)): table i of embeddings= (in order) starts at
  table_init(seed + i * 2**40, scale) (uniform in [-scale, scale), a
  deterministic function of (seed, row, column)); "zeros"; or a dict name ->
  one of those (its seed used as given). table_init_(weight, seed, scale)
  writes the same values into a local tensor (single-process references);
  opt.table_init_of(module) returns what a table uses. A key that already
  exists on the hub keeps its values (a warning says the job resumes).
- Local weights hold the hub's current value only for the rows this rank
  needs: a forward pre-hook pulls the rows of the batch's ids that are not
  current (rows received with the last step's reply or pulled since are
  current until the next update). opt.prefetch(module, ids) asks the next
  step's reply for those rows (no extra round trip). opt.pull_tables() makes
  the whole local weight current (e.g. before saving it).
- step(): every table pushes every step, an empty push when this rank's
  batch touched none of its rows: the sparse gradient's unique ids and rows
  (embedding_coalesce=True, default: duplicates summed here in the order
  given with index_add_, bit for bit what the hub does with them (up to the
  sign of a zero sum); False sends them as they are and the hub sums them
  in order), then the hub sums the ranks' rows in
  rank order and scales by 1/workers with op=Average. All tables' pushes are
  in flight at once; then the replies (updated rows) go into the weights.
"""
import logging

import torch

from .hub_specs import HubOptimizer, spec_of_group, torch_optimizer_name

_log = logging.getLogger("rackhub.torch")

DEFAULT_INIT = ("random", 0.01, 0)
SEED_STRIDE = 2 ** 40  # table i's seed: seed + i * SEED_STRIDE (streams never overlap)
PULL_BLOCK_ROWS = 1 << 16


def _core():
    from .. import _core as core
    return core


def table_init_(weight, seed, scale):
    """Writes into `weight` (rows x dim, fp32 CPU) the initial values the hub
    gives a table initialized with ("random", scale, seed); returns it."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise TypeError("table_init_: weight: a 2-D float32 CPU tensor")
    rows, dim = weight.shape
    with torch.no_grad():
        buf = weight if weight.is_contiguous() else torch.empty(rows, dim)
        for a in range(0, rows, PULL_BLOCK_ROWS):
            b = min(rows, a + PULL_BLOCK_ROWS)
            _core().table_init(a, b - a, dim, int(seed), float(scale), buf.data[a:b].numpy())
        if buf is not weight:
            weight.copy_(buf)
    return weight


def table_spec_of_group(optimizer, group):
    """The hub spec (without the reduction) of a table whose weight is in
    `group` of `optimizer`. Raises ValueError naming what the hub cannot do."""
    if isinstance(optimizer, HubOptimizer):
        return spec_of_group(optimizer, group)
    name = torch_optimizer_name(optimizer)

    def refuse(setting):
        raise ValueError(f"embeddings: the hub's table optimizer for {name} has no {setting}")

    if group.get("maximize"):
        refuse("maximize=True")
    if name == "SparseAdam":
        b1, b2 = group["betas"]
        return {"type": "adam", "lr": float(group["lr"]), "beta1": float(b1),
                "beta2": float(b2), "eps": float(group["eps"])}
    if name not in ("SGD", "Adam", "AdamW", "Adagrad"):
        raise ValueError(f"embeddings: tables run SGD, Adagrad (row-wise), Adam/SparseAdam "
                         f"and AdamW (lazy) on the hub, not {name}")
    try:
        return spec_of_group(optimizer, group)
    except ValueError as e:  # its message speaks of hub_optimizer=False, not for tables
        raise ValueError("embeddings: " + str(e).split("; run it locally")[0]
                         .replace("hub_optimizer: ", "")) from None


def _init_of(embedding_init, name, index):
    v = embedding_init
    if isinstance(v, dict):
        if name not in v:
            raise ValueError(f"embedding_init: no entry for table '{name}'")
        v, index = v[name], None
    if v == "zeros" or v == ("zeros",):
        return ("zeros", 0.0, 0)
    if isinstance(v, (tuple, list)) and len(v) == 3 and v[0] == "random":
        scale, seed = float(v[1]), int(v[2])
        if seed < 0 or not scale >= 0:
            raise ValueError(f"embedding_init: table '{name}': seed >= 0 and scale >= 0")
        if index is not None:
            seed = (seed + index * SEED_STRIDE) % 2 ** 64
        return ("random", scale, seed)
    raise ValueError("embedding_init: ('random', scale, seed), 'zeros', or a dict "
                     f"name -> one of those; got {v!r}")


def tables_of(embeddings, named):
    """[(name, module)] from embeddings= (a list of modules or a dict
    name -> module); `named` is {id(parameter): name} of named_parameters."""
    if isinstance(embeddings, dict):
        pairs = [(f"{k}.weight", m) for k, m in embeddings.items()]
    elif isinstance(embeddings, (list, tuple)):
        pairs = [(named.get(id(getattr(m, "weight", None)), f"table.{i}"), m)
                 for i, m in enumerate(embeddings)]
    else:
        raise TypeError("embeddings: a list of nn.Embedding/nn.EmbeddingBag modules or a "
                        "dict name -> module")
    for name, m in pairs:
        kind = type(m).__name__
        if not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            raise TypeError(f"embeddings: '{name}' is a {kind}, not an nn.Embedding or "
                            f"nn.EmbeddingBag")
        if not m.sparse:
            raise ValueError(f"embeddings: '{name}' ({kind}) was built with sparse=False: "
                             f"its gradients would be dense; build it with sparse=True")
        if m.max_norm is not None:
            raise ValueError(f"embeddings: '{name}' ({kind}) has max_norm: the forward would "
                             f"renormalize rows locally, not on the hub")
        if m.padding_idx is not None:
            raise ValueError(f"embeddings: '{name}' ({kind}) has padding_idx: not supported "
                             f"for hub tables (the hub's row would not stay zero)")
        w = m.weight
        if w.dtype != torch.float32 or w.device.type != "cpu" or not w.is_contiguous():
            raise TypeError(f"embeddings: '{name}': the weight must be a contiguous float32 "
                            f"CPU tensor, got {w.dtype} on {w.device}")
    if len({id(m) for _, m in pairs}) != len(pairs) or len({n for n, _ in pairs}) != len(pairs):
        raise ValueError("embeddings: a module or a name appears twice")
    return pairs


def _empty_ids():
    return torch.empty(0, dtype=torch.int64)


def _sum_duplicates(ids, rows):
    """(unique sorted ids, their rows) with each id's rows summed in the
    order given, as the hub sums a push's duplicates (index_add_ adds in
    index order; torch's coalesce() does not keep that order)."""
    u, inv = torch.unique(ids, return_inverse=True)
    if u.numel() == ids.numel():
        return ids, rows
    return u, torch.zeros(u.numel(), rows.shape[1]).index_add_(0, inv, rows)


class _Table:
    """One table: its key, the rows that are current, the pending push."""

    def __init__(self, client, name, module, key, spec, init):
        self.client = client
        self.name = name
        self.module = module
        self.weight = module.weight
        self.rows, self.dim = self.weight.shape
        self.key = key
        self.spec = spec            # the spec the hub has
        self.key_type = spec["type"]
        self.init = init
        # stamp[r] == epoch <=> row r of the local weight is the hub's current value.
        self.stamp = torch.full((self.rows,), -1, dtype=torch.int32)
        self.epoch = 0
        self.want = []              # prefetch(): ids for the next reply
        self.ticket = None
        self.spec_ticket = None
        self.held = None            # (ids, rows, want, out) of the pending push
        self.pulled_rows = 0        # rows pulled by the pre-hook (not by replies)

    def invalidate(self):
        self.epoch += 1

    def current(self, ids):
        """Pulls the rows of `ids` that are not current into the weight."""
        u = torch.unique(ids.detach().reshape(-1).to(torch.int64))
        if u.numel() == 0:
            return
        if u[0] < 0 or u[-1] >= self.rows:
            bad = int(u[0]) if u[0] < 0 else int(u[-1])
            raise IndexError(f"rackhub: table '{self.name}': row id {bad} not in "
                             f"[0, {self.rows})")
        missing = u[self.stamp[u] != self.epoch]
        if missing.numel() == 0:
            return
        out = torch.empty(missing.numel(), self.dim)
        c = self.client
        c.wait(c.pull_rows(self.key, missing.numpy(), out.numpy()))
        with torch.no_grad():
            self.weight.data.index_copy_(0, missing, out)
        self.stamp[missing] = self.epoch
        self.pulled_rows += missing.numel()


class Tables:
    """The tables of one DistributedOptimizer (used by engine._Sync)."""

    def __init__(self, client, opt, group_of, pairs, prefix, reduction, dtype, embedding_init,
                 coalesce=True):
        self.c = client
        self.coalesce = bool(coalesce)
        self.tables = []
        by_module = {}
        for i, (name, m) in enumerate(pairs):
            w = m.weight
            if w not in group_of:
                raise ValueError(f"embeddings: the weight of '{name}' is not a parameter of "
                                 f"the optimizer (its param group gives the table's optimizer)")
            spec = dict(table_spec_of_group(opt, group_of[w]), reduction=reduction)
            init = _init_of(embedding_init, name, i)
            key_name = f"{prefix}{name}:table:{spec['type']}:{spec['reduction']}"
            rows, dim = w.shape
            key = client.declare_table(key_name, rows, dim, dtype, spec, init[0], init[1],
                                       init[2])
            info = client.key_info(key) or {}
            if info.get("next_iteration", 0) > 0:
                _log.warning("rackhub: table '%s' already exists on the hub (%d updates): "
                             "training resumes from its values", key_name,
                             info["next_iteration"])
            t = _Table(client, name, m, key, spec, init)
            self.tables.append(t)
            by_module[id(m)] = t
            opt.state.pop(w, None)  # e.g. Adagrad's eager dense state: never used
        self.by_module = by_module
        self.hooks = [t.module.register_forward_pre_hook(self._pre_hook(t))
                      for t in self.tables]

    @staticmethod
    def _pre_hook(t):
        def hook(module, inputs):
            if not inputs:
                raise TypeError(f"rackhub: table '{t.name}': pass the ids positionally "
                                f"(module(ids, ...)): the pre-hook pulls their rows")
            t.current(inputs[0])
        return hook

    def weights(self):
        return {id(t.weight) for t in self.tables}

    def remove_hooks(self):
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def table(self, module):
        if isinstance(module, str):
            for t in self.tables:
                if t.name == module or t.name == module + ".weight":
                    return t
            raise KeyError(f"rackhub: no table named '{module}'")
        t = self.by_module.get(id(module))
        if t is None:
            raise KeyError("rackhub: this module is not one of the optimizer's embeddings")
        return t

    def prefetch(self, module, ids):
        self.table(module).want.append(torch.as_tensor(ids).detach().reshape(-1)
                                       .to(torch.int64))

    # -- step ----------------------------------------------------------------

    def push_all(self, spec_now):
        """Issues every table's push_pull_rows (spec_now(t) -> the group's
        spec now, to send a SetOptimizer first when it changed)."""
        c = self.c
        for t in self.tables:
            spec = spec_now(t)
            if spec != t.spec:
                if spec["type"] != t.key_type:
                    raise ValueError(f"table '{t.name}': the optimizer's type changed from "
                                     f"{t.key_type} to {spec['type']}; the hub keeps a key's "
                                     f"type (use a new DistributedOptimizer)")
                t.spec_ticket = c.set_optimizer(t.key, spec, c.key_info(t.key)["next_iteration"])
                t.spec = spec
            g = t.weight.grad
            if g is None:
                ids, rows = _empty_ids(), torch.empty(0)
            elif g.is_sparse:
                ids = g._indices()[0].contiguous()
                rows = g._values().detach().to(torch.float32).reshape(-1, t.dim).contiguous()
                if self.coalesce and not g.is_coalesced():
                    ids, rows = _sum_duplicates(ids, rows)
            else:
                raise RuntimeError(f"rackhub: table '{t.name}' has a dense gradient (was "
                                   f"sparse set to False?); tables need sparse gradients")
            want = torch.unique(torch.cat(t.want)) if t.want else _empty_ids()
            if want.numel() and (want[0] < 0 or want[-1] >= t.rows):
                raise IndexError(f"rackhub: prefetch: table '{t.name}': row ids not in "
                                 f"[0, {t.rows})")
            t.want = []
            out = torch.empty(want.numel(), t.dim)
            t.held = (ids, rows, want, out)
            t.ticket = c.push_pull_rows(t.key, ids.numpy(), rows.reshape(-1).numpy(),
                                        want.numpy(), out.numpy())

    def wait_all(self, retry_errors):
        """Waits for every pending push; returns [(table, error)] of errors
        of the types `retry_errors`, raises the others."""
        failed = []
        try:
            for t in self.tables:
                if t.spec_ticket is not None:
                    s, t.spec_ticket = t.spec_ticket, None
                    self.c.wait(s)
            for t in self.tables:
                if t.ticket is None:
                    continue
                tk, t.ticket = t.ticket, None
                try:
                    self.c.wait(tk)
                except retry_errors as e:
                    failed.append((t, e))
        finally:
            for t in self.tables:
                t.ticket = None
        return failed

    def take_replies(self):
        with torch.no_grad():
            for t in self.tables:
                _, _, want, out = t.held
                t.held = None
                t.invalidate()
                if want.numel():
                    t.weight.data.index_copy_(0, want, out)
                    t.stamp[want] = t.epoch
                t.weight.grad = None

    def drop_step(self):
        """After a failed step: nothing local is current, gradients dropped."""
        for t in self.tables:
            t.held = None
            t.want = []
            t.invalidate()
            t.weight.grad = None

    def clear_grads(self):
        """The wrapped optimizer must not step the tables."""
        for t in self.tables:
            t.weight.grad = None

    def pull_tables(self, modules=None):
        """Every row of the tables (all, or `modules`) into the local weights."""
        c = self.c
        chosen = self.tables if modules is None else [self.table(m) for m in modules]
        for t in chosen:
            w = t.weight.data
            for a in range(0, t.rows, PULL_BLOCK_ROWS):
                b = min(t.rows, a + PULL_BLOCK_ROWS)
                ids = torch.arange(a, b, dtype=torch.int64)
                c.wait(c.pull_rows(t.key, ids.numpy(), w[a:b].numpy()))
            t.stamp.fill_(t.epoch)
