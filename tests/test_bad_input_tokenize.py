"""`rvqlm tokenize` on bad input (issue 49): one row a case; each row's exit code, its one line on stderr
(no traceback), and every file that was there before unchanged (tests/bad_input.py)."""

from __future__ import annotations

import shutil

import pytest

from bad_input import _debug_off, check_row, make_codec, write_wav  # noqa: F401 (a fixture)

FLAGS = ["--codec", "{w}/codec", "--workers", "0", "--threads", "1", "--device", "cpu", "--no-progress"]
ROWS = [
    # id, argv, exit code, in the stderr line, files it writes
    ("out-dir-is-a-file", ["{w}/audio", "{w}/file.txt"], 2, "file.txt is a file, not a folder", ()),
    ("out-dir-under-a-file", ["{w}/audio", "{w}/file.txt/tokens"], 2, "file.txt is a file, not a folder", ()),
    ("out-dir-deep-under-a-file", ["{w}/audio", "{w}/file.txt/a/tokens"], 2, "file.txt is a file, not a folder", ()),
    ("no-codec-folder", ["{w}/audio", "{w}/tokens", "--codec", "{w}/nowhere"], 2, "no codec folder", ()),
]


@pytest.fixture(scope="module")
def codec_dir(tmp_path_factory):
    return make_codec(tmp_path_factory.mktemp("models") / "codec")


@pytest.fixture
def workspace(tmp_path, codec_dir):
    shutil.copytree(codec_dir, tmp_path / "codec")
    write_wav(tmp_path / "audio" / "a.wav", seconds=0.3)
    (tmp_path / "file.txt").write_text("a file\n")
    return tmp_path


@pytest.mark.parametrize("argv, code, message, new", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input(workspace, capsys, argv, code, message, new):
    flags = FLAGS if "--codec" not in argv else FLAGS[2:]
    check_row(workspace, ["tokenize", *argv, *flags], code, message, capsys, new)
