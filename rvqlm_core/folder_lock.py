"""One writer at a time for an output folder (a token folder, an LM run folder): an exclusive
`flock` on `FOLDER/.writer.lock`, held while a run writes there. The OS drops it when the process
ends in any way, kill -9 included, so a crashed run never leaves the folder locked. A second run is
refused in one line naming the folder, or waits for the first (`wait=True`).

The lock file stays behind (empty but for the holder's pid and host); it is never deleted, since
deleting a lock file that another process has open would let two runs hold "the" lock at once.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".writer.lock"


class FolderBusy(RuntimeError):
    """Another process holds the folder's writer lock."""


@contextmanager
def folder_lock(folder: str | os.PathLike, *, wait: bool = False) -> Iterator[Path]:
    """Hold FOLDER's writer lock for the `with` block (the folder is created if missing); FolderBusy
    when another process holds it, or with `wait` block until it is released."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise FolderBusy(f"{folder} is being written by another run ({holder}); wait for it to end "
                             "or pass --wait") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield folder
    finally:
        os.close(fd)
