"""rackhub: Python client of the rackhub parameter server.

    import rackhub                  # the data-plane client (no torch needed)
    import rackhub.torch as rh      # the PyTorch plugin (DistributedOptimizer, ...)

`rackhub.Client` is the binding of librackhub's C++ client
(client/include/rackhub/client/client.h): one worker (rank) of one tenant,
one TCP connection per hub lane. Its data calls take raw addresses of
contiguous fp32 buffers and a `keepalive` object that the binding holds until
the ticket completed, so the library can send from and receive into that
memory directly (zero-copy). Every blocking call releases the GIL. Failures
raise `rackhub.RackhubError` (a RuntimeError) with attributes `code`
(e.g. 'CONNECTION_LOST', 'SERVER', 'TIMEOUT') and `wire` (the hub's code for
'SERVER' errors, e.g. 'WORKER_LOST') and `iteration`. Two subclasses:
`rackhub.RolledBack` (code 'ROLLED_BACK': the hub's version of the key,
`.iteration`, differs after a hub restart; pull the key and go on) and
`rackhub.WorkerLost` (code 'SERVER', wire 'WORKER_LOST': another rank died;
pull, back off and retry). A broken connection is reconnected automatically
within `op_timeout` (`Client(..., reconnect=False)` turns that off).

The launcher is `python3 -m rackhub.run` (build/bin/rackhub-run).
"""
from ._core import Client, RackhubError, RolledBack, WorkerLost  # noqa: F401

__all__ = ["Client", "RackhubError", "RolledBack", "WorkerLost"]
__version__ = "0.1.0"
