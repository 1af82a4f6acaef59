"""`rvqlm demo` end to end at its smallest settings: the shipped codec and LM on a subset of the
built-in corpus, one short prompt, two foreign-speaker clips from a voices corpus in miniature, and
"Say it" lines from a tiny conditioned LM built here; the report, its clips and metrics.json are
checked for content."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
import sys

import pytest
import torch

from codec.core.audio import audio_info, load_audio, save_audio
from rvqlm.cli import main
from rvqlm.demo.pipeline import REPO, SHIPPED_CODEC, DemoSettings
from rvqlm.demo.foreign_clips import TABLE as FOREIGN_TABLE
from rvqlm.demo.foreign_clips import foreign_speaker_clips, pick_foreign_clips
from rvqlm.demo.say_it import TABLE as SAY_IT_TABLE
from rvqlm.demo.say_it import say_it_clips

PROMPT_SECONDS, SECONDS = 1.0, 0.5
SPEAKER_A, SPEAKER_B = "aa_AA_f_One", "bb_BB_m_Two"
# (split, speaker, name, seconds): lines of a voices corpus in miniature, cut from held-out speech
FAKE_VOICES = (("test", SPEAKER_A, "a-short.wav", 1.0), ("test", SPEAKER_A, "b-fits.wav", 3.2),
               ("test", SPEAKER_B, "a-long.wav", 9.0), ("test", SPEAKER_B, "b-fits.wav", 3.5),
               ("test", SPEAKER_B, "sub/c-fits.wav", 3.1), ("train", "cc_CC_m_Three", "fits.wav", 3.3))
SYSTEMS = ["original", "ours N_c=4", "ours N_c=8", "Opus 6 kbps"]


@pytest.fixture(scope="module")
def fake_voices(speech_files, tmp_path_factory):
    """A prepared voices corpus (rvqlm.corpora.fillets.write_corpus, as `make voices` writes it) of FAKE_VOICES:
    two test speakers with lines too short, too long and 3-8 s, and a training speaker."""
    from rvqlm.corpora.folder import CorpusFile, write_corpus

    root = tmp_path_factory.mktemp("voices")
    speech, files, start = torch.cat([load_audio(f, 16000, 1) for f in speech_files["test"][:40]], dim=1), [], 0
    for split, speaker, name, seconds in FAKE_VOICES:
        n = int(seconds * 16000)
        assert start + n <= speech.shape[1], "not enough held-out speech for the fake voices"
        source = save_audio(root / "src" / speaker / name, speech[:, start:start + n], 16000)
        files.append(CorpusFile(split, speaker, source, f"{split}/{speaker}/{name}"))
        start += n
    return write_corpus(root / "voices", lambda: files, {"sample_rate": 16000}, name="fake voices", license="test",
                        progress=False)


def tiny_lm_config(**overrides):
    """A tiny LM for the shipped codec's tokens, conditioned on text and the corpus's speakers by default."""
    from codec import Codec
    from lm import LMConfig

    base = dict(n_codebooks=8, codebook_size=1024, d_model=16, n_layers=1, n_heads=2, max_seq_len=64,
                codec_fingerprint=Codec.from_pretrained(SHIPPED_CODEC).token_fingerprint(),
                condition={"speakers": ["font_big", "font_small", "font_white"], "encoder_layers": 1})
    return LMConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def tiny_conditioned_lm(tmp_path_factory):
    """A conditioned LM of the shipped codec's tokens, untrained (the section's plumbing, not its sound)."""
    from lm import MultiCodebookLM

    torch.manual_seed(0)
    return MultiCodebookLM(tiny_lm_config()).save_pretrained(tmp_path_factory.mktemp("conditioned") / "lm")


@pytest.fixture(scope="module")
def demo(corpus_dir, fake_voices, tmp_path_factory):
    """One small demo run: (samples folder, work folder)."""
    root = tmp_path_factory.mktemp("demo")
    code = main(["demo", "--samples", str(root / "samples"), "--work-dir", str(root / "work"),
                 "--corpus", str(corpus_dir), "--corpus-files", "4", "--lm-minutes", "0", "--prompts", "1",
                 "--prompt-seconds", str(PROMPT_SECONDS), "--seconds", str(SECONDS),
                 "--voices", str(fake_voices), "--foreign-clips", "2",
                 "--conditioned-lm", str(root / "no-conditioned-lm"), "--masked-lm", str(root / "no-masked-lm")])
    assert code == 0
    return root / "samples", root / "work"


def test_demo_writes_a_report_whose_clips_exist(demo):
    samples, _ = demo
    page = (samples / "index.html").read_text()
    assert "<title>rvqlm demo: speech codec and LM continuations</title>" in page
    for heading in ("Reconstruction of held-out speech", "Continuations", "Codec reconstructions",
                    "LM continuations", "Held-out negative log-likelihood, valid split (nats/token)",
                    "Foreign speakers", FOREIGN_TABLE, "Say it"):
        assert f"<h2>{heading}</h2>" in page
    assert "the shipped lm-speech-16k as it is" in page and "plain sampling" in page
    linked = re.findall(r"src='([^']+)'", page)
    stems = ["prompt1-original", "prompt1-recon-1cb", "prompt1-recon-4cb", "prompt1-recon-8cb",
             "prompt1-prompt", "prompt1-continuation"]
    stems += [f"foreign{i}-{s}" for i in (1, 2) for s in ("original", "4cb", "8cb", "opus")]
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
    recon, _, cont, nll = tables.values()
    assert list(tables) == ["Reconstruction of held-out speech", FOREIGN_TABLE, "Continuations",
                            "Held-out negative log-likelihood, valid split (nats/token)"]
    assert [(r["codebooks"], r["kbps"]) for r in recon] == [("1", "0.5"), ("4", "2.0"), ("8", "4.0")]
    mel = [float(r["mel distance"]) for r in recon]
    assert 0 < mel[-1] < mel[0] < 1  # all 8 codebooks reconstruct better than the first alone
    assert set(recon[0]) == {"clip", "codebooks", "kbps", "mel distance", "STOI", "PESQ"}  # no SI-SDR (issue 38)
    stoi = [float(r["STOI"]) for r in recon]
    # The first codebook alone is the pitch stream (no envelope): all 8 must be intelligible.
    assert 0 <= stoi[0] < stoi[-1] <= 1 and stoi[-1] > 0.6 and 1 <= float(recon[-1]["PESQ"]) <= 4.64
    assert len(cont) == 1 and 0 < float(cont[0]["model NLL nats/token"]) < math.log(1024) * 2
    assert [r["codebook"] for r in nll] == [str(c) for c in range(8)]
    lm, unigram = [float(r["LM"]) for r in nll], [float(r["unigram baseline"]) for r in nll]
    assert sum(lm) < sum(unigram) and lm[0] < unigram[0] - 1  # the shipped LM beats the unigram baseline
    tokens = next(work.glob("tokens-4-per-split-*"))  # only the subset was tokenized, under --work-dir
    assert len([f for f in (work / "corpus-4-per-split").rglob("*.wav")]) == 12
    assert tokens.is_dir() and not (work / "lm").exists()  # --lm-minutes 0: no training run


def test_demo_shows_foreign_speaker_clips_with_their_scores(demo, fake_voices):
    """--foreign-clips 2: one 3-8 s test line per speaker, each a row of original / ours 2 kbps / ours
    4 kbps / Opus 6 kbps with its scores on the page and in metrics.json."""
    samples, _ = demo
    page = (samples / "index.html").read_text()
    section = page.split("<h2>Foreign speakers</h2>")[1].split("<h2>")[0]
    assert section.count("<div class='row'>") == 2 and section.count("<div class='clip'>") == 8
    assert f"original ({SPEAKER_A}/b-fits.wav)" in section and f"original ({SPEAKER_B}/b-fits.wav)" in section
    assert section.count("DNSMOS OVRL (ceiling): ") == 2 and section.count("PESQ-WB: ") == 6
    for label in ("ours at 2 kbps (N_c = 4)", "ours at 4 kbps (N_c = 8)", "Opus at 6 kbps"):
        assert section.count(f"<div class='label'>{label}</div>") == 2
    assert "Opus left out" not in section and "n/a" not in section
    table = json.loads((samples / "metrics.json").read_text())[FOREIGN_TABLE]
    assert [(r["clip"], r["speaker"], r["system"]) for r in table] == [
        (f"foreign{i}", speaker, system) for i, speaker in ((1, SPEAKER_A), (2, SPEAKER_B)) for system in SYSTEMS]
    assert {tuple(r) for r in table} == {("clip", "speaker", "system", "kbps", "STOI", "PESQ-WB", "DNSMOS OVRL")}
    for r in table:
        assert 1 < float(r["DNSMOS OVRL"]) < 5, r
        if r["system"] == "original":
            assert r["kbps"] == r["STOI"] == r["PESQ-WB"] == "-"
        else:
            assert 0.3 < float(r["STOI"]) <= 1 and 1 <= float(r["PESQ-WB"]) <= 4.64, r
    assert [r["kbps"] for r in table if r["system"].startswith("ours")] == ["2.0", "4.0"] * 2
    assert all(5 < float(r["kbps"]) < 7.5 for r in table if r["system"].startswith("Opus"))
    for i, speaker in ((1, SPEAKER_A), (2, SPEAKER_B)):
        frames = audio_info(fake_voices / "test" / speaker / "b-fits.wav").frames
        for s in ("original", "4cb", "8cb", "opus"):  # aligned to the original, cut to its length
            assert audio_info(samples / "audio" / f"foreign{i}-{s}.wav").frames == frames


def test_pick_foreign_clips_takes_each_speaker_in_turn_and_only_3_to_8_s(fake_voices):
    from rvqlm.corpora.folder import CorpusError

    def picked(n, **kw):
        return [f.relative_to(fake_voices).as_posix() for f in pick_foreign_clips(fake_voices, n, **kw)]

    a, b, c = f"test/{SPEAKER_A}/b-fits.wav", f"test/{SPEAKER_B}/b-fits.wav", f"test/{SPEAKER_B}/sub/c-fits.wav"
    assert picked(4) == [a, b, c]  # speaker A has one line that fits; the train split is never used
    assert picked(2) == [a, b] and picked(1) == [a]
    assert picked(4, min_seconds=0.5, max_seconds=1.5) == [f"test/{SPEAKER_A}/a-short.wav"]
    with pytest.raises(CorpusError, match="20-30 s long"):
        pick_foreign_clips(fake_voices, 2, min_seconds=20, max_seconds=30)


def test_foreign_clips_say_n_a_for_a_missing_metric_and_leave_opus_out_without_ffmpeg(fake_voices, tmp_path,
                                                                                      monkeypatch):
    from codec import Codec, CodecConfig

    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=4, latent_dim=8, n_codebooks=2,
                              codebook_size=16, dilations=(1,)))).eval()
    monkeypatch.setenv("PATH", str(tmp_path))  # no ffmpeg on it
    monkeypatch.setitem(sys.modules, "pesq", None)  # as if the pesq package were not installed
    said = []
    done = foreign_speaker_clips(codec, fake_voices, 1, tmp_path / "out", said.append)
    assert [r["system"] for r in done.table] == ["original", "ours N_c=2"]  # the tiny codec's N_c at most 2
    assert done.table[1]["PESQ-WB"] == "n/a" and done.table[1]["DNSMOS OVRL"] != "n/a"
    assert "Opus left out: ffmpeg is not installed" in done.description
    assert "n/a: PESQ-WB (pesq not installed)" in done.description
    assert [len(row) for row in done.rows] == [2] and (tmp_path / "out" / "audio" / "foreign1-2cb.wav").is_file()
    assert len(said) == 1 and said[0].startswith("foreign-speaker clips: 1 scored in ")


def test_foreign_clips_are_one_line_saying_how_to_add_them_without_a_prepared_voices_corpus(tmp_path):
    said = []
    for folder, state in ((tmp_path / "none", "is missing"), (tmp_path, "is incomplete (no corpus.json)")):
        done = foreign_speaker_clips(None, folder, 4, tmp_path / "out", said.append)  # no codec needed
        assert done.rows == [] and done.table == [] and said[-1] == done.description
        assert f"the voices corpus {folder} {state}; add it with `make voices`" in done.description
    assert not (tmp_path / "out").exists()


def test_demo_refuses_to_skip_training_when_the_shipped_lm_does_not_fit(tmp_path, corpus_dir, capsys):
    from codec import Codec, CodecConfig

    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=4, latent_dim=8, n_codebooks=2,
                              codebook_size=16, dilations=(1,)))).eval()
    folder = codec.save_pretrained(tmp_path / "codec")
    assert folder != SHIPPED_CODEC
    code = main(["demo", "--samples", str(tmp_path / "samples"), "--work-dir", str(tmp_path / "work"),
                 "--corpus", str(corpus_dir), "--corpus-files", "2", "--codec", str(folder), "--lm-minutes", "0"])
    assert code == 2
    assert "is not an LM trained on this codec's tokens" in capsys.readouterr().err
    assert not list((tmp_path / "work").glob("tokens-*"))  # refused before the slow stages


def test_by_default_the_demo_writes_only_where_git_ignores():
    """`make demo` leaves `git status` clean: its report, work folder, corpus and tokens lie in folders
    that .gitignore names; the committed example report (samples/) is not one of them."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    s = DemoSettings()
    written = [s.samples_dir / "index.html", s.samples_dir / "audio" / "prompt1-original.wav", s.work_dir / "lm" / "x",
               s.corpus_dir / "corpus.json", REPO / "data" / "tokens" / "fillets-cs-16k-0123456789ab" / "codec.json"]
    example = REPO / "samples" / "index.html"
    paths = [str(p.relative_to(REPO)) for p in written + [example]]
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.split() == paths[:-1]


