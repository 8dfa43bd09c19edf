"""Fashion-MNIST through a pipeline of stages, one per rank, passing micro-batches with
torch.distributed's send and recv (a GPipe schedule), on backend hoop or gloo.

    hooprun -np 3 /usr/bin/python3 examples/torch/pipeline_mnist.py --backend hoop
    hooprun -np 3 /usr/bin/python3 examples/torch/pipeline_mnist.py --backend gloo

The classifier's layers are cut into as many stages as there are ranks, each stage with as many of
its Linear layers as the others (give or take one); --linear makes the classifier deeper, and is
at least the number of stages (its default). Each step, every
micro-batch goes forward stage by stage (activations sent to the next rank), then backward in
reverse (gradients sent to the previous rank); each stage accumulates its gradients over the
micro-batches and steps its own layers. On one rank it is plain gradient accumulation, so a run on
several ranks ends with the parameters of a run on one (--save writes them, gathered on rank 0).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--backend", default="hoop", help="hoop (default), gloo, or any other")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch", type=int, default=128, help="samples per step")
parser.add_argument("--micro", type=int, default=4, help="micro-batches per step")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--hidden", type=int, default=512)
parser.add_argument("--linear", type=int, default=0,
                    help="Linear layers in the classifier (default: 3, or one per stage if more)")
parser.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--data", help="the IDX files' directory (default: Debian's)")
parser.add_argument("--save", help="rank 0 writes the final parameters here (torch.save)")
args = parser.parse_args()

if args.backend == "hoop":
    import hoop.torch  # noqa: F401  (registers the backend)
dist.init_process_group(args.backend)
rank, size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
if args.batch % args.micro:
    sys.exit("--batch %d does not divide into %d micro-batches" % (args.batch, args.micro))
micro = args.batch // args.micro

x, y = fashion_mnist.load("train", args.data)
torch.manual_seed(args.seed)
linear = args.linear or max(3, size)
if size > linear:
    sys.exit("%d stages for a classifier of %d Linear layers: give --linear %d or more"
             % (size, linear, size))
layers = list(fashion_mnist.model(args.hidden, linear))
# Stage s holds layers [cut[s], cut[s + 1]): it starts at a Linear layer (the first stage at the
# input) and takes the layers without parameters after its last. The shapes between stages come
# from a dry run.
weighted = [i for i, layer in enumerate(layers) if any(True for _ in layer.parameters())]
cut = [0] + [weighted[round(s * len(weighted) / size)] for s in range(1, size)] + [len(layers)]
shapes, h = [], torch.zeros(micro, 1, 28, 28)
with torch.no_grad():
    for s in range(size):
        shapes.append(tuple(h.shape))
        h = torch.nn.Sequential(*layers[cut[s]:cut[s + 1]])(h)
stage = torch.nn.Sequential(*layers[cut[rank]:cut[rank + 1]])
optimizer = torch.optim.SGD(stage.parameters(), lr=args.lr, momentum=0.9)
first, last = rank == 0, rank == size - 1

steps_per_epoch = len(x) // args.batch
for epoch in range(1, args.epochs + 1):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed + epoch))
    start, total, steps = time.perf_counter(), 0.0, 0
    for step in range(steps_per_epoch):
        batch = order[step * args.batch:(step + 1) * args.batch]
        optimizer.zero_grad()
        kept, loss_sum = [], 0.0
        for m in range(args.micro):  # forward, micro-batch by micro-batch
            part = batch[m * micro:(m + 1) * micro]
            if first:
                inp = x[part]
            else:
                inp = torch.empty(shapes[rank])
                dist.recv(inp, src=rank - 1)
                inp.requires_grad_()
            out = stage(inp)
            if last:
                loss = torch.nn.functional.cross_entropy(out, y[part]) / args.micro
                loss_sum += loss.item()
                kept.append((inp, loss))
            else:
                dist.send(out.detach(), dst=rank + 1)
                kept.append((inp, out))
        for inp, out in reversed(kept):  # backward, in reverse
            if last:
                out.backward()
            else:
                grad = torch.empty(out.shape)
                dist.recv(grad, src=rank + 1)
                out.backward(grad)
            if not first:
                dist.send(inp.grad, dst=rank - 1)
        optimizer.step()
        loss_t = torch.tensor([loss_sum])
        dist.all_reduce(loss_t)  # only the last stage's is not zero
        total += loss_t.item()
        steps += 1
        if args.steps and steps >= args.steps:
            break
    elapsed = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("epoch %d loss %.4f" % (epoch, total / max(1, steps)), flush=True)
        print("epoch %d: %s, %d stages, %d micro-batches, %d steps, %.2f s (%.2f ms/step)"
              % (epoch, args.backend, size, args.micro, steps, elapsed.item(),
                 1e3 * elapsed.item() / max(1, steps)), flush=True)

# Every stage's parameters to rank 0, in layer order.
mine = torch.nn.utils.parameters_to_vector(stage.parameters()).detach() \
    if any(True for _ in stage.parameters()) else torch.zeros(0)
if rank == 0:
    parts = [mine]
    for s in range(1, size):
        n = sum(p.numel() for layer in layers[cut[s]:cut[s + 1]] for p in layer.parameters())
        part = torch.empty(n)
        if n:
            dist.recv(part, src=s)
        parts.append(part)
    if args.save:
        torch.save(torch.cat(parts), args.save)
elif mine.numel():
    dist.send(mine, dst=0)
dist.destroy_process_group()
