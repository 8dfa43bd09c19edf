"""hoop.torch: the calls this process made on the job's communicator, latest last, for join().

Each collective of hoop.torch's Horovod API records what it posted (its kind, the shapes and
dtypes it sent, its op, root and name), and each DistributedOptimizer bucket records itself where
it went out. A rank that has joined repeats the training loop's last cycle of them
(_join.py) with contributions that change nothing, until every rank has joined.
"""

# At most this many calls are kept: a cycle longer than that is not repeated whole.
_LIMIT = 256

_log = []
# True while join() repeats a cycle: what it posts is not recorded again.
_replaying = [False]


def record(kind, *args):
    """One call, as a tuple (kind, args...): see _join._replay for the kinds."""
    if not _replaying[0]:
        _log.append((kind,) + args)
        del _log[:-_LIMIT]


def spec(tensor):
    """What a tensor's place in a call needs to be made again: its shape, dtype and device."""
    return (tuple(tensor.shape), tensor.dtype, tensor.device)


def clear():
    """Forget every call (the job's communicator changed: shutdown, an elastic reset)."""
    del _log[:]


def last_cycle(alive):
    """The loop's last cycle: as many of the latest calls as came between the latest optimizer
    step's two latest starts (its first buckets; alive(optimizer) says which count: a live one of
    the job's communicator), or from its only start to the end. None when no step was recorded."""
    steps = [i for i, call in enumerate(_log)
             if call[0] == "bucket" and call[2] == 0 and alive(call[1])]
    if not steps:
        return None
    latest = steps[-1]
    target = _log[latest][1]()
    earlier = [i for i in steps[:-1] if _log[i][1]() is target]
    period = latest - earlier[-1] if earlier else len(_log) - latest
    return _log[len(_log) - period:]
