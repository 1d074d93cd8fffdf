"""Grouped collectives (Horovod's grouped_allreduce, grouped_allgather):
one op for a list of tensors, with the results the ungrouped ops give.

grouped_allreduce reduces the group in one op (exact.reduce): one header
round (carrying the first elements) and as few data rounds as the group's
total size needs, instead of one round trip per tensor; each result is
bit-identical to the ungrouped allreduce's.

grouped_allgather: a header round, one exchange of every tensor's first
dimension on every rank, one exchange of all the bytes: three round trips
whatever the group's length. sparse_allreduce_async is a grouped allgather
of a sparse tensor's indices and values (Horovod's definition).

Thread use: any thread submits; the ops run on the executor's thread.
"""
import math

import torch

from . import _context, agree, exact, rounds
from .collectives import (OPS, Average, factor, name_arg, op_of, raw, reducible, submit,
                          tensor_arg)
from .compression import Compression, compressor_of
from .handles import synchronize


def tensors_arg(tensors, what):
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what}: a list or tuple of tensors is needed, got "
                        f"{type(tensors).__name__}")
    return [tensor_arg(t, what) for t in tensors]


def _layout(ts):
    return [(tuple(t.shape), str(t.dtype)) for t in ts]


def grouped_allreduce_run(ts, name, op, pre, post, out=None, kind="grouped_allreduce"):
    """The op of grouped_allreduce (and of grouped_reducescatter, `kind`)."""
    flats = [t.detach().to("cpu").contiguous().view(-1) for t in ts]
    group_dtype = exact.header_dtype(flats)
    code = exact.MIXED if group_dtype is None else agree.dtype_code(group_dtype)

    def check(every):
        agree.same(kind, every, 3, "ops or group lengths",
                   lambda v: f"op {v // 1000}, {v % 1000} tensors")
        agree.same(kind, every, 1, "total element counts")
        agree.same(kind, every, 2, "shapes or dtypes", mine=_layout(ts))
    totals = exact.reduce(kind, name, flats, op, pre, post,
                          [code, sum(f.numel() for f in flats), agree.crc(_layout(ts)),
                           OPS[op] * 1000 + len(ts)], check)
    results = []
    for i, (t, total) in enumerate(zip(ts, totals)):
        r = total.view(t.shape).to(t.device)
        if out is None:
            results.append(r)
        else:
            with torch.no_grad():
                out[i].copy_(r)
            results.append(out[i])
    return results


def group_args(tensors, average, op, prescale_factor, postscale_factor, what):
    ts = [reducible(t, what) for t in tensors_arg(tensors, what)]
    if len(ts) >= 1000:
        raise ValueError(f"{what}: at most 999 tensors in a group, got {len(ts)}")
    return (ts, op_of(average, op, what), factor(prescale_factor, f"{what}: prescale_factor"),
            factor(postscale_factor, f"{what}: postscale_factor"))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0):
    """Starts one allreduce of a list of tensors; synchronize(handle)
    returns the list of results (each as allreduce would return it)."""
    ts, op, pre, post = group_args(tensors, average, op, prescale_factor, postscale_factor,
                              "grouped_allreduce")
    return submit("grouped_allreduce", name_arg(name, "grouped_allreduce"),
                  lambda: grouped_allreduce_run(ts, name, op, pre, post))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0):
    """In place: like grouped_allreduce_async; each tensor takes its result."""
    ts, op, pre, post = group_args(tensors, average, op, prescale_factor, postscale_factor,
                              "grouped_allreduce_")
    return submit("grouped_allreduce", name_arg(name, "grouped_allreduce_"),
                  lambda: grouped_allreduce_run(ts, name, op, pre, post, out=ts))


