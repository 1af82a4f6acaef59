"""`rvqlm demo` end to end at its smallest settings: the shipped codec and LM on a subset of the
built-in corpus, one short prompt; the report, its clips and metrics.json are checked for content."""

from __future__ import annotations

import json
import math
import re

import pytest

from codec.audio import audio_info, load_audio
from rvqlm.cli import main
from rvqlm.demo import SHIPPED_CODEC

PROMPT_SECONDS, SECONDS = 1.0, 0.5


@pytest.fixture(scope="module")
def demo(corpus_dir, tmp_path_factory):
    """One small demo run: (samples folder, work folder)."""
    root = tmp_path_factory.mktemp("demo")
    code = main(["demo", "--samples", str(root / "samples"), "--work-dir", str(root / "work"),
                 "--corpus", str(corpus_dir), "--corpus-files", "4", "--lm-minutes", "0", "--prompts", "1",
                 "--prompt-seconds", str(PROMPT_SECONDS), "--seconds", str(SECONDS)])
    assert code == 0
    return root / "samples", root / "work"


def test_demo_writes_a_report_whose_clips_exist(demo):
    samples, _ = demo
    page = (samples / "index.html").read_text()
    assert "<title>rvqlm demo: speech codec and LM continuations</title>" in page
    for heading in ("Reconstruction of held-out speech", "Continuations", "Codec reconstructions",
                    "LM continuations", "Held-out negative log-likelihood, valid split (nats/token)"):
        assert f"<h2>{heading}</h2>" in page
    assert "the shipped lm-speech-16k as it is" in page and "plain sampling" in page
    linked = re.findall(r"src='([^']+)'", page)
    stems = ["prompt1-original", "prompt1-recon-1cb", "prompt1-recon-4cb", "prompt1-recon-8cb",
             "prompt1-prompt", "prompt1-continuation"]
    assert sorted(linked) == sorted([f"audio/{s}.wav" for s in stems] + [f"img/{s}.png" for s in stems])
    for rel in linked:
        assert (samples / rel).stat().st_size > 1000, rel
    assert (samples / "img" / "prompt1-original.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_clips_have_the_lengths_asked_for_and_hold_sound(demo):
    samples, _ = demo
    audio = samples / "audio"
    original = audio_info(audio / "prompt1-original.wav")
    assert original.duration >= PROMPT_SECONDS + 1.0  # pick_prompts: at least 1 s more than the prompt
    for k in (1, 4, 8):
        assert audio_info(audio / f"prompt1-recon-{k}cb.wav").frames == original.frames
    frame = 1 / 50  # the shipped codec's frame rate
    assert abs(audio_info(audio / "prompt1-prompt.wav").duration - PROMPT_SECONDS) <= frame
    assert abs(audio_info(audio / "prompt1-continuation.wav").duration - PROMPT_SECONDS - SECONDS) <= frame
    for name in ("prompt1-original", "prompt1-recon-8cb", "prompt1-continuation"):
        wav = load_audio(audio / f"{name}.wav", 16000, 1)
        rms = wav.pow(2).mean().sqrt().item()
        assert 1e-3 < rms < 1.0, (name, rms)


def test_demo_metrics_json_holds_the_report_tables(demo):
    samples, work = demo
    tables = json.loads((samples / "metrics.json").read_text())
    recon, cont, nll = tables.values()
    assert list(tables) == ["Reconstruction of held-out speech", "Continuations",
                            "Held-out negative log-likelihood, valid split (nats/token)"]
    assert [(r["codebooks"], r["kbps"]) for r in recon] == [("1", "0.5"), ("4", "2.0"), ("8", "4.0")]
    mel = [float(r["mel distance"]) for r in recon]
    assert 0 < mel[-1] < mel[0] < 1  # all 8 codebooks reconstruct better than the first alone
    assert len(cont) == 1 and 0 < float(cont[0]["model NLL nats/token"]) < math.log(1024) * 2
    assert [r["codebook"] for r in nll] == [str(c) for c in range(8)]
    lm, unigram = [float(r["LM"]) for r in nll], [float(r["unigram baseline"]) for r in nll]
    assert sum(lm) < sum(unigram) and lm[0] < unigram[0] - 1  # the shipped LM beats the unigram baseline
    tokens = next(work.glob("tokens-4-per-split-*"))  # only the subset was tokenized, under --work-dir
    assert len([f for f in (work / "corpus-4-per-split").rglob("*.wav")]) == 12
    assert tokens.is_dir() and not (work / "lm").exists()  # --lm-minutes 0: no training run


def test_demo_refuses_to_skip_training_when_the_shipped_lm_does_not_fit(tmp_path, corpus_dir, capsys):
    from codec import Codec, CodecConfig

    codec = Codec(CodecConfig(encoder_channels=2, decoder_channels=4, latent_dim=8, n_codebooks=2,
                              codebook_size=16, dilations=(1,))).eval()
    folder = codec.save_pretrained(tmp_path / "codec")
    assert folder != SHIPPED_CODEC
    code = main(["demo", "--samples", str(tmp_path / "samples"), "--work-dir", str(tmp_path / "work"),
                 "--corpus", str(corpus_dir), "--corpus-files", "2", "--codec", str(folder), "--lm-minutes", "0"])
    assert code == 2
    assert "is not an LM trained on this codec's tokens" in capsys.readouterr().err
    assert not list((tmp_path / "work").glob("tokens-*"))  # refused before the slow stages


@pytest.mark.parametrize("flag", [["--lm-minutes", "-1"], ["--corpus-files", "0"], ["--prompts", "0"]])
def test_demo_refuses_bad_settings(tmp_path, flag, capsys):
    assert main(["demo", "--samples", str(tmp_path), *flag]) == 2
    assert "must be" in capsys.readouterr().err
    assert not (tmp_path / "index.html").exists()


def test_demo_fine_tunes_the_shipped_lm_for_its_time_budget(demo, corpus_dir, tmp_path):
    """The path `make demo` takes: the shipped LM fine-tuned with its recipe (here for 6 s, the
    shortest budget), exported, and used for the continuations."""
    _, first_work = demo
    tokens = next(first_work.glob("tokens-4-per-split-*"))  # tokenized by the first run: reused
    samples, work = tmp_path / "samples", tmp_path / "work"
    assert main(["demo", "--samples", str(samples), "--work-dir", str(work), "--corpus", str(corpus_dir),
                 "--corpus-files", "4", "--tokens", str(tokens), "--lm-minutes", "0.05", "--prompts", "1",
                 "--prompt-seconds", str(PROMPT_SECONDS), "--seconds", str(SECONDS)]) == 0
    assert (work / "lm" / "pretrained" / "model.safetensors").is_file()
    assert "LM: the shipped lm-speech-16k fine-tuned for 0.1 min" in (samples / "index.html").read_text()
    nll = json.loads((samples / "metrics.json").read_text())[
        "Held-out negative log-likelihood, valid split (nats/token)"]
    assert len(nll) == 8 and all(0 < float(r["LM"]) < math.log(1024) + 1 for r in nll)
    assert not list(work.glob("tokens-*"))  # --tokens: no second token folder


def test_corpus_subset_links_the_first_files_of_each_split_and_refuses_another(corpus_dir, tmp_path):
    from rvqlm.corpus import CorpusError, corpus_files, corpus_subset

    sub = corpus_subset(corpus_dir, tmp_path / "sub", 2)
    for split in ("train", "valid", "test"):
        files = corpus_files(sub, split)
        first = corpus_files(corpus_dir, split)[:2]
        assert [f.relative_to(sub) for f in files] == [f.relative_to(corpus_dir) for f in first]
        assert all(f.is_symlink() and f.resolve() == (corpus_dir / f.relative_to(sub)).resolve() for f in files)
    assert corpus_subset(corpus_dir, tmp_path / "sub", 2) == sub  # already there: reused
    with pytest.raises(CorpusError, match="another corpus"):
        corpus_subset(corpus_dir, tmp_path / "sub", 3)
    with pytest.raises(ValueError, match=">= 1"):
        corpus_subset(corpus_dir, tmp_path / "other", 0)
