"""One rank of test_horovod_api.py (rackhub-run, 2 or 3 ranks): Horovod's
torch API beyond the basics (lifecycle, async handles, mismatches, scale
factors, compressors, probes, timeline, barrier), each result compared with
a reference this process computes alone from every rank's inputs (every
rank's input is a function of its rank, so each rank can make all of them).
Prints `CHECK ok|FAIL name detail` per check and `CHECKS n failed k`."""
import json
import os
import tempfile
import threading

import torch

import exact_checks
import rackhub.torch as hvd
from checks import check, raises, summary
from rackhub.torch import collectives, rounds

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.uint8]


def inp(rank, seed, shape, dtype):
    """Rank `rank`'s input `seed`: deterministic, exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 50, shape, generator=g).to(dtype)


def ref_allreduce(size, seed, shape, dtype, op, pre=1.0, post=1.0):
    """The reference of allreduce: every rank's input reduced in rank order
    in its dtype with Horovod's scale factors (exact_checks.rank_order)."""
    return exact_checks.rank_order([inp(r, seed, shape, dtype) for r in range(size)], op, pre,
                                   post)


# ---- Min, Max, Product ----

ALL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.float32, torch.float64, torch.bfloat16]  # every dtype rackhub.torch reduces
ELEMENTWISE = (hvd.Min, hvd.Max, hvd.Product)


def einp(rank, seed, shape, dtype):
    """Rank `rank`'s input for Min/Max/Product: multiples of 0.5 in [-4, 4]
    (integers in [-5, 5], [0, 5] for uint8), so products of 3 ranks are
    exact in every dtype; float tensors of 45+ elements get NaN, +inf, -inf,
    +0 and -0 at places that depend on the rank (they meet other ranks'
    values), and zeros of both signs that meet each other."""
    g = torch.Generator().manual_seed(seed * 1013 + rank)
    if not dtype.is_floating_point:
        return torch.randint(0 if dtype == torch.uint8 else -5, 6, shape, generator=g).to(dtype)
    x = torch.randint(-8, 9, shape, generator=g).to(torch.float64) * 0.5
    flat = x.view(-1)
    if flat.numel() >= 45:
        for j, v in enumerate((float("nan"), float("inf"), float("-inf"), 0.0, -0.0)):
            flat[(7 * j + 3 * rank) % 40] = v
        # Zeros of both signs meeting at the same element, in both orders.
        flat[41], flat[42] = (-0.0, 0.0) if rank % 2 else (0.0, -0.0)
        flat[43] = -0.0 if rank == 1 else 0.0
    return x.to(dtype)


def ref_elementwise(size, seed, shape, dtype, op, pre=1.0, post=1.0, ranks=None, source=einp):
    """The single-process reference of Min/Max/Product: the inputs of
    `ranks` (all by default) reduced in rank order in their dtype
    (exact_checks.rank_order)."""
    return exact_checks.rank_order([source(r, seed, shape, dtype)
                                    if ranks is None or r in ranks else None
                                    for r in range(size)], op, pre, post)


