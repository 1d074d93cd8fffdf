"""One rank of test_process_sets.py (rackhub-run, 3 ranks): Horovod's
process sets. Static sets {0, 2} and {1} from init(process_sets=...), a
dynamic set {0, 1} added and removed; allreduce (Sum, Average, fp32 and
int32, small and above the header round), grouped_allreduce, async ops,
allgather, broadcast (root_rank a global rank), alltoall with splits,
reducescatter, broadcast_object, allgather_object, barrier and a
DistributedOptimizer step within a set, each compared with a reference
this process computes alone from the set's ranks' inputs (every input is a
function of its rank); {0, 2} and {1} run their ops at the same time. The
errors: an op over a set this rank is not in, a root outside the set, a
removed set, sets with duplicate / out-of-range ranks or that exist, ranks
naming different sets at init; each raises on the ranks (no hang) and the
next op works. Gradients of allreduce and allgather over a set go over the
set.
Prints `CHECK ok|FAIL name detail` per check and `CHECKS n failed k`."""
import torch

import rackhub.torch as hvd
from checks import check, raises, summary


def inp(rank, seed, shape, dtype=torch.float32):
    """Rank `rank`'s input `seed`: deterministic, exact in the dtype."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 50, shape, generator=g).to(dtype)


def ref_sum(ranks, seed, shape, dtype=torch.float32, average=False):
    """The fp32 sum of the set's inputs in global-rank order (Average: times
    1/len(ranks) in float64, as rackhub.torch scales), cast to the dtype."""
    total = torch.zeros(shape, dtype=torch.float32)
    for r in ranks:
        total = total + inp(r, seed, shape, dtype).to(torch.float32)
    if average:
        return (total.to(torch.float64) * (1.0 / len(ranks))).to(dtype)
    return total.to(dtype)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def ops_within(ps, me, tag):
    """Every op over `ps` (this rank is in it), against references."""
    ranks = ps.ranks
    n = len(ranks)
    i = ranks.index(me)
    check(f"{tag}.rank_size", ps.rank() == i and ps.size() == n and ps.included(),
          f"{ps.rank()} {ps.size()} {ps.included()}")
    for seed, shape, dtype in ((1, (7,), torch.float32), (2, (5000,), torch.float32),
                               (3, (3, 4), torch.int32)):
        x = inp(me, seed, shape, dtype)
        got = hvd.allreduce(x, op=hvd.Sum, process_set=ps)
        check(f"{tag}.allreduce_sum.{seed}", same(got, ref_sum(ranks, seed, shape, dtype)))
        if dtype.is_floating_point:
            got = hvd.allreduce(x, process_set=ps)  # Average: over the set's size
            want = ref_sum(ranks, seed, shape, dtype, average=True)
            check(f"{tag}.allreduce_avg.{seed}", same(got, want),
                  f"max diff {(got - want).abs().max().item() if got.shape == want.shape else ''}")
    # Async: several in flight, waited for in reverse order; in place.
    hs = [hvd.allreduce_async(inp(me, 10 + k, (100,)), op=hvd.Sum, name=f"{tag}.a{k}",
                              process_set=ps) for k in range(3)]
    outs = [hvd.synchronize(h) for h in reversed(hs)][::-1]
    check(f"{tag}.async", all(same(o, ref_sum(ranks, 10 + k, (100,)))
                              for k, o in enumerate(outs)))
    t = inp(me, 14, (9,))
    hvd.allreduce_(t, op=hvd.Sum, process_set=ps)
    check(f"{tag}.inplace", same(t, ref_sum(ranks, 14, (9,))))
    got = hvd.grouped_allreduce([inp(me, 20, (4,)), inp(me, 21, (6, 2))], op=hvd.Sum,
                                process_set=ps)
    check(f"{tag}.grouped", same(got[0], ref_sum(ranks, 20, (4,))) and
          same(got[1], ref_sum(ranks, 21, (6, 2))))
    # allgather: rank r contributes r + 1 rows.
    got = hvd.allgather(inp(me, 30, (me + 1, 3)), process_set=ps)
    check(f"{tag}.allgather", same(got, torch.cat([inp(r, 30, (r + 1, 3)) for r in ranks])))
    # broadcast from every member (root_rank: a global rank).
    for root in ranks:
        got = hvd.broadcast(inp(me, 40, (5,)), root_rank=root, process_set=ps)
        check(f"{tag}.broadcast.{root}", same(got, inp(root, 40, (5,))))
        got = hvd.broadcast_object({"from": me, "t": inp(me, 41, (2,))}, root_rank=root,
                                   process_set=ps)
        check(f"{tag}.broadcast_object.{root}",
              got["from"] == root and same(got["t"], inp(root, 41, (2,))))
    check(f"{tag}.allgather_object",
          hvd.allgather_object(("r", me), process_set=ps) == [("r", r) for r in ranks])
    # alltoall: set rank i sends j + i + 1 rows to set rank j.
    splits = [j + i + 1 for j in range(n)]
    x = torch.cat([torch.full((s, 2), float(100 * me + j)) for j, s in enumerate(splits)])
    got, rsplits = hvd.alltoall(x, splits=splits, process_set=ps)
    want = torch.cat([torch.full((i + k + 1, 2), float(100 * r + i))
                      for k, r in enumerate(ranks)])
    check(f"{tag}.alltoall", same(got, want) and rsplits.tolist() == [i + k + 1 for k in range(n)],
          f"{got.shape} {rsplits.tolist()}")
    # reducescatter: n * 2 + 1 rows, the first ranks one more.
    rows = 2 * n + 1
    full = ref_sum(ranks, 50, (rows, 3))
    start = sum(rows // n + (1 if k < rows % n else 0) for k in range(i))
    mine = rows // n + (1 if i < rows % n else 0)
    got = hvd.reducescatter(inp(me, 50, (rows, 3)), op=hvd.Sum, process_set=ps)
    check(f"{tag}.reducescatter", same(got, full[start:start + mine]), f"{got.shape}")
    hvd.barrier(process_set=ps)
    check(f"{tag}.barrier", True)


def optimizer_step(ps, me):
    """One DistributedOptimizer step over `ps`: the gradient averaged over
    the set's ranks (local SGD), against a reference."""
    w = torch.nn.Parameter(torch.arange(6, dtype=torch.float32) / 7)
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=0.1),
                                   named_parameters=[("psw", w)], process_set=ps)
    opt.zero_grad()
    (w * inp(me, 60, (6,))).sum().backward()
    opt.step()
    g = ref_sum(ps.ranks, 60, (6,))
    g = g * torch.tensor(1.0 / len(ps.ranks), dtype=torch.float32)
    want = (torch.arange(6, dtype=torch.float32) / 7).add(g, alpha=-0.1)
    check("optimizer.step", same(w.detach(), want), f"{w.detach()} vs {want}")


