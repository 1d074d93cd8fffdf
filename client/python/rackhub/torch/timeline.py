"""start_timeline / stop_timeline (Horovod's names): a Chrome trace
(chrome://tracing, Perfetto) of this process's collectives.

Unlike Horovod, whose coordinator writes one file for every rank, each rank
records its own ops: every rank that calls start_timeline(path) writes
`path` (give each rank its own path, e.g. with its rank in it; rank 0 alone
may call it). Each op is one row (tid) per kind, with two events: QUEUED
(submitted until the executor started it: the time spent behind earlier
ops) and the op itself (its header round and data rounds, named by the
op's name or its kind), with args handle, rank and error. mark_cycles is
accepted and ignored (rackhub has no negotiation cycles).

Thread use: start/stop from the main thread; record() on the executor's.
"""
import json
import threading
import time

_lock = threading.Lock()
_file = None
_t0 = 0.0
_first = True


def start_timeline(file_path, mark_cycles=False):
    """Starts writing this rank's timeline to `file_path` (replaced);
    a running timeline is stopped first."""
    global _file, _t0, _first
    stop_timeline()
    f = open(file_path, "w")
    f.write("[\n")
    f.flush()
    with _lock:
        _file, _t0, _first = f, time.monotonic(), True


def stop_timeline():
    """Stops the timeline and closes its file (a complete JSON array)."""
    global _file
    with _lock:
        f, _file = _file, None
    if f is not None:
        f.write("\n]\n")
        f.close()


def _event(name, tid, start, end, args):
    return {"name": name, "cat": "rackhub", "ph": "X", "pid": args["rank"], "tid": tid,
            "ts": round((start - _t0) * 1e6, 3), "dur": round((end - start) * 1e6, 3),
            "args": args}


def record(op, rank):
    """Writes op's events if a timeline is running (from the executor)."""
    global _first
    with _lock:
        if _file is None or op.queued < _t0:
            return
        args = {"handle": op.handle, "rank": rank, "kind": op.kind}
        if op.error is not None:
            args["error"] = f"{type(op.error).__name__}: {op.error}"
        events = [_event("QUEUED", op.kind, op.queued, op.started, args),
                  _event(op.name or op.kind, op.kind, op.started, op.ended, args)]
        for e in events:
            _file.write(("" if _first else ",\n") + json.dumps(e))
            _first = False
        _file.flush()
