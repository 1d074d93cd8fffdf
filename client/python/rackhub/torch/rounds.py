"""The rounds every collective is made of: PushPulls of a few reused
helper keys of the tenant, and the header round that opens every op.

Helper keys: sum-only keys named `__rackhub/...`, reused by every call and
every later job on the tenant (no key is created per call): the channel
keys (fp32, 4 Ki and 256 Ki elements) and the reduction keys of allreduce
(the same two sizes per wire type: fp32, fp16, bf16, and per reduction:
sum, min, max, product; `__rackhub/allreduce/rounds/<n>/<dtype>/<reduction>`,
keys of reduction min, max and product are declared on first use). A tensor
larger than a key goes through it in rounds. They hold no state between
calls. The hub reduces in rank order, in fp32.

Exact bytes: broadcast and allgather move raw bytes through a channel key.
The bytes are carried as 16-bit integers in fp32 elements; exactly one rank
contributes a non-zero value at each position and the others add 0, so the
hub's sum reproduces every byte (x + 0 is exact for an integer-valued
float). Any dtype arrives bit for bit.

The header round: the first round of every op is a PushPull of the small
channel key that carries every rank's header (FIELDS int64s, as 16-bit
halves at the rank's own place) followed by an inline payload (the first
elements of an allreduce, or the bytes of a small broadcast). Every rank
thus learns every rank's header in the round that starts the op, and all
of them see the same headers, so a mismatch is detected by every rank at
once (agree.py) and never pairs an op with a different one's data.

Lateness: a round the hub aborted because a rank was later than the
straggler timeout (or RolledBack) is retried until the context's op_timeout;
a rank that died fails the op at once (WorkerLost), the key pulled first so
the next op works. In an elastic job every aborted round is pulled and
pushed again (the round then completes with the new membership; the
membership round at the next commit notices the change: elastic/).

Thread use: the executor's thread (handles.py), which runs one op at a time.
"""
import time

import torch

from .. import _core
from . import _context

SMALL = 4 << 10    # elements of the small keys (16 KiB of fp32 per round)
LARGE = 256 << 10  # elements of the large keys (1 MiB of fp32 per round)
FIELDS = 8         # int64 fields of a rank's header
_HALVES = FIELDS * 4


def _np(t):
    return t.detach().numpy()


def key(purpose, elements, dtype="fp32", reduction="sum"):
    """The helper key of `purpose` with `elements` elements of wire type
    `dtype` that reduces by `reduction` (sum, min, max or product)."""
    ctx = _context.need()
    k = (purpose, elements, dtype, reduction)
    if k not in ctx.keys:
        # A process set's keys (ctx is its SetView): named with its tag and
        # reduced by the hub over its ranks only (participants).
        extra = {"participants": ctx.participants} if ctx.participants else {}
        ctx.keys[k] = ctx.client.declare_key(
            f"__rackhub/{ctx.key_tag}{purpose}/rounds/{elements}/{dtype}/{reduction}", elements,
            dtype, {"type": "sum-only", "reduction": reduction}, False, **extra)
    return ctx.keys[k]


def _late_only(e, forming=False):
    """True if the hub aborted the round because a connected rank was late
    (straggler timeout) or the key's version moved (RolledBack), not because
    a rank died ("worker lost") or is not connected (it left). While the job
    is `forming` (init()'s first collective), a rank not connected yet is
    late too: it has not arrived."""
    text = str(e)
    return isinstance(e, _core.RolledBack) or (
        "straggler" in text and "worker lost" not in text and
        (forming or "not connected" not in text))


def push_pull(k, src, dst):
    """One PushPull of helper key `k` (src, dst: fp32 tensors of its size)."""
    ctx = _context.need()
    c = ctx.client
    deadline = time.monotonic() + ctx.op_timeout
    while True:
        try:
            c.wait(c.push_pull(k, _np(src), _np(dst)))
            if ctx.elastic is not None and c.key_info(k)["membership_generation"] not in (
                    0, ctx.elastic.generation):
                ctx.elastic.interrupted = True  # this round ran in another membership
            return
        except (_core.WorkerLost, _core.RolledBack) as e:
            try:
                c.wait(c.pull(k, _np(torch.empty_like(dst))))
            except _core.RackhubError:
                pass  # the original error says more
            if time.monotonic() >= deadline:
                raise
            if ctx.elastic is not None:
                ctx.elastic.interrupted = True
                continue  # the Pull waited for the new membership: push again in it
            if not _late_only(e, ctx.forming):
                raise
            time.sleep(0.05)  # back off before the retry the late rank will meet


def reduce(flat, purpose="allreduce", dtype="fp32", reduction="sum"):
    """The rank-order fp32 reduction (sum, min, max or product) of a flat
    fp32 tensor, in rounds of at most LARGE elements through the `purpose`
    keys of wire type `dtype` and that reduction. Every rank pads a round's
    unused tail alike (zeros); those elements are not returned."""
    out = torch.empty_like(flat)
    off = 0
    while off < flat.numel():
        left = flat.numel() - off
        size = SMALL if left <= SMALL else LARGE
        take = min(left, size)
        src = torch.zeros(size, dtype=torch.float32)
        src[:take] = flat[off:off + take]
        dst = torch.empty(size, dtype=torch.float32)
        push_pull(key(purpose, size, dtype, reduction), src, dst)
        out[off:off + take] = dst[:take]
        off += take
    return out


def halves(raw):
    """uint8 bytes -> fp32 elements holding their 16-bit halves."""
    n = raw.numel()
    padded = torch.zeros(n + (n & 1), dtype=torch.uint8)
    padded[:n] = raw
    return padded.view(torch.int16).to(torch.float32)


def unhalves(values, n):
    """The first n bytes carried by fp32 elements of 16-bit halves."""
    return values.to(torch.int16).view(torch.uint8)[:n]


def exchange(mine):
    """Every rank passes a uint8 tensor of the same length; returns the
    position-wise sum: the contributed bytes where exactly one rank wrote
    non-zero bytes."""
    n = mine.numel()
    return unhalves(reduce(halves(mine), "channel"), n)


def _header_size():
    return SMALL if _context.need().size * _HALVES <= SMALL // 2 else LARGE


def capacity():
    """fp32 elements of inline payload the header round carries."""
    return _header_size() - _context.need().size * _HALVES


def header(fields, inline=None):
    """The header round: every rank passes FIELDS ints and an optional flat
    fp32 `inline` of at most capacity() elements (summed over the ranks).
    Returns (every rank's fields, by rank; the sum of the inline payloads:
    all capacity() elements, whatever this rank sent)."""
    ctx = _context.need()
    assert len(fields) == FIELDS
    size = _header_size()
    hdr = ctx.size * _HALVES
    src = torch.zeros(size, dtype=torch.float32)
    mine = torch.tensor([int(f) for f in fields], dtype=torch.int64)
    src[ctx.rank * _HALVES:(ctx.rank + 1) * _HALVES] = mine.view(torch.int16).to(torch.float32)
    n = 0 if inline is None else inline.numel()
    if n:
        src[hdr:hdr + n] = inline
    dst = torch.empty(size, dtype=torch.float32)
    push_pull(key("channel", size), src, dst)
    every = dst[:hdr].to(torch.int16).view(torch.int64).view(ctx.size, FIELDS).tolist()
    return every, dst[hdr:].clone()
