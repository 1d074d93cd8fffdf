"""Tensor collectives over the hub (Horovod's names and signatures):
allreduce, allgather, broadcast, barrier, each blocking and `*_async`.

Every op is submitted to the context's executor (handles.py) and returns a
handle; the blocking form is the same op followed by synchronize(). Every
rank must make the same collective calls in the same order (as with
Horovod without its name-based negotiation); the first round of every op
carries every rank's header (rounds.py, agree.py), so ranks whose ops do
not match (kind, name, dtype, shape, root, op) raise MismatchError (a
HorovodInternalError and a ValueError) together, never hang and never
return a result.

allreduce: every rank's tensor reduced by Sum, Average, Min, Max or
Product in rank order in the tensor's own dtype, with Horovod's
prescale/postscale, bit for bit as a single process would compute it with
torch (exact.py says how, per dtype, and what it costs). Min and Max
propagate NaN as torch.minimum / torch.maximum do, -0 below +0. Sum and
Average send their first elements in the header round (one round trip for
small tensors); Min, Max and Product go through helper keys of their own
reduction (rounds.py) after the header round.

allgather and broadcast move raw bytes (rounds.exchange): any dtype
arrives bit for bit.

Multi-rack tenants: ranks are global (rack * workers_per_rack + rank), see
lifecycle.init(racks=...).

Thread use: any thread submits; the ops run on the executor's thread.
"""
import math

import torch

from . import _context, agree, exact, rounds
from .compression import Compression, compressor_of
from .errors import HorovodInternalError
from .handles import Op, synchronize

# Reduction ops (Horovod's names) and their codes in an op's header.
from .hub_specs import Adasum, Average, Max, Min, Product, Sum  # noqa: F401

OPS = {Average: 1, Sum: 2, Min: 3, Max: 4, Product: 5}
OP_OF_CODE = {v: k for k, v in OPS.items()}


def op_of(average, op, what):
    if op is None:
        return Average if average is None or average else Sum
    if average is not None:
        raise ValueError(f"{what}: give op or average, not both")
    if op == Adasum:
        raise ValueError(f"{what}: op: Adasum is not implemented by rackhub (use Average or Sum)")
    if op not in OPS:
        raise ValueError(f"{what}: op: rackhub.torch.Average, Sum, Min, Max or Product, got "
                         f"{op!r}")
    return op


def factor(v, what):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"{what}: a finite number, got {v!r}")
    return f


def name_arg(name, what):
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{what}: name: a string or None, got {name!r}")
    return name


def tensor_arg(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: a torch.Tensor is needed, got {type(t).__name__}")
    return t


REDUCIBLE = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
             torch.float32, torch.float64, torch.bfloat16)  # Horovod's CPU dtypes


def reducible(t, what):
    """t, if its dtype is one the reductions take; else TypeError."""
    tensor_arg(t, what)
    if t.dtype not in REDUCIBLE or t.is_sparse:
        raise TypeError(f"{what}: {'a sparse tensor' if t.is_sparse else t.dtype} cannot be "
                        f"reduced (dense uint8, int8, int16, int32, int64, float16, bfloat16, "
                        f"float32 or float64)")
    return t


def submit(kind, name, run, finish=None):
    """Submits an op to the context's executor; returns its handle."""
    return _context.need().executor.submit(Op(kind, name, run, finish))


def allreduce_run(tensor, name, op, pre, post, out=None, kind="allreduce"):
    """The op of allreduce (and of reducescatter, `kind`): every rank's
    tensor reduced by op, scaled, in tensor's dtype (exact.py); into `out`
    when given."""
    t = tensor.detach()
    shape, dtype = tuple(t.shape), t.dtype
    flat = t.to("cpu").contiguous().view(-1)

    def check(every):
        agree.same(kind, every, 0, "dtypes", agree.dtype_name)
        agree.same(kind, every, 1, "element counts")
        agree.same(kind, every, 2, "shapes", mine=shape)
        agree.same(kind, every, 3, "ops (Average, Sum, Min, Max, Product)", OP_OF_CODE.get)
    total, = exact.reduce(kind, name, [flat], op, pre, post,
                          [agree.dtype_code(dtype), flat.numel(), agree.crc(shape), OPS[op]],
                          check)
    result = total.view(shape).to(tensor.device)
    if out is None:
        return result
    with torch.no_grad():
        out.copy_(result)
    return out


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """Starts an allreduce of `tensor`; returns a handle (synchronize(handle)
    returns the reduced tensor, a new one of tensor's dtype, shape and
    device). op: Average (default), Sum, Min, Max or Product. Do not modify
    `tensor` before the op finished."""
    op = op_of(average, op, "allreduce")
    pre = factor(prescale_factor, "allreduce: prescale_factor")
    post = factor(postscale_factor, "allreduce: postscale_factor")
    reducible(tensor, "allreduce")
    return submit("allreduce", name_arg(name, "allreduce"),
                  lambda: allreduce_run(tensor, name, op, pre, post))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """In place: like allreduce_async; the op writes the result into
    `tensor`, which synchronize(handle) returns."""
    op = op_of(average, op, "allreduce_")
    pre = factor(prescale_factor, "allreduce_: prescale_factor")
    post = factor(postscale_factor, "allreduce_: postscale_factor")
    reducible(tensor, "allreduce_")
    return submit("allreduce", name_arg(name, "allreduce_"),
                  lambda: allreduce_run(tensor, name, op, pre, post, out=tensor))


