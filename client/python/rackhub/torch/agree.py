"""The check that opens every op: every rank's header (rounds.header) says
what this rank's op is, and every rank compares all of them, so a mismatch
raises the same error on every rank, before any result is used.

A header: the op's kind, its name (crc32, 0 without a name), its root
(NO_ROOT for ops without one, BAD for a root out of range), whether this
rank can take part (a local problem, e.g. an object that does not pickle),
and four ints of the op's own (dtype, element count, shape, reduction...).

Thread use: the executor's thread.
"""
import zlib

import torch

from . import _context, rounds
from .errors import MismatchError

NO_ROOT = None   # the root of an op without one
_NO_ROOT = -3    # its header field
_BAD = -2

KINDS = {1: "allreduce", 2: "allgather", 3: "broadcast", 4: "barrier",
         5: "broadcast_object", 6: "allgather_object", 7: "broadcast_parameters",
         8: "grouped_allreduce", 9: "grouped_allgather", 10: "alltoall", 11: "reducescatter",
         12: "join", 13: "grouped_reducescatter", 14: "optimizer_step", 15: "process_set"}
CODE = {v: k for k, v in KINDS.items()}

_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.float32, torch.float64, torch.bfloat16, torch.bool, torch.complex64,
           torch.complex128]


def dtype_code(dtype):
    return _DTYPES.index(dtype) + 1 if dtype in _DTYPES else zlib.crc32(str(dtype).encode())


def dtype_of(code):
    """The torch dtype of a dtype_code (float32 for an unknown one)."""
    return _DTYPES[code - 1] if 0 < code <= len(_DTYPES) else torch.float32


def dtype_name(code):
    return str(_DTYPES[code - 1]).replace("torch.", "") if 0 < code <= len(_DTYPES) else "?"


def crc(value):
    """A stable 32-bit digest of a name, shape or layout (0 for None)."""
    return 0 if value is None else zlib.crc32(repr(value).encode())


# What runs while ranks are joined (join.py); every rank's values of such an
# op are None for the joined ranks.
JOINABLE = ("allreduce", "grouped_allreduce", "allgather", "optimizer_step")


def open_op(kind, name, values, root=NO_ROOT, problem=None, inline=None, joinable=False):
    """The header round of an op of `kind` with up to four ints `values`.
    Raises on every rank (MismatchError) when the ranks' kinds, names or
    roots differ, a rank has a local `problem`, or the root is out of
    range. Returns (every rank's values, the inline sum). A `joinable` op
    (JOINABLE) runs with ranks that called join() (they contribute zeros or
    nothing, join.py); their values are None."""
    ctx = _context.need()
    if root is NO_ROOT:
        root_field = _NO_ROOT
    elif isinstance(root, int) and not isinstance(root, bool) and 0 <= root < ctx.size:
        root_field = root
    else:
        root_field = _BAD
    values = list(values) + [0] * (4 - len(values))
    every, got = rounds.header([CODE[kind], crc(name), root_field, _BAD if problem else 0]
                               + values, inline)
    # An all-zero header: the rank is not a member of an elastic job (it
    # pushed nothing; every real header has a kind). It takes no part.
    absent = {r for r, e in enumerate(every) if e[0] == 0}
    joined = [r for r, e in enumerate(every) if e[0] == CODE["join"]]
    if joined and not joinable:
        raise MismatchError(f"{kind}: rank(s) {joined} called join(); while a rank is "
                            f"joined the others may run {', '.join(JOINABLE)} only")
    live = [(r, e) for r, e in enumerate(every) if e[0] != CODE["join"] and r not in absent]
    if len({e[0] for _, e in live}) != 1:
        raise MismatchError(f"{kind}: the ranks' ops differ (every rank must call the same "
                            f"collectives in the same order): " + ", ".join(
                                f"rank {r}: {KINDS.get(e[0], e[0])}" for r, e in live))
    bad = [r for r, e in live if e[3] == _BAD]
    if problem or bad:
        raise MismatchError(f"{kind}: " + (problem or f"rank(s) {bad} could not take part "
                                                      f"(their error says why)"))
    if len({e[1] for _, e in live}) != 1:
        raise MismatchError(f"{kind}: the ranks' ops have different names at this point (every "
                            f"rank must call the same collectives in the same order); this "
                            f"rank's is {name!r}")
    if root_field == _BAD:
        raise MismatchError(f"{kind}: root_rank: {root!r} not in [0, {ctx.size})")
    if len({e[2] for _, e in live}) != 1:
        raise MismatchError(f"{kind}: the ranks name different roots: " + ", ".join(
            f"rank {r}: {'out of range' if e[2] == _BAD else e[2]}" for r, e in live))
    return [None if e[0] == CODE["join"] or r in absent else e[4:]
            for r, e in enumerate(every)], got


def same(kind, every, index, what, show=str, mine=None):
    """Raises MismatchError on every rank unless field `index` of every
    rank's values is equal; `what` names it, show(value) prints each rank's
    (or, with `mine`, only this rank's value is printed: a digest)."""
    if len({e[index] for e in every if e is not None}) != 1:
        if mine is not None:
            raise MismatchError(f"{kind}: the ranks' tensors have different {what} (this "
                                f"rank's: {mine})")
        raise MismatchError(f"{kind}: the ranks' tensors have different {what}: " + ", ".join(
            f"rank {r}: {show(e[index])}" for r, e in enumerate(every) if e is not None))
