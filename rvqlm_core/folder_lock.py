"""One writer at a time for an output folder (a token folder, an LM run folder): an exclusive
`flock` on `FOLDER/.writer.lock`, held while a run writes there. The OS drops it when the process
ends in any way, kill -9 included, so a crashed run never leaves the folder locked. A second run is
refused in one line naming the folder, or waits for the first (`wait=True`).

The lock file stays behind (it names the last holder's pid and host), except in a folder that the
run created and left empty. A waiter that finds the file it locked deleted starts over, so two runs
never hold locks on two different files.
"""

from __future__ import annotations

import contextlib
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
    """Hold FOLDER's writer lock for the `with` block; FolderBusy when another process holds it, or
    with `wait` block until it is released. A folder this call created is removed again at the end
    if the block left nothing in it but the lock file (a run refused before writing leaves no trace)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd = _lock(folder / LOCK_FILE, wait)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield folder
    finally:
        with contextlib.suppress(OSError):
            if created and [p.name for p in folder.iterdir()] == [LOCK_FILE]:
                (folder / LOCK_FILE).unlink()  # still held: a waiter sees its file gone and starts over
                folder.rmdir()
        os.close(fd)


def _lock(path: Path, wait: bool) -> int:
    """An open descriptor of `path` holding its flock. Retried when the file was removed (by a holder
    cleaning up) between our open and our lock, so two holders never lock two different files."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FolderBusy(f"{path.parent} is being written by another run ({holder}); let it end first") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
