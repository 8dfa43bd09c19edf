"""Compressed reductions from Python (hoop(3), "Slow links"), on ranks that tell hosts apart by
HOOP_HOSTNAME (two ranks a host): the Communicator's compress setting and per-call keyword,
refusals, register() with "+feedback", hvd.Compression.int8 in DistributedOptimizer (every
replica the same bits, gradients within int8's bound of the exact average) and the torch backend's
pg_options compress. Results are checked against sums computed here in double. Prints
"compress worker: N cases, F failed"."""

import array
import os
import sys

os.environ["HOOP_HOSTNAME"] = "py-host-%d" % (int(os.environ.get("HOOP_RANK", "0")) // 2)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hoop  # noqa: E402
import hoop.torch as hvd  # noqa: E402
from tally import Tally  # noqa: E402

tally = Tally("compress worker")
check = tally.check



def values(rank, n):
    g = torch.Generator().manual_seed(1000 + rank)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * 4


hvd.init()
comm = hvd._job._live("compress_worker")  # the job's communicator, which hvd shares
comm.compress = "int8"
rank, size = comm.rank, comm.size
hosts = size // comm.local_size
check(comm.compress == "int8", "compress read back: %s" % comm.compress)
n = 5003
exact = sum(values(r, n) for r in range(size))
# The largest sum of magnitudes within 128 elements (a block's scale there, at most).
near = torch.nn.functional.max_pool1d(sum(values(r, n).abs() for r in range(size)).view(1, 1, -1),
                                      257, stride=1, padding=128).view(-1)
for fmt, step in (("int8", 0.5 / 127), ("bf16", 2 ** -8), ("fp8", 2 ** -4)):
    comm.compress = fmt
    buf = values(rank, n).float()
    comm.allreduce(buf)  # the communicator's format
    err = float(((buf.double() - exact).abs() / near.clamp(min=1e-30)).max())
    bound = (hosts + 1) * step * (1 + 2 ** -10) + (size + 2) * 2 ** -24
    check(err <= bound, "%s: off by %.3g of the magnitude, bound %.3g" % (fmt, err, bound))
    check(hosts == 1 or err > (size + 2) * 2 ** -24, "%s: the call was not compressed" % fmt)
comm.compress = None
check(comm.compress == "none", "compress cleared: %s" % comm.compress)

# One call's format; refusals name the call and the reason.
buf = values(rank, n).float()
comm.allreduce(buf, compress="int8+stochastic")
check(float(((buf.double() - exact).abs() / near).max()) <= (hosts + 1) / 127 + 1e-6,
      "int8+stochastic per call")
for bad, words in ((lambda: comm.allreduce(array.array("i", [1, 2]), compress="int8"), "int32"),
                   (lambda: comm.allreduce(buf, op="max", compress="bf16"), "max"),
                   (lambda: comm.allreduce(buf, compress="int9"), "int9"),
                   (lambda: comm.allreduce(buf, compress="int8+feedback"), "hoop_register")):
    try:
        bad()
        check(False, "no refusal for %s" % words)
    except hoop.InvalidArgument as e:
        check(words in str(e), "refusal says %s: %s" % (words, e))

# Error feedback on a registered buffer: a constant gradient's sum over 12 calls drifts less.
grad = values(rank, n).float()
drift = {}
for feedback in (True, False):
    buf = torch.empty(n)
    handle = comm.register(buf)
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(12):
        buf.copy_(grad)
        comm.allreduce(buf, compress="int8+feedback" if feedback else "int8")
        total += buf.double()
    comm.deregister(handle)
    drift[feedback] = float(((total - 12 * exact).abs() / near).max())
check(hosts == 1 or drift[True] * 4 < drift[False],
      "feedback drift %.3g, without %.3g" % (drift[True], drift[False]))

# hvd.DistributedOptimizer(compression=hvd.Compression.int8): the same bits on every replica.
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters(),
                               compression=hvd.Compression.int8)
torch.manual_seed(50 + rank)
for _ in range(4):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(torch.randn(16, 40)), torch.randn(16, 5))
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(flat.unsqueeze(0))
check(all(torch.equal(gathered[0], gathered[i]) for i in range(size)),
      "DistributedOptimizer with Compression.int8: replicas differ")
t = values(rank, n).float()
out = hvd.allreduce(t, op=hvd.Sum, compression=hvd.Compression.int8)
check(float(((out.double() - exact).abs() / near).max()) <= (hosts + 1) * 0.5 / 127 * 1.001,
      "hvd.allreduce with Compression.int8")

# The torch backend's pg_options (the group shares the job's communicator with hvd).
from hoop.torch import ProcessGroupHoop  # noqa: E402
dist.init_process_group("hoop", pg_options=ProcessGroupHoop.Options(compress="int8"))
t = values(rank, n).float()
dist.all_reduce(t)
err = float(((t.double() - exact).abs() / near).max())
check(err <= (hosts + 1) * 0.5 / 127 * 1.001 and (hosts == 1 or err > 1e-6),
      "torch backend with compress int8: off by %.3g" % err)
dist.destroy_process_group()
sys.exit(tally.finish())
