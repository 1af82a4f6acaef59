"""Atomic file writes: a reader sees either the old file or the complete new one, never a part.

Every write goes to a temporary name in the destination's own folder (same filesystem), is
flushed and fsync'ed, then renamed over the destination with `os.replace`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


def check_file_destination(dest: str | os.PathLike, *inputs: str | os.PathLike | None) -> Path:
    """`dest` as a Path, or ValueError in one line when it is an existing folder or one of the command's
    `inputs` (None: none given) by another name: a command that writes a file checks its output before
    the work, not when the rename fails at the end, and never replaces what it reads."""
    dest = Path(dest)
    if dest.is_dir():
        raise ValueError(f"{dest} is a folder; give the output a file name (e.g. {dest / 'NAME'})")
    check_folder_destination(dest.parent, what=dest)
    refuse_inputs(dest, inputs)
    return dest


def refuse_inputs(dest: str | os.PathLike, inputs) -> None:
    """ValueError in one line when `dest` is one of a command's `inputs` (None: not given) by any name: a
    command never replaces what it reads."""
    for source in inputs:
        if source is not None and _same_file(Path(dest), Path(source)):
            kind = "folder" if Path(source).is_dir() else "file"
            raise ValueError(f"refusing to write {dest}: it is the input {kind} {source}, which it would replace; "
                             "give the output another name")


def check_folder_destination(folder: str | os.PathLike, what: str | os.PathLike | None = None,
                             inputs=()) -> Path:
    """`folder` as a Path, or ValueError in one line naming the path when it cannot be made or written
    into: it, or the nearest of its parents that exists, is a file, or that one is not writable (its
    permissions, a read-only mount), or it is one of the command's `inputs` (`refuse_inputs`). `what`:
    the path the message says cannot be written (default folder)."""
    refuse_inputs(folder, inputs)
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    what = folder if what is None else what
    if not existing.is_dir():
        raise ValueError(f"cannot write {what}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {what}: the folder {existing} is not writable (its permissions, or a "
                         "read-only file system)")
    return folder


def _same_file(a: Path, b: Path) -> bool:
    """The same file: equal resolved paths (links and `..` followed), or one file under two names."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # either one does not exist (yet)
        return False


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; on success it is renamed to `dest`, on error removed.

    `suffix` defaults to dest's own suffix, so format-by-extension writers (soundfile, numpy)
    still see the right extension.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", suffix=dest.suffix if suffix is None else suffix,
                               dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp makes 0600 and some writers recreate the file: give it the usual permissions.
        os.chmod(tmp_path, 0o666 & ~_umask())
        _fsync_file(tmp_path)
        os.replace(tmp_path, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def atomic_write_bytes(dest: str | os.PathLike, data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dest: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(dest, text.encode("utf-8"))


def atomic_write_json(dest: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def usual_permissions(folder: str | os.PathLike) -> None:
    """chmod a folder written under a temporary name (mkdtemp: 0700) and its files (often 0600) to
    what a plain mkdir/open would have given under the current umask, before it is renamed into place."""
    mask = _umask()
    folder = Path(folder)
    os.chmod(folder, 0o777 & ~mask)
    for p in folder.rglob("*"):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def refuse_foreign_folder(dest: str | os.PathLike, allowed: tuple[str, ...], what: str) -> None:
    """Raise FileExistsError if `dest` exists and is not a folder holding only `allowed` files: a
    save that replaces a whole folder must not take a model card or figures with it."""
    dest = Path(dest)
    if not dest.exists():
        return
    if not dest.is_dir():
        raise FileExistsError(f"{dest} exists and is not a folder")
    foreign = sorted(p.name for p in dest.iterdir() if p.name not in allowed)
    if foreign:
        raise FileExistsError(f"refusing to replace {dest}: it holds files that are not {what} {foreign}")
