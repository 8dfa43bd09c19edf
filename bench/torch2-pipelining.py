"""torch.distributed.pipelining (torch >= 2.4) on the hoop backend, for a lent GPU (bench/gpu-run,
step 7): an MLP split into one stage per rank by pipeline(), a GPipe schedule of 4 micro-batches,
a few steps; the last stage's losses are compared with one process running the whole model on the
same data. Prints "pipelining ok" or what differed; never run on this project's CPU machines.
Usage (under hooprun, 2 ranks): torch2-pipelining.py [--steps N]
"""
import sys

import torch
import torch.distributed as dist

import hoop.torch  # noqa: F401  (registers the backend)

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
dist.init_process_group("hoop")
rank, size = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(2 * size))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


micro, n_micro = 4, 4
model, reference = MLP().to(device), MLP().to(device)
split = {"layers.%d" % (2 * s): SplitPoint.BEGINNING for s in range(1, size)}
pipe = pipeline(model, mb_args=(torch.randn(micro, 32, device=device),), split_spec=split)
stage = pipe.build_stage(rank, device)


def loss_fn(out, target):
    return ((out - target) ** 2).mean()


schedule = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=loss_fn)
opt = torch.optim.SGD(stage.submod.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
ours, theirs = [], []
for step in range(steps):
    x = torch.randn(micro * n_micro, 32, generator=g).to(device)
    y = torch.randn(micro * n_micro, 32, generator=g).to(device)
    opt.zero_grad()
    if rank == 0:
        schedule.step(x)
    elif rank == size - 1:
        losses = []
        schedule.step(target=y, losses=losses)
        ours.append(sum(v.item() for v in losses) / len(losses))
    else:
        schedule.step()
    opt.step()
    theirs.append(sum(loss_fn(reference(x[m * micro:(m + 1) * micro]),
                              y[m * micro:(m + 1) * micro]).item() for m in range(n_micro)) / n_micro)
    with torch.no_grad():  # the reference takes the same step on the whole batch
        reference.zero_grad()
    sum(loss_fn(reference(x[m * micro:(m + 1) * micro]), y[m * micro:(m + 1) * micro])
        for m in range(n_micro)).div(n_micro).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.05 * p.grad
if rank == size - 1:
    worst = max(abs(a - b) for a, b in zip(ours, theirs))
    print("pipelining %s: %d stages on %s, losses %s, one process %s (largest difference %.3g)"
          % ("ok" if worst < 1e-4 else "FAIL", size, device, ["%.5f" % v for v in ours],
             ["%.5f" % v for v in theirs], worst), flush=True)
dist.destroy_process_group()
