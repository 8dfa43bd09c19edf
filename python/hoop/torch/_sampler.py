"""hoop.torch: hvd.elastic.ElasticSampler, Horovod's sampler for elastic jobs.

It deals this epoch's indices that no rank has processed yet among the job's ranks (shuffled by
seed + epoch, padded to a multiple of the rank count), and remembers what this rank processed
(record_batch, record_indices). Kept in a TorchState (TorchState(model, optimizer,
train_sampler=sampler, ...)), it is saved at each commit, restored after a failure and, at each
sync, every rank's processed indices are united and the indices left are dealt again among the
ranks of the job as it is now: after a reset, take batches from the start of the new dealing
(get_indices(0, ...), or iterate the sampler again), whatever the epoch's batch count says. The
indices travel as integers, never pickled.
"""

import math

import torch

from . import _job, _plain


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch):
        """A new epoch: nothing processed yet; the indices dealt again."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """This rank processed its batch_idx-th batch of batch_size."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of its batch_idx-th batch of batch_size."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = {int(i) for i in state_dict["processed_indices"]}
        self.reset()

    def reset(self):
        """Deal the indices not processed yet among the job's ranks as it is now."""
        comm = _job._live("hvd.elastic.ElasticSampler")
        self.num_replicas, self.rank = comm.size, comm.rank
        left = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        if self.shuffle:
            order = torch.randperm(len(left), generator=torch.Generator().manual_seed(
                self.seed + self.epoch)).tolist()
            left = [left[i] for i in order]
        self.num_samples = int(math.ceil(len(left) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        while left and len(left) < self.total_size:  # padded with the first ones again
            left += left[:self.total_size - len(left)]
        self.remaining_indices = left
        self.indices = left[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples

    def _sync(self, comm, call):
        """Every rank's processed indices united, rank 0's epoch; dealt again."""
        mine = torch.tensor(sorted(self.processed_indices), dtype=torch.int64)
        united = set()
        for theirs in _plain.allgather(mine, comm, call):
            united.update(int(i) for i in theirs.tolist())
        epoch = _plain.broadcast(int(self.epoch), 0, comm, call)
        self.load_state_dict({"epoch": epoch, "processed_indices": sorted(united)})


__all__ = ["ElasticSampler"]
