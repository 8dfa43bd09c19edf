"""hvd.elastic as Horovod's own elastic example keeps it: a DistributedOptimizer and an
ElasticSampler inside the TorchState, under hooprun --min-np 2 on 3 ranks; rank 1 kills itself in
the middle of epoch 0. The survivors restore, shrink and sync, the optimizer goes on over the new
communicator, and the sampler deals what no survivor has processed among the 2 left: by the end
of epoch 0 the survivors have processed every index of the data set, epoch 1 deals it anew between
them, and their parameters agree. Prints "hvd elastic sampler ok" on each survivor."""
import os
import signal
import sys

import torch

import hoop.torch as hvd

hvd.init()
first_rank = hvd.rank()
torch.manual_seed(0)
N, BATCH = 60, 4
data = torch.randn(N, 4, generator=torch.Generator().manual_seed(5))
target = torch.randn(N, 2, generator=torch.Generator().manual_seed(6))
model = torch.nn.Linear(4, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(torch.utils.data.TensorDataset(data, target), seed=3)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
resets, covered, dealt = [], {}, {}
state.register_reset_callbacks([lambda: resets.append(hvd.size())])


@hvd.elastic.run
def train(state):
    dealing = 0  # batches taken from the sampler's dealing, which a reset makes anew
    while state.epoch < 2:
        dealt.setdefault(state.epoch, len(state.sampler))
        indices = state.sampler.get_indices(dealing, BATCH)
        if not indices:  # this epoch is done on every rank alike (equal shares)
            mine = torch.tensor(sorted(state.sampler.processed_indices), dtype=torch.int64)
            every = hvd.allgather(mine)
            covered[state.epoch] = len(set(every.tolist()))
            state.epoch, state.batch, dealing = state.epoch + 1, 0, 0
            state.sampler.set_epoch(state.epoch)
            state.commit()
            continue
        if first_rank == 1 and state.epoch == 0 and state.batch == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        loss = ((model(data[indices]) - target[indices]) ** 2).mean()
        loss.backward()
        optimizer.step()
        state.sampler.record_indices(indices)
        state.batch, dealing = state.batch + 1, dealing + 1
        state.commit()


train(state)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = hvd.allgather(flat.unsqueeze(0))
same = all(torch.equal(every[0], every[r]) for r in range(hvd.size()))
ok = (hvd.size() == 2 and resets == [2] and same and covered == {0: N, 1: N} and
      dealt.get(1) == N // 2)
print("rank %d -> %d of %d: %s (resets %s, indices covered per epoch %s, dealt %s)"
      % (first_rank, hvd.rank(), hvd.size(), "hvd elastic sampler ok" if ok else "FAIL", resets,
         covered, dealt), flush=True)
hvd.shutdown()
sys.exit(0 if ok else 1)
