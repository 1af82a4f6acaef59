"""`rvqlm encode` and `rvqlm decode` on bad input (issue 49): one row a case; each row's exit code, its
one line on stderr (no traceback), and every file that was there before unchanged (tests/bad_input.py)."""

from __future__ import annotations

import shutil

import pytest

from bad_input import _debug_off, check_row, make_codec, rows, table, write_wav  # noqa: F401 (a fixture)

ROWS = table("""
# id | command line ({w}: the workspace) | exit code | in the one line on stderr | files it leaves
encode-output-is-the-input | encode {w}/in.wav {w}/in.wav | 2 | is the input file
encode-output-is-a-folder | encode {w}/in.wav {w}/sub | 2 | is a folder
encode-output-under-a-file | encode {w}/in.wav {w}/text.wav/a/o.rvq | 2 | text.wav is a file, not a folder
encode-float-input-past-full-scale | encode {w}/loud.wav {w}/out.rvq | 0 | warning: {w}/loud.wav peaks at 8.00 |
    out.rvq
encode-missing-input | encode {w}/nope.wav {w}/out.rvq | 2 | no such file
encode-not-audio | encode {w}/text.wav {w}/out.rvq | 2 | not a readable audio file
encode-too-many-codebooks | encode {w}/in.wav {w}/out.rvq --n-codebooks 0 | 2 | --n-codebooks must be in 1..4
decode-output-is-the-input | decode {w}/in.rvq {w}/in.rvq | 2 | is the input file
decode-output-under-a-file | decode {w}/in.rvq {w}/in.wav/o.wav | 2 | in.wav is a file, not a folder
decode-not-rvq | decode {w}/in.wav {w}/out.wav | 2 | not an .rvq file
decode-another-codecs-file | decode {w}/in.rvq {w}/out.wav --codec {w}/other | 2 | was made by codec
""")


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


@rows(ROWS)
def test_bad_input(workspace, capsys, row):
    codec = "" if "--codec" in row.argv else " --codec {w}/codec"
    check_row(workspace, row.argv + codec, row.code, row.message, capsys, row.new)


# ---- Hugging Face codec folders (transformers, tiny random EnCodec written offline) ---------------------

HF_ROWS = table("""
# id | command line ({w}: the workspace) | exit code | in the one line on stderr | files it leaves
hf-missing-encoder-tensors | encode {w}/in.wav {w}/o.rvq --codec {w}/hf-missing | 2 | hf-missing is missing weights
    the model needs (
hf-unexpected-tensors | encode {w}/in.wav {w}/o.rvq --codec {w}/hf-extra | 2 | hf-extra holds weights the model does
    not have (extra.weight)
hf-truncated-weights | reconstruct {w}/in.wav {w}/o.wav --codec {w}/hf-cut | 2 | hf-cut/model.safetensors is not a
    readable safetensors file
hf-truncated-weights-tokenize | tokenize {w}/audio {w}/tokens --codec {w}/hf-cut --workers 0 --threads 1
    --no-progress | 2 | hf-cut/model.safetensors is not a readable safetensors file
""")


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """An EnCodec folder as save_pretrained writes it, and three broken copies: encoder tensors missing, an
    unexpected tensor, model.safetensors cut in half."""
    transformers = pytest.importorskip("transformers")
    import torch
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    config = transformers.EncodecConfig(target_bandwidths=[1.5, 3.0, 6.0], hidden_size=16, num_filters=4,
                                        num_lstm_layers=1)
    transformers.EncodecModel(config).eval().save_pretrained(root / "hf")
    weights = load_file(root / "hf" / "model.safetensors")
    for name in ("hf-missing", "hf-extra", "hf-cut"):
        shutil.copytree(root / "hf", root / name)
    save_file({k: v for k, v in weights.items() if not k.startswith("encoder.")},
              root / "hf-missing" / "model.safetensors", metadata={"format": "pt"})
    save_file({**weights, "extra.weight": torch.zeros(3)}, root / "hf-extra" / "model.safetensors",
              metadata={"format": "pt"})
    data = (root / "hf" / "model.safetensors").read_bytes()
    (root / "hf-cut" / "model.safetensors").write_bytes(data[: len(data) // 2])
    return root


@rows(HF_ROWS)
def test_bad_hugging_face_folder(hf_folders, tmp_path, capsys, row):
    for name in ("hf-missing", "hf-extra", "hf-cut"):
        shutil.copytree(hf_folders / name, tmp_path / name)
    write_wav(tmp_path / "in.wav")
    write_wav(tmp_path / "audio" / "a.wav", seconds=0.2)
    check_row(tmp_path, row.argv, row.code, row.message, capsys, row.new)