def same_values(a, b):
    """Same dtype and shape, NaN at the same places, every other element bit
    for bit (a NaN's payload is not compared here; kernels_test does)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and bitwise(a[~na], b[~nb])


def elementwise_reductions(rank, size):
    """allreduce / grouped_allreduce / reducescatter with op Min, Max and
    Product against ref_elementwise, for every dtype; prescale/postscale;
    Min/Max/Product helper keys named by their reduction."""
    for dtype in ALL_DTYPES:
        for op in ELEMENTWISE:
            for n in (1, 50, 5000):  # one element; the specials; beyond the small key (two rounds)
                seed = 200 + n
                got = hvd.allreduce(einp(rank, seed, (n,), dtype), op=op)
                want = ref_elementwise(size, seed, (n,), dtype, op)
                check(f"allreduce {op} {str(dtype)[6:]} n={n}", same_values(got, want),
                      f"got {got[:6].tolist()} want {want[:6].tolist()}")
    big = hvd.allreduce(einp(rank, 9, (300_000,), torch.float32), op=hvd.Max)
    check("allreduce Max of 300000 elements (two large-key rounds)",
          same_values(big, ref_elementwise(size, 9, (300_000,), torch.float32, hvd.Max)))
    for pre, post, op, dtype in ((2.0, 0.5, hvd.Min, torch.float32),
                                 (-1.0, 1.0, hvd.Max, torch.float32),  # pre < 0 flips the order
                                 (0.5, 4.0, hvd.Product, torch.float64),
                                 (3.0, 1.0, hvd.Min, torch.int32),
                                 (1.0, 1.5, hvd.Max, torch.int16),
                                 (2.0, 0.25, hvd.Product, torch.float16),
                                 (-0.5, 2.0, hvd.Min, torch.bfloat16)):
        got = hvd.allreduce(einp(rank, 5, (100,), dtype), op=op, prescale_factor=pre,
                            postscale_factor=post)
        want = ref_elementwise(size, 5, (100,), dtype, op, pre, post)
        check(f"allreduce {op} prescale {pre} postscale {post} {str(dtype)[6:]}",
              same_values(got, want), f"{got[:4].tolist()} vs {want[:4].tolist()}")
    t = einp(rank, 6, (64,), torch.float32)
    r = hvd.allreduce_(t, op=hvd.Min)
    check("allreduce_ Min in place", r is t and same_values(t, ref_elementwise(
        size, 6, (64,), torch.float32, hvd.Min)))
    h = hvd.allreduce_async(einp(rank, 7, (3000,), torch.bfloat16), op=hvd.Product)
    check("allreduce_async Product bfloat16", same_values(
        hvd.synchronize(h), ref_elementwise(size, 7, (3000,), torch.bfloat16, hvd.Product)))
    ctx = hvd.client()
    names = [n for n in (f"__rackhub/allreduce/rounds/{k}/{w}/{red}" for k in (4096, 262144)
                         for w in ("fp32", "fp16", "bf16") for red in ("min", "max", "product"))
             if ctx.find_key(n) is not None]
    check("Min/Max/Product go through helper keys named by their reduction",
          "__rackhub/allreduce/rounds/4096/fp32/min" in names and
          "__rackhub/allreduce/rounds/262144/fp32/max" in names and
          "__rackhub/allreduce/rounds/4096/bf16/min" in names, str(names))
    # Ranks naming different ops raise on every rank.
    ok, detail = raises(lambda: hvd.allreduce(torch.ones(3), op=hvd.Max if rank == 0 else hvd.Min),
                        hvd.MismatchError, "ops (Average, Sum, Min, Max, Product)")
    check("mismatch: allreduce Max on rank 0, Min on the others", ok, detail)
    lin = torch.nn.Linear(2, 1)
    ok, detail = raises(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(lin.parameters(), lr=0.1), named_parameters=lin.named_parameters(),
        op=hvd.Min), ValueError, "a DistributedOptimizer averages or sums")
    check("DistributedOptimizer(op=Min) refused by name", ok, detail)

    # grouped_allreduce: each result equals the ungrouped allreduce and the reference.
    shapes = [((3000,), torch.float32), ((10, 5), torch.float16), ((7,), torch.int32),
              ((5000,), torch.bfloat16), ((2, 2, 10), torch.float64), ((9,), torch.uint8)]
    for op in ELEMENTWISE:
        ts = [einp(rank, 210 + i, s, d) for i, (s, d) in enumerate(shapes)]
        got = hvd.grouped_allreduce(ts, op=op, postscale_factor=2.0)
        single = [hvd.allreduce(t, op=op, postscale_factor=2.0) for t in ts]
        ok = all(same_values(g, s_) for g, s_ in zip(got, single))
        ok &= all(same_values(g, ref_elementwise(size, 210 + i, t.shape, t.dtype, op, 1.0, 2.0))
                  for i, (g, t) in enumerate(zip(got, ts)))
        check(f"grouped_allreduce {op} == allreduce of each == reference", ok)

    # reducescatter: this rank's share of the reference.
    for rows_, op, dtype in ((7, hvd.Min, torch.float32), (2 * size, hvd.Max, torch.int64),
                             (5, hvd.Product, torch.float16)):
        full = ref_elementwise(size, 220, (rows_, 8), dtype, op, 0.5, 1.0)
        base, extra = divmod(rows_, size)
        first = rank * base + min(rank, extra)
        got = hvd.reducescatter(einp(rank, 220, (rows_, 8), dtype), op=op, prescale_factor=0.5)
        check(f"reducescatter {rows_} rows {op} {str(dtype)[6:]}",
              same_values(got, full[first:first + base + (rank < extra)]), f"{got.shape}")
    specs = [((7, 8), torch.float32), ((size, 3), torch.int8)]
    got = hvd.grouped_reducescatter([einp(rank, 230 + i, s, d) for i, (s, d) in enumerate(specs)],
                                    op=hvd.Max)
    ok = True
    for i, ((shape, dtype), g) in enumerate(zip(specs, got)):
        full = ref_elementwise(size, 230 + i, shape, dtype, hvd.Max)
        base, extra = divmod(shape[0], size)
        first = rank * base + min(rank, extra)
        ok &= same_values(g, full[first:first + base + (rank < extra)])
    check("grouped_reducescatter Max == reference shares", ok)


def elementwise_joins(rank, size):
    """join() with Min, Max, Product: rank r has r + 1 steps, then joins;
    each step's result is the reduction over the ranks that still have data
    (a joined rank contributes the identity: +inf, -inf, 1)."""
    ops = (hvd.Min, hvd.Max, hvd.Product)
    dtypes = (torch.float32, torch.int32, torch.float16)
    results = []
    for step in range(rank + 1):
        op, dtype = ops[step % 3], dtypes[step % 3]
        t = einp(rank, 240 + step, (60,), dtype)
        if step == 1:
            results.append(hvd.grouped_allreduce([t, t[:5].clone()], op=op)[0])
        else:
            results.append(hvd.allreduce(t, op=op))
    last = hvd.join()
    ok, detail = True, ""
    for step, got in enumerate(results):
        op, dtype = ops[step % 3], dtypes[step % 3]
        want = ref_elementwise(size, 240 + step, (60,), dtype, op,
                               ranks=[r for r in range(size) if step <= r])
        if not same_values(got, want):
            ok, detail = False, f"step {step} {op}: {got[:6].tolist()} vs {want[:6].tolist()}"
    check("join with Min/Max/Product: joined ranks do not change the result", ok, detail)
    check("join (Min/Max/Product) returns the last rank that joined", last == size - 1, str(last))


def ref_allgather(size, seed, dtype, cols=3):
    return torch.cat([inp(r, seed, (r + 1, cols), dtype) for r in range(size)])


def bitwise(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.contiguous().view(-1).view(torch.uint8) if a.numel() else a,
                        b.contiguous().view(-1).view(torch.uint8) if b.numel() else b))


def lifecycle(rank, size):
    c = hvd.client()
    hvd.init()
    check("init() twice is a no-op", hvd.is_initialized() and hvd.client() is c
          and (hvd.rank(), hvd.size()) == (rank, size))
    hvd.shutdown()
    check("shutdown() ends it", not hvd.is_initialized())
    ok, detail = raises(lambda: hvd.init(process_sets=[[0, size]]), ValueError,
                        f"rank(s) [{size}] not in [0, {size})")
    check("init(process_sets=...) with a rank out of range refused, naming it",
          ok and not hvd.is_initialized(), detail)
    ok, detail = raises(lambda: hvd.init(max_size=4, rack=1, racks=2), ValueError,
                        "rackhub.torch.elastic runs on one rack's hub; rack 1 of 2 racks")
    check("an elastic init across racks refused by name (docs/elastic.md, Limits)",
          ok and not hvd.is_initialized(), detail)
    hvd.shutdown()  # idempotent
    hvd.init()
    got = hvd.allreduce(torch.full((4,), float(rank)), op=hvd.Sum)
    check("shutdown() then init() works", hvd.client() is not c and
          torch.equal(got, torch.full((4,), float(sum(range(size))))), str(got))
    check("HorovodInternalError is a RuntimeError",
          issubclass(hvd.HorovodInternalError, RuntimeError)
          and issubclass(hvd.MismatchError, hvd.HorovodInternalError)
          and issubclass(hvd.MismatchError, ValueError))


def allreduce_values(rank, size):
    for dtype in DTYPES:
        for n in (0, 1, 3000, 10_000):
            for op in (hvd.Sum, hvd.Average):
                if op == hvd.Average and not dtype.is_floating_point and n != 1:
                    continue
                seed = 7 + n
                got = hvd.allreduce(inp(rank, seed, (n,), dtype), op=op)
                want = ref_allreduce(size, seed, (n,), dtype, op)
                check(f"allreduce {str(dtype)[6:]} n={n} {op}", bitwise(got, want),
                      f"got {got[:3].tolist()} want {want[:3].tolist()}")
    # Several rounds of the large key; a shape of more dimensions.
    got = hvd.allreduce(inp(rank, 1, (300_000,), torch.float32))
    check("allreduce 300000 elements", bitwise(got, ref_allreduce(size, 1, (300_000,),
                                                                  torch.float32, hvd.Average)))
    got = hvd.allreduce(inp(rank, 2, (5, 7, 3), torch.float32), op=hvd.Sum)
    check("allreduce shape (5, 7, 3)", bitwise(got, ref_allreduce(size, 2, (5, 7, 3),
                                                                  torch.float32, hvd.Sum)))
    # prescale / postscale (with Average too), in float64 as Horovod does on the CPU.
    for pre, post, op, dtype in ((0.5, 1.0, hvd.Sum, torch.float32),
                                 (1.0, 3.0, hvd.Sum, torch.float32),
                                 (0.25, 10.0, hvd.Average, torch.float32),
                                 (2.0, 0.5, hvd.Average, torch.float16),
                                 (3.0, 1.0, hvd.Sum, torch.int32)):
        got = hvd.allreduce(inp(rank, 3, (5000,), dtype), op=op, prescale_factor=pre,
                            postscale_factor=post)
        want = ref_allreduce(size, 3, (5000,), dtype, op, pre, post)
        check(f"allreduce prescale {pre} postscale {post} {op} {str(dtype)[6:]}",
              bitwise(got, want), f"{got[:3].tolist()} vs {want[:3].tolist()}")
    t = inp(rank, 4, (100,), torch.float32)
    r = hvd.allreduce_(t, op=hvd.Sum, postscale_factor=2.0)
    check("allreduce_ in place with postscale", r is t and
          bitwise(t, ref_allreduce(size, 4, (100,), torch.float32, hvd.Sum, 1.0, 2.0)))
    ok, detail = raises(lambda: hvd.allreduce(t, op=hvd.Adasum), ValueError, "Adasum")
    check("op Adasum refused by name", ok, detail)
    ok, detail = raises(lambda: hvd.allreduce(t, op="median"), ValueError, "Min, Max or Product")
    check("an unknown op refused, naming the ops", ok, detail)
    ok, detail = raises(lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)), TypeError,
                        "cannot be reduced")
    check("allreduce of a complex tensor refused", ok, detail)
    ok, detail = raises(lambda: hvd.allreduce(t, prescale_factor="x"), ValueError,
                        "prescale_factor")
    check("a bad prescale_factor refused", ok, detail)


def async_handles(rank, size):
    # Many ops in flight, of every kind, waited for in an order that differs
    # by rank (reversed on odd ranks, a rotation on even ones).
    specs = []
    handles = []
    for i in range(12):
        kind = ("allreduce", "allreduce_", "allgather", "broadcast", "broadcast_")[i % 5]
        seed = 100 + i
        n = (10, 5000, 70_000)[i % 3]
        if kind == "allreduce":
            h = hvd.allreduce_async(inp(rank, seed, (n,), torch.float32), name=f"op{i}",
                                    op=hvd.Sum)
            want = ref_allreduce(size, seed, (n,), torch.float32, hvd.Sum)
            specs.append((kind, None, want))
        elif kind == "allreduce_":
            t = inp(rank, seed, (n,), torch.float32)
            h = hvd.allreduce_async_(t, name=f"op{i}")
            specs.append((kind, t, ref_allreduce(size, seed, (n,), torch.float32, hvd.Average)))
        elif kind == "allgather":
            h = hvd.allgather_async(inp(rank, seed, (rank + 1, 3), torch.int64))
            specs.append((kind, None, ref_allgather(size, seed, torch.int64)))
        else:
            root = i % size
            t = inp(rank, seed, (n,), torch.float64)
            h = (hvd.broadcast_async if kind == "broadcast" else hvd.broadcast_async_)(
                t, root_rank=root, name=f"op{i}")
            specs.append((kind, t if kind == "broadcast_" else None,
                          inp(root, seed, (n,), torch.float64)))
        handles.append(h)
    order = list(range(len(handles)))
    order = order[::-1] if rank % 2 else order[rank:] + order[:rank]
    for i in order:
        kind, inplace, want = specs[i]
        got = hvd.synchronize(handles[i])
        ok = bitwise(got, want) and (inplace is None or got is inplace)
        check(f"async {kind} #{i} (waited in this rank's order)", ok,
              f"{got.shape} {got.flatten()[:2].tolist()} want {want.flatten()[:2].tolist()}")
    check("synchronize of a consumed handle returns None", hvd.synchronize(handles[0]) is None)
    ok, detail = raises(lambda: hvd.poll(handles[0]), ValueError, "handle")
    check("poll of a consumed handle refused", ok, detail)

    # poll: the ops run in submission order, so once the last one is done
    # the first is too.
    a = hvd.allreduce_async(torch.ones(3))
    b = hvd.allreduce_async(torch.ones(3), op=hvd.Sum)
    got_b = hvd.synchronize(b)
    check("poll after a later op finished", hvd.poll(a) is True and
          torch.equal(got_b, torch.full((3,), float(size))))
    check("synchronize after poll", torch.equal(hvd.synchronize(a), torch.ones(3)))

    # A name may be used by one unfinished op at a time. The first op is
    # held behind a local op that waits for an event (deterministic).
    gate = threading.Event()
    blocker = collectives.submit("barrier", None, gate.wait)
    h1 = hvd.allreduce_async(torch.ones(2), name="dup")
    ok, detail = raises(lambda: hvd.allreduce_async(torch.ones(2), name="dup"), ValueError,
                        "'dup' is used by an op that has not finished")
    check("the same name twice in flight refused", ok and not hvd.poll(h1), detail)
    gate.set()
    hvd.synchronize(blocker)
    check("the first op with the name completes",
          torch.equal(hvd.synchronize(h1), torch.ones(2)))
    h2 = hvd.allreduce_async(torch.ones(2), name="dup")
    check("the name is free once its op finished", torch.equal(hvd.synchronize(h2),
                                                                torch.ones(2)))


def mismatches(rank, size):
    """Every one raises MismatchError (a HorovodInternalError and a
    ValueError) on every rank; the next op works."""
    odd = rank == size - 1

    def case(name, fn, text):
        ok, detail = raises(fn, hvd.MismatchError, text)
        after = hvd.allreduce(torch.full((3,), float(rank)), op=hvd.Sum)
        check(f"mismatch: {name}", ok and torch.equal(after, torch.full((3,), float(
            sum(range(size))))), detail)

    case("allreduce shapes (same count)", lambda: hvd.allreduce(
        torch.ones((2, 6) if odd else (3, 4))), "different shapes")
    case("allreduce element counts", lambda: hvd.allreduce(torch.ones(5 if odd else 4)),
         "different element counts")
    case("allreduce element counts above the inline capacity",
         lambda: hvd.allreduce(torch.ones(50_000 if odd else 20_000)), "element counts")
    case("allreduce dtypes", lambda: hvd.allreduce(
        torch.ones(4, dtype=torch.float64 if odd else torch.float32)), "different dtypes")
    case("allreduce ops", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum if odd else
                                                hvd.Average), "different ops")
    case("names", lambda: hvd.allreduce(torch.ones(4), name="b" if odd else "a"),
         "different names")
    case("kinds (allreduce vs allgather)", lambda: (hvd.allgather if odd else hvd.allreduce)(
        torch.ones(4)), "ops differ")
    case("allgather dtypes", lambda: hvd.allgather(
        torch.ones(2, 2, dtype=torch.int32 if odd else torch.int64)), "different dtypes")
    case("allgather trailing shapes", lambda: hvd.allgather(torch.ones(2, 3 if odd else 2)),
         "differ beyond dimension 0")
    case("broadcast root out of range on one rank",
         lambda: hvd.broadcast(torch.ones(3), size if odd else 0),
         "root_rank" if odd else "different roots")
    case("broadcast root out of range on every rank",
         lambda: hvd.broadcast(torch.ones(3), -1), "root_rank")
    case("broadcast roots differ", lambda: hvd.broadcast(torch.ones(3), 1 if odd else 0),
         "different roots")
    case("broadcast shapes", lambda: hvd.broadcast(torch.ones(6 if odd else 5), 0), "sizes")
    case("broadcast dtypes", lambda: hvd.broadcast(
        torch.ones(4, dtype=torch.int32 if odd else torch.float32), 0), "dtypes")
    case("async: the error comes from synchronize", lambda: hvd.synchronize(
        hvd.allreduce_async(torch.ones(5 if odd else 4))), "element counts")


class RoundCounter:
    """Counts the PushPulls of the helper keys (rounds.push_pull) while active."""

    def __enter__(self):
        self.n = 0
        self.orig = rounds.push_pull

        def counted(*a):
            self.n += 1
            return self.orig(*a)
        rounds.push_pull = counted
        return self

    def __exit__(self, *exc):
        rounds.push_pull = self.orig


def grouped(rank, size):
    shapes = [((3000,), torch.float32), ((10, 3), torch.float16), ((7,), torch.int32),
              ((5000,), torch.bfloat16), ((2, 2, 2), torch.float64)]
    for op in (hvd.Sum, hvd.Average):
        ts = [inp(rank, 40 + i, s, d) for i, (s, d) in enumerate(shapes)]
        if op == hvd.Average:
            ts[2] = ts[2].float()
        with RoundCounter() as rc:
            got = hvd.grouped_allreduce(ts, op=op, postscale_factor=1.5)
        rounds_grouped = rc.n
        with RoundCounter() as rc:
            single = [hvd.allreduce(t, op=op, postscale_factor=1.5) for t in ts]
        ok = all(bitwise(g, s_) for g, s_ in zip(got, single))
        ok &= all(bitwise(g, ref_allreduce(size, 40 + i, t.shape, t.dtype, op, 1.0, 1.5))
                  for i, (g, t) in enumerate(zip(got, ts)) if not (op == hvd.Average and i == 2))
        check(f"grouped_allreduce {op} == allreduce of each == reference", ok)
        check(f"grouped_allreduce {op}: fewer round trips than one per tensor",
              rounds_grouped < rc.n and rounds_grouped <= 3,  # header, data, float64 gather
              f"grouped {rounds_grouped}, ungrouped {rc.n}")
    small = [inp(rank, 50 + i, (20,), torch.float32) for i in range(6)]
    with RoundCounter() as rc:
        got = hvd.synchronize(hvd.grouped_allreduce_async(small, op=hvd.Sum))
    check("grouped_allreduce_async of 6 small tensors: one round trip",
          rc.n == 1 and all(bitwise(g, ref_allreduce(size, 50 + i, (20,), torch.float32,
                                                     hvd.Sum)) for i, g in enumerate(got)),
          f"{rc.n} rounds")
    inplace = [t.clone() for t in small]
    r = hvd.grouped_allreduce_(inplace)
    check("grouped_allreduce_ in place", all(a is b for a, b in zip(r, inplace)) and all(
        bitwise(t, ref_allreduce(size, 50 + i, (20,), torch.float32, hvd.Average))
        for i, t in enumerate(inplace)))
    ga = hvd.grouped_allgather([inp(rank, 60, (rank + 1, 3), torch.int64),
                                inp(rank, 61, (rank + 1, 3), torch.float32),
                                inp(rank, 62, (rank + 1, 3), torch.bfloat16)])
    check("grouped_allgather == allgather reference of each",
          bitwise(ga[0], ref_allgather(size, 60, torch.int64))
          and bitwise(ga[1], ref_allgather(size, 61, torch.float32))
          and bitwise(ga[2], ref_allgather(size, 62, torch.bfloat16)))
    # sparse_allreduce_async: every rank's entries, duplicate rows adding up.
    def sparse_of(r):
        rows = torch.tensor([[r, r + 2, 5]])
        vals = torch.arange(9, dtype=torch.float32).view(3, 3) + 10 * r
        return torch.sparse_coo_tensor(rows, vals, (10, 3))
    for op in (hvd.Sum, hvd.Average):
        got = hvd.synchronize(hvd.sparse_allreduce_async(sparse_of(rank), name="emb", op=op))
        want = torch.zeros(10, 3)
        for r in range(size):
            want += sparse_of(r).to_dense() / (size if op == hvd.Average else 1)
        check(f"sparse_allreduce_async {op}", got.is_sparse and
              torch.allclose(got.to_dense(), want, rtol=0, atol=1e-6), str(got.to_dense()[5]))
    odd = rank == size - 1
    ok, detail = raises(lambda: hvd.grouped_allreduce([torch.ones(3)] * (3 if odd else 2)),
                        hvd.MismatchError, "group lengths")
    check("mismatch: grouped_allreduce group lengths", ok, detail)
    ok, detail = raises(lambda: hvd.grouped_allreduce(
        [torch.ones(3), torch.ones(4 if odd else 5)]), hvd.MismatchError, "")
    check("mismatch: grouped_allreduce a tensor's shape", ok, detail)
    ok, detail = raises(lambda: hvd.grouped_allgather(
        [torch.ones(1, 3), torch.ones(1, 2 if odd else 4)]), hvd.MismatchError,
        "beyond dimension 0")
    check("mismatch: grouped_allgather trailing shape", ok, detail)


def alltoall_and_reducescatter(rank, size):
    x = inp(rank, 70, (2 * size, 3), torch.float32)
    got = hvd.alltoall(x)
    want = torch.cat([inp(s, 70, (2 * size, 3), torch.float32)[2 * rank:2 * rank + 2]
                      for s in range(size)])
    check("alltoall, equal splits", bitwise(got, want), f"{got.shape}")

    def splits_of(r):
        return [(r + d) % 3 for d in range(size)]
    rows = sum(splits_of(rank))
    x = inp(rank, 71, (rows, 2), torch.int64)
    got, rsplits = hvd.synchronize(hvd.alltoall_async(x, splits=splits_of(rank)))
    want_parts = []
    for s in range(size):
        sp = splits_of(s)
        src = inp(s, 71, (sum(sp), 2), torch.int64)
        want_parts.append(src[sum(sp[:rank]):sum(sp[:rank]) + sp[rank]])
    check("alltoall with splits: rows and received splits",
          bitwise(got, torch.cat(want_parts)) and
          rsplits.tolist() == [splits_of(s)[rank] for s in range(size)],
          f"{got.shape} {rsplits.tolist()}")
    got, rsplits = hvd.alltoall(torch.zeros(0, 2), splits=[0] * size)
    check("alltoall of nothing", got.shape == (0, 2) and rsplits.tolist() == [0] * size)
    bad = [rows + 1] + [0] * (size - 1) if rank == 0 else splits_of(rank)
    ok, detail = raises(lambda: hvd.alltoall(x, splits=bad), hvd.MismatchError,
                        "splits" if rank == 0 else "could not take part")
    check("alltoall bad splits on rank 0: every rank raises", ok, detail)
    ok, detail = raises(lambda: hvd.alltoall(torch.ones(2 * size + 1, 2)), hvd.MismatchError,
                        "divide")
    check("alltoall without splits, dimension 0 not divisible", ok, detail)

    for rows_, op in ((7, hvd.Sum), (2 * size, hvd.Average), (1, hvd.Sum)):
        t = inp(rank, 72, (rows_, 4), torch.float32)
        full = ref_allreduce(size, 72, (rows_, 4), torch.float32, op, 2.0, 1.0)
        base, extra = divmod(rows_, size)
        first = rank * base + min(rank, extra)
        want = full[first:first + base + (rank < extra)]
        got = hvd.reducescatter(t, op=op, prescale_factor=2.0)
        check(f"reducescatter {rows_} rows {op}", bitwise(got, want), f"{got.shape}")
    got = hvd.synchronize(hvd.reducescatter_async(inp(rank, 73, (6, 2), torch.float16)))
    full = ref_allreduce(size, 73, (6, 2), torch.float16, hvd.Average)
    base, extra = divmod(6, size)
    first = rank * base + min(rank, extra)
    check("reducescatter_async float16", bitwise(got, full[first:first + base + (rank < extra)]))
    # grouped_reducescatter: each share as reducescatter gives it; one op.
    specs = [((7, 2), torch.float32), ((size, 3), torch.float16), ((1,), torch.float32)]
    ts = [inp(rank, 74 + i, s, d) for i, (s, d) in enumerate(specs)]
    with RoundCounter() as rc:
        got = hvd.grouped_reducescatter(ts, op=hvd.Sum, postscale_factor=0.5)
    ok = rc.n == (1 if size <= 2 else 2)  # on 3+ ranks the float16 sum is gathered
    for i, ((shape, dtype), g) in enumerate(zip(specs, got)):
        full = ref_allreduce(size, 74 + i, shape, dtype, hvd.Sum, 1.0, 0.5)
        base, extra = divmod(shape[0], size)
        first = rank * base + min(rank, extra)
        ok &= bitwise(g, full[first:first + base + (rank < extra)])
    check("grouped_reducescatter == reference shares, one round trip (2 on 3+ ranks)", ok,
          f"{rc.n} rounds")
    x = inp(rank, 77, (5, 2), torch.float32).requires_grad_()
    (y,) = hvd.grouped_reducescatter([x])
    base, extra = divmod(5, size)
    (y * inp(rank, 78, tuple(y.shape), torch.float32)).sum().backward()
    want = torch.cat([inp(r, 78, (base + (r < extra), 2), torch.float32) for r in range(size)])
    want = (want.to(torch.float64) * (1.0 / size)).to(torch.float32)
    check("autograd grouped_reducescatter (Average)", bitwise(x.grad, want))
    ok, detail = raises(lambda: hvd.reducescatter(torch.ones(4, 2 + (rank == size - 1))),
                        hvd.MismatchError, "element counts")
    check("mismatch: reducescatter shapes", ok, detail)


def joins(rank, size):
    # Uneven data: rank r has r + 1 batches; after its last it joins. Each
    # step's result = the average over size() of the ranks that still have
    # data (the joined ones count as zeros). Step 1 uses a tensor larger
    # than the header round (data rounds that the joined ranks join).
    n_of = [10, 9000, 33]
    results = []
    for step in range(rank + 1):
        t = inp(rank, 80 + step, (n_of[step % 3],), torch.float32)
        if step == 1:
            results.append(hvd.grouped_allreduce([t, t[:5].clone()])[0])
        else:
            results.append(hvd.allreduce(t))
    last = hvd.join()
    ok = True
    for step, got in enumerate(results):
        n = n_of[step % 3]
        total = torch.zeros(n)
        for r in range(size):
            total = total + (inp(r, 80 + step, (n,), torch.float32) if step <= r
                             else torch.zeros(n))
        want = exact_checks.rscale(total, 1.0 / size)
        ok &= bitwise(got, want)
    check("join with uneven data: the others' allreduces count joined ranks as zeros", ok)
    check("join returns the last rank that joined", last == size - 1, str(last))
    # allgather while ranks are joined: they contribute no rows.
    got = [hvd.allgather(inp(rank, 130 + k, (rank + 1, 2), torch.int64)) for k in range(rank + 1)]
    last = hvd.join()
    ok = all(bitwise(g, torch.cat([inp(r, 130 + k, (r + 1, 2), torch.int64)
                                   for r in range(size) if k <= r]))
             for k, g in enumerate(got))
    check("join: the others' allgathers get no rows from joined ranks", ok and last == size - 1)
    check("after join, ops run as before",
          hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [float(size)] * 2)
    # A broadcast while a rank is joined: the others raise, then join.
    if rank == 0:
        last = hvd.join()
    else:
        ok, detail = raises(lambda: hvd.broadcast(torch.ones(2), 1), hvd.MismatchError,
                            "join")
        check("a broadcast while a rank is joined raises", ok, detail)
        last = hvd.join()
    check("join: ranks joining at the same point: the highest is last", last == size - 1,
          str(last))


def joins_with_optimizer(rank, size, hub):
    """DistributedOptimizer steps while ranks are joined: rank r has r + 1
    batches, then joins; the others' steps count the joined ranks' gradients
    as zeros (Average divides by size()). Each rank's parameters are
    compared with a single-process reference that applies the same steps:
    mean over size() of the active ranks' gradients (float64), SGD."""
    lr = 0.1
    torch.manual_seed(7)
    model = torch.nn.Linear(5, 3)
    start = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=[(f"jo{int(hub)}.{n}", p) for n, p in
                                                     model.named_parameters()],
                                   hub_optimizer=hub, zero_copy=True)

    def batch(r, step):
        return inp(r, 300 + step, (4, 5), torch.float32)

    leased = opt._rackhub.leased
    for step in range(rank + 1):
        opt.zero_grad()
        model(batch(rank, step)).pow(2).sum().backward()
        opt.step()
    last = hvd.join()
    if opt.transport == "shm":  # zero copy: .grad in memory leased to the hub
        check(f"DistributedOptimizer ({'hub-side' if hub else 'local'}) keeps the gradients in "
              f"leased memory over shared memory", leased == 2, f"{leased} of 2")
    # The reference: the same model in float64, stepped on every step any
    # rank took; this rank's parameters are the reference's after its own
    # rank + 1 steps.
    ref = torch.nn.Linear(5, 3).to(torch.float64)
    with torch.no_grad():
        for q, p0 in zip(ref.parameters(), start):
            q.copy_(p0.to(torch.float64))
    mine = None
    for step in range(size):
        grads = [torch.zeros_like(q) for q in ref.parameters()]
        for r in range(size):
            if step > r:
                continue  # joined: zeros
            ref.zero_grad()
            ref(batch(r, step).to(torch.float64)).pow(2).sum().backward()
            grads = [g + q.grad for g, q in zip(grads, ref.parameters())]
        with torch.no_grad():
            for q, g in zip(ref.parameters(), grads):
                q -= lr * g / size
        if step == rank:
            mine = [q.detach().clone() for q in ref.parameters()]
    worst = max(float((p.detach().to(torch.float64) - q).abs().max())
                for p, q in zip(model.parameters(), mine))
    mode = "hub-side SGD" if hub else "local SGD"
    check(f"join with DistributedOptimizer ({mode}): each rank's parameters equal the "
          f"reference that counts joined ranks as zeros", worst < 1e-5, f"max diff {worst}")
    check(f"join with DistributedOptimizer ({mode}) returns the last rank", last == size - 1,
          str(last))
    # After join every rank steps again, all of them active: a plain step.
    opt.zero_grad()
    model(batch(rank, 50)).pow(2).sum().backward()
    opt.step()
    check(f"after join, DistributedOptimizer ({mode}) steps again",
          opt.skipped_steps == 0, f"skipped {opt.skipped_steps}")