@pytest.mark.parametrize("flag", [["--lm-minutes", "-1"], ["--corpus-files", "0"], ["--prompts", "0"],
                                  ["--foreign-clips", "-1"]])
def test_demo_refuses_bad_settings(tmp_path, flag, capsys):
    assert main(["demo", "--samples", str(tmp_path), *flag]) == 2
    assert "must be" in capsys.readouterr().err
    assert not (tmp_path / "index.html").exists()


def test_demo_fine_tunes_the_shipped_lm_for_its_time_budget(demo, corpus_dir, tmp_path, capsys, tiny_conditioned_lm):
    """The path `make demo` takes: the shipped LM fine-tuned with its recipe (here for 6 s, the
    shortest budget), exported, and used for the continuations; and on a fresh clone, without the
    voices corpus, the page and the demo's output say in one line how to add the foreign speakers.
    Given a conditioned LM, the page says a held-out line in both voices."""
    _, first_work = demo
    tokens = next(first_work.glob("tokens-4-per-split-*"))  # tokenized by the first run: reused
    samples, work = tmp_path / "samples", tmp_path / "work"
    assert main(["demo", "--samples", str(samples), "--work-dir", str(work), "--corpus", str(corpus_dir),
                 "--corpus-files", "4", "--tokens", str(tokens), "--lm-minutes", "0.05", "--prompts", "1",
                 "--prompt-seconds", str(PROMPT_SECONDS), "--seconds", str(SECONDS),
                 "--voices", str(tmp_path / "no-voices"), "--conditioned-lm", str(tiny_conditioned_lm),
                 "--say-it-lines", "1"]) == 0
    assert (work / "lm" / "pretrained" / "model.safetensors").is_file()
    page = (samples / "index.html").read_text()
    assert "LM: the shipped lm-speech-16k fine-tuned for 0.1 min" in page
    hint = f"the voices corpus {tmp_path / 'no-voices'} is missing; add it with `make voices`"
    assert f"<h2>Foreign speakers</h2><p>Foreign-speaker clips left out: {hint}" in page
    assert [line for line in capsys.readouterr().out.splitlines() if hint in line] != []
    assert "foreign" not in " ".join(re.findall(r"src='([^']+)'", page))
    tables = json.loads((samples / "metrics.json").read_text())
    assert FOREIGN_TABLE not in tables
    section = page.split("<h2>Say it</h2>")[1].split("<h2>")[0]
    assert section.count("<div class='row'>") == 1 and section.count("<div class='clip'>") == 3
    assert [r["voice"] for r in tables[SAY_IT_TABLE]] == ["font_small", "font_big"]
    nll = tables["Held-out negative log-likelihood, valid split (nats/token)"]
    assert len(nll) == 8 and all(0 < float(r["LM"]) < math.log(1024) + 1 for r in nll)
    assert not list(work.glob("tokens-*"))  # --tokens: no second token folder


