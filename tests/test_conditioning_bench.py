"""benchmarks/conditioning.py (issue 20's measurements) on a tiny conditioned LM, a tiny codec and a
token folder with texts and speakers: its pieces against hand counts and the model's own loss, and
the script end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from benchmarks import conditioning as bench

VOICES = ("font_small", "font_big")
PITCH = {"font_small": 220.0, "font_big": 110.0}  # the real recordings: sine tones, an octave apart
TEXTS = ["Co je to za divnou loď?", "Teď na nic nesahej.", "Já jsem ryba.", "Ahoj!", "Kde to jsme?", "Ne."]


def test_shuffled_texts_leave_no_file_its_own_and_swapped_speakers_exchange_the_voices():
    rng = np.random.default_rng(0)
    for n in (2, 3, 7):
        values = [f"t{i}" for i in range(n)]
        out = bench.shuffled(values, rng)
        assert sorted(out) == values and all(a != b for a, b in zip(values, out))
    table = ["font_big", "font_small", "font_x"]
    out = bench.swapped(["font_small", "font_big", "font_x", ""], VOICES, table, rng)
    assert out[:2] == ["font_big", "font_small"] and out[2] in ("font_big", "font_small") and out[3] == ""


def test_mean_se_pearson_and_semitones_hand_counted():
    mean, se, n = bench.mean_se([1.0, 2.0, 3.0, float("nan")])
    assert (mean, n) == (2.0, 3) and se == pytest.approx(1 / math.sqrt(3))
    assert bench.pearson([1, 2, 3, 4], [2, 4, 6, 8.5]) > 0.99 and math.isnan(bench.pearson([1, 2], [1, 2]))
    assert bench.semitones(220, 110) == pytest.approx(12.0) and math.isnan(bench.semitones(float("nan"), 1))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(root, codec, model, shards): 6 test files (two voices and a third speaker, some longer than the
    LM's 38-frame context), their recordings as sine tones in the corpus folder, an LM of the codec."""
    from codec import Codec, CodecConfig
    from codec.core.audio import save_audio
    from codec.tokenize.folder import codec_meta
    from lm import LMConfig, MultiCodebookLM
    from rvqlm_core.shard_writer import write_token_corpus

    root = tmp_path_factory.mktemp("cond")
    torch.manual_seed(0)
    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=4, latent_dim=8, n_codebooks=3,
                              codebook_size=16, dilations=(1,)))).eval()
    codec.save_pretrained(root / "codec")
    rng = np.random.default_rng(0)
    speakers = ["font_small", "font_big", "font_small", "font_big", "font_x", "font_small"]
    arrays, metadata = {}, {}
    for i, (text, speaker) in enumerate(zip(TEXTS, speakers)):
        path, n = f"test/lvl/f{i}.wav", 20 + 9 * i
        arrays[path] = rng.integers(0, 16, (n, 3)).astype(np.uint16)
        metadata[path] = {"text": text, "speaker": speaker}
        t = torch.arange(int(n / codec.frame_rate * 16000)) / 16000
        save_audio(root / "corpus" / path, 0.3 * torch.sin(2 * math.pi * PITCH.get(speaker, 150.0) * t)[None], 16000)
    arrays["train/lvl/g.wav"] = rng.integers(0, 16, (30, 3)).astype(np.uint16)
    shards = write_token_corpus(root / "tokens", arrays, codec_meta(codec), metadata=metadata)
    torch.manual_seed(1)
    model = MultiCodebookLM(LMConfig(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=4, max_seq_len=40,
                                     codec_fingerprint=codec.token_fingerprint(),
                                     condition={"speakers": ["font_big", "font_small", "font_x"],
                                                "text_max_bytes": 64, "encoder_layers": 1})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)  # large weights: the conditions change the NLL
    model.save_pretrained(root / "lm")
    return root, codec, model, shards


def test_the_reading_summary_counts_each_row_up_to_the_step_of_its_end():
    """Three rows of a 6-step log: ended at step 3 (chosen), at step 2 (forced there), and capped at 6 frames;
    what a row's window does after its end is not counted."""
    from types import SimpleNamespace

    t, f = True, False
    crossed = [[1, 0, 1], [0, 1, 1], [1, 0, 0], [0, 9, 1], [9, 9, 0], [9, 9, 1]]
    pushed = [[f, f, f], [f, t, f], [t, f, f], [f, t, f], [t, t, f], [t, t, t]]
    forced = [[f, f, f], [f, f, f], [f, t, f], [f, t, f], [t, t, f], [t, t, f]]
    window = SimpleNamespace(log=[(torch.tensor(c, dtype=torch.float32), torch.tensor(p), torch.tensor(e))
                                  for c, p, e in zip(crossed, pushed, forced)])
    summary = bench.reading_summary(window, torch.tensor([3, 2, 6]), max_frames=6)
    # row 0, steps 0-3: 2 bytes, 1 push; row 1, steps 0-2: 1 byte, 1 push; row 2, steps 0-5: 4 bytes, 1 push
    assert summary == {"bytes_crossed": 7.0, "pushed_share": 3 / 7, "ends_forced": 1, "ends_chosen": 1, "capped": 1}


