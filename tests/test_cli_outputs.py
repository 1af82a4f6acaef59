"""A command that writes a file refuses an output path that is an existing folder: one line, exit
2, before any work (here before it reads the codec or the input, which do not even exist)."""

from __future__ import annotations

import pytest

from rvqlm.cli import main


@pytest.mark.parametrize("command", ["reconstruct", "encode", "decode"])
def test_an_existing_folder_as_the_output_file_is_refused_in_one_line_before_the_work(tmp_path, capsys, command):
    folder = tmp_path / "samples"
    folder.mkdir()
    code = main([command, str(tmp_path / "missing.wav"), str(folder), "--codec", str(tmp_path / "no-codec")])
    err = capsys.readouterr().err
    assert code == 2 and err == f"rvqlm {command}: error: {folder} is a folder; give the output a file name " \
                                 f"(e.g. {folder / 'NAME'})\n"
    assert list(folder.iterdir()) == []
