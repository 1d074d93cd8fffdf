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
per call): two channel keys (4 Ki and 256 Ki elements) and one key per
(allreduce name or size, op, compression). They hold no state between calls.

Thread use: the thread that runs the training loop.
"""
import io

import torch

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


def _exchange(mine):
    """Every rank passes a uint8 tensor of the same length; returns the
    position-wise sum, which is the contributed bytes where exactly one rank
    wrote non-zero bytes (see the module docstring)."""
    ctx = _context.need()
    c = ctx.client
    n = mine.numel()
    padded = torch.zeros(n + (n & 1), dtype=torch.uint8)
    padded[:n] = mine
    halves = padded.view(torch.int16).to(torch.float32)
    out = torch.empty_like(halves)
    off = 0
    while off < halves.numel():
        left = halves.numel() - off
        size = _SMALL if left <= _SMALL else _LARGE
        take = min(left, size)
        src = torch.zeros(size, dtype=torch.float32)
        src[:take] = halves[off:off + take]
        dst = torch.empty(size, dtype=torch.float32)
        c.wait(c.push_pull(_key(ctx, "channel", "bytes", size), _np(src), _np(dst)))
        out[off:off + take] = dst[:take]
        off += take
    return out.to(torch.int16).view(torch.uint8)[:n]


def _gather_ints(values):
    """Every rank passes a list of the same number of ints; returns the
    lists of every rank, by rank."""
    ctx = _context.need()
    k = len(values)
    mine = torch.zeros(ctx.size * k, dtype=torch.int64)
    mine[ctx.rank * k:(ctx.rank + 1) * k] = torch.tensor(values, dtype=torch.int64)
    every = _exchange(mine.view(torch.uint8)).view(torch.int64)
    return [every[r * k:(r + 1) * k].tolist() for r in range(ctx.size)]


def _check_root(ctx, root_rank, what):
    if not isinstance(root_rank, int) or not 0 <= root_rank < ctx.size:
        raise ValueError(f"{what}: root_rank: {root_rank!r} not in [0, {ctx.size})")


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
    _check_root(ctx, root_rank, "broadcast_parameters")
    items = [(n, t) for n, t in _tensors_of(params) if isinstance(t, torch.Tensor)]
    sizes = [t.numel() * t.element_size() for _, t in items]
    total = sum(sizes)
    every = _gather_ints([total, len(items)])
    if any(e != every[root_rank] for e in every):
        raise ValueError("broadcast_parameters: the ranks pass different tensors: "
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
            if n:
                t.copy_(got[off:off + n].view(t.dtype).view(t.shape))
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
    return torch.load(io.BytesIO(raw.numpy().tobytes()))


def broadcast_object(obj, root_rank=0, name=None):
    """Returns root_rank's `obj` on every rank (pickled; tensors inside are
    carried too). The other ranks' `obj` is ignored."""
    ctx = _context.need()
    _check_root(ctx, root_rank, "broadcast_object")
    raw = _pickled(obj) if ctx.rank == root_rank else torch.empty(0, dtype=torch.uint8)
    n = _gather_ints([raw.numel()])[root_rank][0]
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
    tensors are exact while |sum| < 2**24). `name` (optional) names the
    helper key; calls with the same name and size reuse it."""
    ctx = _context.need()
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ValueError("allreduce: give op or average, not both")
    reduction = reduction_of(op)
    src = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().view(-1)
    key = _key(ctx, "allreduce", name or "anonymous", src.numel(), wire_dtype(compression),
               reduction)
    out = torch.empty_like(src)
    ctx.client.wait(ctx.client.push_pull(key, _np(src), _np(out)))
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
    dcode = sum(ord(ch) << (8 * (i % 7)) for i, ch in enumerate(dt))  # equal dtypes, equal codes
    every = _gather_ints([len(shape), dcode, t.numel() * t.element_size()] + shape[:1] +
                         [_shape_code(shape[1:])])
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


def _shape_code(dims):
    code = 0
    for d in dims:
        code = (code * 1_000_003 + d + 1) % (1 << 61)
    return code


def allgather_object(obj, name=None):
    """A list of every rank's `obj`, by rank (pickled)."""
    ctx = _context.need()
    raw = _pickled(obj)
    sizes = [e[0] for e in _gather_ints([raw.numel()])]
    buf = torch.zeros(sum(sizes), dtype=torch.uint8)
    off = sum(sizes[:ctx.rank])
    buf[off:off + raw.numel()] = raw
    got = _exchange(buf)
    out, off = [], 0
    for n in sizes:
        out.append(_unpickled(got[off:off + n]))
        off += n
    return out
