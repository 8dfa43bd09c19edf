"""One rank of the gradients-through-collectives check (tests/test_torch.sh, 1 to 4 ranks): each
differentiable hoop.torch collective, on float64 random inputs that differ per rank, with a loss on
each rank that weighs the output by random weights of that rank's own; the input's gradient is
compared with the one computed here, in this process, from every rank's weights (each rank makes
every rank's inputs and weights from the same seeds). Horovod's rules: allreduce's gradient is the
ranks' output gradients reduced with the same op (for Average, the mean: the gradient of the ranks'
summed loss); allgather's and broadcast's are the ranks' output gradients averaged (this rank's
rows; the root only); alltoall's, the output gradient's rows sent back; reducescatter's, every
rank's output gradient gathered (divided by the rank count for Average).

Each case prints "PASS <case>: ..." or "FAIL <case>: ..."; the last line counts them.
"""

import sys
import zlib

import torch

import hoop.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
failed, cases = [], 0


def randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def report(case, got, want):
    global cases
    cases += 1
    ok = got is not None and got.shape == want.shape and torch.allclose(got, want, rtol=1e-12,
                                                                         atol=1e-12)
    print("%s %s: rank %d%s" % ("PASS" if ok else "FAIL", case, rank,
                                "" if ok else ": got %s, want %s" % (got, want)), flush=True)
    if not ok:
        failed.append(case)


def weights(case, r, shape):
    return randn(1000 * (zlib.crc32(case.encode()) % 997) + 10 * r + 7, *shape)  # alike everywhere


def run(case, x, call, out_shape_of):
    """Backward of sum(w_rank * call(x)); returns x.grad."""
    x = x.clone().requires_grad_(True)
    out = call(x)
    if out.grad_fn is None:
        return None
    (weights(case, rank, out_shape_of(rank)) * out).sum().backward()
    return x.grad


rows = [r + 2 for r in range(size)]  # uneven first dimensions
inputs = [randn(r + 1, rows[r], 3) for r in range(size)]

# allreduce, Sum and Average (and scaled): every rank's output has one shape.
for op, name in ((hvd.Sum, "allreduce-sum"), (hvd.Average, "allreduce-avg")):
    x = randn(50 + rank, 4, 3)
    got = run(name, x, lambda t: hvd.allreduce(t, op=op), lambda r: (4, 3))
    ws = sum(weights(name, r, (4, 3)) for r in range(size))
    report(name, got, ws if op == hvd.Sum else ws / size)
got = run("allreduce-scaled", randn(60 + rank, 5),
          lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
          lambda r: (5,))
report("allreduce-scaled", got, 1.5 * sum(weights("allreduce-scaled", r, (5,))
                                          for r in range(size)))

# allgather: this rank's rows of the averaged output gradient.
total = sum(rows)
got = run("allgather", inputs[rank], hvd.allgather, lambda r: (total, 3))
mean = sum(weights("allgather", r, (total, 3)) for r in range(size)) / size
report("allgather", got, mean[sum(rows[:rank]):sum(rows[:rank + 1])])

# broadcast from the last rank: the averaged gradient there, zero elsewhere.
root = size - 1
got = run("broadcast", randn(70 + rank, 2, 3), lambda t: hvd.broadcast(t, root), lambda r: (2, 3))
mean = sum(weights("broadcast", r, (2, 3)) for r in range(size)) / size
report("broadcast", got, mean if rank == root else torch.zeros(2, 3, dtype=torch.float64))

# alltoall with uneven splits: rank r sends (r + q) % 3 rows to rank q.
splits = [[(r + q) % 3 for q in range(size)] for r in range(size)]
recv = [sum(splits[r][q] for r in range(size)) for q in range(size)]
x = randn(80 + rank, sum(splits[rank]), 2)
got = run("alltoall", x, lambda t: hvd.alltoall(t, torch.tensor(splits[rank]))[0],
          lambda r: (recv[r], 2))
want = []
for q in range(size):  # the rows rank sent q sit in q's output after those of lower ranks
    start = sum(splits[r][q] for r in range(rank))
    want.append(weights("alltoall", q, (recv[q], 2))[start:start + splits[rank][q]])
report("alltoall", got, torch.cat(want))

# reducescatter of 2 * size + 1 rows: rank q gets the q-th share, the first (rows % size) one more.
n = 2 * size + 1
share = [n // size + (1 if q < n % size else 0) for q in range(size)]
for op, name in ((hvd.Sum, "reducescatter-sum"), (hvd.Average, "reducescatter-avg")):
    got = run(name, randn(90 + rank, n, 2), lambda t: hvd.reducescatter(t, op=op),
              lambda r: (share[r], 2))
    want = torch.cat([weights(name, q, (share[q], 2)) for q in range(size)])
    report(name, got, want if op == hvd.Sum else want / size)

# Without requires_grad, and in place or asynchronous, nothing is recorded (as in Horovod).
plain = hvd.allreduce(randn(5, 3))
inplace = hvd.allreduce_(randn(5, 3).requires_grad_(True).clone())
cases += 1
recorded = [type(t.grad_fn).__name__ for t in (plain, inplace) if t.grad_fn is not None]
if plain.grad_fn is not None or any("Allreduce" in n for n in recorded):
    failed.append("unrecorded")
    print("FAIL unrecorded: rank %d: %s %s" % (rank, plain.grad_fn, inplace.grad_fn), flush=True)
else:
    print("PASS unrecorded: rank %d" % rank, flush=True)

print("autograd worker: %d cases, %d failed%s" % (cases, len(failed),
                                                   (" (" + ", ".join(failed) + ")") if failed
                                                   else ""), flush=True)
hvd.shutdown()
sys.exit(1 if failed else 0)
