"""Fashion-MNIST with Horovod's elastic training on hoop: a rank may die, the others go on.

    hooprun -np 4 --min-np 2 /usr/bin/python3 examples/torch/elastic_mnist.py --epochs 2
    hooprun -np 4 --min-np 2 /usr/bin/python3 examples/torch/elastic_mnist.py --kill 3:40

The training loop runs under hvd.elastic.run with its model, optimizer, epoch and step in a
TorchState committed every --commit-every steps. With --kill R:S rank R SIGKILLs itself at global
step S: every survivor's next call fails, hvd.elastic restores the last commit, shrinks the job to
the survivors, brings them to rank 0's state and goes on, without a restart of the job. The global
batch stays --global-batch whatever the number of ranks (each takes its slice of the same samples),
so a run that lost a rank computes what an unfaulted run computes, up to the steps redone after the
last commit; the test accuracy at the end says how close it came.
"""

import argparse
import os
import signal
import sys
import time

import torch

import hoop.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--global-batch", type=int, default=240, help="split among the ranks alive")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--hidden", type=int, default=256)
parser.add_argument("--commit-every", type=int, default=10, help="steps between commits")
parser.add_argument("--kill", help="R:S: rank R (of the first generation) dies at step S")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--data", help="the IDX files' directory (default: Debian's)")
args = parser.parse_args()

hvd.init()
first_rank = hvd.rank()
kill_rank, kill_step = (int(v) for v in args.kill.split(":")) if args.kill else (-1, -1)
torch.manual_seed(args.seed)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
x, y = fashion_mnist.load("train", args.data)
tx, ty = fashion_mnist.load("test", args.data)
model = fashion_mnist.model(args.hidden)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
state = hvd.elastic.TorchState(model, optimizer, epoch=0, step=0)
state.register_reset_callbacks([lambda: hvd.rank() == 0 and print(
    "reset: %d ranks go on from epoch %d step %d" % (hvd.size(), state.epoch, state.step),
    flush=True)])
steps_per_epoch = len(x) // args.global_batch


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed +
                                                                               state.epoch))
        start, losses = time.perf_counter(), []
        while state.step < steps_per_epoch:
            global_step = state.epoch * steps_per_epoch + state.step
            if first_rank == kill_rank and global_step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            size, rank = hvd.size(), hvd.rank()
            batch = order[state.step * args.global_batch:(state.step + 1) * args.global_batch]
            share = (len(batch) + size - 1) // size
            mine = batch[rank * share:(rank + 1) * share]
            optimizer.zero_grad()
            # A sum over this rank's slice, over the global batch's size: the ranks' sum of
            # gradients is the global batch's mean, however the batch was split.
            loss = torch.nn.functional.cross_entropy(model(x[mine]), y[mine], reduction="sum")
            (loss / len(batch)).backward()
            grads = [p.grad for p in model.parameters()]
            for p, g in zip(model.parameters(), hvd.grouped_allreduce(grads, op=hvd.Sum)):
                p.grad = g
            optimizer.step()
            losses.append(loss.item() / max(1, len(mine)))
            state.step += 1
            if state.step % args.commit_every == 0:
                state.commit()
        if hvd.rank() == 0:
            print("epoch %d: train loss %.4f, %d ranks, %.1f s" % (
                state.epoch + 1, sum(losses) / max(1, len(losses)), hvd.size(),
                time.perf_counter() - start), flush=True)
        state.epoch += 1
        state.step = 0
        state.commit()


train(state)
model.eval()
with torch.no_grad():
    correct = (model(tx).argmax(1) == ty).sum().item()
if hvd.rank() == 0:
    print("test accuracy %.2f%% on %d ranks" % (100.0 * correct / len(ty), hvd.size()),
          flush=True)
hvd.shutdown()
