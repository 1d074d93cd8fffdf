"""join() (Horovod's): a rank that ran out of data joins; until every rank
has joined, it takes part in the other ranks' allreduce and
grouped_allreduce ops with -0.0, the identity of IEEE addition (their
Average still divides by size(): the result is that of an allreduce where
the joined ranks passed zeros, and a sum of -0.0s stays -0.0); for
Min, Max and Product a joined rank passes the reduction's identity, +inf,
-inf and 1, so the result is that of the active ranks alone) and in
their allgathers with no rows (so SyncBatchNorm's statistics are those of
the ranks that still have data). When
all have joined, join() returns on every rank the rank that joined last
(of ranks that joined at the same point, the highest).

How: a joined rank sends a join header in every header round (rounds.py);
the others' op sees it (agree.open_op) and runs with it when the op is
joinable, and raises MismatchError on every active rank otherwise (e.g. a
broadcast while a rank is joined). The joined rank reads the active ranks'
headers and, when they agree on a joinable op, sends -0.0 in the op's
data rounds (exact.join_rounds: the rounds the active ranks' op makes).
DistributedOptimizer steps open with a header round of their
own (kind "optimizer_step", optimizer.py): a joined rank answers it by
pushing -0.0 to every key of its optimizer with the same join id.

Thread use: any thread; the op runs on the executor's thread.
"""
import torch

from . import _context, agree, exact, rounds
from .collectives import OP_OF_CODE, submit
from .errors import MismatchError
from .handles import synchronize

_JOIN = agree.CODE["join"]


def _join_run():
    waited = 0
    while True:
        # The inline payload of a sum op: -0.0, the identity of IEEE addition.
        every, _ = rounds.header([_JOIN, 0, -3, 0, waited, 0, 0, 0],
                                 torch.full((rounds.capacity(),), exact.NOTHING))
        active = [e for e in every if e[0] != _JOIN]
        if not active:
            least = min(e[4] for e in every)
            return max(r for r, e in enumerate(every) if e[4] == least)
        waited += 1
        kind = agree.KINDS.get(active[0][0])
        if kind == "optimizer_step" and len({tuple(e) for e in active}) == 1:
            _optimizer_step(active[0][4])
            continue
        if len({e[0] for e in active}) != 1 or kind not in agree.JOINABLE:
            continue  # the active ranks raise MismatchError: no data rounds follow
        if kind == "allgather":  # the rows of each may differ; the rest must agree
            if len({tuple(e[:7]) for e in active}) != 1:
                continue
            rows = sum(e[7] for e in active)
            rounds.exchange(torch.zeros(rows * active[0][5], dtype=torch.uint8))
            continue
        if len({tuple(e) for e in active}) != 1:
            continue
        dtype_code, numel, op_code = active[0][4], active[0][5], active[0][7]
        if kind == "grouped_allreduce":
            op_code //= 1000  # op * 1000 + group length
        exact.join_rounds(dtype_code, numel, OP_OF_CODE.get(op_code))


def _optimizer_step(join_id):
    """The active ranks step the DistributedOptimizer `join_id`: zeros to its
    keys from this rank."""
    ref = _context.need().optimizers.get(join_id)
    sync = ref() if ref is not None else None
    if sync is None:
        raise MismatchError(f"join: the other ranks step a DistributedOptimizer (join id "
                            f"{join_id}) that this rank does not have; create the same "
                            f"optimizer over the same parameters on every rank")
    sync.push_zeros()


def join(device=-1):
    """Joins (this rank has no more data); returns, once every rank joined,
    the rank that joined last. `device` is accepted for Horovod's sake.
    Not for elastic jobs (ValueError): a rank that runs out of data there
    leaves the job instead."""
    if _context.need().elastic is not None:
        raise ValueError("join: not built for elastic jobs (a rank without data leaves: its "
                         "process exits, and the others continue without it)")
    return synchronize(submit("join", None, _join_run))
