"""The Work objects of hoop's torch.distributed backend (_backend): a group's calls return one,
over hoop's requests; Work.wait(timeout), futures completed by a thread of their own."""

import datetime
import queue
import threading

import torch
from torch._C._distributed_c10d import Work

from .. import HoopError, Timeout


class _Work(Work):
    """One collective of the process group: hoop requests, and what to do once they complete.

    Its future (get_future, which DistributedDataParallel chains its bucket's work on) completes
    when the collective does, set by the completer thread; so backward goes on while the
    collective runs on hoop's progress thread."""

    def __init__(self, group, requests, result, then=None):
        super().__init__()
        self._group = group
        self._requests = requests
        self._result = result
        self._then = then
        self._error = None
        self._done = False
        self._future = None
        self._waiter = None  # the thread that waits for it, once Work.wait had a timeout
        self._lock = threading.Lock()  # one thread at a time completes the requests

    def _complete(self):
        with self._lock:
            if self._done:
                return
            try:
                for request in self._requests:
                    request.wait()
                if self._then:
                    self._then()
            except HoopError as err:
                self._error = err
            self._done = True
        if self._group is not None:  # None: a DDP hook's (_hooks), which no group holds
            self._group._forget(self)

    def is_completed(self):
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # the completer thread is waiting for it
        try:
            ready = all(request.test() for request in self._requests)
        except HoopError:
            ready = True  # failed: _complete records the error
        finally:
            self._lock.release()
        if ready:
            self._complete()
        return self._done

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout=datetime.timedelta(0)):
        """Until the collective completes; with a timeout (a timedelta or seconds, 0 for none),
        raises hoop.Timeout once that passes first. The collective stays posted then: wait again,
        or end the job."""
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
        if seconds > 0 and not self._done:
            # Waited for on a thread of its own (hoop_wait runs without the GIL), so that this one
            # can stop at the timeout: hoop_test may itself run the call to its end.
            with self._lock:
                if self._waiter is None and not self._done:
                    self._waiter = threading.Thread(target=self._complete, daemon=True,
                                                    name="hoop-work-wait")
                    self._waiter.start()
            if self._waiter is not None:
                self._waiter.join(seconds)
            if not self._done:
                raise Timeout("hoop backend: Work.wait: the collective did not complete within "
                              "its timeout of %g s (it stays posted; wait again or end the job)"
                              % seconds, Timeout.code)
        self._complete()
        if self._error is not None:
            raise RuntimeError("hoop backend: %s" % self._error) from self._error
        return True

    def synchronize(self):
        self.wait()

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        if self._future is None:
            self._future = torch.futures.Future()
            _completer.add(self)
        return self._future

    def _settle(self):
        """On the completer thread: complete, then set the future."""
        try:
            self.wait()
            self._future.set_result(self._result)
        except RuntimeError as err:
            self._future.set_exception(err)


class _Completer:
    """A daemon thread that completes the works whose futures were asked for, in order, blocked in
    hoop_wait (which ctypes runs without the GIL)."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def add(self, work):
        if threading.current_thread() is self._thread:
            # Asked from a callback of a future this thread is setting (torch runs a future's
            # then() callbacks in the thread that sets it; PowerSGD's hook posts an all_reduce
            # there and waits on its future): settled here and now, or it would wait on itself.
            work._settle()
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hoop-futures",
                                                daemon=True)
                self._thread.start()
        self._queue.put(work)

    def _run(self):
        while True:
            self._queue.get()._settle()


_completer = _Completer()
