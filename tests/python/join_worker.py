"""hvd.join() with uneven inputs (python/hoop/torch/_join.py): rank r trains 3 + r % 3 steps of a
model with an hvd.SyncBatchNorm and a layer shared between the ranks (an allreduce with autograd,
whose backward comes between the DistributedOptimizer's two buckets), in a loop that makes,
besides the optimizer's step and those layers' allreduces, an allreduce before backward (Sum) and,
after the step, allreduces with Max, Min, Product and Average, a grouped allreduce, an allgather
with uneven first dimensions, a reducescatter, an alltoall with splits and a broadcast from the
rank that trains longest. A rank that has joined repeats the loop's calls with contributions that
change nothing, so each result on the ranks still training equals a reference computed here over
the ranks still training alone (Average still divides by every rank, as Horovod's does); join()
returns the rank that joined last, whose parameters, broadcast, equal the reference's.

With "irregular", the loop makes one call only every other step: a joined rank's cycle then
differs from the others' next step, and every rank fails (hoop.Mismatch or another HoopError)
instead of mixing results.

Prints "join worker: N cases, F failed"."""

import sys

import torch

import hoop
import hoop.torch as hvd
from tally import Tally

hvd.init()
rank, size = hvd.rank(), hvd.size()
tally = Tally("join worker")
check = tally.check



STEPS = [3 + r % 3 for r in range(size)]
ROOT = max(range(size), key=lambda r: (STEPS[r], -r))  # trains longest: joins last
LR = 0.1


def batch(r, s):
    """Rank r's inputs at step s: random floats, so that a wrong order or a missing term shows."""
    g = torch.Generator().manual_seed(1000 * r + s)
    return {"x": torch.randn(5, 6, generator=g), "y": torch.randn(5, 2, generator=g),
            "z": torch.randn(2 * size + 1, 3, generator=g),
            "send": torch.randn(size + r, 2, generator=g),
            "a": torch.randn(7, generator=g), "b": torch.randn(2, 3, generator=g)}


def splits(r):
    """How many of rank r's alltoall rows go to each rank (r + size rows in all)."""
    out = [1] * size
    out[r % size] += r
    return out


class Net(torch.nn.Module):
    """The trained model, with hvd.SyncBatchNorm and the ranks' hidden layers averaged into each
    one's (an allreduce with autograd); the reference's with torch's BatchNorm1d, which the
    reference runs on the batches of all the ranks still training at once (reference())."""

    def __init__(self, sync=True):
        super().__init__()
        torch.manual_seed(3)
        self.first = torch.nn.Linear(6, 4)
        self.norm = hvd.SyncBatchNorm(4) if sync else torch.nn.BatchNorm1d(4)
        self.last = torch.nn.Linear(4, 2)

    def hidden(self, x):
        return torch.tanh(self.norm(self.first(x)))

    def forward(self, x):
        h = self.hidden(x)
        return self.last(hvd.allreduce(h, name="shared") + h)


def close(got, want, what, tol=1e-5):
    ok = got.shape == want.shape and torch.allclose(got, want, rtol=tol, atol=tol)
    check(ok, "%s: %s, not %s" % (what, got.flatten()[:4].tolist(), want.flatten()[:4].tolist()))


