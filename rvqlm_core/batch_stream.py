"""What the codec's and the LM's resumable training streams share.

Both trainers read an IterableDataset that yields whole batches from a position (batches this
rank has consumed) to the end of the epoch. The position is saved in checkpoints through the
loader's `state_dict` (Lightning treats a loader with that method as resumable), and the stream
splits its batches between DataLoader workers itself.
"""

from __future__ import annotations

import warnings

from torch.utils.data import DataLoader, get_worker_info

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


class StreamLoader(DataLoader):
    """The DataLoader of a stream with a `position`; its state is that position, so Lightning sees
    a resumable loader (it saves and restores this state with the loops' state)."""

    def state_dict(self) -> dict:
        return {"consumed_batches": self.dataset.position.consumed_batches}

    def load_state_dict(self, state: dict) -> None:
        self.dataset.position.consumed_batches = int(state["consumed_batches"])