def autograd(rank, size):
    """Gradients of L = sum over ranks of each rank's (result * w_rank).sum()
    (every rank runs backward), against references from the inputs."""
    def w(r, seed, shape):
        return inp(r, seed, shape, torch.float32)

    def fsum(parts):  # rank-order fp32 sum
        total = torch.zeros_like(parts[0])
        for p_ in parts:
            total = total + p_
        return total

    for op in (hvd.Sum, hvd.Average):
        x = inp(rank, 90, (50,), torch.float32).requires_grad_()
        (hvd.allreduce(x, op=op) * w(rank, 91, (50,))).sum().backward()
        want = fsum([w(r, 91, (50,)) for r in range(size)])
        if op == hvd.Average:
            want = exact_checks.rscale(want, 1.0 / size)
        check(f"autograd allreduce {op}", bitwise(x.grad, want))
    x = inp(rank, 92, (rank + 1, 3), torch.float32).requires_grad_()
    total = size * (size + 1) // 2
    (hvd.allgather(x) * w(rank, 93, (total, 3))).sum().backward()
    first = rank * (rank + 1) // 2
    want = fsum([w(r, 93, (total, 3)) for r in range(size)])[first:first + rank + 1]
    check("autograd allgather", bitwise(x.grad, want))
    root = size - 1
    x = inp(rank, 94, (8,), torch.float32).requires_grad_()
    (hvd.broadcast(x, root) * w(rank, 95, (8,))).sum().backward()
    want = fsum([w(r, 95, (8,)) for r in range(size)]) if rank == root else torch.zeros(8)
    check("autograd broadcast", bitwise(x.grad, want))

    def splits_of(r):
        return [(r + 2 * d) % 3 + 1 for d in range(size)]
    x = inp(rank, 96, (sum(splits_of(rank)), 2), torch.float32).requires_grad_()
    out, received = hvd.alltoall(x, splits=splits_of(rank))
    (out * w(rank, 97, tuple(out.shape))).sum().backward()
    parts = []
    for d in range(size):  # the rows this rank sent to d, as d's gradient rows
        rows_d = sum(splits_of(s)[d] for s in range(size))
        off = sum(splits_of(s)[d] for s in range(rank))
        parts.append(w(d, 97, (rows_d, 2))[off:off + splits_of(rank)[d]])
    check("autograd alltoall with splits", bitwise(x.grad, torch.cat(parts)))
    rows = 2 * size + 1
    x = inp(rank, 98, (rows, 3), torch.float32).requires_grad_()
    y = hvd.reducescatter(x, op=hvd.Average, prescale_factor=2.0)

    def share(r):
        base, extra = divmod(rows, size)
        return base + (r < extra)
    (y * w(rank, 99, (share(rank), 3))).sum().backward()
    gathered = torch.cat([w(r, 99, (share(r), 3)) for r in range(size)])
    want = (gathered.to(torch.float64) * (2.0 / size)).to(torch.float32)
    check("autograd reducescatter", bitwise(x.grad, want))
    a = inp(rank, 100, (4,), torch.float32).requires_grad_()
    b = inp(rank, 101, (2, 2), torch.float32).requires_grad_()
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * w(rank, 102, (4,))).sum() + (yb * w(rank, 103, (2, 2))).sum()).backward()
    check("autograd grouped_allreduce",
          bitwise(a.grad, fsum([w(r, 102, (4,)) for r in range(size)])) and
          bitwise(b.grad, fsum([w(r, 103, (2, 2)) for r in range(size)])))
    y = hvd.allreduce(torch.ones(3))
    check("no grad_fn for inputs without requires_grad", y.grad_fn is None)


