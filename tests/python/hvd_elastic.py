"""hvd.elastic under hooprun --min-np 2 on 3 ranks: rank 1 kills itself in the middle of epoch 1
(in the first generation); the survivors restore their last commit, shrink, sync from rank 0 and
finish the run; every survivor ends with the same parameters, after exactly one reset to 2 ranks.
Prints "hvd elastic ok" on each survivor."""
import os
import signal
import sys

import torch

import hoop.torch as hvd

hvd.init()
first_rank = hvd.rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
steps = []


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, 3):
        for state.batch in range(state.batch, 6):
            if first_rank == 1 and state.epoch == 1 and state.batch == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            g = torch.Generator().manual_seed(1000 * hvd.rank() + 10 * state.epoch + state.batch)
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            for p in model.parameters():
                p.grad = hvd.allreduce(p.grad)  # the average over the ranks
            optimizer.step()
            steps.append((state.epoch, state.batch))
            state.commit()
        state.batch = 0


train(state)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = hvd.allgather(flat.unsqueeze(0))
same = all(torch.equal(every[0], every[r]) for r in range(hvd.size()))
# Epoch 1's batch 3 ran again after the reset (its commit never came), nothing else did twice.
redone = [s for s in set(steps) if steps.count(s) > 1]
ok = hvd.size() == 2 and resets == [2] and same and state.epoch == 2 and len(set(steps)) == 18
print("rank %d -> %d of %d: %s (resets %s, steps run twice %s)"
      % (first_rank, hvd.rank(), hvd.size(), "hvd elastic ok" if ok else "FAIL", resets,
         sorted(redone)), flush=True)
hvd.shutdown()
sys.exit(0 if ok else 1)
