"""alltoall, reducescatter and grouped_reducescatter (Horovod's names and
results).

alltoall(tensor, splits=None): rank r sends rows [sum(splits[:d]),
sum(splits[:d + 1])) of its tensor to rank d (equal splits of dimension 0
when splits is None: it must divide by size()); every rank receives the
rows sent to it, in rank order. With splits it returns (output,
received_splits) as Horovod does, without only the output. Through the hub
it is an exchange of every rank's splits, then one exchange of all the
rows: every rank receives the whole exchange (size() times the bytes a
point-to-point alltoall moves), which is what a hub of sums can do.

reducescatter(tensor, op=Average): the allreduce of tensor, of which rank
r keeps its share of dimension 0: size() near-equal parts, the first
(rows % size()) ranks one row more (Horovod's split). prescale_factor and
postscale_factor as for allreduce. The whole tensor travels (an allreduce
through the hub), so the result is bit-identical to slicing an allreduce.
grouped_reducescatter does that for a list of tensors in one grouped op.

Elastic jobs: the ranks are the current members (rank() and size() are
dense): shares and alltoall's splits go by dense rank, Average (and the
factor of reducescatter's gradient) divides by the member count.

Thread use: any thread submits; the ops run on the executor's thread.
"""
import math

import torch

from . import _context, agree, rounds
from .collectives import (Average, allgather_async, allreduce_run, factor, name_arg, op_of,
                          raw, reducible, submit, tensor_arg)
from .compression import Compression, compressor_of
from .grouped import group_args, grouped_allgather_async, grouped_allreduce_run, tensors_arg
from .handles import synchronize


def _splits_arg(splits, rows, size, what):
    """This rank's splits as a list of ints, or a problem message."""
    if splits is None:
        if rows % size:
            return None, (f"{what}: dimension 0 ({rows}) does not divide by size() ({size}); "
                          f"pass splits")
        return [rows // size] * size, None
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64) or splits.dim() != 1:
            return None, f"{what}: splits: a 1-D int32/int64 tensor or a list of ints"
        splits = splits.tolist()
    try:
        s = [int(v) for v in splits]
    except (TypeError, ValueError):
        return None, f"{what}: splits: a list of ints, got {splits!r}"
    if len(s) != size or any(v < 0 for v in s) or sum(s) != rows:
        return None, (f"{what}: splits: {size} non-negative ints summing to dimension 0 "
                      f"({rows}), got {s}")
    return s, None


def _alltoall_run(tensor, splits, name):
    ctx = _context.need()
    t = tensor.detach()
    shape = list(t.shape) if t.dim() else [1]
    # splits go to the op's ranks (an elastic job's members, by dense rank);
    # the exchange below is over the hub's slots, free slots sending nothing.
    _, size = _context.dense(ctx)
    ranks = list(range(ctx.size)) if ctx.elastic is None else list(ctx.elastic.members)
    mine, problem = _splits_arg(splits, shape[0], size, "alltoall")
    every, _ = agree.open_op("alltoall", name, [agree.dtype_code(t.dtype),
                                                agree.crc(shape[1:]), int(splits is None)],
                             problem=problem)
    agree.same("alltoall", every, 0, "dtypes", agree.dtype_name)
    agree.same("alltoall", every, 1, "shapes (they differ beyond dimension 0)",
               mine=tuple(t.shape))
    agree.same("alltoall", every, 2, "uses of splits (some ranks pass splits, some do not)")
    n = ctx.size
    m = torch.zeros(n * n, dtype=torch.int64)
    for d, slot in enumerate(ranks):
        m[ctx.rank * n + slot] = mine[d]
    matrix = rounds.exchange(m.view(torch.uint8)).view(torch.int64).view(n, n).tolist()
    row = t.element_size() * math.prod(shape[1:])
    # The buffer: for each destination d, the rows every source s sends to d, by s.
    offsets, off = {}, 0
    for d in range(n):
        for s in range(n):
            offsets[(s, d)] = off
            off += matrix[s][d] * row
    buf = torch.zeros(off, dtype=torch.uint8)
    data = raw(t)
    src = 0
    for d in range(n):
        k = matrix[ctx.rank][d] * row
        buf[offsets[(ctx.rank, d)]:offsets[(ctx.rank, d)] + k] = data[src:src + k]
        src += k
    got = rounds.exchange(buf)
    received = [matrix[s][ctx.rank] for s in ranks]
    start = offsets[(0, ctx.rank)]
    part = got[start:start + sum(received) * row].clone()
    shape_out = [sum(received)] + shape[1:]
    out = (part.view(t.dtype).view(shape_out) if part.numel()
           else torch.empty(shape_out, dtype=t.dtype)).to(tensor.device)
    if splits is None:
        return out
    return out, torch.tensor(received, dtype=torch.int32)


def alltoall_async(tensor, splits=None, name=None):
    """Starts an alltoall; synchronize(handle) returns what alltoall returns."""
    tensor_arg(tensor, "alltoall")
    return submit("alltoall", name_arg(name, "alltoall"),
                  lambda: _alltoall_run(tensor, splits, name))