def sync_batchnorm(rank, size):
    """SyncBatchNorm on uneven batches (3-D inputs: rank r has r samples,
    so rank 0's batch is empty; 4-D: r + 2) against torch's BatchNorm in one
    process over the
    concatenated batch: outputs, input gradients of the sum of every
    rank's loss, the summed weight/bias gradients, running statistics."""
    for dims, bn_cls in ((3, torch.nn.BatchNorm1d), (4, torch.nn.BatchNorm2d)):
        c = 3
        extra = 0 if dims == 3 else 2
        shape_of = (lambda r: (r + extra, c, 5)) if dims == 3 else (lambda r: (r + extra, c, 2, 3))
        def x_of(r):
            return inp(r, 110 + dims, shape_of(r), torch.float32) * 2 + 1
        def w_of(r):
            return inp(r, 120 + dims, shape_of(r), torch.float32)
        torch.manual_seed(3)
        sbn = hvd.SyncBatchNorm(c, momentum=0.3)
        ref = bn_cls(c, momentum=0.3)
        with torch.no_grad():
            for m in (sbn, ref):
                m.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
                m.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
        x = x_of(rank).requires_grad_()
        y = sbn(x)
        (y * w_of(rank)).sum().backward()
        xs = torch.cat([x_of(r) for r in range(size)]).requires_grad_()
        yr = ref(xs)
        (yr * torch.cat([w_of(r) for r in range(size)])).sum().backward()
        first = sum(r + extra for r in range(rank))
        mine = slice(first, first + rank + extra)
        gw = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
        gb = hvd.allreduce(sbn.bias.grad, op=hvd.Sum)
        tol = dict(rtol=1e-5, atol=1e-5)
        ok = torch.allclose(y, yr[mine], **tol) and torch.allclose(x.grad, xs.grad[mine], **tol)
        ok &= torch.allclose(gw, ref.weight.grad, **tol) and torch.allclose(gb, ref.bias.grad,
                                                                           **tol)
        ok &= torch.allclose(sbn.running_mean, ref.running_mean, **tol) and \
            torch.allclose(sbn.running_var, ref.running_var, **tol)
        def mx(a, b):
            return (a - b).abs().max().item() if a.numel() else 0.0
        check(f"SyncBatchNorm {dims}-D == BatchNorm over the whole batch"
              + (" (this rank's batch is empty)" if x.shape[0] == 0 else ""), ok,
              f"y {mx(y, yr[mine]):.2e} dx {mx(x.grad, xs.grad[mine]):.2e} "
              f"dw {mx(gw, ref.weight.grad):.2e} rv {mx(sbn.running_var, ref.running_var):.2e}")
        sbn.eval()
        ref.eval()
        check(f"SyncBatchNorm {dims}-D eval uses the running statistics",
              torch.allclose(sbn(x_of(rank)), ref(x_of(rank)), **tol))
        sbn.train()


