"""ElasticSampler: shards a dataset over the current ranks and remembers what was seen.

Horovod's API, so elastic scripts written for it run unchanged: each rank records the
batches it has processed (``record_batch``); a commit holds the union of every rank's
records; after a failure (in the same processes, or in a job the elastic launcher
restarted with another number of ranks) the remaining indices are sharded afresh over
the ranks there are now, so an epoch resumed mid-way neither repeats nor skips samples.

    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
    ...
        for state.epoch in range(state.epoch, epochs):
            for batch_idx, batch in enumerate(loader):
                ...
                sampler.record_batch(batch_idx, 32)
                state.commit()
            sampler.set_epoch(state.epoch + 1)

Padding: like DistributedSampler, every rank gets the same number of indices (so the
same number of batches), the shortest ones padded with indices from the start of the
epoch's order; at most one per rank, at its end. A DataLoader over the sampler yields
them (Horovod's behaviour: up to size - 1 samples seen twice at the end of an epoch).
``get_indices(batch_idx, batch_size)`` leaves them out: a loop that builds its batches
from it sees every sample of the epoch exactly once (a rank's last batch may then be
shorter than the others', or empty).
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Sized

import torch

from ..common import api


class ElasticSampler(torch.utils.data.Sampler):
    """Like DistributedSampler (every rank the same number of indices, padded by
    repeating the first ones; shuffled by seed + epoch), over the indices not processed
    yet in this epoch."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self._recorded: list[int] = []  # since the last take_recorded()
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """A new epoch: nothing processed yet, a new shuffle."""
        self.epoch = epoch
        self.processed_indices = set()
        self._recorded = []
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Batch batch_idx (of batch_size, counted from this sampler's last reset) has
        been processed on this rank."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        indices = [int(index) for index in indices]
        self.processed_indices.update(indices)
        self._recorded.extend(indices)

    def take_recorded(self) -> list[int]:
        """The indices recorded on this rank since the last call (TorchState's commit
        shares them with the other ranks)."""
        recorded, self._recorded = self._recorded, []
        return recorded

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of batch batch_idx on this rank, padding left out."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, self._real)]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self._recorded = []
        self.reset()

    def reset(self) -> None:
        """Shard what is left of the epoch over the current ranks."""
        self.num_replicas = api.size() if api.is_initialized() else 1
        self.rank = api.rank() if api.is_initialized() else 0
        self.remaining_indices = [index for index in range(len(self.dataset))
                                  if index not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        # This rank's position k is the epoch order's rank + k * num_replicas; those from
        # len(remaining_indices) on are padding: this rank's first _real are not.
        self._real = len(range(self.rank, len(self.remaining_indices), self.num_replicas))
        self.indices = self._mine()

    def _mine(self) -> list[int]:
        indices = self.remaining_indices
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(indices), generator=generator).tolist()
            indices = [indices[i] for i in order]
        if indices:
            while len(indices) < self.total_size:  # pad so every rank gets as many
                indices = indices + indices[:self.total_size - len(indices)]
        return indices[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        self.indices = self._mine()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
