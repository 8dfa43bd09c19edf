"""Fashion-MNIST with the parameters sharded across ranks: ZeRO-3's pattern written out in plain
torch.distributed, on backend hoop or gloo.

    hooprun -np 4 /usr/bin/python3 examples/torch/sharded_mnist.py --backend hoop
    hooprun -np 4 /usr/bin/python3 examples/torch/sharded_mnist.py --backend gloo

Every rank keeps only its shard of the flat parameter vector and of the optimizer's momentum. Each
step it gathers the whole vector from the shards (all_gather_into_tensor), runs forward and
backward on its slice of the global batch, and reduce-scatters the flat gradient so that it gets
the sum for its own shard only (reduce_scatter_tensor), then steps its shard. Torch 1.13's gloo has
neither: there the program does what gloo's users do, all_gather into a list of the shards, and an
all_reduce of the whole gradient then its own block (twice the bytes), and says so.

The global batch at step k is the same samples whatever the number of ranks (rank r takes its
slice of them), so a run on 4 ranks ends with the parameters of a run on 1 (--save writes them).
"""

import argparse
import os
import sys
import time

import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--backend", default="hoop", help="hoop (default), gloo, or any other")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--global-batch", type=int, default=256, help="split evenly among the ranks")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--hidden", type=int, default=512)
parser.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--data", help="the IDX files' directory (default: Debian's)")
parser.add_argument("--compress", help="hoop only: the gradients' reduce-scatter in this wire "
                    "format between hosts (int8, int8+feedback, bf16, fp8: hoop(3), \"Slow links\")")
parser.add_argument("--fp16", action="store_true",
                    help="cast the gradient to float16 for its reduce-scatter (Horovod's way)")
parser.add_argument("--save", help="rank 0 writes the final parameters here (torch.save)")
args = parser.parse_args()

if args.backend == "hoop":
    import hoop.torch  # noqa: F401  (registers the backend)
warnings.filterwarnings("ignore", message=".*_reduce_scatter_base is a private function")
dist.init_process_group(args.backend)
if args.compress and args.backend != "hoop":
    sys.exit("--compress is hoop's (backend hoop)")
rank, size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
if args.global_batch % size:
    sys.exit("--global-batch %d does not divide among %d ranks" % (args.global_batch, size))
local_batch = args.global_batch // size
reduce_scatter = hasattr(dist, "_reduce_scatter_base") and args.backend != "gloo"
if rank == 0 and not reduce_scatter:
    print("%s: no reduce_scatter_tensor here; gradients go by all_reduce of the whole vector"
          % args.backend, flush=True)

x, y = fashion_mnist.load("train", args.data)
torch.manual_seed(args.seed)
model = fashion_mnist.model(args.hidden)
params = list(model.parameters())
numel = sum(p.numel() for p in params)
shard = (numel + size - 1) // size  # the padded vector divides into size shards
flat = torch.zeros(shard * size)
flat[:numel] = torch.nn.utils.parameters_to_vector(params).detach()
# The model's parameters become views of the gathered vector; this rank keeps its shard.
at = 0
for p in params:
    p.data = flat[at:at + p.numel()].view_as(p)
    at += p.numel()
mine = flat[rank * shard:(rank + 1) * shard].clone()
momentum = torch.zeros(shard)
grad_flat = torch.zeros(shard * size)
grad_mine = torch.zeros(shard)
grad_group = None
if args.compress:
    # The gradients' own group, whose communicator sends its reductions compressed between hosts;
    # with +feedback, what one step's encoding dropped goes into the next (kept with grad_flat's
    # registration).
    grad_group = dist.new_group(list(range(size)), pg_options=hoop.torch.ProcessGroupHoop.Options(
        compress=args.compress))
    grad_group.register(grad_flat)
if args.fp16:
    grad_wire, grad_wire_mine = grad_flat.half(), grad_mine.half()


shards = list(flat.split(shard))  # views: an all_gather into them fills flat


def gather_parameters():
    if args.backend == "gloo":  # 1.13's gloo has no all_gather_into_tensor
        dist.all_gather(shards, mine)
    elif hasattr(dist, "all_gather_into_tensor"):
        dist.all_gather_into_tensor(flat, mine)
    else:  # torch 1.13
        dist._all_gather_base(flat, mine)


def scatter_gradient():
    at = 0
    for p in params:
        grad_flat[at:at + p.numel()] = p.grad.reshape(-1)
        at += p.numel()
    into, what = (grad_wire_mine, grad_wire) if args.fp16 else (grad_mine, grad_flat)
    if args.fp16:
        grad_wire.copy_(grad_flat)
    if reduce_scatter and hasattr(dist, "reduce_scatter_tensor"):
        dist.reduce_scatter_tensor(into, what, group=grad_group)
    elif reduce_scatter:  # torch 1.13's name
        dist._reduce_scatter_base(into, what, group=grad_group)
    else:
        dist.all_reduce(what)
        into.copy_(what[rank * shard:(rank + 1) * shard])
    if args.fp16:
        grad_mine.copy_(grad_wire_mine)
    grad_mine.div_(size)


steps_per_epoch = len(x) // args.global_batch
for epoch in range(1, args.epochs + 1):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed + epoch))
    start, total, steps = time.perf_counter(), 0.0, 0
    for step in range(steps_per_epoch):
        batch = order[step * args.global_batch:(step + 1) * args.global_batch]
        batch = batch[rank * local_batch:(rank + 1) * local_batch]
        gather_parameters()
        for p in params:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        scatter_gradient()
        momentum.mul_(0.9).add_(grad_mine)  # SGD with momentum on this rank's shard
        mine.sub_(args.lr * momentum)
        mean = loss.detach().reshape(1) / size
        dist.all_reduce(mean)
        total += mean.item()
        steps += 1
        if args.steps and steps >= args.steps:
            break
    elapsed = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("epoch %d loss %.4f" % (epoch, total / max(1, steps)), flush=True)
        print("epoch %d: %s, %d ranks, %d steps, %.2f s (%.2f ms/step)"
              % (epoch, args.backend, size, steps, elapsed.item(),
                 1e3 * elapsed.item() / max(1, steps)), flush=True)

gather_parameters()
if rank == 0 and args.save:
    torch.save(flat[:numel].clone(), args.save)
dist.destroy_process_group()
