"""ElasticSampler (Horovod's hvd.elastic.ElasticSampler): a
torch.utils.data.Sampler that splits the indices of a dataset not yet
processed this epoch over the current members, and splits them again after
every reset (docs/elastic.md, "ElasticSampler").

The order of an epoch: range(len(dataset)), shuffled with
random.Random(seed + epoch) when shuffle is true (the same on every
member). The indices of that order not in `processed_indices` are padded
by repeating them cyclically to a multiple of size() (as Horovod: every
member gets the same number of samples, so the members make the same
number of steps; at most size() - 1 extra samples, at the end of an epoch,
and only when the remaining count does not divide by size(); with fewer
remaining indices than members an index is seen several times); member
rank() takes every size()-th from position rank().

Recording what was processed (before the state.commit() that should keep
it): record_batch(batch_idx, batch_size) records batch `batch_idx` of
every member's current share (the members step together, so every member
records the same indices without a collective); record_indices(indices)
records the given indices of this member only, which reach the others at
the next sync. TorchState(..., sampler=s) saves the sampler at commit,
restores it after a failure, and at every sync gives every member the
union of the members' processed indices and splits the rest over the new
membership (reset()). set_epoch(epoch) at the end of an epoch starts the
next with nothing processed.

Thread use: the main thread (the training loop's).
"""
import math
import random

import torch.utils.data

from .. import _context


class ElasticSampler(torch.utils.data.Sampler):
    """ElasticSampler(dataset, shuffle=True, seed=0): this member's share of
    the indices of `dataset` (anything with len()) not processed yet this
    epoch (module docstring)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        try:
            n = len(dataset)
        except TypeError:
            raise TypeError(f"ElasticSampler: dataset: an object with len(), got "
                            f"{type(dataset).__name__}") from None
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"ElasticSampler: seed: an int, got {seed!r}")
        self.dataset = dataset
        self.length = n
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch` (call it at the end of an epoch): nothing
        processed, a new order when shuffling."""
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise TypeError(f"ElasticSampler.set_epoch: an int, got {epoch!r}")
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def get_indices(self, batch_idx, batch_size):
        """This member's indices of batch `batch_idx` (of `batch_size`) of its
        current share (the share since the last reset)."""
        start = self._batch_start(batch_idx, batch_size)
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def record_batch(self, batch_idx, batch_size):
        """Records batch `batch_idx` of every member's current share as
        processed (every member makes the same steps)."""
        start = self._batch_start(batch_idx, batch_size)
        end = min(start + batch_size, self.num_samples)
        rem, n = self.remaining_indices, self.num_replicas
        if rem:  # member r's j-th index is position r + n*j of the padded order
            self.processed_indices.update(rem[(r + n * j) % len(rem)]
                                          for r in range(n) for j in range(start, end))

    def record_indices(self, indices):
        """Records `indices` (ints) as processed by this member."""
        got = [int(i) for i in indices]
        bad = [i for i in got if not 0 <= i < self.length]
        if bad:
            raise ValueError(f"ElasticSampler.record_indices: {bad[:5]} not in [0, "
                             f"{self.length})")
        self.processed_indices.update(got)

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self):
        """Splits the indices not processed this epoch over the current
        members (rank(), size())."""
        self.num_replicas = _context.size()
        self.rank = _context.rank()
        order = list(range(self.length))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._share(self.rank)

    def _share(self, r):
        # The padded order repeats the remaining indices cyclically up to
        # total_size (a remaining count not a multiple of size(), or below it).
        rem = self.remaining_indices
        return [rem[p % len(rem)] for p in range(r, self.total_size, self.num_replicas)]

    @staticmethod
    def _batch_start(batch_idx, batch_size):
        for v, what in ((batch_idx, "batch_idx"), (batch_size, "batch_size")):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"ElasticSampler: {what}: a non-negative int, got {v!r}")
        return batch_idx * batch_size

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
