"""One rank of test_collectives.py's second job (rackhub-run with 3 ranks and
a hub whose straggler timeout is 1 s): what happens to the others when a rank
starts later than the straggler timeout, when a rank is later than it in a
collective, and when a rank has left. Prints
`CHECK ok|FAIL name detail` per check and `CHECKS n failed k`; exits 1 if any
failed.

No sleeps: the late root waits for the event that makes it late (the hub's
`rackhub_stragglers_total` for this tenant has counted the others' aborted
round), read from the metrics of the hub rackhub-run started
(RACKHUB_HUB_METRICS)."""
import os
import re
import time
import urllib.request

import torch

import rackhub
import rackhub.torch as hvd
from checks import check, summary


def metric(name):
    """This tenant's value of the hub's metric `name` (0 before it has one)."""
    text = urllib.request.urlopen(os.environ["RACKHUB_HUB_METRICS"], timeout=30).read().decode()
    tenant = os.environ["RACKHUB_TENANT"]
    m = re.search(r'^' + name + r'\{tenant="' + re.escape(tenant) + r'"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def stragglers():
    """The hub's count of iterations of this tenant aborted by the straggler
    timeout."""
    return metric("rackhub_stragglers_total")


def wait_for(what, cond, timeout=120):
    """Polls `cond` until it holds; the timeout only turns a hang into a
    failure."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.02)


def main():
    torch.set_num_threads(1)
    op_timeout = 60.0
    # A rank that starts later than the straggler timeout: rank 2 calls
    # init() only once the hub has aborted the others' first round of init()
    # (its collective finds rank 2 not connected). They wait for it, as
    # Horovod's init waits for every rank, instead of failing.
    late_start = os.environ["RACKHUB_RANK"] == "2"
    if late_start:
        wait_for("the others' init round to be aborted as a straggler",
                 lambda: stragglers() > 0)
    hvd.init(op_timeout=op_timeout)
    rank, size = hvd.rank(), hvd.size()
    check("3 ranks", size == 3, str(size))
    check("init waits for a rank later than the straggler timeout",
          not late_start or stragglers() > 0)
    # Every rank connected before the first collective: a rank that has not
    # connected yet (still importing torch on a loaded machine) would be
    # "not connected" to the hub, which fails a collective at once, as for a
    # rank that left (checked below).
    wait_for("all 3 ranks connected", lambda: metric("rackhub_workers_connected") == size)
    before = stragglers()
    # A root later than the straggler timeout: ranks 1 and 2 start the
    # broadcast, the hub aborts their round after 1 s; rank 0 comes only
    # then. Their aborted rounds are retried until it comes, as Horovod
    # tolerates any lateness.
    if rank == 0:
        wait_for("the others' round to be aborted as a straggler",
                 lambda: stragglers() > before)
    got = hvd.broadcast_object({"late": True} if rank == 0 else None, root_rank=0)
    check("broadcast_object from a root later than the straggler timeout", got == {"late": True},
          repr(got))
    check("the hub counted the aborted round", stragglers() > before)
    check("allreduce after it", hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [3.0, 3.0])

    # Rank 2 leaves (shutdown() says BYE) and exits: the others' next
    # collective fails once the hub's straggler timeout (1 s) finds rank 2
    # not connected, naming it, instead of retrying until op_timeout.
    if rank == 2:
        hvd.shutdown()
        return summary()
    ok, detail = False, "nothing raised"
    t0 = time.monotonic()
    try:
        hvd.allreduce(torch.ones(3))
    except rackhub.RackhubError as e:
        ok, detail = "rank(s) 2 not connected" in str(e), f"{type(e).__name__}: {e}"
        # Horovod's type for it, and still the library's (WorkerLost)
        ok &= isinstance(e, hvd.HorovodInternalError) and isinstance(e, rackhub.WorkerLost)
    waited = time.monotonic() - t0
    check("a rank that left fails the next collective (HorovodInternalError and WorkerLost), "
          "named, before op_timeout",
          ok and waited < op_timeout,
          f"after {waited:.2f} s: {detail}")
    hvd.shutdown()
    return summary()


if __name__ == "__main__":
    raise SystemExit(main())