def main():
    torch.set_num_threads(1)
    even = hvd.ProcessSet([2, 0])  # sorted, as in Horovod
    odd = hvd.ProcessSet([1])
    hvd.init(process_sets=[even, odd])
    me = hvd.rank()
    check("size", hvd.size() == 3)
    check("ids", (hvd.global_process_set.process_set_id, even.process_set_id,
                  odd.process_set_id) == (0, 1, 2) and even.ranks == [0, 2],
          f"{even} {odd}")
    check("global", hvd.global_process_set.ranks == [0, 1, 2] and
          hvd.global_process_set.size() == 3 and hvd.global_process_set.rank() == me)
    mine, other = (even, odd) if me in even.ranks else (odd, even)
    check("included", mine.included() and not other.included())
    ok, why = raises(other.rank, ValueError, "is not in process set")
    check("rank_of_other_set", ok, why)

    # The two disjoint sets at the same time: ranks 0 and 2 over {0, 2}
    # while rank 1 runs over {1}.
    ops_within(mine, me, "even" if mine is even else "odd")
    if mine is even:
        optimizer_step(even, me)

    # Errors at the call, on the ranks that make them (no collective runs).
    ok, why = raises(lambda: hvd.allreduce(torch.ones(3), process_set=other), ValueError,
                     f"is not in process set {other.process_set_id}")
    check("err.not_member", ok, why)
    ok, why = raises(lambda: hvd.broadcast_object(1, root_rank=1, process_set=even)
                     if me != 1 else hvd.broadcast_object(1, root_rank=0, process_set=odd),
                     ValueError, "is not in process set")
    check("err.root_outside", ok, why)
    # Gradients over a set go over the set: the gradient of a Sum allreduce
    # is the Sum allreduce of the members' upstream gradients, of an
    # allgather each member's own rows of the upstream gradient summed over
    # the members.
    x = inp(me, 41, (3,)).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
    (y * inp(me, 42, (3,))).sum().backward()
    check("grad.allreduce", same(y.detach(), ref_sum(mine.ranks, 41, (3,))) and
          same(x.grad, ref_sum(mine.ranks, 42, (3,))), f"{x.grad} {ref_sum(mine.ranks, 42, (3,))}")
    x = inp(me, 43, (2, 2)).requires_grad_()
    g = hvd.allgather(x, process_set=mine)
    (g * torch.arange(g.numel(), dtype=torch.float32).view_as(g) * (me + 1)).sum().backward()
    pos = mine.ranks.index(me)
    want = sum(torch.arange(g.numel(), dtype=torch.float32).view_as(g)[2 * pos:2 * pos + 2] *
               (r + 1) for r in mine.ranks)
    check("grad.allgather", g.shape == (2 * len(mine.ranks), 2) and same(x.grad, want),
          f"{x.grad} {want}")
    ok, why = raises(lambda: hvd.allreduce(torch.ones(2), process_set=[0, 2]), ValueError,
                     "process_set: a ProcessSet")
    check("err.not_a_set", ok, why)

    # Dynamic sets: collective over all ranks.
    pair = hvd.add_process_set([0, 1])
    check("add.id", pair.process_set_id == 3 and pair.ranks == [0, 1], str(pair))
    if me in pair.ranks:
        got = hvd.allreduce(inp(me, 70, (300,)), op=hvd.Sum, process_set=pair)
        check("add.allreduce", same(got, ref_sum([0, 1], 70, (300,))))
    # Bad sets raise on every rank (ValueError), and the next op works.
    for ranks, text in (([0, 0, 1], "more than once"), ([1, 5], "not in [0, 3)"),
                        ([2, 0], "exists already (id 1)"), ([], "at least one rank")):
        ok, why = raises(lambda: hvd.add_process_set(ranks), ValueError, text)
        check(f"add.bad.{ranks}", ok, why)
    got = hvd.allreduce(inp(me, 71, (8,)), op=hvd.Sum)
    check("add.bad.then_global_op", same(got, ref_sum([0, 1, 2], 71, (8,))))
    check("remove.global", hvd.remove_process_set(hvd.global_process_set) is False)
    check("remove", hvd.remove_process_set(pair) is True and pair.process_set_id is None)
    ok, why = raises(lambda: hvd.allreduce(torch.ones(2), process_set=pair), ValueError,
                     "is not registered")
    check("removed.use", ok, why)
    ok, why = raises(lambda: hvd.remove_process_set(pair), ValueError, "is not registered")
    check("removed.remove_again", ok, why)
    # Added again: a new id, the same keys (named by the ranks).
    again = hvd.add_process_set(hvd.ProcessSet([0, 1]))
    check("readd.id", again.process_set_id == 4, str(again))
    if me in again.ranks:
        got = hvd.allreduce(inp(me, 72, (10,)), process_set=again, op=hvd.Sum)
        check("readd.allreduce", same(got, ref_sum([0, 1], 72, (10,))))

    # Ranks that name different static sets at init: ValueError on every
    # rank, then a plain init works.
    hvd.shutdown()
    ok, why = raises(lambda: hvd.init(process_sets=[[me]]), ValueError, "different process sets")
    check("init.mismatch", ok, why)
    check("init.mismatch.shut", not hvd.is_initialized())
    hvd.init()
    check("init.again", hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [3.0, 3.0] and
          even.process_set_id is None)
    hvd.shutdown()
    return summary()


if __name__ == "__main__":
    raise SystemExit(main())
