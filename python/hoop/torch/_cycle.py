"""hoop.torch: the calls this process made on the job's communicator, latest last, for join().

Each collective of hoop.torch's Horovod API records what it posted (its kind, the shapes and
dtypes it sent, its op, root and name), and each DistributedOptimizer bucket records itself where
it went out. A rank that has joined repeats the training loop's last cycle of them
(_join.py) with contributions that change nothing, until every rank has joined.
"""

import collections

# At most this many calls are kept: a loop that makes more in a step is not repeated whole (the
# joined rank's calls then fail as a Mismatch).
_LIMIT = 1024

_log = collections.deque(maxlen=_LIMIT)
# True while join() repeats a cycle: what it posts is not recorded again.
_replaying = [False]


def record(kind, *args):
    """One call, as a tuple (kind, args...): see _join._replay for the kinds."""
    if not _replaying[0]:
        _log.append((kind,) + args)


def spec(tensor):
    """What a tensor's place in a call needs to be made again: its shape, dtype and device."""
    return (tuple(tensor.shape), tensor.dtype, tensor.device)


def clear():
    """Forget every call (the job's communicator changed: shutdown, an elastic reset)."""
    _log.clear()


def last_cycle(alive):
    """The loop's last cycle: as many of the latest calls as came between the latest optimizer
    step's two latest starts (its first buckets; alive(optimizer) says which count: a live one of
    the job's communicator), or from its only start to the end. None when no step was recorded."""
    log = list(_log)
    steps = [i for i, call in enumerate(log)
             if call[0] == "bucket" and call[2] == 0 and alive(call[1])]
    if not steps:
        return None
    latest = steps[-1]
    target = log[latest][1]()
    earlier = [i for i in steps[:-1] if log[i][1]() is target]
    period = latest - earlier[-1] if earlier else len(log) - latest
    return log[len(log) - period:]
