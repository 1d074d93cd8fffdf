"""Asynchronous collectives: the background thread that runs them and the
handles that wait for them (Horovod's poll() and synchronize()).

Every collective of rackhub.torch is an op submitted here: the `*_async`
functions return its handle (an int, as in Horovod), the blocking ones are
the same op followed by synchronize(). One thread per initialized context
runs the ops one at a time, in the order this rank submitted them, which is
what pairs an op with the other ranks' op (every rank submits its
collectives in the same order, as rackhub.torch requires; the first round
of each op checks that they match). Meanwhile the submitting thread goes on
(the backward pass computes while gradients travel), and any number of ops
may be in flight and be waited for in any order.

A name may be used by one unfinished op at a time (Horovod's rule): a
second op with the name of one that has not finished raises ValueError at
submission. Names are released when the op finishes, before synchronize.

shutdown() closes the executor: ops not yet started fail with
HorovodInternalError, the running one fails when the client closes.

Thread use: submit() from any thread; ops run on the executor's thread.
"""
import collections
import itertools
import threading
import time

from .. import _core
from . import _context
from .errors import HorovodInternalError, internal


class Op:
    """One submitted collective: `run()` computes its result on the
    executor's thread; `finish(result)` (optional) runs on the thread that
    synchronizes (copies into the caller's tensor for the in-place ops)."""
    __slots__ = ("handle", "kind", "name", "run", "finish", "done", "result", "error",
                 "queued", "started", "ended", "executor", "view")

    def __init__(self, kind, name, run, finish=None):
        self.kind, self.name, self.run, self.finish = kind, name, run, finish
        # The process set the op was submitted under (_context.SetView), in
        # which it runs on the executor's thread; None: the global set.
        self.view = _context.view()
        self.done = threading.Event()
        self.result = self.error = None
        self.queued = self.started = self.ended = None
        self.handle = None
        self.executor = None


class Executor:
    """The thread that runs one context's ops in submission order."""

    def __init__(self, on_done=None):
        self._cv = threading.Condition()
        self._queue = collections.deque()
        self._names = {}  # name -> handle of the unfinished op that uses it
        self._closed = None  # the reason, once closed
        self._on_done = on_done  # called with each finished op (the timeline)
        self._thread = threading.Thread(target=self._loop, name="rackhub-collectives",
                                        daemon=True)
        self._thread.start()

    def submit(self, op):
        with self._cv:
            if self._closed is not None:
                raise HorovodInternalError(f"rackhub.torch: {self._closed}")
            if op.name is not None and op.name in self._names:
                raise ValueError(
                    f"{op.kind}: the name '{op.name}' is used by an op that has not finished "
                    f"(handle {self._names[op.name]}); use a different name")
            op.handle = next(_handles)
            op.executor = self
            op.queued = time.monotonic()
            if op.name is not None:
                self._names[op.name] = op.handle
            _ops[op.handle] = op
            self._queue.append(op)
            self._cv.notify()
        return op.handle

    def _loop(self):
        while True:
            with self._cv:
                while not self._queue and self._closed is None:
                    self._cv.wait()
                if not self._queue:
                    return
                op = self._queue.popleft()
            op.started = time.monotonic()
            try:
                with _context.viewing(op.view):
                    op.result = op.run()
            except BaseException as e:  # noqa: BLE001 - handed to synchronize()
                op.error = e
            self._end(op)

    def _end(self, op):
        op.ended = time.monotonic()
        with self._cv:
            if op.name is not None and self._names.get(op.name) == op.handle:
                del self._names[op.name]
        op.done.set()
        if self._on_done is not None and op.started is not None:
            try:
                self._on_done(op)
            except Exception:  # noqa: BLE001 - the timeline never fails an op
                pass

    def close(self, reason, before_join=None):
        """Fails the queued ops with `reason`; `before_join()` (closing the
        client) makes the running op fail; waits for the thread."""
        with self._cv:
            self._closed = reason
            dropped = list(self._queue)
            self._queue.clear()
            self._cv.notify()
        for op in dropped:
            op.error = HorovodInternalError(f"rackhub.torch: {reason}")
            self._end(op)
        if before_join is not None:
            before_join()
        if self._thread is not threading.current_thread():
            self._thread.join()


_handles = itertools.count(1)
_ops = {}  # handle -> Op, until synchronize() takes it


def _op_of(handle, what):
    op = _ops.get(handle)
    if op is None:
        raise ValueError(f"{what}: {handle!r} is not the handle of an op that was not yet "
                         f"synchronized")
    return op


def poll(handle):
    """True if the op of `handle` has finished (synchronize() will not block)."""
    return _op_of(handle, "poll").done.is_set()


def synchronize(handle):
    """Waits for the op of `handle` and returns its result (the output
    tensor; the input tensor for the in-place ops). A failed op raises
    HorovodInternalError (or MismatchError, one). The handle is consumed;
    an unknown handle returns None (as in Horovod)."""
    op = _ops.get(handle)
    if op is None:
        return None
    op.done.wait()
    _ops.pop(handle, None)
    if op.error is not None:
        e = op.error
        if isinstance(e, _core.RackhubError) and not isinstance(e, HorovodInternalError):
            raise internal(e) from e
        raise e
    return op.finish(op.result) if op.finish is not None else op.result
