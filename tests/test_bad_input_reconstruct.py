"""`rvqlm reconstruct` on bad input (issue 49): one row a case; each row's exit code, its one line on
stderr (no traceback), and every file that was there before unchanged (tests/bad_input.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bad_input import _debug_off, check_row, make_codec, rows, table, write_wav  # noqa: F401 (a fixture)

ROWS = table("""
# id | command line ({w}: the workspace) | exit code | in the one line on stderr | files it leaves
output-is-the-input | {w}/in.wav {w}/in.wav | 2 | is the input file
output-is-the-input-by-another-name | {w}/in.wav {w}/sub/../in.wav | 2 | is the input file
output-is-a-folder | {w}/in.wav {w}/sub | 2 | is a folder
output-under-a-file | {w}/in.wav {w}/text.wav/out.wav | 2 | text.wav is a file, not a folder
output-deep-under-a-file | {w}/in.wav {w}/text.wav/a/out.wav | 2 | text.wav is a file, not a folder
missing-input | {w}/nope.wav {w}/out.wav | 2 | no such file
float-input-past-full-scale | {w}/loud.wav {w}/out.wav | 0 | warning: {w}/loud.wav peaks at 8.00 | out.wav
float-input-past-full-scale-streamed | {w}/loud.wav {w}/out.wav --stream | 0 | warning: {w}/loud.wav peaks at 8.00 |
    out.wav
pcm-input-resampled-past-full-scale | {w}/full8k.wav {w}/out.wav | 0 |  | out.wav
not-audio | {w}/text.wav {w}/out.wav | 2 | not a readable audio file
empty-input | {w}/empty.wav {w}/out.wav | 2 | empty file
too-many-codebooks | {w}/in.wav {w}/out.wav --n-codebooks 5 | 2 | --n-codebooks must be in 1..4
no-codec-folder | {w}/in.wav {w}/out.wav --codec {w}/nowhere | 2 | no codec folder
chunk-shorter-than-a-sample | {w}/in.wav {w}/out.wav --stream --chunk-ms 0 | 2 | --chunk-ms must be at least one
    sample
""")


@pytest.fixture(scope="module")
def codec_dir(tmp_path_factory):
    return make_codec(tmp_path_factory.mktemp("models") / "codec")


@pytest.fixture
def workspace(tmp_path, codec_dir):
    shutil.copytree(codec_dir, tmp_path / "codec")
    write_wav(tmp_path / "in.wav")
    write_wav(tmp_path / "loud.wav", peak=8.0, subtype="FLOAT")
    write_wav(tmp_path / "full8k.wav", rate=8000, peak=1.0)  # resampling to 16 kHz overshoots 1 a little
    (tmp_path / "sub").mkdir()
    (tmp_path / "text.wav").write_text("not audio\n")
    (tmp_path / "empty.wav").write_bytes(b"")
    return tmp_path


@rows(ROWS)
def test_bad_input(workspace, capsys, row):
    codec = "" if "--codec" in row.argv else " --codec {w}/codec"
    check_row(workspace, f"reconstruct {row.argv}{codec}", row.code, row.message, capsys, row.new)


def test_an_unwritable_folder_is_named_in_one_line(workspace, capsys, monkeypatch):
    """Root writes anywhere, so the test makes the folder read-only for os.access (a read-only mount, an
    immutable folder: refused before the work) and then for the write itself (refused in one line naming
    the path when the system says no only at the end)."""
    import errno
    import os
    import tempfile

    (workspace / "ro").mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != workspace / "ro" and access(p, mode))
    check_row(workspace, ["reconstruct", "{w}/in.wav", "{w}/ro/out.wav", "--codec", "{w}/codec"], 2,
              f"the folder {workspace / 'ro'} is not writable", capsys)
    monkeypatch.setattr(os, "access", access)

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", dir)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    check_row(workspace, ["reconstruct", "{w}/in.wav", "{w}/ro/out.wav", "--codec", "{w}/codec"], 2,
              f"rvqlm reconstruct: error: {workspace / 'ro'}: Permission denied", capsys)


def test_stream_is_not_held_to_the_whole_file_limit(workspace, capsys):
    """reconstruct holds a whole file in memory, so it refuses files past 180 s; --stream runs chunk by
    chunk in bounded memory (the file read and the output written block by block) and takes them."""
    import soundfile as sf

    write_wav(workspace / "long.wav", seconds=181)
    argv = ["reconstruct", "{w}/long.wav", "{w}/out.wav", "--codec", "{w}/codec"]
    check_row(workspace, argv, 2, "too long (181.0 s > limit 180.0 s)", capsys)
    check_row(workspace, [*argv, "--stream", "--chunk-ms", "4000"], 0, "", capsys, new=["out.wav"])
    assert sf.info(str(workspace / "out.wav")).frames == 181 * 16000
