"""benchmarks/masked_vs_ar.py (issue 21's measurements) on a tiny codec, a tiny AR LM and a tiny masked
LM of its tokens: the call counts against the decoders' own schedules, the bound against hand numbers,
and the script end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks import masked_vs_ar as bench
from lm.generate import generate
from lm.masked_generate import MaskedDecoding
from lm.sampling import SamplingOptions


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(root, ar, masked): a codec of 2 codebooks x 16, test files of 30..80 frames, both LMs of its tokens."""
    from codec import Codec, CodecConfig
    from codec.tokenize.folder import codec_meta
    from lm import LMConfig, MaskedLM, MultiCodebookLM
    from rvqlm_core.shard_writer import write_token_corpus

    root = tmp_path_factory.mktemp("masked_bench")
    torch.manual_seed(0)
    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=4, latent_dim=8, n_codebooks=2,
                              codebook_size=16, dilations=(1,)))).eval()
    codec.save_pretrained(root / "codec")
    rng = np.random.default_rng(0)
    arrays = {f"{split}/lvl/f{i}.wav": rng.integers(0, 16, (30 + 10 * i, 2)).astype(np.uint16)
              for split in ("train", "test") for i in range(6)}
    write_token_corpus(root / "tokens", arrays, codec_meta(codec))
    fp = codec.token_fingerprint()
    common = dict(n_codebooks=2, codebook_size=16, d_model=16, n_layers=1, n_heads=2, codec_fingerprint=fp)
    ar = MultiCodebookLM(LMConfig(max_seq_len=24, **common)).eval()
    masked = MaskedLM(LMConfig(max_seq_len=24, pattern="parallel", family="masked", **common)).eval()
    ar.save_pretrained(root / "ar")
    masked.save_pretrained(root / "masked")
    return root, ar, masked


def test_call_counts_are_what_the_decoders_make(setup):
    from lm.masked_generate import model_calls

    _, ar, masked = setup
    calls = []  # the prefill's forward, then one decode_step per step (lm.decode_step)
    ar_forward, ar_step = ar.forward, ar.decode_step
    ar.forward = lambda *a, **k: calls.append("forward") or ar_forward(*a, **k)
    ar.decode_step = lambda *a, **k: calls.append("step") or ar_step(*a, **k)
    try:
        generate(ar, torch.zeros(1, 2, 5, dtype=torch.long), 30, sampling=SamplingOptions(greedy=True))
    finally:
        del ar.forward, ar.decode_step
    assert calls[0] == "forward" and set(calls[1:]) <= {"step"}
    assert len(calls) == bench.ar_calls(ar, 5, 30) == 30 + 1  # one per frame, and the delay pattern's tail
    steps = []
    generate(masked, torch.zeros(1, 2, 5, dtype=torch.long), 30,
             options=MaskedDecoding(steps=[3, 2], window=24, on_step=steps.append))
    assert len(steps) == model_calls(5, 30, 24, [3, 2]) == 2 * 5  # two 24-frame chunks x (3 + 2) steps


def test_the_bound_is_the_longer_of_flops_and_weight_reads(setup):
    _, ar, _ = setup
    n = sum(p.numel() for p in ar.parameters())
    m = bench.matmul_params(ar)
    one = bench.bound(ar, calls=10, frames_per_call=1, batch=1, peak=1e9, bandwidth=1e9)
    assert one["flops_s"] == pytest.approx(2 * m * 10 / 1e9) and one["weights_s"] == pytest.approx(4 * n * 10 / 1e9)
    assert one["bound"] == "weight reads"  # 2 FLOPs per parameter against 4 bytes
    wide = bench.bound(ar, calls=10, frames_per_call=300, batch=8, peak=1e9, bandwidth=1e9)
    assert wide["bound"] == "arithmetic"
    assert bench.memory_bandwidth(1 << 20, 1) > 0


def test_the_script_measures_both_families_end_to_end(setup, tmp_path, capsys, monkeypatch):
    """End to end, DNSMOS replaced by the clip's RMS (speechmos takes seconds a clip; its wrapper has its own tests)."""
    import rvqlm.quality.metrics

    monkeypatch.setattr(rvqlm.quality.metrics, "dnsmos", lambda wav, rate: {"dnsmos_ovrl": float(np.sqrt(np.mean(wav ** 2)))})
    root, _, _ = setup
    out = tmp_path / "r.json"
    assert bench.main(["--masked", str(root / "masked"), "--ar", str(root / "ar"), "--codec", str(root / "codec"),
                       "--tokens", str(root / "tokens"), "--prompts", "2", "--timing-prompts", "2",
                       "--prompt-seconds", "0.2", "--seconds", "0.6", "--batch-sizes", "1,2", "--steps", "4,2",
                       "--sweep", "8", "--one-pass", "--ratios", "0.5,1", "--score-windows", "4", "--json", str(out),
                       "--choice-temperature", "0", "--choice-sweep", "3", "--step-lists", "2"]) == 0
    result = json.loads(out.read_text())
    speed = {(r["family"], r["batch"]): r for r in result["speed"]}
    assert set(speed) == {(f, b) for f in ("AR (KV cache)", "masked", "masked 1 pass") for b in (1, 2)}
    assert speed[("AR (KV cache)", 1)]["calls_per_audio_s"] == pytest.approx((30 + 1) / 0.6)
    assert speed[("masked", 1)]["calls_per_audio_s"] == pytest.approx(3 * 6 / 0.6)  # 3 chunks x (4 + 2) steps
    assert speed[("masked 1 pass", 1)]["calls_per_audio_s"] == pytest.approx((4 + 2) / 0.6)  # one 40-frame window
    assert speed[("AR (KV cache)", 1)]["vs_ar"] == 1.0 and speed[("masked", 2)]["vs_ar"] > 0
    masked_rows = {f"{v} {s} tau {t}" for v in ("masked", "masked 1 pass") for s in ("4,2", "8,2", "2,1") for t in (0, 3)}
    assert set(result["quality"]) == {"AR (KV cache)", "real audio"} | masked_rows
    for q in result["quality"].values():
        assert q["prompts"] >= 1 and 0 <= q["rep_share"] <= 1 and np.isfinite(q["nll"]) and q["dnsmos_ovrl"] > 0
    ar, row = result["quality"]["AR (KV cache)"], result["quality"]["masked 2,1 tau 3"]
    for ref, table in (("AR (KV cache)", ar), ("masked 4,2 tau 0", result["quality"]["masked 4,2 tau 0"])):
        assert set(result["paired"][ref]) == masked_rows - {ref}
        mean, se, n = result["paired"][ref]["masked 2,1 tau 3"]["silence"]
        assert n == 2 and mean == pytest.approx(row["silence"] - table["silence"]) and se >= 0
    assert set(result["masked_nll"]) == {"0.5", "1.0"} and len(result["masked_nll"]["0.5"]) == 2
    printed = capsys.readouterr().out
    assert "calls/audio s" in printed and "masked NLL at ratio 0.5" in printed
