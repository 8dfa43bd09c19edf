"""Fashion-MNIST with torch.distributed by hand: the same program on backend gloo or hoop.

    hooprun -np 4 /usr/bin/python3 examples/torch/dist_mnist.py --backend hoop
    hooprun -np 4 /usr/bin/python3 examples/torch/dist_mnist.py --backend gloo

After loss.backward() every rank sums each parameter's gradient over the ranks with
dist.all_reduce and divides by the number of ranks, then steps; each rank prints its loss for the
epoch. hooprun gives the ranks what init_process_group needs (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), as torchrun would: the program itself is plain torch.distributed.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--backend", default="hoop", help="hoop (default), gloo, or any other")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=64, help="per rank")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--hidden", type=int, default=256)
parser.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps")
parser.add_argument("--train-limit", type=int, default=0, help="use only the first N images")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--data", help="the IDX files' directory (default: Debian's)")
args = parser.parse_args()

if args.backend == "hoop":
    import hoop.torch  # noqa: F401  (registers the backend)
dist.init_process_group(args.backend)
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

x, y = fashion_mnist.load("train", args.data)
if args.train_limit:
    x, y = x[:args.train_limit], y[:args.train_limit]
train = TensorDataset(x, y)
sampler = DistributedSampler(train, num_replicas=size, rank=rank, seed=args.seed)
loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

model = fashion_mnist.model(args.hidden)
for p in model.parameters():  # every rank starts from rank 0's parameters
    dist.broadcast(p.data, src=0)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

for epoch in range(1, args.epochs + 1):
    sampler.set_epoch(epoch)
    start, total, batches = time.perf_counter(), 0.0, 0
    for data, target in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad.data, op=dist.ReduceOp.SUM)
            p.grad.data /= size
        optimizer.step()
        total += loss.item()
        batches += 1
        if args.steps and batches >= args.steps:
            break
    elapsed = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    print("rank %d epoch %d loss %.4f" % (rank, epoch, total / max(1, batches)), flush=True)
    dist.barrier()
    if rank == 0:
        print("epoch %d: %s, %d ranks, %d steps, %.2f s (%.2f ms/step)"
              % (epoch, args.backend, size, batches, elapsed.item(),
                 1e3 * elapsed.item() / max(1, batches)), flush=True)

dist.destroy_process_group()
