"""Transcripts as an N_c = 1 token folder of UTF-8 bytes (`rvqlm corpus text-tokens`,
rvqlm/corpora/text_tokens.py), and the speech LM's recipe training on it (recipes/lm_text_bytes.yaml):
the LM is token-generic."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from rvqlm.cli import main
from rvqlm.corpora.text_tokens import TEXT_FINGERPRINT, text_to_tokens
from rvqlm_core.token_shards import TokenShards

REPO = Path(__file__).resolve().parents[1]
LINES = ["Co je to za divnou loď?", "Teď na nic nesahej.", "Já jsem ryba.", "Ahoj, rybičko!"]


def audio_folder(root: Path, n_per_split: int = 12) -> Path:
    """A corpus laid out like the built-in one (train/ valid/, metadata.jsonl per split): the files'
    contents are never read, only their names and rows. train/a/f000.wav has no row, and two bad rows."""
    for split in ("train", "valid"):
        rows = []
        for i in range(n_per_split):
            name = f"a/f{i:03d}.wav"
            (root / split / name).parent.mkdir(parents=True, exist_ok=True)
            (root / split / name).write_bytes(b"RIFF")
            if split == "train" and i == 0:
                continue
            speaker = "font_small" if i % 2 else "font_big"
            rows.append({"file_name": name, "text": LINES[i % len(LINES)], "speaker": speaker})
        if split == "train":
            rows[0]["text"] = 7  # train/a/f001.wav: not a string
            rows.append({"file_name": "a/missing.wav", "text": "nikde"})
        (root / split / "metadata.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                                     encoding="utf-8")
    return root


def test_text_tokens_are_each_files_utf8_bytes_and_a_newline_and_nothing_is_dropped_silently(tmp_path, capsys):
    corpus = audio_folder(tmp_path / "corpus")
    out = tmp_path / "text"
    assert main(["corpus", "text-tokens", "--corpus", str(corpus), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"text tokens in {out}: 22 of 24 files" in said and "2 metadata, 1 no text" in said
    shards = TokenShards.open(out)
    assert (shards.n_codebooks, shards.codebook_size, shards.fingerprint) == (1, 256, TEXT_FINGERPRINT)
    by_path = {e.path: e for e in shards.entries}
    entry = by_path["valid/a/f005.wav"]
    tokens = np.asarray(shards.read(entry))
    assert tokens.shape == (len(LINES[1].encode("utf-8")) + 1, 1)  # "ď" is two bytes
    assert tokens.astype(np.uint8).tobytes().decode("utf-8") == LINES[1] + "\n" and entry.metadata == {"speaker": "font_small"}
    assert text_to_tokens("loď").ravel().tolist() == [108, 111, 0xC4, 0x8F, 10]
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert {(e["path"], e["kind"]) for e in errors} == {
        ("train/a/f000.wav", "no text"), ("train/a/f001.wav", "metadata"), ("train/a/missing.wav", "metadata")}
    assert "train/a/f000.wav" not in by_path and "train/a/f001.wav" not in by_path
    assert main(["corpus", "text-tokens", "--corpus", str(corpus), "--out", str(out)]) == 2  # never overwritten
    assert "already exists" in capsys.readouterr().err


def test_the_speech_lms_recipe_trains_on_text_bytes_and_its_loss_falls(tmp_path):
    """recipes/lm_text_bytes.yaml layered over the speech LM's, shrunk to a tiny decoder: the same code
    trains on N_c = 1 byte tokens, its training loss falls, and it beats the uniform byte model."""
    corpus = audio_folder(tmp_path / "corpus", n_per_split=24)
    assert main(["corpus", "text-tokens", "--corpus", str(corpus), "--out", str(tmp_path / "text")]) == 0
    run = tmp_path / "run"
    assert main(["train-lm", "--config", str(REPO / "recipes" / "lm_speech.yaml"),
                 "--config", str(REPO / "recipes" / "lm_text_bytes.yaml"),
                 "--data.tokens_dir", str(tmp_path / "text"), "--trainer.default_root_dir", str(run),
                 "--trainer.max_steps", "40", "--model.total_steps", "40", "--model.warmup_steps", "5",
                 "--model.lr", "1e-2", "--trainer.val_check_interval", "20", "--trainer.log_every_n_steps", "1",
                 "--model.config.d_model", "32", "--model.config.n_layers", "1", "--model.config.n_heads", "2",
                 "--model.config.max_seq_len", "40", "--data.window_frames", "32", "--data.batch_size", "8",
                 "--model.measure_peak", "false", "--trainer.enable_model_summary", "false"]) == 0
    rows = list(csv.DictReader(open(next(run.glob("logs/*/metrics.csv")))))
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    valid = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(train) == 40 and np.mean(train[-5:]) < np.mean(train[:5]) - 1.0, train
    assert valid and valid[-1] < math.log(256) - 2.0, valid
    config = json.loads((run / "pretrained" / "config.json").read_text())["config"]
    assert (config["n_codebooks"], config["codebook_size"], config["codec_fingerprint"]) == (1, 256, TEXT_FINGERPRINT)
