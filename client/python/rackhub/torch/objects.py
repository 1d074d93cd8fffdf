"""Collectives of objects and of many tensors at once: broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object (Horovod's
names). Each is one op of the executor (handles.py), its bytes carried
exactly (rounds.py); a rank that cannot take part (an object that does not
pickle) or tensors that differ across ranks raise on every rank.

Thread use: any thread submits; the ops run on the executor's thread.
"""
import io
import zlib

import torch

from . import _context, agree, rounds
from .collectives import _root, broadcast_bytes, raw, submit
from .handles import synchronize


def _tensors_of(obj):
    if isinstance(obj, torch.nn.Module):
        return list(obj.state_dict(keep_vars=True).items())
    if isinstance(obj, dict):
        return list(obj.items())
    items = list(obj)
    if items and not isinstance(items[0], tuple):
        return [(str(i), t) for i, t in enumerate(items)]
    return items


def _broadcast_parameters_run(items, root_rank):
    ctx = _context.need()
    sizes = [t.numel() * t.element_size() for _, t in items]
    total = sum(sizes)
    layout = zlib.crc32(repr([(tuple(t.shape), str(t.dtype)) for _, t in items]).encode())
    payload = torch.zeros(total, dtype=torch.uint8)
    if ctx.rank == root_rank:
        off = 0
        for (_, t), n in zip(items, sizes):
            payload[off:off + n] = raw(t)
            off += n
    every, got = broadcast_bytes("broadcast_parameters", None, root_rank,
                                 [total, len(items), layout], payload)
    # (None: a slot of an elastic job without a member.)
    if any(e is not None and e[:3] != every[root_rank][:3] for e in every):
        raise agree.MismatchError(
            "broadcast_parameters: the ranks pass different tensors (count, bytes, shapes or "
            "dtypes): " + ", ".join(f"rank {r}: {e[1]} tensors of {e[0]} bytes"
                                    for r, e in enumerate(every) if e is not None))
    if ctx.rank == root_rank:
        return
    off = 0
    with torch.no_grad():
        for (_, t), n in zip(items, sizes):
            if n:  # a copy first: a view as t.dtype needs an aligned offset
                t.copy_(got[off:off + n].clone().view(t.dtype).view(t.shape))
            off += n


def broadcast_parameters(params, root_rank=0):
    """Makes every rank's tensors equal to root_rank's, bit for bit.

    params: an nn.Module (its state_dict: parameters and buffers), a dict
    name -> tensor (model.state_dict()), an iterable of (name, tensor)
    (model.named_parameters()) or of tensors. Every rank passes the same
    names, shapes and dtypes (checked: a mismatch raises MismatchError, a
    ValueError, on every rank). Any dtype and device; copied in place."""
    items = [(n, t) for n, t in _tensors_of(params) if isinstance(t, torch.Tensor)]
    root = _root(root_rank)  # an elastic job: the member's hub rank
    synchronize(submit("broadcast_parameters", None,
                       lambda: _broadcast_parameters_run(items, root)))


def _pickled(obj):
    b = io.BytesIO()
    torch.save(obj, b)
    return torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8)


def _unpickled(data):
    # Tensors land on the CPU (state_dict loaders move them to their device).
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu")


def _broadcast_object_run(obj, root_rank, name):
    ctx = _context.need()
    data, problem = torch.empty(0, dtype=torch.uint8), None
    if ctx.rank == root_rank:
        try:
            data = _pickled(obj)
        except Exception as e:  # noqa: BLE001 - every rank raises it
            problem = f"rank {ctx.rank} cannot pickle the object: {type(e).__name__}: {e}"
    every, got = _broadcast_object_bytes(root_rank, name, data, problem)
    return obj if ctx.rank == root_rank else _unpickled(got)


def _broadcast_object_bytes(root_rank, name, data, problem):
    if problem is None:
        return broadcast_bytes("broadcast_object", name, root_rank, [data.numel()], data)
    agree.open_op("broadcast_object", name, [0], root=root_rank, problem=problem)
    raise AssertionError("unreachable: open_op raises for a problem")


def broadcast_object(obj, root_rank=0, name=None):
    """Returns root_rank's `obj` on every rank (pickled; tensors inside are
    carried too). The other ranks' `obj` is ignored."""
    root = _root(root_rank)  # an elastic job: the member's hub rank
    return synchronize(submit("broadcast_object", name,
                              lambda: _broadcast_object_run(obj, root, name)))


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Every rank's optimizer takes root_rank's state_dict (hyperparameters
    such as the learning rate, and the per-parameter state: momentum
    buffers, Adam moments, step counts). The optimizers must hold the same
    parameters in the same order. For a hub-side DistributedOptimizer the
    per-parameter state lives on the hub; the hyperparameters are taken."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if _context.need().rank != _root(root_rank):
        optimizer.load_state_dict(state)


def _allgather_object_run(obj, name):
    ctx = _context.need()
    data, problem = torch.empty(0, dtype=torch.uint8), None
    try:
        data = _pickled(obj)
    except Exception as e:  # noqa: BLE001 - every rank raises it
        problem = f"rank {ctx.rank} cannot pickle its object: {type(e).__name__}: {e}"
    every, _ = agree.open_op("allgather_object", name, [data.numel()], problem=problem)
    # By rank (hub slots in an elastic job, whose free slots are None).
    sizes = [0 if e is None else e[0] for e in every]
    buf = torch.zeros(sum(sizes), dtype=torch.uint8)
    off = sum(sizes[:ctx.rank])
    buf[off:off + data.numel()] = data
    got = rounds.exchange(buf)
    out, off = [], 0
    for e, n in zip(every, sizes):
        if e is not None:
            out.append(_unpickled(got[off:off + n]))
        off += n
    return out


def allgather_object(obj, name=None):
    """A list of every rank's `obj`, by rank (pickled)."""
    return synchronize(submit("allgather_object", name,
                              lambda: _allgather_object_run(obj, name)))
