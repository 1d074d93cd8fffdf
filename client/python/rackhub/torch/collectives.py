"""Collectives over the hub: broadcast, allreduce, allgather (Horovod's names).

Every rank must make the same calls in the same order (as with Horovod).

Exact bytes: broadcast and allgather move raw bytes through a sum-only key
(reduction sum) of the tenant. The bytes are carried as 16-bit integers in
fp32 elements; exactly one rank contributes a non-zero value at each position
and the others add 0, so the hub's sum reproduces every byte (x + 0 is exact
for an integer-valued float). Any dtype (int64 counters, bf16, bool) arrives
bit for bit.

Helper keys: the collectives use a few keys per tenant, named `__rackhub/...`
and reused by every call and every later job on the tenant (no key is created
per call): two channel keys (4 Ki and 256 Ki elements), and for allreduce the
same two sizes per (op, compression). A tensor larger than a key goes
through it in rounds. They hold no state between calls.

Failures: every rank checks what the others pass (sizes, roots, a pickling
failure) in a first exchange and raises the same ValueError together. A
round the hub aborts (a rank later than data.straggler_timeout_ms, or one
that died) raises WorkerLost/RolledBack on the ranks; the helper key is
pulled first, so the next collective works.

Multi-rack tenants: ranks are global (rack * workers_per_rack + rank), see
lifecycle.init(racks=...).

Thread use: the thread that runs the training loop.
"""
import io
import time
import zlib

import torch

from .. import _core
from . import _context
from .hub_specs import Average, Compression, Sum, reduction_of, wire_dtype

_SMALL = 4 << 10    # elements of the small channel key (8 KiB of payload per round)
_LARGE = 256 << 10  # elements of the large one (512 KiB of payload per round)


def _np(t):
    return t.detach().numpy()


def _key(ctx, purpose, name, elements, dtype="fp32", reduction="sum"):
    k = (purpose, name, elements, dtype, reduction)
    if k not in ctx.keys:
        ctx.keys[k] = ctx.client.declare_key(
            f"__rackhub/{purpose}/{name}/{elements}/{dtype}/{reduction}", elements, dtype,
            {"type": "sum-only", "reduction": reduction}, False)
    return ctx.keys[k]


def _late_only(e):
    """True if the hub aborted the round because a connected rank was late
    (straggler timeout) or the key's version moved (RolledBack), not because
    a rank died ("worker lost") or is not connected (it left)."""
    text = str(e)
    return isinstance(e, _core.RolledBack) or (
        "straggler" in text and "worker lost" not in text and "not connected" not in text)


def _round(key, src, dst):
    """One PushPull of a helper key. A round the hub aborted because a rank
    was later than the straggler timeout (or RolledBack) is retried after
    pulling the key (which clears the client's resync mark) until the
    context's op_timeout: the late rank then meets the others' retry, as
    Horovod tolerates any lateness. A rank that died fails the collective at
    once (WorkerLost), the key pulled first so later rounds work."""
    ctx = _context.need()
    c = ctx.client
    deadline = time.monotonic() + ctx.op_timeout
    while True:
        try:
            c.wait(c.push_pull(key, _np(src), _np(dst)))
            return
        except (_core.WorkerLost, _core.RolledBack) as e:
            try:
                c.wait(c.pull(key, _np(torch.empty_like(dst))))
            except _core.RackhubError:
                pass  # the original error says more
            if not _late_only(e) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _reduce(flat, purpose, dtype, reduction):
    """Rank-order reduction of a flat fp32 tensor through the reused helper
    keys of `purpose` (rounds of at most _LARGE elements)."""
    ctx = _context.need()
    out = torch.empty_like(flat)
    off = 0
    while off < flat.numel():
        left = flat.numel() - off
        size = _SMALL if left <= _SMALL else _LARGE
        take = min(left, size)
        src = torch.zeros(size, dtype=torch.float32)
        src[:take] = flat[off:off + take]
        dst = torch.empty(size, dtype=torch.float32)
        _round(_key(ctx, purpose, "rounds", size, dtype, reduction), src, dst)
        out[off:off + take] = dst[:take]
        off += take
    return out


def _exchange(mine):
    """Every rank passes a uint8 tensor of the same length; returns the
    position-wise sum, which is the contributed bytes where exactly one rank
    wrote non-zero bytes (see the module docstring)."""
    n = mine.numel()
    padded = torch.zeros(n + (n & 1), dtype=torch.uint8)
    padded[:n] = mine
    halves = padded.view(torch.int16).to(torch.float32)
    out = _reduce(halves, "channel", "fp32", "sum")
    return out.to(torch.int16).view(torch.uint8)[:n]


