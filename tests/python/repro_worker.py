"""Reproducible mode from Python (tests/test_torch.sh): hoop.Communicator(reproducible=True), the
torch backend under torch.use_deterministic_algorithms(True), and hoop.torch (hvd) on the same
job. Each rank makes every rank's input itself (floats of mixed signs over 2^-12..2^12, whose sums
round differently in every order) and compares the result bit for bit with the fixed tree of
hoop(3), computed here in torch: with p the largest power of two <= the rank count, the first
2(n - p) ranks paired, then adjacent pairs of the p leaves, lower ranks on the left; float32
steps for float32, bfloat16 and float16 (those rounded back at every step), float64 for float64;
Average the sum divided once.

usage: repro_worker.py comm|torch    each a job of its own (a process joins its job once): comm
runs hoop.Communicator's calls, torch the backend's and then hvd's; prints "repro worker: N
cases, F failed" on every rank.
"""

import sys

import numpy
import torch
import torch.distributed as dist

import hoop
import hoop.torch as hvd  # registers the "hoop" backend too

failures = []
cases = 0


def check(what, got, want):
    global cases
    cases += 1
    a = got.contiguous().view(torch.uint8) if got.dtype != torch.uint8 else got
    b = want.contiguous().view(torch.uint8)
    if not torch.equal(a, b):
        diff = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
        first = int(diff[0][0]) if len(diff) else -1
        failures.append("%s: %d elements differ from the tree, the first %d: %r against %r"
                        % (what, len(diff), first, got[first].item(), want[first].item()))


def value(rank, count, dtype, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    mant = torch.rand(count, generator=g, dtype=torch.float64) + 1
    exp = torch.randint(-12, 13, (count,), generator=g).to(torch.float64)
    sign = torch.randint(0, 2, (count,), generator=g).to(torch.float64) * 2 - 1
    return (sign * mant * torch.pow(2.0, exp)).to(dtype)


def tree(parts, dtype):
    """hoop(3)'s tree: with p the largest power of two <= n, the first 2(n - p) ranks paired, then
    adjacent pairs of the p leaves, and so on, lower ranks on the left; each step in float32 (or
    float64) and, for the 16-bit types, rounded back to them."""
    def op(a, b):
        return (a + b).to(dtype).to(a.dtype)
    n = len(parts)
    p = 1
    while p * 2 <= n:
        p *= 2
    rem = n - p
    leaves = [op(parts[2 * v], parts[2 * v + 1]) if v < rem else parts[v + rem] for v in range(p)]
    width = 1
    while width < p:
        for v in range(0, p, 2 * width):
            leaves[v] = op(leaves[v], leaves[v + width])
        width *= 2
    return leaves[0]


def expected(size, count, dtype, seed, average=False):
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    total = tree([value(r, count, dtype, seed).to(wide) for r in range(size)], dtype)
    if average:
        total = total / size
    return total.to(dtype)


def communicator():
    comm = hoop.Communicator(reproducible=True)
    rank, size = comm.rank, comm.size
    if not comm.reproducible:
        failures.append("Communicator(reproducible=True).reproducible is False")
    # The Communicator's own calls, on numpy buffers (float32 and float64), sizes on both sides of
    # the small calls' cut-over.
    seed = 1
    for dtype, npdtype in ((torch.float32, numpy.float32), (torch.float64, numpy.float64)):
        for count in (5, 3001, 40001):
            send = value(rank, count, dtype, seed).numpy()
            out = numpy.empty_like(send)
            comm.allreduce(send, out)
            check("Communicator.allreduce %s %d" % (dtype, count), torch.from_numpy(out),
                  expected(size, count, dtype, seed))
            many = [send[: count // 3].copy(), send[count // 3:].copy()]
            comm.allreduce_many(many)
            check("Communicator.allreduce_many %s %d" % (dtype, count),
                  torch.from_numpy(numpy.concatenate(many)), expected(size, count, dtype, seed))
            seed += 1
    comm.reproducible = False
    if comm.reproducible:
        failures.append("Communicator.reproducible = False did not turn it off")
    comm.finalize()
    return rank


def torch_apis():
    # torch.distributed: the mode on by itself under deterministic algorithms.
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("hoop")
    rank, size = dist.get_rank(), dist.get_world_size()
    seed = 100
    group = dist.distributed_c10d._get_default_group()
    if not getattr(group, "reproducible", False):
        failures.append("the hoop backend's default group is not reproducible under "
                        "torch.use_deterministic_algorithms(True)")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for count in (7, 20001):
            t = value(rank, count, dtype, seed)
            dist.all_reduce(t)
            check("dist.all_reduce %s %d" % (dtype, count), t, expected(size, count, dtype, seed))
            t = value(rank, count, dtype, seed)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            check("dist.all_reduce AVG %s %d" % (dtype, count), t,
                  expected(size, count, dtype, seed, average=True))
            seed += 1

    # The backend's option (pg_options) sets the mode of a group either way, over the flag.
    from hoop.torch import ProcessGroupHoop
    off = dist.new_group(list(range(size)), pg_options=ProcessGroupHoop.Options(reproducible=False))
    if getattr(off, "reproducible", True):
        failures.append("new_group(pg_options=Options(reproducible=False)) is reproducible")
    torch.use_deterministic_algorithms(False)
    on = dist.new_group(list(range(size)), pg_options={"reproducible": True})
    if not getattr(on, "reproducible", False):
        failures.append("new_group(pg_options={'reproducible': True}) is not reproducible")
    for dtype in (torch.float32, torch.float16):
        t = value(rank, 3001, dtype, seed)
        dist.all_reduce(t, group=on)
        check("dist.all_reduce over pg_options' group %s" % dtype, t,
              expected(size, 3001, dtype, seed))
        seed += 1
    for bad in (ProcessGroupHoop.Options(reproducible="yes"), {"reproducable": True}, 3):
        try:
            dist.new_group(list(range(size)), pg_options=bad)
            failures.append("new_group(pg_options=%r) did not fail" % (bad,))
        except TypeError as err:
            if "pg_options" not in str(err):
                failures.append("new_group(pg_options=%r): %s" % (bad, err))

    # Horovod's API on the same job.
    hvd.init()
    for dtype in (torch.float32, torch.bfloat16):
        t = value(rank, 9001, dtype, seed)
        check("hvd.allreduce Sum %s" % dtype, hvd.allreduce(t, op=hvd.Sum),
              expected(size, 9001, dtype, seed))
        check("hvd.allreduce Average %s" % dtype, hvd.allreduce(t),
              expected(size, 9001, dtype, seed, average=True))
        seed += 1
    return rank


def main():
    rank = communicator() if sys.argv[1:] == ["comm"] else torch_apis()
    print("repro worker: %d cases, %d failed" % (cases, len(failures)))
    for failure in failures[:5]:
        print("FAIL rank %d: %s" % (rank, failure))
    sys.exit(1 if failures else 0)


main()
