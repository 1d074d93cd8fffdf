"""Exact reductions: allreduce (and grouped_allreduce, reducescatter,
grouped_reducescatter, their async forms) give, for every dtype they take,
bit for bit the result of a reduction in rank order in the tensor's own
dtype, as torch computes it on the CPU, with Horovod's scale factors:

    y_r = scale(x_r, prescale)                    on every rank r
    acc = y_0; acc = acc (op) y_r for r = 1 .. size-1   (torch, in dtype)
    result = scale(acc, postscale [/ size() for Average])

scale(t, f): integers (t as float64 * f) converted back (truncated toward
zero; a value outside the dtype's range converts as torch converts it,
undefined in C++ and so in Horovod too); float32 t * (float32)f; float16 and
bfloat16 (float32(t) * (float32)f rounded to float32, then to the dtype);
float64 t * f: what Horovod's ScaleBuffer does on the CPU. Integer Sum wraps
around as torch's (and C's) integer addition does; Product likewise. Min and
Max: NaN propagates, -0 is below +0 (collectives.py).

The hub only sums, takes min/max or multiplies fp32 (fp16/bf16 on the wire)
in rank order. Per dtype and op (size() = W):

- float32, every op: the hub's fp32 rank-order reduction is the reference
  (rank 0's value first, the others combined in rank order).
- float16/bfloat16: Min/Max through the hub (a minimum is one of the
  values, exact in fp32). Sum/Average/Product with W <= 2: the hub's fp32
  result of two 16-bit values rounded once is torch's 16-bit addition or
  product; with W > 2 "gather" (below).
- integers, Sum/Average: "limbs": each value's two's-complement bits are
  cut into m limbs of L bits, L the largest with W * (2**L - 1) <= 2**24,
  so the hub's fp32 sum of a limb over the ranks is exact; the limb sums
  are recombined with carries in int64 and the bits above the dtype's
  dropped (the wrap-around of a rank-order sum in the dtype). uint8/int8
  (W <= 65793) and int16 (W <= 256) are one limb, int32 two (W <= 256),
  int64 three (W <= 4) or four (W <= 256): 4, 8 or 16 bytes of fp32 on the
  wire per element (1, 2, 4 or 8 bytes in the dtype).
- integers, Min/Max: "lexicographic rounds": the value as a signed top
  limb and unsigned 24-bit limbs below it (int32: 8 + 24 bits, two rounds;
  int64: 16 + 24 + 24, three rounds; 8- and 16-bit integers: one round).
  Round k reduces limb k of the ranks still tied with the best so far (the
  others send the op's identity, +-inf), so the limbs of the result are
  exact min/max of fp32 integers below 2**24.
- "gather": float64 (every op), integer Product, and float16/bfloat16
  Sum/Average/Product when W > 2: every rank's bytes are allgathered
  (rounds.exchange) and reduced locally in rank order. Cost: each rank
  pushes and pulls W times the tensor's bytes twice over (bytes travel as
  16-bit halves in fp32 elements): 2 * W * 8 bytes per float64 element,
  against 4 for a hub-reduced fp32 element.

A group (grouped_allreduce) puts its tensors in one op: the hub-summed
buffer (fp32 values, limbs, 16-bit values for W <= 2) starts in the header
round and continues in data rounds; Min/Max/Product reduce their buffer in
the op's helper keys, then one round per further integer limb; then one
exchange of every gathered tensor's bytes. A rank that called join()
contributes -0.0 (Sum, Average: the identity of IEEE addition, so the sum
is the active ranks' bit for bit, the sign of a zero included; Average
still divides by size()), the op's identity (Min, Max, Product), and
gathered ops skip it (as an elastic job's free slots, which push nothing);
it follows the same rounds from the op's header
(plan_of), and for a group of mixed dtypes from one extra exchange of the
dtypes' element counts (layout_round), which only joins cost.

Thread use: the executor's thread (handles.py).
"""
import math

import torch

from . import _context, agree, rounds
from .hub_specs import Average, Max, Min, Product, Sum