class Quarter(hvd.Compressor):
    """A user-written compressor: scales by 1/4 (exact) and counts its calls."""
    calls = 0

    @staticmethod
    def compress(tensor):
        Quarter.calls += 1
        return tensor * 0.25, 4.0

    @staticmethod
    def decompress(tensor, ctx):
        Quarter.calls += 1
        return tensor * ctx


def compression(rank, size):
    x = inp(rank, 20, (6000,), torch.float32)
    got = hvd.allreduce(x, compression=hvd.Compression.fp16)
    # The reference: every rank's input cast to fp16, averaged in rank order
    # in fp16 (exact_checks.rank_order), then back to fp32 (decompress).
    want = exact_checks.rank_order([inp(r, 20, (6000,), torch.float32).to(torch.float16)
                                    for r in range(size)], hvd.Average).to(torch.float32)
    check("allreduce compression=fp16", bitwise(got, want), f"{got[:2]} {want[:2]}")
    got = hvd.allreduce(x, compression=hvd.Compression.bf16, op=hvd.Sum)
    want = exact_checks.rank_order([inp(r, 20, (6000,), torch.float32).to(torch.bfloat16)
                                    for r in range(size)], hvd.Sum).to(torch.float32)
    check("allreduce compression=bf16", bitwise(got, want))
    got = hvd.allreduce(x, compression=Quarter, op=hvd.Sum)
    total = torch.zeros(6000)
    for r in range(size):
        total += inp(r, 20, (6000,), torch.float32) * 0.25
    check("allreduce with a user-written Compressor", bitwise(got, total * 4.0)
          and Quarter.calls == 2, f"calls {Quarter.calls}")
    g = hvd.allgather(inp(rank, 21, (rank + 1, 3), torch.float32), compression=Quarter)
    check("allgather with a user-written Compressor",
          bitwise(g, ref_allgather(size, 21, torch.float32)) and Quarter.calls == 4)
    c, ctx = hvd.Compression.none.compress(x)
    check("Compression.none is Horovod's interface", c is x and
          hvd.Compression.none.decompress(c, ctx) is x)
    model = torch.nn.Linear(2, 2)
    ok, detail = raises(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
        compression=Quarter), ValueError, "user-written")
    check("DistributedOptimizer refuses a user-written compressor, naming why", ok, detail)
    ok, detail = raises(lambda: hvd.allreduce(x, compression=object()), ValueError,
                        "Compressor")
    check("a non-compressor refused", ok, detail)


