"""hoop.torch: the handles of asynchronous calls (poll, synchronize).

The table of outstanding handles lives here; hvd.shutdown() clears it.
"""

import itertools


_handles = {}
_handle_numbers = itertools.count(1)


class _Pending:
    """The hoop requests of one asynchronous call, its result, and what finishes it."""

    __slots__ = ("requests", "result", "finish")

    def __init__(self, requests, result, finish):
        self.requests, self.result, self.finish = requests, result, finish


def _post(requests, result, finish=None):
    handle = next(_handle_numbers)
    _handles[handle] = _Pending(requests, result, finish)
    return handle


def _pending(handle, call):
    try:
        return _handles[handle]
    except KeyError:
        raise ValueError("%s: %r is not an outstanding handle (each is synchronized once)"
                         % (call, handle)) from None


def poll(handle):
    """True once the asynchronous call behind handle has completed (synchronize() then returns
    at once); raises its error if it failed."""
    return all(r.test() for r in _pending(handle, "hvd.poll").requests)


def synchronize(handle):
    """Wait for the asynchronous call behind handle; return its output tensor."""
    pending = _pending(handle, "hvd.synchronize")
    try:
        for request in pending.requests:
            request.wait()
    finally:
        del _handles[handle]
    if pending.finish is not None:
        return pending.finish()
    return pending.result