def test_nll_by_file_is_the_models_loss_with_the_text_on_the_first_window_only(setup):
    root, _, model, shards = setup
    entries = [i for i, e in enumerate(shards.entries) if e.path.startswith("test/")]
    texts, speakers = TEXTS[:len(entries)], ["font_small"] * len(entries)
    nll, count, head_nll, head_count = bench.nll_by_file(model, shards, entries, texts, speakers, batch_size=3,
                                                         head_frames=38)
    for f, e in enumerate(entries):
        codes = torch.from_numpy(np.asarray(shards.read(shards.entries[e]), dtype=np.int64)).T[None]
        windows = [codes[..., s:s + 38] for s in range(0, codes.shape[-1], 38)]  # max_frames = 40 - 3 + 1
        want = [model.log_likelihood(w, condition=model.condition_inputs(texts[f] if s == 0 else None,
                                                                         "font_small", 1)).item()
                for s, w in enumerate(windows)]
        assert nll[f].sum() == pytest.approx(sum(want), rel=1e-5)
        assert count[f].sum() == 3 * codes.shape[-1]
        assert head_nll[f].sum() == pytest.approx(want[0], rel=1e-5)  # the first 38 frames: the first window
        assert head_count[f].sum() == 3 * min(38, codes.shape[-1])
    assert shards.entries[entries[-1]].n_frames > 38  # a file of two windows was among them


def test_the_benchmark_runs_end_to_end_and_reads_the_real_voices(setup, monkeypatch, capsys):
    root, _, _, _ = setup
    monkeypatch.setattr("rvqlm.quality.metrics.dnsmos", lambda wav, sr: {"dnsmos_ovrl": 1.0 + float(np.abs(wav).mean())})
    out = root / "result.json"
    args = ["--lm", str(root / "lm"), "--codec", str(root / "codec"), "--tokens", str(root / "tokens"),
            "--corpus", str(root / "corpus"), "--max-files", "4", "--cfg", "1", "3", "--max-seconds", "0.4",
            "--head-seconds", "0.5"]
    assert bench.main(args + ["--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1. conditioning gain" in printed and "speakers swapped" in printed and "real: voice distance 11.9" in printed
    result = json.loads(out.read_text())
    gain = result["gain"]
    assert gain["files"] == 6 and set(gain["rows"]) == set(bench.VARIANTS)  # every test file: --gain-files 0
    assert gain["head_frames"] == 25  # 0.5 s at 50 frames/s
    assert gain["rows"]["null"]["head_minus_true"] != 0 and gain["rows"]["true"]["head_minus_true"] == 0
    assert gain["rows"]["true"]["minus_true"] == 0 and gain["rows"]["null"]["minus_true"] != 0
    assert all(len(r["per_codebook"]) == 3 for r in gain["rows"].values())
    assert len(result["lines"]) == 4 and set(result["sweep"]) == {"1", "3"}
    for s in result["sweep"].values():
        for v in VOICES:
            assert s["voices"][v]["real_median_f0"] == pytest.approx(PITCH[v], rel=0.02)
            assert s["voices"][v]["clips"] == 4  # every line in every voice
        assert s["length_lines"] == 4 and 0 <= s["ended_share"] <= 1 and s["dnsmos"] >= 1.0
    assert result["real"]["dnsmos"][0] > 1.0 and result["max_generated_seconds"] == pytest.approx(0.4)


def test_the_benchmark_refuses_an_unconditioned_lm_and_an_unknown_voice(setup, tmp_path):
    from lm import LMConfig, MultiCodebookLM

    root, codec, _, _ = setup
    MultiCodebookLM(LMConfig(n_codebooks=3, codebook_size=16, d_model=16, n_layers=1, n_heads=2, max_seq_len=40,
                             codec_fingerprint=codec.token_fingerprint())).save_pretrained(tmp_path / "plain")
    args = ["--codec", str(root / "codec"), "--tokens", str(root / "tokens"), "--corpus", str(root / "corpus")]
    with pytest.raises(ValueError, match="is not a conditioned LM"):
        bench.main(["--lm", str(tmp_path / "plain"), *args])
    with pytest.raises(ValueError, match="unknown speaker 'font_nobody'; this LM knows: font_big, font_small, font_x"):
        bench.main(["--lm", str(root / "lm"), *args, "--voices", "font_small", "font_nobody"])
