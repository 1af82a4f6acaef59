"""`rvqlm tokenize` on bad input (issue 49): one row a case; each row's exit code, its one line on stderr
(no traceback), and every file that was there before unchanged (tests/bad_input.py)."""

from __future__ import annotations

import shutil

import pytest

from bad_input import (_debug_off, check_row, make_codec, make_lm, rows, table,  # noqa: F401 (a fixture)
                       write_wav)

FLAGS = "--workers 0 --threads 1 --device cpu --no-progress"
ROWS = table("""
# id | command line ({w}: the workspace) | exit code | in the one line on stderr | files it leaves
out-dir-is-a-file | {w}/audio {w}/file.txt | 2 | file.txt is a file, not a folder
out-dir-under-a-file | {w}/audio {w}/file.txt/tokens | 2 | file.txt is a file, not a folder
out-dir-deep-under-a-file | {w}/audio {w}/file.txt/a/tokens | 2 | file.txt is a file, not a folder
out-dir-is-the-audio-dir | {w}/audio {w}/audio | 2 | is not empty and is not a token folder
no-audio-folder | {w}/nowhere {w}/tokens | 2 | no audio folder at
an-lm-folder-as-the-codec | {w}/audio {w}/tokens --codec {w}/lm | 2 | does not describe an rvqlm codec
no-codec-folder | {w}/audio {w}/tokens --codec {w}/nowhere | 2 | no codec folder
""")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    make_lm(root / "lm", make_codec(root / "codec"))
    return root


@pytest.fixture
def workspace(tmp_path, models):
    shutil.copytree(models / "codec", tmp_path / "codec")
    shutil.copytree(models / "lm", tmp_path / "lm")
    write_wav(tmp_path / "audio" / "a.wav", seconds=0.3)
    (tmp_path / "file.txt").write_text("a file\n")
    return tmp_path


@rows(ROWS)
def test_bad_input(workspace, capsys, row):
    codec = "" if "--codec" in row.argv else " --codec {w}/codec"
    check_row(workspace, f"tokenize {row.argv}{codec} {FLAGS}", row.code, row.message, capsys, row.new)