@_context.keeps_view
class _Allreduce(torch.autograd.Function):
    """allreduce as a differentiable function: the gradient of an allreduce
    is the allreduce of the gradient, with the same op and factors."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, pre, post):
        ctx.args = (average, op, pre, post)
        return synchronize(allreduce_async(tensor, average, name, op, pre, post))

    @staticmethod
    def backward(ctx, grad):
        average, op, pre, post = ctx.args
        return (synchronize(allreduce_async(grad.contiguous(), average, None, op, pre, post)),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    """Averages (op=Average, the default), sums (op=Sum) or takes the
    element-wise minimum, maximum or product (op=Min, Max, Product) of
    `tensor` over the ranks; returns a new tensor of the same dtype, shape
    and device.
    compression: a Compressor (Compression.none, .fp16, .bf16 or a
    user-written one): the compressed tensor is reduced and decompressed.
    Differentiable: the gradient is the allreduce of the result's gradient."""
    comp = compressor_of(compression)
    tensor_arg(tensor, "allreduce")
    compressed, cctx = comp.compress(tensor)
    summed = _Allreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor)
    return comp.decompress(summed, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, compression=Compression.none):
    """In place: tensor takes allreduce(tensor, ...)'s values. Returns tensor."""
    if compression in (None, Compression.none):
        return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                            postscale_factor))
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name, compression, op, prescale_factor,
                               postscale_factor))
    return tensor


def raw(t):
    """The bytes of tensor t (a copy on the host)."""
    t = t.detach()
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    flat = t.cpu().reshape(-1)
    # A transposed tensor with a dimension of size 1 (a 1-D sparse tensor's
    # indices.t()) counts as contiguous with a stride other than 1.
    if flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def _allgather_run(tensor, name):
    t = tensor.detach()
    shape = list(t.shape) if t.dim() else [1]
    row = t.element_size() * math.prod(shape[1:])
    every, _ = agree.open_op("allgather", name, [agree.dtype_code(t.dtype), row,
                                                 agree.crc(shape[1:]), shape[0]], joinable=True)
    agree.same("allgather", every, 0, "dtypes", agree.dtype_name)
    agree.same("allgather", every, 2, "shapes (they differ beyond dimension 0)",
               mine=tuple(t.shape))
    agree.same("allgather", every, 1, "row sizes")
    rows = [0 if e is None else e[3] for e in every]  # a joined rank contributes no rows
    ctx = _context.need()
    buf = torch.zeros(sum(rows) * row, dtype=torch.uint8)
    off = sum(rows[:ctx.rank]) * row
    buf[off:off + rows[ctx.rank] * row] = raw(t)
    got = rounds.exchange(buf)
    out = got.view(t.dtype).view([sum(rows)] + shape[1:]) if got.numel() else \
        torch.empty([sum(rows)] + shape[1:], dtype=t.dtype)
    return out.to(tensor.device)


def allgather_async(tensor, name=None):
    """Starts an allgather; synchronize(handle) returns every rank's tensor
    concatenated along dimension 0, in rank order (the first dimension may
    differ by rank; the others and the dtype must agree)."""
    tensor_arg(tensor, "allgather")
    return submit("allgather", name_arg(name, "allgather"), lambda: _allgather_run(tensor, name))