def test_corpus_subset_links_the_first_files_of_each_split_and_refuses_another(corpus_dir, tmp_path):
    from rvqlm.corpora.folder import CorpusError, corpus_files, corpus_subset

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


def test_without_a_conditioned_lm_the_say_it_section_is_one_line_saying_how_to_get_it(demo):
    samples, work = demo
    page = (samples / "index.html").read_text()
    hint = (f"“Say it” left out: no conditioned LM at {work.parent / 'no-conditioned-lm'}; tokenize the folder of "
            "`rvqlm corpus prepare synthetic` with this codec, train one with `rvqlm train-lm --config "
            "recipes/lm_speech.yaml --config recipes/lm_speech_conditioned.yaml` and give its pretrained/ folder "
            "with --conditioned-lm.")
    assert f"<h2>Say it</h2><p>{html.escape(hint)}</p>" in page
    assert SAY_IT_TABLE not in json.loads((samples / "metrics.json").read_text())


def test_say_it_is_left_out_for_an_lm_that_does_not_fit(tmp_path):
    from lm import MultiCodebookLM
    from rvqlm.demo.pipeline import load_codec

    codec = load_codec(SHIPPED_CODEC)
    cases = {"plain": (tiny_lm_config(condition=None), "is an LM without text and speaker conditioning"),
             "other": (tiny_lm_config(codec_fingerprint="0" * 64), "was trained on another codec's tokens"),
             "no-fish": (tiny_lm_config(condition={"speakers": ["font_big", "font_white"]}),
                         "knows no speaker font_small")}
    for name, (config, why) in cases.items():
        lm = MultiCodebookLM(config).save_pretrained(tmp_path / name)
        said = []
        done = say_it_clips(codec, lm, "unused", 4, tmp_path / "out", say=said.append)
        assert done.rows == [] and done.table == [] and said == [done.description]
        assert done.description.startswith(f"“Say it” left out: {lm} {why}; tokenize the"), done.description
    assert say_it_clips(codec, "unused", "unused", 0, tmp_path / "out", say=said.append).description == \
        "“Say it” left out (0 lines asked for)."
    assert not (tmp_path / "out").exists()


