"""`rvqlm generate` on bad input (issue 49): one row a case; each row's exit code, its one line on stderr
(no traceback), and every file that was there before unchanged (tests/bad_input.py)."""

from __future__ import annotations

import shutil

import pytest

from bad_input import (_debug_off, check_row, make_codec, make_lm, rows, table,  # noqa: F401 (a fixture)
                       write_wav)

ROWS = table("""
# id | command line ({w}: the workspace) | exit code | in the one line on stderr | files it leaves
out-is-the-prompt | --prompt {w}/p.wav --out {w}/p.wav | 2 | is the input file
out-full-is-the-prompt | --prompt {w}/p.full.wav --out {w}/p.wav | 2 | is the input file
a-numbered-out-is-the-prompt | --prompt {w}/p-2.wav --out {w}/p.wav --num-samples 2 | 2 | is the input file
out-is-a-folder | --out {w}/sub | 2 | is a folder
out-under-a-file | --out {w}/p.wav/a/o.wav | 2 | p.wav is a file, not a folder
prompt-past-full-scale | --prompt {w}/loud.wav --out {w}/o.wav | 0 | warning: {w}/loud.wav peaks at 8.00 |
    o.full.wav o.wav
steps-on-the-ar-lm | --out {w}/o.wav --steps 4 | 2 | --steps is not an option of the 'ar' LM family ({w}/lm; its
    decoding options: --no-cache, --monotonic / --no-monotonic)
window-on-the-ar-lm | --out {w}/o.wav --window 8 | 2 | --window is not an option of the 'ar'
missing-prompt | --prompt {w}/nope.wav --out {w}/o.wav | 2 | no such file
prompt-not-audio | --prompt {w}/lm/config.json --out {w}/o.wav | 2 | not a readable audio file
a-codec-folder-as-the-lm | --lm {w}/codec --out {w}/o.wav | 2 | {w}/codec
no-lm-folder | --lm {w}/nowhere --out {w}/o.wav | 2 | no LM folder
zero-seconds | --out {w}/o.wav --seconds 0 | 2 | --seconds must be > 0
decode-no-codebooks | --out {w}/o.wav --decode-codebooks 0 | 2 | --decode-codebooks must be >= 1
decode-more-codebooks-than-made | --out {w}/o.wav --decode-codebooks 99 | 2 | --decode-codebooks 99: the LM makes
decode-the-first-codebook | --out {w}/o.wav --decode-codebooks 1 | 0 |  | o.wav
""")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    codec = make_codec(root / "codec")
    return codec, make_lm(root / "lm", codec)


@pytest.fixture
def workspace(tmp_path, models):
    shutil.copytree(models[0], tmp_path / "codec")
    shutil.copytree(models[1], tmp_path / "lm")
    for name in ("p.wav", "p.full.wav", "p-2.wav"):
        write_wav(tmp_path / name, seconds=0.3)
    write_wav(tmp_path / "loud.wav", seconds=0.3, peak=8.0, subtype="FLOAT")
    (tmp_path / "sub").mkdir()
    return tmp_path


@rows(ROWS)
def test_bad_input(workspace, capsys, row):
    lm = "" if "--lm" in row.argv else "--lm {w}/lm "
    check_row(workspace, f"generate {lm}--codec {{w}}/codec --seconds 0.1 --no-progress {row.argv}", row.code,
              row.message, capsys, row.new)