def reference():
    """Every step's results over the ranks still training, and the final parameters."""
    model = Net(sync=False)
    results = []
    for s in range(max(STEPS)):
        active = [r for r in range(size) if s < STEPS[r]]
        batches = {r: batch(r, s) for r in active}
        center = sum(batches[r]["x"].mean(0) for r in active)
        # One batch of every rank still training: the normalization's statistics over them all,
        # and the gradient of their losses' sum over every rank (DistributedOptimizer's average).
        h = model.hidden(torch.cat([batches[r]["x"] - center / size for r in active]))
        hs = {r: h[5 * i:5 * i + 5] for i, r in enumerate(active)}
        shared = sum(hs.values()) / size
        losses = {r: (model.last(shared + hs[r]) - batches[r]["y"]).pow(2).mean() for r in active}
        model.zero_grad()
        (sum(losses.values()) / size).backward()
        losses = {r: v.detach() for r, v in losses.items()}
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
        rs = sum(batches[r]["z"] for r in active)
        counts = [rs.shape[0] // size + (1 if q < rs.shape[0] % size else 0) for q in range(size)]
        starts = [sum(counts[:q]) for q in range(size)]
        results.append({
            "center": center,
            "worst": max(losses.values()), "least": min(losses.values()),
            "product": torch.stack([1 + v for v in losses.values()]).prod(),
            "mean": sum(losses.values()) / size,
            "group": [sum(batches[r]["a"] for r in active) / size,
                      sum(batches[r]["b"] for r in active) / size],
            "rows": torch.cat([batches[r]["x"][:1 + r] for r in active]),
            "scatter": [rs[starts[q]:starts[q] + counts[q]] for q in range(size)],
            "alltoall": [torch.cat([batches[r]["send"][sum(splits(r)[:q]):
                                                       sum(splits(r)[:q + 1])]
                                    for r in active]) for q in range(size)],
            "root": batches[ROOT]["b"] if ROOT in active else None,
            "losses": losses})
    return results, [p.detach().clone() for p in model.parameters()]


irregular = len(sys.argv) > 1 and sys.argv[1] == "irregular"
model = Net()
# Two buckets: the last layer's gradients (ready first) go before the shared layer's backward, the
# others after it.
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                               named_parameters=model.named_parameters(),
                               groups=[list(model.last.parameters()),
                                       list(model.first.parameters()) +
                                       list(model.norm.parameters())])
want, final = reference()
try:
    for s in range(STEPS[rank]):
        b = batch(rank, s)
        center = hvd.allreduce(b["x"].mean(0), name="center", op=hvd.Sum)
        loss = (model(b["x"] - center / size) - b["y"]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        got = {"center": center,
               "worst": hvd.allreduce(loss.detach(), name="worst", op=hvd.Max),
               "least": hvd.allreduce(loss.detach(), name="least", op=hvd.Min),
               "product": hvd.allreduce(1 + loss.detach(), name="product", op=hvd.Product),
               "mean": hvd.allreduce(loss.detach(), name="mean"),
               "group": hvd.grouped_allreduce([b["a"], b["b"]], name="group"),
               "rows": hvd.allgather(b["x"][:1 + rank], name="rows"),
               "scatter": hvd.reducescatter(b["z"], name="scatter", op=hvd.Sum),
               "alltoall": hvd.alltoall(b["send"], splits(rank), name="alltoall")[0],
               "root": hvd.broadcast(b["b"], ROOT, name="root")}
        if irregular and s % 2 == 1:
            hvd.allreduce(torch.ones(3), name="every other step")
        w = want[s]
        close(loss.detach(), w["losses"][rank], "step %d: this rank's loss" % s)
        for key in ("center", "worst", "least", "product", "mean", "rows", "root"):
            close(got[key], w[key], "step %d: %s" % (s, key))
        for i in range(2):
            close(got["group"][i], w["group"][i], "step %d: grouped allreduce %d" % (s, i))
        close(got["scatter"], w["scatter"][rank], "step %d: reducescatter" % s)
        close(got["alltoall"], w["alltoall"][rank], "step %d: alltoall" % s)
    last = hvd.join()
    check(not irregular, "join() returned %d in a loop whose calls change from step to step" % last)
    check(last == ROOT, "join() returned %d, not %d (the rank that trains longest)" % (last, ROOT))
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    for i, (p, f) in enumerate(zip(model.parameters(), final)):
        close(p.detach(), f, "parameter %d after join and a broadcast from rank %d" % (i, last))
except hoop.HoopError as err:
    check(irregular and size > 1 and min(STEPS) < max(STEPS),
          "%s: %s" % (type(err).__name__, err))
    if irregular:
        print("join worker rank %d: irregular loop refused: %s: %s"
              % (rank, type(err).__name__, str(err)[:160]), flush=True)
hvd.shutdown()
sys.exit(tally.finish())
