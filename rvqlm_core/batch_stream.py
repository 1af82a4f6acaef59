"""What the codec's and the LM's resumable training streams share.

Both trainers read an IterableDataset that yields whole batches from a position (batches this
rank has consumed) to the end of the epoch. The position is saved in checkpoints through the
loader's `state_dict` (Lightning treats a loader with that method as resumable), and the stream
splits its batches between DataLoader workers itself.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

# The streams split their batches between DataLoader workers themselves (`worker_share`), so
# Lightning's generic warning about `__len__` on an IterableDataset does not apply.
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")


def worker_share() -> tuple[int, int]:
    """(this DataLoader worker's id, number of workers); (0, 1) in the main process."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class StreamPosition:
    """How many training batches of the stream this rank has consumed (its data position).

    Shared between the DataModule (which saves/restores it in checkpoints) and the stream
    (which starts there whenever an epoch's iterator is created).
    """

    def __init__(self, consumed_batches: int = 0):
        self.consumed_batches = consumed_batches


class BatchStream(IterableDataset, ABC):
    """A rank's training batches from `position.consumed_batches` to the end of that epoch.

    Rank r's batch b holds samples ``(b * world_size + r) * batch_size + j`` (DDP ranks read
    disjoint samples); an epoch is `batches_per_epoch` batches; DataLoader workers take batches
    round-robin. Subclasses say what batch b is (`batch`).
    """

    def __init__(self, batch_size: int, batches_per_epoch: int, rank: int = 0, world_size: int = 1,
                 position: StreamPosition | None = None):
        if batch_size < 1 or batches_per_epoch < 1:
            raise ValueError(f"batch_size and batches_per_epoch must be >= 1, got {batch_size}, {batches_per_epoch}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.batch_size, self.batches_per_epoch = batch_size, batches_per_epoch
        self.rank, self.world_size = rank, world_size
        self.position = position or StreamPosition()

    def __len__(self) -> int:
        return self.batches_per_epoch  # what the DataLoader (batch_size=None) reports as its length

    def first_sample(self, batch_index: int) -> int:
        """The run-wide index of the first sample of this rank's batch `batch_index`."""
        return (batch_index * self.world_size + self.rank) * self.batch_size

    @abstractmethod
    def batch(self, batch_index: int) -> dict:
        """This rank's batch `batch_index` of the run."""

    def __iter__(self) -> Iterator[dict]:
        start = self.position.consumed_batches
        end = (start // self.batches_per_epoch + 1) * self.batches_per_epoch  # the rest of this epoch
        worker, n_workers = worker_share()
        for batch_index in range(start + worker, end, n_workers):
            yield self.batch(batch_index)


class StreamLoader(DataLoader):
    """The DataLoader of a stream with a `position`; its state is that position, so Lightning sees
    a resumable loader (it saves and restores this state with the loops' state)."""

    def state_dict(self) -> dict:
        return {"consumed_batches": self.dataset.position.consumed_batches}

    def load_state_dict(self, state: dict) -> None:
        self.dataset.position.consumed_batches = int(state["consumed_batches"])