def probes_and_more(rank, size, tmp):
    probes = {p: getattr(hvd, p)() for p in (
        "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
        "nccl_built", "ddl_built", "ccl_built", "rocm_built")}
    check("the MPI/Gloo/NCCL/DDL/CCL/ROCm probes are False", not any(probes.values()),
          str(probes))
    check("cuda_built is the torch build's", hvd.cuda_built() == (torch.version.cuda is not None))
    # rackhub-run starts every rank on this host: local rank = rank, so
    # each rank is alone with its local rank (Horovod: cross_size = hosts).
    check("cross_rank, cross_size, is_homogeneous on one host",
          (hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous()) == (0, 1, True),
          f"{hvd.cross_rank()} {hvd.cross_size()} {hvd.is_homogeneous()}")
    path = os.path.join(tmp, f"timeline.{rank}.json")
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(4), name="timed")
    hvd.allgather(torch.ones(1, 2))
    hvd.stop_timeline()
    with open(path) as f:
        events = json.load(f)
    names = [e["name"] for e in events]
    check("timeline: a Chrome trace of this rank's ops",
          "timed" in names and "allgather" in names and names.count("QUEUED") == 2
          and all(e["pid"] == rank and e["dur"] >= 0 for e in events), str(names))
    hvd.barrier()
    got = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    check("barrier, then an op", got.item() == size)


