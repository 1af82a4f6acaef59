"""`rvqlm export-lm`, `eval-lm` and `export-codec` on bad input (issue 49): one row a case; each row's exit
code, its one line on stderr (no traceback), and every file that was there before unchanged
(tests/bad_input.py)."""

from __future__ import annotations

import shutil

import pytest

from bad_input import _debug_off, check_row, make_codec, make_lm, rows, table  # noqa: F401 (a fixture)
from test_lm_data import make_token_corpus

ROWS = table("""
# id | command line ({w}: the workspace) | exit code | in the one line on stderr | files it leaves
export-lm-onto-itself | export-lm {w}/lm {w}/lm --dtype float16 | 2 | refusing to write {w}/lm: it is the input
    folder
export-lm-onto-itself-by-another-name | export-lm {w}/lm {w}/sub/../lm/ | 2 | is the input folder
export-lm-under-a-file | export-lm {w}/lm {w}/file.txt/lm | 2 | file.txt is a file, not a folder
export-lm-into-a-foreign-folder | export-lm {w}/lm {w}/sub | 2 | refusing to replace {w}/sub: it holds files that
    are not a saved LM
export-lm-no-lm-folder | export-lm {w}/nowhere {w}/out | 2 | no LM folder
export-codec-onto-itself | export-codec {w}/codec {w}/codec --dtype float16 | 2 | refusing to write {w}/codec: it is
    the input folder
export-codec-under-a-file | export-codec {w}/codec {w}/file.txt/c | 2 | file.txt is a file, not a folder
eval-lm-no-token-folder | eval-lm --lm {w}/lm --tokens {w}/nowhere | 2 | is not a token folder
eval-lm-another-codecs-tokens | eval-lm --lm {w}/lm --tokens {w}/tokens | 2 | codec mismatch
eval-lm-json-under-a-file | eval-lm --lm {w}/lm --tokens {w}/tokens --json {w}/file.txt/r.json | 2 | file.txt is a
    file, not a folder
""")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    codec = make_codec(root / "codec")
    make_lm(root / "lm", codec)
    make_token_corpus(root / "tokens")  # another codec's tokens
    return root


@pytest.fixture
def workspace(tmp_path, models):
    for name in ("codec", "lm", "tokens"):
        shutil.copytree(models / name, tmp_path / name)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("not an LM\n")
    (tmp_path / "file.txt").write_text("a file\n")
    return tmp_path


@rows(ROWS)
def test_bad_input(workspace, capsys, row):
    check_row(workspace, row.argv, row.code, row.message, capsys, row.new)
