"""Fashion-MNIST, trained the way Horovod programs train, on hoop.

    hooprun -np 4 /usr/bin/python3 examples/torch/horovod_mnist.py --epochs 2

The program is Horovod's PyTorch example with one line changed (``import hoop.torch as hvd``): every
rank trains on its shard (DistributedSampler), DistributedOptimizer averages the gradients (fp16 on
the wire with --fp16), rank 0's parameters and optimizer state are broadcast at the start, and the
test accuracy is the average of the ranks' shards. --compression picks hvd.Compression's kind
(int8, fp8 and wire_bf16: hoop's encodings between hosts, with error feedback). --global-batch B
keeps the global batch at B whatever the number of ranks (B / size per rank, learning rate
unscaled), so that a run on 4 ranks computes what a run on 1 rank computes; --save writes rank 0's
final parameters.
"""

import argparse
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hoop.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
parser.add_argument("--global-batch", type=int, default=0,
                    help="global batch size, split over the ranks (overrides --batch-size and "
                         "the scaling of the learning rate by the number of ranks)")
parser.add_argument("--lr", type=float, default=0.01, help="per rank, scaled by size()")
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--hidden", type=int, default=256)
parser.add_argument("--fp16", action="store_true", help="send gradients as float16")
parser.add_argument("--compression", default="none",
                    choices=["none", "fp16", "bf16", "int8", "fp8", "wire_bf16"],
                    help="hvd.Compression's kind: fp16 and bf16 cast as Horovod does; int8, fp8 "
                         "and wire_bf16 are encoded by hoop between hosts only, with error "
                         "feedback (--fp16 is --compression fp16)")
parser.add_argument("--steps", type=int, default=0, help="stop after this many steps in all")
parser.add_argument("--train-limit", type=int, default=0, help="use only the first N images")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--save", help="rank 0 writes the final state_dict here (torch.save)")
parser.add_argument("--data", help="the IDX files' directory (default: Debian's)")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

if args.global_batch:
    if args.global_batch % hvd.size():
        sys.exit("--global-batch %d is not a multiple of %d ranks" % (args.global_batch,
                                                                        hvd.size()))
    batch, lr = args.global_batch // hvd.size(), args.lr
else:
    batch, lr = args.batch_size, args.lr * hvd.size()

x, y = fashion_mnist.load("train", args.data)
if args.train_limit:
    x, y = x[:args.train_limit], y[:args.train_limit]
train = TensorDataset(x, y)
sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
loader = DataLoader(train, batch_size=batch, sampler=sampler)
tx, ty = fashion_mnist.load("test", args.data)
test_sampler = DistributedSampler(TensorDataset(tx, ty), num_replicas=hvd.size(),
                                  rank=hvd.rank(), shuffle=False)

model = fashion_mnist.model(args.hidden)
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
if args.fp16:
    args.compression = "fp16"
compression = getattr(hvd.Compression, args.compression)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression)


def metric_average(value):
    return hvd.allreduce(torch.tensor(float(value)), name="metric").item()


def test():
    model.eval()
    correct = 0
    index = torch.tensor(list(iter(test_sampler)))
    with torch.no_grad():
        for start in range(0, len(index), 1000):
            chunk = index[start:start + 1000]
            correct += (model(tx[chunk]).argmax(1) == ty[chunk]).sum().item()
    model.train()
    # The sampler pads the last shard with repeated images: count each image once.
    total = hvd.allreduce(torch.tensor([float(correct), float(len(index))]), op=hvd.Sum)
    return 100.0 * total[0].item() / total[1].item()


steps = 0
for epoch in range(1, args.epochs + 1):
    sampler.set_epoch(epoch)
    start, losses = time.perf_counter(), []
    for data, target in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        steps += 1
        if args.steps and steps >= args.steps:
            break
    elapsed = time.perf_counter() - start
    train_loss = metric_average(sum(losses) / max(1, len(losses)))
    accuracy = test()
    if hvd.rank() == 0:
        print("epoch %d: train loss %.4f, test accuracy %.2f%%, %d steps, %.1f s (%.2f ms/step), "
              "%d ranks x batch %d%s" % (epoch, train_loss, accuracy, len(losses), elapsed,
                                         1e3 * elapsed / max(1, len(losses)), hvd.size(), batch,
                                         "" if args.compression == "none" else
                                         ", " + args.compression), flush=True)
    if args.steps and steps >= args.steps:
        break

if args.save and hvd.rank() == 0:
    torch.save(model.state_dict(), args.save)
hvd.shutdown()