INTS = {torch.uint8: 8, torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
HALF = (torch.float16, torch.bfloat16)
SUMS = (Average, Sum)
MIXED = 99  # the header's dtype field of a group of several dtypes
# What a rank that takes no part (a joined rank) adds to a sum: -0.0, the
# identity of IEEE addition (-0.0 + x == x for every x, -0.0 included); +0.0
# would turn a sum whose other terms are all -0.0 into +0.0.
NOTHING = -0.0
_LEX_BITS = 24
# The dtypes of a layout round, in agree's order of codes.
_LAYOUT = [agree.dtype_of(c) for c in range(1, 10)]


def limb_bits(size):
    """L: the widest limb whose sum over `size` ranks is exact in fp32."""
    bits = 1
    while bits < 24 and size * ((1 << (bits + 1)) - 1) <= 1 << 24:
        bits += 1
    return bits


def lex_limbs(dtype):
    """The lexicographic limbs of an integer dtype: (shift, bits, signed)
    from the top."""
    b = INTS[dtype]
    if b <= _LEX_BITS:
        return [(0, b, True)]
    out, shift = [], 0
    while b - shift > _LEX_BITS:
        out.append((shift, _LEX_BITS, False))
        shift += _LEX_BITS
    out.append((shift, b - shift, True))
    return out[::-1]


def method(dtype, op, size):
    """How a tensor of dtype goes: "hub", "limbs", "lex" or "gather"."""
    if dtype == torch.float32:
        return "hub"
    if dtype in HALF:
        return "hub" if op in (Min, Max) or size <= 2 else "gather"
    if dtype in INTS:
        return "limbs" if op in SUMS else "lex" if op in (Min, Max) else "gather"
    return "gather"  # float64


class Plan:
    """The buffers of an op over tensors of (dtype, numel): `hub` fp32
    elements reduced by the op in the first data buffer, `lex[k]` elements
    of further rounds, `gather` bytes per rank."""

    def __init__(self, layout, op, size):
        self.hub, self.lex, self.gather = 0, [], 0
        bits = limb_bits(size)
        for dtype, n in layout:
            m = method(dtype, op, size)
            if m == "hub":
                self.hub += n
            elif m == "limbs":
                self.hub += n * math.ceil(INTS[dtype] / bits)
            elif m == "lex":
                limbs = lex_limbs(dtype)
                self.hub += n
                for k in range(1, len(limbs)):
                    if len(self.lex) < k:
                        self.lex.append(0)
                    self.lex[k - 1] += n
            else:
                self.gather += n * (torch.finfo(dtype).bits if dtype.is_floating_point
                                    else INTS[dtype]) // 8


def _identity(op):
    return math.inf if op == Min else -math.inf if op == Max else 1.0


# ---- scaling (Horovod's ScaleBuffer on the CPU) ----

def scale(t, f):
    """t * f in t's dtype as Horovod scales a buffer (module docstring)."""
    if f == 1.0:
        return t
    d = t.dtype
    if d == torch.float64:
        return t * f
    if d in INTS:
        return (t.to(torch.float64) * f).to(d)
    f32 = float(torch.tensor(f, dtype=torch.float32))
    wide = (t.to(torch.float64) * f32).to(torch.float32)  # exact product, rounded once
    return wide if d == torch.float32 else wide.to(d)


# ---- integer limbs ----

def _split(v, dtype, bits):
    """The Sum limbs of v (int64): m tensors of values below 2**bits."""
    b = INTS[dtype]
    return [((v >> s) & ((1 << min(bits, b - s)) - 1)) for s in range(0, b, bits)]


def _join_limbs(sums, dtype, bits):
    """The dtype's wrap-around sum from the limbs' exact sums (int64): the
    digits with carries, their bits above the dtype's dropped (torch's
    int64 shift and narrowing conversion wrap)."""
    b = INTS[dtype]
    carry = torch.zeros_like(sums[0])
    out = torch.zeros_like(sums[0])
    for k, s in enumerate(range(0, b, bits)):
        w = min(bits, b - s)
        v = sums[k] + carry
        out = out | ((v & ((1 << w) - 1)) << s)
        carry = v >> w
    return out.to(dtype)


def _lex_parts(v, dtype):
    return [(v >> s) & ((1 << w) - 1) if not signed else v >> s
            for s, w, signed in lex_limbs(dtype)]


# ---- local rank-order reduction of gathered values ----

def combine(op, a, b):
    """a op b in the dtype: Sum/Average add, Product multiplies, Min/Max
    take the smaller/larger with NaN propagated (a's NaN first) and -0
    below +0."""
    if op in SUMS:
        return a + b
    if op == Product:
        return a * b
    if not a.dtype.is_floating_point:
        return torch.minimum(a, b) if op == Min else torch.maximum(a, b)
    r = torch.where((a < b) if op == Min else (a > b), a, b)
    zeros = torch.where(torch.signbit(a) == (op == Min), a, b)
    r = torch.where(a == b, zeros, r)
    r = torch.where(torch.isnan(b), b, r)
    return torch.where(torch.isnan(a), a, r)


def _gathered(rows, op, live):
    """The rank-order reduction of rows (a list by rank) over the live ranks:
    a joined rank or an elastic job's free slot (not live) is skipped, which
    for Sum/Average is adding -0.0, the identity of IEEE addition (adding
    its +0.0 row would turn a sum of -0.0s into +0.0)."""
    acc = None
    for r, x in enumerate(rows):
        if not live[r]:
            continue
        acc = x if acc is None else combine(op, acc, x)
    return acc


# ---- the op ----

def header_dtype(tensors):
    dtypes = {t.dtype for t in tensors}
    return dtypes.pop() if len(dtypes) == 1 else None


def wire_of(plan_dtype):
    """The hub buffer's wire type: the 16-bit type of a group of one such
    dtype (its values are exact in it), else fp32."""
    if plan_dtype in HALF:
        return {torch.float16: "fp16", torch.bfloat16: "bf16"}[plan_dtype]
    return "fp32"


def layout_round(counts):
    """Every active rank passes its per-dtype element counts (None on a
    joined rank); returns the first active rank's."""
    ctx = _context.need()
    k = len(_LAYOUT)
    buf = torch.zeros(ctx.size * k, dtype=torch.int64)
    if counts is not None:
        buf[ctx.rank * k:(ctx.rank + 1) * k] = torch.tensor(counts, dtype=torch.int64)
    got = rounds.exchange(buf.view(torch.uint8)).view(torch.int64).view(ctx.size, k)
    for row in got.tolist():
        if any(row):
            return row
    return [0] * k


def _counts(flats):
    return [sum(f.numel() for f in flats if f.dtype == d) for d in _LAYOUT]


def _pack(ys, op, size):
    """This rank's parts of the op over tensors ys: the hub buffer (fp32),
    each tensor's (method, offset in it), the lower limbs of each "lex"
    tensor (by tensor index), the gathered bytes."""
    bits = limb_bits(size)
    hub, spans, lex, gather, off = [], [], {}, [], 0
    for i, y in enumerate(ys):
        m = method(y.dtype, op, size)
        spans.append((m, off))
        if m == "hub":
            parts = [y.to(torch.float32)]
        elif m == "limbs":
            parts = [p.to(torch.float32) for p in _split(y.to(torch.int64), y.dtype, bits)]
        elif m == "lex":
            limbs = _lex_parts(y.to(torch.int64), y.dtype)
            parts, lex[i] = [limbs[0].to(torch.float32)], limbs[1:]
        else:
            parts = []
            gather.append(y.contiguous().view(torch.uint8) if y.numel()
                          else torch.zeros(0, dtype=torch.uint8))
        hub += parts
        off += sum(p.numel() for p in parts)
    return (torch.cat(hub) if hub else torch.zeros(0), spans, lex,
            torch.cat(gather) if gather else torch.zeros(0, dtype=torch.uint8))


def _open(kind, name, values, check, op, hub, wire, mixed, counts):
    """The header round and the hub buffer's rounds. Returns (every rank's
    header values, None for joined ranks; the hub buffer reduced)."""
    joinable = kind in agree.JOINABLE
    cap = rounds.capacity() if op in SUMS else 0
    every, head = agree.open_op(kind, name, values, inline=hub[:cap] if cap else None,
                                joinable=joinable)
    check(every)
    if mixed and any(e is None for e in every):
        layout_round(counts)
    if op in SUMS:
        return every, head[:hub.numel()] if hub.numel() <= cap else torch.cat(
            [head, rounds.reduce(hub[cap:], "allreduce", wire)])
    return every, rounds.reduce(hub, "allreduce", wire, reduction=op)


def _lex_rounds(ys, spans, lex, hub_sum, op):
    """The further rounds of integer Min/Max: round k reduces limb k + 1 of
    the ranks still tied with the best limbs so far (the others send the
    op's identity). Returns {tensor index: its result in its dtype}."""
    best = {i: [hub_sum[spans[i][1]:spans[i][1] + ys[i].numel()].to(torch.int64)] for i in lex}
    tied = {i: _lex_parts(ys[i].to(torch.int64), ys[i].dtype)[0] == best[i][0] for i in lex}
    ident = torch.tensor(_identity(op))
    for k in range(max((len(p) for p in lex.values()), default=0)):
        idx = [i for i in lex if len(lex[i]) > k]
        send = torch.cat([torch.where(tied[i], lex[i][k].to(torch.float32), ident)
                          for i in idx])
        got = rounds.reduce(send, "allreduce", "fp32", reduction=op)
        off = 0
        for i in idx:
            n = ys[i].numel()
            g = got[off:off + n].to(torch.int64)
            off += n
            tied[i] = tied[i] & (lex[i][k] == g)
            best[i].append(g)
    out = {}
    for i in lex:
        v = torch.zeros(ys[i].numel(), dtype=torch.int64)
        for (shift, _, _), part in zip(lex_limbs(ys[i].dtype), best[i]):
            v = v + part * (1 << shift)  # the top limb signed: no overflow
        out[i] = v.to(ys[i].dtype)
    return out


def reduce(kind, name, flats, op, pre, post, values, check):
    """The op over every rank's flat CPU tensors `flats` (any of the
    reducible dtypes): opens it with `values` in the header (check(every)
    must accept every rank's) and returns the results, flat, in each
    tensor's dtype, scaled."""
    ctx = _context.need()
    size = ctx.size
    # Average divides by the ranks of the op: the set's (a process set's
    # view), or an elastic job's current members (ctx.size is its slots).
    mean_size = _context.dense(ctx)[1]
    bits = limb_bits(size)
    ys = [scale(f, pre) for f in flats]
    group_dtype = header_dtype(ys)
    hub, spans, lex, mine = _pack(ys, op, size)
    every, hub_sum = _open(kind, name, values, check, op, hub, wire_of(group_dtype),
                           group_dtype is None, _counts(flats))
    live = [e is not None for e in every]
    lex_results = _lex_rounds(ys, spans, lex, hub_sum, op)
    g = mine.numel()
    gathered = None
    if g:
        buf = torch.zeros(size * g, dtype=torch.uint8)
        buf[ctx.rank * g:(ctx.rank + 1) * g] = mine
        gathered = rounds.exchange(buf).view(size, g)
    out, goff = [], 0
    for i, (y, (m, off)) in enumerate(zip(ys, spans)):
        n, d = y.numel(), y.dtype
        if m == "hub":
            r = hub_sum[off:off + n].to(d)
        elif m == "limbs":
            k = math.ceil(INTS[d] / bits)
            r = _join_limbs([hub_sum[off + j * n:off + (j + 1) * n].to(torch.int64)
                             for j in range(k)], d, bits)
        elif m == "lex":
            r = lex_results[i]
        else:
            nb = n * y.element_size()
            r = _gathered([gathered[q, goff:goff + nb].clone().view(d) if nb
                           else torch.zeros(0, dtype=d) for q in range(size)], op, live)
            goff += nb
        out.append(scale(r, post / mean_size if op == Average else post))
    return out


def plan_of(dtype_code, numel, op):
    """The Plan a joined rank follows for an op whose header says
    dtype_code (MIXED: a layout round tells the counts) and numel."""
    size = _context.need().size
    if dtype_code == MIXED:
        counts = layout_round(None)
        return Plan(list(zip(_LAYOUT, counts)), op, size)
    return Plan([(agree.dtype_of(dtype_code), numel)], op, size)


def join_rounds(dtype_code, numel, op):
    """A joined rank's part of an allreduce (after the header round, whose
    inline part it sent as zeros): the same rounds as the active ranks,
    with -0.0 (Sum, Average: NOTHING) or the op's identity, and zero bytes."""
    ctx = _context.need()
    wire = wire_of(agree.dtype_of(dtype_code) if dtype_code != MIXED else None)
    plan = plan_of(dtype_code, numel, op)
    if op in SUMS:
        rest = plan.hub - rounds.capacity()
        if rest > 0:
            rounds.reduce(torch.full((rest,), NOTHING), "allreduce", wire)
    else:
        rounds.reduce(torch.full((plan.hub,), _identity(op)), "allreduce", wire, reduction=op)
        for n in plan.lex:
            rounds.reduce(torch.full((n,), _identity(op)), "allreduce", "fp32", reduction=op)
    if plan.gather:
        rounds.exchange(torch.zeros(ctx.size * plan.gather, dtype=torch.uint8))