def shutdown_fails_pending(rank):
    """Last: rank 0 submits an op the others never join, then shuts down:
    the op fails with HorovodInternalError."""
    if rank != 0:
        return
    h = hvd.allreduce_async(torch.ones(8), name="never-joined")
    hvd.shutdown()
    ok, detail = raises(lambda: hvd.synchronize(h), hvd.HorovodInternalError, "")
    check("shutdown() fails an op in flight with HorovodInternalError", ok, detail)
    ok, detail = raises(lambda: hvd.allreduce_async(torch.ones(8)), RuntimeError, "init")
    check("an op after shutdown() refused", ok, detail)


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    with tempfile.TemporaryDirectory() as tmp:
        lifecycle(rank, size)
        allreduce_values(rank, size)
        async_handles(rank, size)
        mismatches(rank, size)
        compression(rank, size)
        grouped(rank, size)
        alltoall_and_reducescatter(rank, size)
        joins(rank, size)
        joins_with_optimizer(rank, size, hub=False)
        joins_with_optimizer(rank, size, hub=True)
        elementwise_reductions(rank, size)
        elementwise_joins(rank, size)
        exact_checks.run(rank, size)
        autograd(rank, size)
        sync_batchnorm(rank, size)
        probes_and_more(rank, size, tmp)
    hvd.barrier()
    shutdown_fails_pending(rank)
    hvd.shutdown()
    return summary()


if __name__ == "__main__":
    raise SystemExit(main())