@_context.keeps_view
class _Alltoall(torch.autograd.Function):
    """alltoall as a differentiable function: the gradient goes back by an
    alltoall of the result's gradient with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name):
        got = synchronize(alltoall_async(tensor, splits, name))
        if splits is None:
            ctx.back = None
            return got
        out, received = got
        ctx.back = received.tolist()
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, *unused):
        if ctx.back is None:
            return synchronize(alltoall_async(grad.contiguous())), None, None
        return synchronize(alltoall_async(grad.contiguous(), ctx.back))[0], None, None


def alltoall(tensor, splits=None, name=None):
    """Sends rows of dimension 0 to every rank by `splits` (module
    docstring); returns the received rows (and, with splits, the received
    splits as an int32 tensor). Differentiable."""
    tensor_arg(tensor, "alltoall")
    return _Alltoall.apply(tensor, splits, name)


def _share(rows, size, rank):
    base, extra = divmod(rows, size)
    first = rank * base + min(rank, extra)
    return first, base + (rank < extra)


def _my_share(rows):
    """(first row, rows) of this rank's share of `rows`: split over the op's
    ranks (an elastic job's current members, by dense rank)."""
    rank, size = _context.dense(_context.need())
    return _share(rows, size, rank)


def _average_divisor(op):
    """What Average divides by (the op's ranks: an elastic job's members)."""
    return _context.dense(_context.need())[1] if op_of(None, op, "") == Average else 1


def _reducescatter_run(tensor, name, op, pre, post):
    first, n = _my_share(tensor.shape[0])
    return allreduce_run(tensor, name, op, pre, post, kind="reducescatter")[first:first + n] \
        .clone()


def reducescatter_async(tensor, name=None, op=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reducescatter; synchronize(handle) returns this rank's share."""
    op = op_of(None, op, "reducescatter")
    pre = factor(prescale_factor, "reducescatter: prescale_factor")
    post = factor(postscale_factor, "reducescatter: postscale_factor")
    reducible(tensor, "reducescatter")
    if tensor.dim() == 0:
        raise ValueError("reducescatter: a tensor of at least one dimension is needed")
    return submit("reducescatter", name_arg(name, "reducescatter"),
                  lambda: _reducescatter_run(tensor, name, op, pre, post))


@_context.keeps_view
class _Reducescatter(torch.autograd.Function):
    """reducescatter as a differentiable function: every rank's gradient is
    the allgather of the shares' gradients times the op's factor
    (prescale * postscale, / size() for Average)."""

    @staticmethod
    def forward(ctx, tensor, name, op, pre, post):
        ctx.factor = pre * post / _average_divisor(op)
        return synchronize(reducescatter_async(tensor, name, op, pre, post))

    @staticmethod
    def backward(ctx, grad):
        gathered = synchronize(allgather_async(grad.contiguous()))
        return (gathered.to(torch.float64) * ctx.factor).to(grad.dtype), None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's share of dimension 0 of the allreduce of `tensor`
    (module docstring). Differentiable."""
    comp = compressor_of(compression)
    compressed, cctx = comp.compress(tensor_arg(tensor, "reducescatter"))
    got = _Reducescatter.apply(compressed, name, op, factor(prescale_factor, "reducescatter"),
                               factor(postscale_factor, "reducescatter"))
    return comp.decompress(got, cctx)



def _grouped_reducescatter_run(ts, name, op, pre, post):
    full = grouped_allreduce_run(ts, name, op, pre, post, kind="grouped_reducescatter")
    out = []
    for t, r in zip(ts, full):
        first, n = _my_share(t.shape[0])
        out.append(r[first:first + n].clone())
    return out


def grouped_reducescatter_async(tensors, name=None, op=None, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Starts one reducescatter of a list of tensors (one grouped op);
    synchronize(handle) returns the list of this rank's shares."""
    ts, op, pre, post = group_args(tensors, None, op, prescale_factor, postscale_factor,
                                   "grouped_reducescatter")
    if any(t.dim() == 0 for t in ts):
        raise ValueError("grouped_reducescatter: tensors of at least one dimension are needed")
    return submit("grouped_reducescatter", name_arg(name, "grouped_reducescatter"),
                  lambda: _grouped_reducescatter_run(ts, name, op, pre, post))


@_context.keeps_view
class _GroupedReducescatter(torch.autograd.Function):
    """grouped_reducescatter as a differentiable function (as reducescatter's,
    per tensor, through one grouped allgather)."""

    @staticmethod
    def forward(ctx, name, op, pre, post, *tensors):
        ctx.factor = pre * post / _average_divisor(op)
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, pre,
                                                             post)))

    @staticmethod
    def backward(ctx, *grads):
        got = synchronize(grouped_allgather_async([g.contiguous() for g in grads]))
        return (None, None, None, None) + tuple(
            (g.to(torch.float64) * ctx.factor).to(g.dtype) for g in got)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatter of each tensor of the list, in one op; returns the
    list of this rank's shares. Differentiable."""
    comp = compressor_of(compression)
    pairs = [comp.compress(t) for t in tensors_arg(tensors, "grouped_reducescatter")]
    if not pairs:
        return []
    got = _GroupedReducescatter.apply(name, op, factor(prescale_factor, "grouped_reducescatter"),
                                      factor(postscale_factor, "grouped_reducescatter"),
                                      *[p[0] for p in pairs])
    return [comp.decompress(g, p[1]) for g, p in zip(got, pairs)]