def _gather_ints(values):
    """Every rank passes a list of the same number of ints; returns the
    lists of every rank, by rank."""
    ctx = _context.need()
    k = len(values)
    mine = torch.zeros(ctx.size * k, dtype=torch.int64)
    mine[ctx.rank * k:(ctx.rank + 1) * k] = torch.tensor(values, dtype=torch.int64)
    every = _exchange(mine.view(torch.uint8)).view(torch.int64).clone()
    return [every[r * k:(r + 1) * k].tolist() for r in range(ctx.size)]


_BAD = -1  # a rank's "I cannot take part" in the first exchange


def _agree(what, root_rank, values, problem=None):
    """The first exchange of a collective: every rank's root_rank, `values`
    (ints) and whether it has a local `problem` (a message). Raises the same
    ValueError on every rank when a rank has a problem or the roots differ;
    returns every rank's values."""
    ctx = _context.need()
    root_ok = isinstance(root_rank, int) and 0 <= root_rank < ctx.size
    every = _gather_ints([root_rank if root_ok else _BAD, _BAD if problem else 0] + list(values))
    bad = [r for r, e in enumerate(every) if e[1] == _BAD]
    if problem or bad:
        raise ValueError(f"{what}: " + (problem or f"rank(s) {bad} could not take part "
                                                   f"(their error says why)"))
    if not root_ok:
        raise ValueError(f"{what}: root_rank: {root_rank!r} not in [0, {ctx.size})")
    roots = {e[0] for e in every}
    if len(roots) != 1:
        raise ValueError(f"{what}: the ranks name different roots: "
                         + ", ".join(f"rank {r}: {e[0]}" for r, e in enumerate(every)))
    return [e[2:] for e in every]


def _raw(t):
    """The bytes of tensor t (a copy on the host)."""
    t = t.detach()
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return t.cpu().contiguous().view(-1).view(torch.uint8)


def _tensors_of(obj):
    if isinstance(obj, torch.nn.Module):
        return list(obj.state_dict(keep_vars=True).items())
    if isinstance(obj, dict):
        return list(obj.items())
    items = list(obj)
    if items and not isinstance(items[0], tuple):
        return [(str(i), t) for i, t in enumerate(items)]
    return items


def broadcast_parameters(params, root_rank=0):
    """Makes every rank's tensors equal to root_rank's, bit for bit.

    params: an nn.Module (its state_dict: parameters and buffers), a dict
    name -> tensor (model.state_dict()), an iterable of (name, tensor)
    (model.named_parameters()) or of tensors. Every rank passes the same
    names, shapes and dtypes (checked: a mismatch raises ValueError on every
    rank). Any dtype and device; copied in place."""
    ctx = _context.need()
    items = [(n, t) for n, t in _tensors_of(params) if isinstance(t, torch.Tensor)]
    sizes = [t.numel() * t.element_size() for _, t in items]
    total = sum(sizes)
    layout = zlib.crc32(repr([(tuple(t.shape), str(t.dtype)) for _, t in items]).encode())
    every = _agree("broadcast_parameters", root_rank, [total, len(items), layout])
    if any(e != every[root_rank] for e in every):
        raise ValueError("broadcast_parameters: the ranks pass different tensors (count, "
                         "bytes, shapes or dtypes): "
                         + ", ".join(f"rank {r}: {e[1]} tensors of {e[0]} bytes"
                                     for r, e in enumerate(every)))
    buf = torch.zeros(total, dtype=torch.uint8)
    if ctx.rank == root_rank:
        off = 0
        for (_, t), n in zip(items, sizes):
            buf[off:off + n] = _raw(t)
            off += n
    got = _exchange(buf)
    if ctx.rank == root_rank:
        return
    off = 0
    with torch.no_grad():
        for (_, t), n in zip(items, sizes):
            if n:  # a copy first: a view as t.dtype needs an aligned offset
                t.copy_(got[off:off + n].clone().view(t.dtype).view(t.shape))
            off += n


def broadcast_(tensor, root_rank, name=None):
    """In place: tensor takes root_rank's values. Returns tensor."""
    broadcast_parameters([(name or "tensor", tensor)], root_rank)
    return tensor


