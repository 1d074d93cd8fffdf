"""The exact reductions of rackhub.torch (exact.py), checked by
horovod_api_worker.py on every rank: every dtype x op x (prescale,
postscale) through allreduce, and through allreduce_async_, grouped
allreduce, reducescatter and grouped_reducescatter, join with the exact
paths, each against rank_order(): a single-process reduction in rank order
written here with plain torch ops from every rank's inputs (every input is
a function of its rank). The inputs defeat an fp32 reduction: int64 near
2**62 and int32 near 2**31 whose sums wrap around, values differing only
in bits fp32 drops, float64 whose fp32 rounding differs, float16/bfloat16
sums whose rounding after each addition differs from one rounding of the
fp32 sum (on 3 ranks)."""
import torch

import rackhub.torch as hvd
from checks import check

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
SUMS = (hvd.Sum, hvd.Average)


def factors(dtype):
    """(prescale, postscale) of the scaled cases: not exact in fp32 for the
    float dtypes; for integers, small enough that no scaled value leaves the
    dtype's range (a conversion C and torch leave undefined)."""
    if dtype.is_floating_point:
        return 0.1, -2.5
    return (0.75, 0.5) if dtype == torch.uint8 else (0.75, -0.5)


def xin(rank, seed, n, dtype, op):
    """Rank `rank`'s input: values an fp32 reduction gets wrong."""
    g = torch.Generator().manual_seed(seed * 7919 + rank * 31 + DTYPES.index(dtype))
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        if op == hvd.Product:  # odd values whose products wrap around
            return (torch.randint(-(1 << 20), 1 << 20, (n,), generator=g) * 2 + 1).to(dtype) \
                if dtype != torch.uint8 else torch.randint(0, 256, (n,), generator=g).to(dtype)
        bits = info.bits
        # Near the top of the range: sums wrap; Min/Max differ in the low bits only.
        top = info.max - torch.randint(0, 1 << min(bits - 2, 20), (n,), generator=g)
        low = torch.randint(info.min, info.max, (n,), generator=g)
        pick = torch.randint(0, 4, (n,), generator=g)
        x = torch.where(pick == 0, top, torch.where(pick == 1, low,
                                                    torch.where(pick == 2, -top - 1, top - 3)))
        if dtype == torch.uint8:
            x = x.abs()
        return x.clamp(info.min, info.max).to(dtype)
    if op == hvd.Product:
        mag = torch.randint(-3, 4, (n,), generator=g).to(torch.float64)
    else:
        mag = torch.randint(-12, 12, (n,), generator=g).to(torch.float64)
    x = (torch.rand(n, generator=g, dtype=torch.float64) + 0.5) * torch.exp2(mag)
    x = torch.where(torch.rand(n, generator=g) < 0.3, -x, x)
    if dtype in (torch.float16, torch.bfloat16):
        # 2048 + 1 + 1 in float16 is 2048; the fp32 sum 2050, rounded once, is 2050.
        big = 2048.0 if dtype == torch.float16 else 256.0
        x[:4] = torch.tensor([big if rank == 0 else 1.0, -big if rank == 0 else 1.0,
                              big / 2 + rank, 3.0 - rank], dtype=torch.float64)
    if n >= 12:
        for j, v in enumerate((float("nan"), float("inf"), -0.0, 0.0)):
            x[4 + (2 * j + rank) % 8] = v
    return x.to(dtype)


def rscale(t, f):
    """Horovod's scale on the CPU, written independently of exact.py."""
    if f == 1.0:
        return t
    if not t.dtype.is_floating_point:
        return (t.to(torch.float64) * f).to(t.dtype)
    if t.dtype == torch.float64:
        return t * torch.tensor(f, dtype=torch.float64)
    return (t.to(torch.float32) * torch.tensor(f, dtype=torch.float32)).to(t.dtype)


