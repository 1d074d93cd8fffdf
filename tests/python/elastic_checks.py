"""Collectives by member in an elastic job, checked by elastic_worker.py on
every step attempt against references computed here from the members' hub
ranks alone (every input is a function of (step, slot)): reducescatter
(Average and Sum) and its gradient, grouped_reducescatter and its gradient,
sparse_allreduce_async's Average, alltoall with splits, and the sign of
zero in Sum/Average sums (all members -0.0, mixed signs) through the hub
(float32) and the gathered paths (float16, float64). The job has free slots
(--max-np 8, fewer members) and, after a kill, a gap among the members:
a free slot must count as nothing, not as a rank and not as +0.0.

run(step, slot, members) returns the names of the checks that failed
(empty: all bit for bit)."""
import torch

import rackhub.torch as hvd
from exact_checks import rank_order, same, signed_zeros


def _inp(step, slot, shape, dtype, seed):
    g = torch.Generator().manual_seed(step * 7919 + slot * 104729 + seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)


def _share(rows, n, r):
    base, extra = divmod(rows, n)
    first = r * base + min(r, extra)
    return first, base + (r < extra)


def _reducescatters(step, slot, members, bad):
    n, r = len(members), members.index(slot)
    for op, dtype, name in ((hvd.Average, torch.float32, "reducescatter Average"),
                            (hvd.Sum, torch.float64, "reducescatter Sum")):
        x = _inp(step, slot, (2 * n + 1, 3), dtype, 1).requires_grad_(True)
        got = hvd.reducescatter(x, op=op)
        first, k = _share(2 * n + 1, n, r)
        want = rank_order([_inp(step, s, (2 * n + 1, 3), dtype, 1) for s in members],
                          op)[first:first + k]
        w = torch.arange(float((2 * n + 1) * 3), dtype=dtype).view(2 * n + 1, 3)
        (got * w[first:first + k]).sum().backward()
        f = 1.0 / n if op == hvd.Average else 1.0
        if not same(got.detach(), want):
            bad.append(name)
        if not same(x.grad, (w.to(torch.float64) * f).to(dtype)):
            bad.append(f"{name} gradient")
    # grouped: shares of each tensor, gradients with the Average factor.
    xs = [_inp(step, slot, (n + 2, 2), torch.float32, 2).requires_grad_(True),
          _inp(step, slot, (3 * n - 1,), torch.float16, 3).requires_grad_(True)]
    got = hvd.grouped_reducescatter(xs, op=hvd.Average)
    loss = 0
    for i, (g, x) in enumerate(zip(got, xs)):
        first, k = _share(x.shape[0], n, r)
        want = rank_order([_inp(step, s, tuple(x.shape), x.dtype, 2 + i) for s in members],
                          hvd.Average)[first:first + k]
        if not same(g.detach(), want):
            bad.append(f"grouped_reducescatter tensor {i}")
        loss = loss + (g.to(torch.float32) * (i + 2)).sum()
    loss.backward()
    for i, x in enumerate(xs):
        want = (torch.full(x.shape, float(i + 2), dtype=torch.float64) * (1.0 / n)).to(x.dtype)
        if not same(x.grad, want):
            bad.append(f"grouped_reducescatter gradient {i}")


def _sparse(step, slot, members, bad):
    n = len(members)

    def mine(s):  # two entries, at one index every fifth step (coalesced: one)
        return torch.sparse_coo_tensor(torch.tensor([[s % 5, (s + step) % 5]]),
                                       _inp(step, s, (2,), torch.float32, 4), (5,))
    got = hvd.synchronize(hvd.sparse_allreduce_async(mine(slot), op=hvd.Average))
    # Horovod's definition: every member's coalesced entries, in rank order,
    # the values divided by the member count.
    parts = [mine(s).coalesce() for s in members]
    want_i = torch.cat([p.indices() for p in parts], dim=1)
    want_v = torch.cat([p.values() for p in parts]) / n
    if not (torch.equal(got._indices(), want_i) and same(got._values(), want_v)):
        bad.append("sparse_allreduce_async Average")


def _alltoall(step, slot, members, bad):
    n, r = len(members), members.index(slot)

    def rows(src, dst):  # what member src (a slot) sends to dense rank dst
        return torch.full(((src + dst + step) % 3, 2), float(src * 100 + dst))
    splits = [(slot + d + step) % 3 for d in range(n)]
    data = torch.cat([rows(slot, d) for d in range(n)])
    out, received = hvd.alltoall(data, splits=splits)
    want = torch.cat([rows(s, r) for s in members])
    if not (same(out, want) and received.tolist() == [(s + r + step) % 3 for s in members]):
        bad.append("alltoall")


def _signed_zeros(step, slot, members, bad):
    for dtype, n in ((torch.float32, 5000), (torch.float16, 40), (torch.float64, 40)):
        for op in (hvd.Sum, hvd.Average):
            got = hvd.allreduce(signed_zeros(slot, n, dtype, seed=step), op=op)
            want = rank_order([signed_zeros(s, n, dtype, seed=step) for s in members], op)
            if not same(got, want):
                bad.append(f"signed zero {str(dtype)[6:]} {op}")


def run(step, slot, members):
    """Every check of the module docstring; returns the failed ones."""
    bad = []
    _reducescatters(step, slot, members, bad)
    _sparse(step, slot, members, bad)
    _alltoall(step, slot, members, bad)
    _signed_zeros(step, slot, members, bad)
    return bad
