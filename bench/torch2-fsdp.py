"""FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6) on the hoop backend, for a lent GPU
(bench/gpu-run, step 7): an MLP with every layer and the root sharded over the ranks, a few
steps of synthetic data on CUDA (or the CPU), then the parameters gathered and compared with the
same steps taken by one process on the whole batch. Prints "fsdp2 ok" or what differed; never run
on this project's CPU machines (torch 1.13 there has no FSDP2).
Usage (under hooprun): torch2-fsdp.py [--steps N]
"""
import sys

import torch
import torch.distributed as dist

import hoop.torch  # noqa: F401  (registers the backend)

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 5
dist.init_process_group("hoop")
rank, size = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
if device.type == "cuda":
    # Every rank shares the one GPU here. DeviceMesh would otherwise choose the device itself,
    # from LOCAL_RANK (cuda:1 on rank 1), unless CUDA is already initialized.
    torch.cuda.set_device(device)
    torch.cuda.init()
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 8)).to(device)


mesh = init_device_mesh(device.type, (size,))
model, reference = make(), make()
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    x, y = torch.randn(8 * size, 64, generator=g), torch.randn(8 * size, 8, generator=g)
    x, y = x.to(device), y.to(device)
    mine = slice(8 * rank, 8 * rank + 8)
    opt.zero_grad()
    loss = ((model(x[mine]) - y[mine]) ** 2).mean()
    loss.backward()  # FSDP2 averages the gradients over the ranks (reduce-scatter)
    opt.step()
    ref_opt.zero_grad()
    ((reference(x) - y) ** 2).mean().backward()
    ref_opt.step()
    losses.append(loss.item())
worst = 0.0
for p, q in zip(model.parameters(), reference.parameters()):
    full = p.full_tensor() if hasattr(p, "full_tensor") else p
    worst = max(worst, (full - q).abs().max().item())
if rank == 0:
    print("fsdp2 %s: %d ranks on %s, %d steps, losses %s, largest difference from one process "
          "%.3g" % ("ok" if worst < 1e-4 else "FAIL", size, device, steps,
                    ["%.4f" % v for v in losses], worst), flush=True)
dist.destroy_process_group()
