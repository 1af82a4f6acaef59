"""`rvqlm encode` and `rvqlm decode` on bad input (issue 49): one row a case; each row's exit code, its
one line on stderr (no traceback), and every file that was there before unchanged (tests/bad_input.py)."""

from __future__ import annotations

import shutil

import pytest

from bad_input import _debug_off, check_row, make_codec, write_wav  # noqa: F401 (a fixture)

ROWS = [
    # id, argv, exit code, in the stderr line, files it writes
    ("encode-output-is-the-input", ["encode", "{w}/in.wav", "{w}/in.wav"], 2, "is the input file", ()),
    ("encode-output-is-a-folder", ["encode", "{w}/in.wav", "{w}/sub"], 2, "is a folder", ()),
    ("encode-output-under-a-file", ["encode", "{w}/in.wav", "{w}/text.wav/a/o.rvq"], 2,
     "text.wav is a file, not a folder", ()),
    ("encode-float-input-past-full-scale", ["encode", "{w}/loud.wav", "{w}/out.rvq"], 0,
     "warning: {w}/loud.wav peaks at 8.00", ("out.rvq",)),
    ("encode-missing-input", ["encode", "{w}/nope.wav", "{w}/out.rvq"], 2, "no such file", ()),
    ("encode-not-audio", ["encode", "{w}/text.wav", "{w}/out.rvq"], 2, "not a readable audio file", ()),
    ("encode-too-many-codebooks", ["encode", "{w}/in.wav", "{w}/out.rvq", "--n-codebooks", "0"], 2,
     "--n-codebooks must be in 1..4", ()),
    ("decode-output-is-the-input", ["decode", "{w}/in.rvq", "{w}/in.rvq"], 2, "is the input file", ()),
    ("decode-output-under-a-file", ["decode", "{w}/in.rvq", "{w}/in.wav/o.wav"], 2, "in.wav is a file, not a folder",
     ()),
    ("decode-not-rvq", ["decode", "{w}/in.wav", "{w}/out.wav"], 2, "not an .rvq file", ()),
    ("decode-another-codecs-file", ["decode", "{w}/in.rvq", "{w}/out.wav", "--codec", "{w}/other"], 2,
     "was made by codec", ()),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    codec = make_codec(root / "codec")
    other = make_codec(root / "other")
    from codec import Codec

    c = Codec.from_pretrained(other)
    c.quantizer.embed.data.mul_(1.5)  # other codes
    c.save_pretrained(other)
    return codec, other


@pytest.fixture
def workspace(tmp_path, models, capsys):
    from rvqlm.cli import main

    shutil.copytree(models[0], tmp_path / "codec")
    shutil.copytree(models[1], tmp_path / "other")
    write_wav(tmp_path / "in.wav")
    write_wav(tmp_path / "loud.wav", peak=8.0, subtype="FLOAT")
    assert main(["encode", str(tmp_path / "in.wav"), str(tmp_path / "in.rvq"), "--codec", str(tmp_path / "codec")]) == 0
    (tmp_path / "sub").mkdir()
    (tmp_path / "text.wav").write_text("not audio\n")
    return tmp_path


@pytest.mark.parametrize("argv, code, message, new", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input(workspace, capsys, argv, code, message, new):
    codec = [] if "--codec" in argv else ["--codec", "{w}/codec"]
    check_row(workspace, [*argv, *codec], code, message, capsys, new)
