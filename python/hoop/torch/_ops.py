"""hoop.torch: Horovod's op names and the global process set (the others are in _sets).

The checks every call makes of its op and average arguments live here too.
"""

from .. import InvalidArgument, Unsupported


Average = "avg"
Sum = "sum"
Min = "min"
Max = "max"
Product = "prod"
Adasum = "adasum"


class _GlobalProcessSet:
    """Horovod's process set of all ranks."""

    def __repr__(self):
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def _op(average, op, call):
    if op is not None and average is not None:
        raise ValueError("%s: give op or average, not both" % call)
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise Unsupported("%s: Adasum is not supported by hoop (Average, Sum, Min, Max and "
                          "Product are)" % call, Unsupported.code)
    if op not in (Average, Sum, Min, Max, Product):
        raise InvalidArgument("%s: unknown op %r (hvd.Average, Sum, Min, Max or Product)"
                              % (call, op), InvalidArgument.code)
    return op