@_context.keeps_view
class _GroupedAllreduce(torch.autograd.Function):
    """grouped_allreduce as a differentiable function: the gradients are
    the grouped allreduce of the results' gradients (same op and factors)."""

    @staticmethod
    def forward(ctx, average, name, op, pre, post, *tensors):
        ctx.args = (average, op, pre, post)
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op, pre,
                                                         post)))

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post = ctx.args
        grads = [g.contiguous() for g in grads]
        got = synchronize(grouped_allreduce_async(grads, average, None, op, pre, post))
        return (None, None, None, None, None) + tuple(got)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0):
    """The allreduce of each tensor of the list, in one op; returns a list.
    Differentiable."""
    comp = compressor_of(compression)
    pairs = [comp.compress(t) for t in tensors_arg(tensors, "grouped_allreduce")]
    if not pairs:
        return synchronize(grouped_allreduce_async([], average, name, op, prescale_factor,
                                                   postscale_factor))
    got = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                  *[p[0] for p in pairs])
    return [comp.decompress(g, p[1]) for g, p in zip(got, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0):
    """In place: each tensor takes its allreduce; returns the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor))


def _grouped_allgather_run(ts, name):
    ctx = _context.need()
    shapes = [list(t.shape) if t.dim() else [1] for t in ts]
    trailing = [(s[1:], str(t.dtype)) for s, t in zip(shapes, ts)]
    every, _ = agree.open_op("grouped_allgather", name, [len(ts), agree.crc(trailing)])
    agree.same("grouped_allgather", every, 0, "group lengths")
    agree.same("grouped_allgather", every, 1, "dtypes or shapes beyond dimension 0",
               mine=[(tuple(t.shape), str(t.dtype)) for t in ts])
    # Every rank's first dimensions (int64 at the rank's own place).
    k = len(ts)
    mine = torch.zeros(ctx.size * k, dtype=torch.int64)
    mine[ctx.rank * k:(ctx.rank + 1) * k] = torch.tensor([s[0] for s in shapes],
                                                         dtype=torch.int64)
    rows = rounds.exchange(mine.view(torch.uint8)).view(torch.int64).view(ctx.size, k).tolist()
    # One buffer: tensor i's rows of rank 0, rank 1, ..., then tensor i + 1.
    row_bytes = [t.element_size() * math.prod(s[1:]) for t, s in zip(ts, shapes)]
    sizes = [sum(rows[r][i] for r in range(ctx.size)) * row_bytes[i] for i in range(k)]
    buf = torch.zeros(sum(sizes), dtype=torch.uint8)
    base = 0
    for i, t in enumerate(ts):
        off = base + sum(rows[r][i] for r in range(ctx.rank)) * row_bytes[i]
        n = rows[ctx.rank][i] * row_bytes[i]
        buf[off:off + n] = raw(t)
        base += sizes[i]
    got = rounds.exchange(buf)
    out, base = [], 0
    for i, t in enumerate(ts):
        total_rows = sum(rows[r][i] for r in range(ctx.size))
        part = got[base:base + sizes[i]].clone()
        base += sizes[i]
        shape = [total_rows] + shapes[i][1:]
        out.append((part.view(t.dtype).view(shape) if part.numel()
                    else torch.empty(shape, dtype=t.dtype)).to(t.device))
    return out


def grouped_allgather_async(tensors, name=None):
    """Starts one allgather of a list of tensors; synchronize(handle)
    returns the list of results (each as allgather would return it)."""
    ts = tensors_arg(tensors, "grouped_allgather")
    return submit("grouped_allgather", name_arg(name, "grouped_allgather"),
                  lambda: _grouped_allgather_run(ts, name))


def grouped_allgather(tensors, name=None):
    """The allgather of each tensor of the list, in one op; returns a list."""
    return synchronize(grouped_allgather_async(tensors, name))


def _sparse_run(t, name, op):
    t = t.coalesce() if not t.is_coalesced() else t
    indices = t.indices().transpose(0, 1).contiguous()
    values = t.values().contiguous()
    got_i, got_v = _grouped_allgather_run([indices, values], name)
    if op == Average:  # by the op's ranks: an elastic job's members, not its slots
        got_v = got_v / _context.dense(_context.need())[1]
    return torch.sparse_coo_tensor(got_i.transpose(0, 1), got_v, t.size())


def sparse_allreduce_async(tensor, name=None, op=Average):
    """Starts the allreduce of a sparse COO tensor as Horovod does: every
    rank's indices and values are allgathered (one grouped op) and the
    result is their sparse tensor, uncoalesced (duplicate indices add up
    when it is coalesced or used); Average divides the values by size()
    (in an elastic job the current members).
    synchronize(handle) returns it."""
    tensor_arg(tensor, "sparse_allreduce_async")
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async: a sparse COO tensor is needed "
                         "(allreduce_async takes dense ones)")
    op = op_of(None, op, "sparse_allreduce_async")
    return submit("grouped_allgather", name_arg(name, "sparse_allreduce_async"),
                  lambda: _sparse_run(tensor, name, op))
