"""Fashion-MNIST through a mixture-of-experts layer, one expert per rank, tokens routed to their
expert with all_to_all_single (uneven splits), on backend hoop or gloo.

    hooprun -np 4 /usr/bin/python3 examples/torch/moe_mnist.py --backend hoop
    hooprun -np 4 /usr/bin/python3 examples/torch/moe_mnist.py --backend gloo
    /usr/bin/python3 examples/torch/moe_mnist.py --experts 4      # the same, in one process

Each image is encoded by layers every rank holds, a gate picks its expert (top-1), and the images'
features travel to the rank of their expert and back with torch.distributed.nn's autograd-aware
all_to_all_single: as many rows to each rank as its expert was picked, first the counts themselves.
The output is the expert's result scaled by the gate's probability, then a shared head. The shared
layers' gradients are averaged with all_reduce; each expert's gradient comes back through the
all-to-all. One process with --experts N runs the same model and batches with the N experts local,
so that a run on N ranks ends with its parameters (--save, gathered on rank 0).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--backend", default="hoop", help="hoop (default), gloo, or any other")
parser.add_argument("--experts", type=int, default=0, help="one process: run this many experts")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch", type=int, default=64, help="per expert (per rank)")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--hidden", type=int, default=256)
parser.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--data", help="the IDX files' directory (default: Debian's)")
parser.add_argument("--save", help="rank 0 writes the final parameters here (torch.save)")
args = parser.parse_args()

alone = args.experts > 0
if alone:
    rank, size = 0, args.experts
else:
    if args.backend == "hoop":
        import hoop.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

x, y = fashion_mnist.load("train", args.data)
torch.manual_seed(args.seed)
H = args.hidden
encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, H), torch.nn.ReLU())
gate = torch.nn.Linear(H, size)
experts = [torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.ReLU()) for _ in range(size)]
head = torch.nn.Linear(H, 10)
shared = list(encoder.parameters()) + list(gate.parameters()) + list(head.parameters())
mine = experts if alone else [experts[rank]]  # every rank made all, alike; keeps its own
params = shared + [p for e in mine for p in e.parameters()]
optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9)


def moe(h, choice):
    """Each row of h through the expert choice picked: here, or on the expert's rank."""
    if alone:
        out = torch.empty_like(h)
        for e in range(size):
            rows = (choice == e).nonzero().flatten()
            out[rows] = experts[e](h[rows])
        return out
    order = torch.argsort(choice, stable=True)
    send = torch.bincount(choice, minlength=size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)  # how many rows come from each rank
    send, recv = send.tolist(), recv.tolist()
    there = dnn.all_to_all_single(torch.empty(sum(recv), H), h[order], recv, send)
    back = dnn.all_to_all_single(torch.empty(len(choice), H), experts[rank](there), send, recv)
    out = torch.empty_like(back)
    out[order] = back
    return out


steps_per_epoch = len(x) // (args.batch * size)
for epoch in range(1, args.epochs + 1):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed + epoch))
    start, total, steps = time.perf_counter(), 0.0, 0
    for step in range(steps_per_epoch):
        batch = order[step * args.batch * size:(step + 1) * args.batch * size]
        if not alone:
            batch = batch[rank * args.batch:(rank + 1) * args.batch]
        optimizer.zero_grad()
        h = encoder(x[batch])
        probs = torch.softmax(gate(h), dim=1)
        choice = probs.argmax(dim=1)
        picked = probs.gather(1, choice.unsqueeze(1))
        loss = torch.nn.functional.cross_entropy(head(moe(h, choice) * picked), y[batch])
        loss.backward()
        if not alone:
            # The global loss is the ranks' mean: shared gradients averaged, the expert's (summed
            # over every rank's tokens by the all-to-all's backward) divided too.
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if any(p is q for q in shared):
                    dist.all_reduce(p.grad)
                p.grad.div_(size)
        optimizer.step()
        mean = loss.detach().reshape(1)
        if not alone:
            mean /= size
            dist.all_reduce(mean)
        total += mean.item()
        steps += 1
        if args.steps and steps >= args.steps:
            break
    elapsed = time.perf_counter() - start
    if rank == 0:
        print("epoch %d loss %.4f" % (epoch, total / max(1, steps)), flush=True)
        print("epoch %d: %s, %d experts, %d steps, %.2f s (%.2f ms/step)"
              % (epoch, "one process" if alone else args.backend, size, steps, elapsed,
                 1e3 * elapsed / max(1, steps)), flush=True)

# The shared layers, then every expert in order, on rank 0.
flat = [torch.nn.utils.parameters_to_vector(shared).detach()]
if alone:
    flat += [torch.nn.utils.parameters_to_vector(e.parameters()).detach() for e in experts]
elif rank == 0:
    flat.append(torch.nn.utils.parameters_to_vector(experts[0].parameters()).detach())
    for r in range(1, size):
        part = torch.empty_like(flat[-1])
        dist.recv(part, src=r)
        flat.append(part)
else:
    dist.send(torch.nn.utils.parameters_to_vector(experts[rank].parameters()).detach(), dst=0)
if rank == 0 and args.save:
    torch.save(torch.cat(flat), args.save)
if not alone:
    dist.destroy_process_group()
