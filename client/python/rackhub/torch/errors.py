"""The exceptions of rackhub.torch's collectives (Horovod's names).

HorovodInternalError (a RuntimeError, as in Horovod) is what a failed
collective raises from synchronize() and from the blocking ops: the hub
aborted a round (a rank died or was later than the straggler timeout for
longer than op_timeout), the connection was closed (shutdown()), or the
ranks disagreed about the op (shapes, dtypes, roots, names, kinds; see
MismatchError). A failure that came from the client library keeps its
rackhub type too: the raised object is an instance of both
HorovodInternalError and the library's class (rackhub.WorkerLost,
rackhub.RolledBack, rackhub.RackhubError), with its attributes code, wire
and iteration, so code written for either catches it.

MismatchError is raised on every rank when the ranks pass ops that do not
match; it is a HorovodInternalError (Horovod's type for the error) and a
ValueError (what rackhub.torch raised for it before, kept for existing
callers).

This module imports no other module of the package.
"""
from .. import _core


class HorovodInternalError(RuntimeError):
    """A collective failed (Horovod's horovod.common.exceptions.HorovodInternalError)."""


class HostsUpdatedInterrupt(RuntimeError):
    """The membership of an elastic job changed at a commit (ranks joined or
    left while the last step completed): rackhub.torch.elastic.run keeps the
    state, resets and calls the training function again (Horovod's
    horovod.common.exceptions.HostsUpdatedInterrupt). skip_sync is accepted
    for Horovod's signature; rackhub always syncs after a reset."""

    def __init__(self, skip_sync=False):
        super().__init__("the membership of the elastic job changed")
        self.skip_sync = skip_sync


class MismatchError(HorovodInternalError, ValueError):
    """The ranks' ops do not match (shape, dtype, root, name, op or kind):
    raised on every rank, no result is returned anywhere."""


_mixed = {}


def internal(e):
    """The HorovodInternalError to raise for exception `e` from the client
    library (an instance of both classes, same message and attributes);
    a HorovodInternalError is returned as it is."""
    if isinstance(e, HorovodInternalError):
        return e
    base = type(e) if isinstance(e, _core.RackhubError) else None
    if base is None:
        out = HorovodInternalError(f"{type(e).__name__}: {e}")
    else:
        cls = _mixed.get(base)
        if cls is None:
            cls = type(base.__name__, (HorovodInternalError, base),
                       {"__module__": "rackhub.torch.errors",
                        "__doc__": f"HorovodInternalError that is also {base.__name__}."})
            _mixed[base] = cls
        out = cls(str(e))
        for a in ("code", "wire", "iteration"):
            if hasattr(e, a):
                setattr(out, a, getattr(e, a))
    out.__cause__ = e
    return out