def broadcast(tensor, root_rank, name=None):
    """A new tensor equal to root_rank's `tensor` (same shape on every rank)."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


def _pickled(obj):
    b = io.BytesIO()
    torch.save(obj, b)
    return torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8)


def _unpickled(raw):
    # Tensors land on the CPU (state_dict loaders move them to their device).
    return torch.load(io.BytesIO(raw.numpy().tobytes()), map_location="cpu")


def broadcast_object(obj, root_rank=0, name=None):
    """Returns root_rank's `obj` on every rank (pickled; tensors inside are
    carried too). The other ranks' `obj` is ignored."""
    ctx = _context.need()
    raw, problem = torch.empty(0, dtype=torch.uint8), None
    if ctx.rank == root_rank:
        try:
            raw = _pickled(obj)
        except Exception as e:  # noqa: BLE001 - every rank raises it below
            problem = f"rank {ctx.rank} cannot pickle the object: {type(e).__name__}: {e}"
    n = _agree("broadcast_object", root_rank, [raw.numel()], problem)[root_rank][0]
    buf = torch.zeros(n, dtype=torch.uint8)
    if ctx.rank == root_rank:
        buf[:] = raw
    got = _exchange(buf)
    return obj if ctx.rank == root_rank else _unpickled(got)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Every rank's optimizer takes root_rank's state_dict (hyperparameters
    such as the learning rate, and the per-parameter state: momentum
    buffers, Adam moments, step counts). The optimizers must hold the same
    parameters in the same order. For a hub-side DistributedOptimizer the
    per-parameter state lives on the hub; the hyperparameters are taken."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if _context.need().rank != root_rank:
        optimizer.load_state_dict(state)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None):
    """Averages (op=Average, the default) or sums (op=Sum) `tensor` over the
    ranks, in rank order (bitwise reproducible); returns a new tensor of the
    same dtype, shape and device. The sum is computed in fp32 (integer
    tensors are exact while |sum| < 2**24). `name` is accepted for Horovod's
    sake; every call goes through the same reused helper keys."""
    ctx = _context.need()
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ValueError("allreduce: give op or average, not both")
    reduction = reduction_of(op)
    src = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().view(-1)
    out = _reduce(src, "allreduce", wire_dtype(compression), reduction)
    return out.view(tensor.shape).to(device=tensor.device, dtype=tensor.dtype)


def allreduce_(tensor, average=None, name=None, compression=Compression.none, op=None):
    """In place: tensor takes allreduce(tensor, ...)'s values. Returns tensor."""
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name, compression, op))
    return tensor


def allgather(tensor, name=None):
    """Concatenates every rank's tensor along dimension 0, in rank order.
    The other dimensions and the dtype must agree (the first may differ)."""
    ctx = _context.need()
    t = tensor.detach()
    shape = list(t.shape) if t.dim() else [1]
    dt = str(t.dtype)
    every = _agree("allgather", 0, [len(shape), zlib.crc32(dt.encode()),
                                    t.numel() * t.element_size(), shape[0],
                                    zlib.crc32(repr(shape[1:]).encode())])
    if any(e[0] != every[0][0] or e[1] != every[0][1] or e[4] != every[0][4] for e in every):
        raise ValueError(f"allgather: the ranks' tensors differ beyond dimension 0 or in dtype "
                         f"(this rank: {tuple(t.shape)} {dt})")
    sizes = [e[2] for e in every]
    buf = torch.zeros(sum(sizes), dtype=torch.uint8)
    off = sum(sizes[:ctx.rank])
    buf[off:off + sizes[ctx.rank]] = _raw(t)
    got = _exchange(buf)
    rows = sum(e[3] for e in every)
    out = got.view(t.dtype).view([rows] + shape[1:]) if got.numel() else \
        torch.empty([rows] + shape[1:], dtype=t.dtype)
    return out.to(tensor.device)


def allgather_object(obj, name=None):
    """A list of every rank's `obj`, by rank (pickled)."""
    ctx = _context.need()
    raw, problem = torch.empty(0, dtype=torch.uint8), None
    try:
        raw = _pickled(obj)
    except Exception as e:  # noqa: BLE001 - every rank raises it below
        problem = f"rank {ctx.rank} cannot pickle its object: {type(e).__name__}: {e}"
    sizes = [e[0] for e in _agree("allgather_object", 0, [raw.numel()], problem)]
    buf = torch.zeros(sum(sizes), dtype=torch.uint8)
    off = sum(sizes[:ctx.rank])
    buf[off:off + raw.numel()] = raw
    got = _exchange(buf)
    out, off = [], 0
    for n in sizes:
        out.append(_unpickled(got[off:off + n]))
        off += n
    return out