def rcombine(op, a, b):
    if op in SUMS:
        return a + b
    if op == hvd.Product:
        return a * b
    if not a.dtype.is_floating_point:
        return torch.min(a, b) if op == hvd.Min else torch.max(a, b)
    take_a = []  # element by element: a NaN first, -0 below +0, else the smaller/larger
    for x, y, sa in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist(),
                        torch.signbit(a).reshape(-1).tolist()):
        if x != x or y != y:
            take_a.append(x != x)
        elif x == y:
            take_a.append(sa if op == hvd.Min else not sa)
        else:
            take_a.append((x < y) == (op == hvd.Min))
    return torch.where(torch.tensor(take_a, dtype=torch.bool).view(a.shape), a, b)


def rank_order(xs, op, pre=1.0, post=1.0):
    """The reference: xs by rank (None: a joined rank, which adds nothing:
    skipped, as -0.0, the identity of IEEE addition, would be), each
    prescaled, combined in rank order in the dtype, postscaled (/ size for
    Average, the joined ranks counted)."""
    size = len(xs)
    acc = None
    for x in xs:
        if x is None:
            continue
        y = rscale(x, pre)
        acc = y if acc is None else rcombine(op, acc, y)
    return rscale(acc, post / size if op == hvd.Average else post)


def same(a, b):
    """Same dtype and shape, NaN at the same places, the rest bit for bit."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    na, nb = torch.isnan(a), torch.isnan(b)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(na, nb) and torch.equal(a[~na].view(bits), b[~nb].view(bits))


def show(t):
    return t[:6].tolist()


def every_dtype_and_op(rank, size):
    """allreduce: 9 dtypes x 5 ops x (unscaled, scaled), 40 elements."""
    for dtype in DTYPES:
        for op in OPS:
            for scaled in (False, True):
                pre, post = factors(dtype) if scaled else (1.0, 1.0)
                seed = 900 + OPS.index(op)
                got = hvd.allreduce(xin(rank, seed, 40, dtype, op), op=op, prescale_factor=pre,
                                    postscale_factor=post)
                want = rank_order([xin(r, seed, 40, dtype, op) for r in range(size)], op, pre,
                                  post)
                check(f"exact allreduce {str(dtype)[6:]} {op} pre {pre} post {post}", same(got, want),
                      f"got {show(got)} want {show(want)}")


def other_paths(rank, size):
    """allreduce_async_ (in place), grouped_allreduce of all nine dtypes,
    reducescatter, grouped_reducescatter, larger tensors (data rounds)."""
    for op in OPS:
        seed = 950 + OPS.index(op)
        # In place, async, 5000 elements: beyond the header round.
        for dtype in (torch.int64, torch.float64, torch.float16):
            t = xin(rank, seed, 5000, dtype, op)
            h = hvd.allreduce_async_(t, op=op, prescale_factor=factors(dtype)[0])
            r = hvd.synchronize(h)
            want = rank_order([xin(q, seed, 5000, dtype, op) for q in range(size)], op,
                              factors(dtype)[0])
            check(f"exact allreduce_async_ {str(dtype)[6:]} {op} 5000", r is t and same(t, want),
                  f"got {show(t)} want {show(want)}")
        # One group of every dtype.
        ts = [xin(rank, seed + i, 30 + i, d, op) for i, d in enumerate(DTYPES)]
        got = hvd.grouped_allreduce(ts, op=op, postscale_factor=0.5)
        ok = all(same(g, rank_order([xin(q, seed + i, 30 + i, d, op) for q in range(size)], op,
                                    1.0, 0.5)) for i, (g, d) in enumerate(zip(got, DTYPES)))
        check(f"exact grouped_allreduce of nine dtypes {op}", ok)
        # reducescatter: this rank's rows of the reference.
        for dtype in (torch.int32, torch.bfloat16, torch.float64):
            rows = 2 * size + 1
            xs = [xin(q, seed, rows * 3, dtype, op).view(rows, 3) for q in range(size)]
            got = hvd.reducescatter(xs[rank], op=op)
            base, extra = divmod(rows, size)
            first = rank * base + min(rank, extra)
            want = rank_order(xs, op)[first:first + base + (rank < extra)]
            check(f"exact reducescatter {str(dtype)[6:]} {op}", same(got, want),
                  f"got {show(got.view(-1))} want {show(want.view(-1))}")
        xs = [[xin(q, seed + 20, 8, torch.int64, op).view(4, 2),
               xin(q, seed + 21, 9, torch.float16, op).view(3, 3)] for q in range(size)]
        got = hvd.grouped_reducescatter(xs[rank], op=op)
        ok = True
        for i, g in enumerate(got):
            rows = xs[0][i].shape[0]
            base, extra = divmod(rows, size)
            first = rank * base + min(rank, extra)
            want = rank_order([x[i] for x in xs], op)[first:first + base + (rank < extra)]
            ok &= same(g, want)
        check(f"exact grouped_reducescatter int64 + float16 {op}", ok)


def joins(rank, size):
    """join() with the exact paths: rank r has r + 1 steps (an int64 Sum, a
    float64 Max, a mixed group with Min: its layout round), then joins."""
    steps = [(hvd.Sum, [torch.int64]), (hvd.Max, [torch.float64]),
             (hvd.Min, [torch.int32, torch.float16, torch.float64])]
    results = []
    for step in range(rank + 1):
        op, dts = steps[step % 3]
        ts = [xin(rank, 990 + step, 5000, d, op) for d in dts]
        results.append(hvd.grouped_allreduce(ts, op=op) if len(ts) > 1
                       else [hvd.allreduce(ts[0], op=op)])
    last = hvd.join()
    ok, detail = True, ""
    for step, got in enumerate(results):
        op, dts = steps[step % 3]
        for g, d in zip(got, dts):
            want = rank_order([xin(q, 990 + step, 5000, d, op) if step <= q else None
                               for q in range(size)], op)
            if not same(g, want):
                ok, detail = False, f"step {step} {d}: {show(g)} vs {show(want)}"
    check("exact: join with int64 Sum, float64 Max, a mixed group's Min", ok, detail)
    check("exact: join returns the last rank", last == size - 1, str(last))


def signed_zeros(rank, n, dtype, seed=997):
    """Rank `rank`'s input of the signed-zero checks: element 0 -0.0 on
    every rank, element 1 -0.0 or +0.0 by rank, every third -0.0, the rest
    small values with some cancelling (elastic_checks.py too)."""
    x = xin(rank, seed, n, torch.float64, hvd.Sum)
    x[0] = -0.0
    x[1] = -0.0 if rank % 2 else 0.0
    x[2::3] = -0.0
    x[4::7] = (rank % 3 - 1) * 0.5
    return x.to(dtype)


def signed_zero_joins(rank, size):
    """Sum and Average of tensors that are -0.0 on every active rank while
    ranks are joined (rank r has r + 1 steps, then joins): a joined rank
    adds -0.0, so the results keep the sign (float32 through the hub with
    data rounds, float16 and float64 gathered; one grouped op)."""
    dts = [(torch.float32, 5000), (torch.float16, 40), (torch.float64, 40)]
    results = []
    for step in range(rank + 1):
        op = (hvd.Sum, hvd.Average)[step % 2]
        results.append(hvd.grouped_allreduce([signed_zeros(rank, n, d) for d, n in dts], op=op))
    hvd.join()
    ok, detail = True, ""
    for step, got in enumerate(results):
        op = (hvd.Sum, hvd.Average)[step % 2]
        for g, (d, n) in zip(got, dts):
            want = rank_order([signed_zeros(q, n, d) if step <= q else None
                               for q in range(size)], op)
            if not same(g, want):
                ok, detail = False, f"step {step} {d} {op}: {show(g)} vs {show(want)}"
    check("exact: join keeps the sign of zero sums (a joined rank adds -0.0)", ok, detail)


def run(rank, size):
    every_dtype_and_op(rank, size)
    other_paths(rank, size)
    joins(rank, size)
    signed_zero_joins(rank, size)