@_context.keeps_view
class _Allgather(torch.autograd.Function):
    """allgather as a differentiable function: each rank's gradient is its
    rows of the sum over the ranks of the result's gradients."""

    @staticmethod
    def forward(ctx, tensor, name):
        ctx.rows, ctx.shape = (tensor.shape[0] if tensor.dim() else 1), tensor.shape
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad):
        summed = synchronize(allreduce_async(grad.contiguous(), op=Sum))
        # (rank, rows) of every rank taking part, in rank order: this rank's
        # rows start after the rows of those before it (an elastic job's
        # free slots take no part; a process set's ranks are the set's).
        me = _context.need().rank
        every = synchronize(allgather_async(torch.tensor([[me, ctx.rows]], dtype=torch.int64)))
        mine = (every[:, 0] == me).nonzero().flatten().tolist()
        first = int(every[:mine[0], 1].sum()) if mine else -1
        if first < 0 or first + ctx.rows > summed.shape[0]:
            raise HorovodInternalError("allgather backward: the ranks taking part changed "
                                       "since the forward (an elastic job's membership)")
        return summed.narrow(0, first, ctx.rows).reshape(ctx.shape), None


def allgather(tensor, name=None, compression=Compression.none):
    """Concatenates every rank's tensor along dimension 0, in rank order.
    The other dimensions and the dtype must agree (the first may differ).
    Differentiable (each rank's gradient: its rows of the summed gradient)."""
    comp = compressor_of(compression)
    tensor_arg(tensor, "allgather")
    compressed, cctx = comp.compress(tensor)
    return comp.decompress(_Allgather.apply(compressed, name), cctx)


def broadcast_bytes(kind, name, root, values, payload):
    """The op that gives every rank root's `payload` (uint8, its length in
    values[0]) after the header check; `values` must agree on every rank.
    Returns (every rank's values, root's bytes)."""
    ctx = _context.need()
    mine = rounds.halves(payload) if ctx.rank == root else None
    cap = rounds.capacity()
    inline = mine if mine is not None and mine.numel() <= cap else None
    every, head = agree.open_op(kind, name, values, root=root, inline=inline)
    n = every[root][0]
    if (n + 1) // 2 <= cap:  # it came inline (from the root: the others sent zeros)
        return every, rounds.unhalves(head, n) if ctx.rank != root else payload
    buf = torch.zeros(n, dtype=torch.uint8)
    if ctx.rank == root:
        buf[:] = payload
    return every, rounds.exchange(buf)


def _broadcast_run(tensor, root, name, out):
    t = tensor.detach()
    every, got = broadcast_bytes(
        "broadcast", name, root,
        [t.numel() * t.element_size(), agree.dtype_code(t.dtype), agree.crc(tuple(t.shape))],
        raw(t))
    agree.same("broadcast", every, 1, "dtypes", agree.dtype_name)
    agree.same("broadcast", every, 0, "sizes (bytes)")
    agree.same("broadcast", every, 2, "shapes", mine=tuple(t.shape))
    with torch.no_grad():
        if _context.need().rank != root and got.numel():
            out.copy_(got.clone().view(t.dtype).view(t.shape))
    return out


def _root(root_rank):
    if not isinstance(root_rank, int) or isinstance(root_rank, bool):
        return repr(root_rank)
    el = _context.need().elastic  # an elastic job: the dense rank's hub rank
    return el.slot_of(root_rank) if el is not None else root_rank


def broadcast_async(tensor, root_rank, name=None):
    """Starts a broadcast; synchronize(handle) returns a new tensor equal to
    root_rank's `tensor` (same shape and dtype on every rank, bit for bit)."""
    tensor_arg(tensor, "broadcast")
    out = tensor.detach().clone()
    return submit("broadcast", name_arg(name, "broadcast"),
                  lambda: _broadcast_run(tensor, _root(root_rank), name, out))


def broadcast_async_(tensor, root_rank, name=None):
    """In place: like broadcast_async; the op writes root's values into
    `tensor`, which synchronize(handle) returns."""
    tensor_arg(tensor, "broadcast_")
    return submit("broadcast", name_arg(name, "broadcast_"),
                  lambda: _broadcast_run(tensor, _root(root_rank), name, tensor))


@_context.keeps_view
class _Broadcast(torch.autograd.Function):
    """broadcast as a differentiable function: the root's gradient is the
    sum over the ranks of the result's gradients; the others' is zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        summed = synchronize(allreduce_async(grad.contiguous(), op=Sum))
        if _context.need().rank != ctx.root:
            summed = torch.zeros_like(summed)
        return summed, None, None


def broadcast(tensor, root_rank, name=None):
    """A new tensor equal to root_rank's `tensor` (same shape on every rank).
    Differentiable (the root's gradient: the summed gradient; others': 0)."""
    tensor_arg(tensor, "broadcast")
    return _Broadcast.apply(tensor, root_rank, name)


def broadcast_(tensor, root_rank, name=None):
    """In place: tensor takes root_rank's values. Returns tensor."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def barrier():
    """Returns when every rank called barrier() (after this rank's earlier
    ops finished: they run in order)."""
    synchronize(submit("barrier", None, lambda: agree.open_op("barrier", None, []) and None))
