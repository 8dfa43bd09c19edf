"""What hoop does to the process once it has joined a job (installed by the first Communicator,
never by import hoop): an exception nothing caught tells the other ranks before this one ends
(sys.excepthook), and communicators the program never finalized leave the job at exit (atexit).
"""

import atexit
import os
import sys

from ._errors import Aborted, HoopError

_installed = False
_previous_excepthook = None


def install():
    """Once per process, when a communicator joins a job."""
    global _installed, _previous_excepthook
    if _installed:
        return
    _installed = True
    _previous_excepthook = sys.excepthook
    sys.excepthook = _abort_on_exception
    atexit.register(_finalize_at_exit)


def _alive():
    from ._comm import _alive as alive
    return alive


def _where(trace):
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is None:
        return ""
    code = trace.tb_frame.f_code
    return " (at %s:%d in %s)" % (os.path.basename(code.co_filename), trace.tb_lineno,
                                  code.co_name)


def _abort_on_exception(kind, value, trace):
    """An exception nothing caught ends this rank: first tell every other rank, which then fails
    its next (or current) hoop call with "aborted by rank R: ..." instead of waiting for a rank
    that is gone. Then Python's own report."""
    # An abort that came from another rank is not passed on again: every rank has it already.
    cause, seen = value, 0
    while cause is not None and not isinstance(cause, Aborted) and seen < 8:
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    if _alive() and not isinstance(cause, Aborted):
        reason = "%s: %s%s" % (kind.__name__, value, _where(trace))
        for comm in list(_alive()):
            comm.abort(reason)
    _previous_excepthook(kind, value, trace)



def _finalize_at_exit():
    # Sub-communicators before the communicators they were split from.
    for comm in sorted(_alive(), key=lambda c: -c._depth):
        try:
            comm.finalize()
        except HoopError:
            pass