def test_say_it_says_held_out_lines_in_both_voices_with_their_text(tiny_conditioned_lm, corpus_dir, tmp_path):
    from rvqlm.demo.pipeline import load_codec

    codec = load_codec(SHIPPED_CODEC)
    said = []
    done = say_it_clips(codec, tiny_conditioned_lm, corpus_dir, 2, tmp_path, seed=3, say=said.append)
    meta = {json.loads(line)["file_name"]: json.loads(line)
            for line in (corpus_dir / "test" / "metadata.jsonl").read_text().splitlines()}
    assert said[-1].startswith("say it: 2 lines in 2 voices in ")
    assert all("pip install -e '.[bench]'" in hint for hint in said[:-1]) and len(said) <= 2  # no recognizer: a hint
    assert [len(row) for row in done.rows] == [3, 3] and len(done.table) == 4
    for i, row in enumerate(done.rows):
        real, small, big = row
        name = real.label.split(", ")[1].rstrip(")")
        line = meta[name]
        assert real.label.startswith(f"real recording ({'small' if line['speaker'] == 'font_small' else 'big'} fish")
        assert small.label == "small fish (font_small)" and big.label == "big fish (font_big)"
        assert all(clip.metrics["text"] == line["text"] for clip in row)  # the text beside every player
        real_seconds = audio_info(tmp_path / real.wav).duration
        assert 1.5 <= real_seconds <= 6.0
        for clip, voice in ((small, "font_small"), (big, "font_big")):
            seconds = float(clip.metrics["seconds"])
            assert 0 < seconds <= 2 * real_seconds + 0.02  # stopped by its end or by twice the real length
            assert abs(audio_info(tmp_path / clip.wav).duration - max(seconds, 0.02)) <= 0.02
            assert (tmp_path / clip.spectrogram).stat().st_size > 1000
            assert {"line": f"sayit{i + 1}", "voice": voice, "text": line["text"]}.items() <= \
                done.table[2 * i + (voice == "font_big")].items()
