"""Generation with the KV cache: pattern honoured, prompt forced, cache == recompute, past the context."""

from __future__ import annotations

import collections
import functools

import pytest
import torch

from lm import LMConfig, MultiCodebookLM
from lm.ar_decode import ARDecoding, iter_decode, plan_generation
from lm.generate import generate
from lm.sampling import SamplingOptions, sample_next

N_C, V = 3, 16


def tiny_lm(pos: str = "rope", pattern: str = "delay", max_seq_len: int = 16, seed: int = 0,
            n_layers: int = 2) -> MultiCodebookLM:
    """A 2-layer (default) model with large random weights, so its choices depend strongly on the context
    (at the N(0, 0.02) init every logit is ~0 and a broken cache could go unnoticed)."""
    torch.manual_seed(seed)
    cfg = LMConfig(n_codebooks=N_C, codebook_size=V, d_model=32, n_layers=n_layers, n_heads=4,
                   max_seq_len=max_seq_len, pos=pos, pattern=pattern)
    model = MultiCodebookLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model.eval()


def prompt(b: int = 2, t0: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, N_C, t0), generator=torch.Generator().manual_seed(seed))


def greedy(logits):
    return logits.argmax(-1)


# ---- shapes, prompt and pattern ---------------------------------------------------------------

def test_output_shape_prompt_kept_and_codes_in_range():
    model = tiny_lm()
    p = prompt()
    out = generate(model, p, 9, sampling=SamplingOptions(temperature=0.9, top_k=8, top_p=0.9, seed=0))
    assert out.shape == (2, N_C, 4 + 9) and out.dtype == torch.long
    assert torch.equal(out[..., :4], p)
    assert out.min() >= 0 and out.max() < V  # no pad / bos leaks into the codes
    assert len(out[..., 4:].unique()) > 3  # it really generated something varied


def test_prompt_frames_are_forced_not_sampled():
    # Build a prompt that greedy decoding would never produce: the model's own greedy continuation
    # of a 1-frame prompt, with frame 1 replaced by codes differing from it.
    model = tiny_lm()
    p1 = prompt(1, 1)
    own = generate(model, p1, 3, sampling=SamplingOptions(greedy=True))
    forced = own[..., :3].clone()
    forced[..., 1] = (own[..., 1] + 1) % V
    out = generate(model, forced, 2, sampling=SamplingOptions(greedy=True))
    assert torch.equal(out[..., :3], forced)


def test_delay_pattern_codebook_k_at_step_s_is_frame_s_minus_k():
    model = tiny_lm()
    plan = plan_generation(model, prompt(1, 2), 5)
    collections.deque(iter_decode(model, plan, greedy), maxlen=0)  # run every step; the plan holds the result
    seq, codes = plan.seq[0], model.pattern.revert(plan.seq)[0]  # [N_c, S], [N_c, T]
    t = codes.shape[-1]
    for k in range(N_C):
        for s in range(seq.shape[-1]):
            frame = s - k
            expected = codes[k, frame] if 0 <= frame < t else model.config.pad_id
            assert seq[k, s] == expected
    # The forced mask: invalid slots and the 2 prompt frames; the first step to sample is frame 2's.
    assert plan.first_step == 2
    assert plan.forced[:, :2].all() and plan.forced[1, 2] and plan.forced[2, 3]
    assert not plan.forced[0, 2] and not plan.forced[1, 3]


def test_zero_new_frames_returns_the_prompt():
    model = tiny_lm()
    p = prompt(2, 3)
    assert torch.equal(generate(model, p, 0, sampling=SamplingOptions(greedy=True)), p)


def test_unconditional_generation_starts_from_bos():
    model = tiny_lm()
    out = generate(model, None, 6, sampling=SamplingOptions(greedy=True), batch_size=3)
    assert out.shape == (3, N_C, 6)
    assert (out == out[:1]).all()  # greedy from the same bos: identical rows
    plan = plan_generation(model, torch.zeros(1, N_C, 0, dtype=torch.long), 6)
    first = next(iter_decode(model, plan, greedy))
    bos = torch.full((1, N_C, 1), model.config.bos_id)
    with torch.no_grad():
        assert torch.allclose(first.logits, model(bos)[:, :, 0], atol=1e-6)
    assert torch.equal(generate(model, torch.zeros(3, N_C, 0, dtype=torch.long), 6,
                                sampling=SamplingOptions(greedy=True)), out)


def test_batch_rows_are_independent():
    model = tiny_lm()
    p = prompt(3, 3)
    together = generate(model, p, 7, sampling=SamplingOptions(greedy=True))
    alone = torch.cat([generate(model, p[i:i + 1], 7, sampling=SamplingOptions(greedy=True)) for i in range(3)])
    assert torch.equal(together, alone)


# ---- determinism ------------------------------------------------------------------------------

def test_greedy_is_deterministic_and_equals_top_k_1():
    model = tiny_lm()
    p = prompt()
    a = generate(model, p, 10, sampling=SamplingOptions(greedy=True))
    b = generate(model, p, 10, sampling=SamplingOptions(greedy=True))
    c = generate(model, p, 10, sampling=SamplingOptions(temperature=2.0, top_k=1, seed=5))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_fixed_seed_is_reproducible():
    model = tiny_lm()
    p = prompt()
    kw = dict(temperature=1.5, top_k=10, top_p=0.95)
    a = generate(model, p, 12, sampling=SamplingOptions(seed=3, **kw))
    b = generate(model, p, 12, sampling=SamplingOptions(**kw), generator=torch.Generator().manual_seed(3))
    c = generate(model, p, 12, sampling=SamplingOptions(seed=4, **kw))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


# ---- KV cache against full recompute ----------------------------------------------------------

def collect(model, plan, use_cache, sink=True):
    steps = list(iter_decode(model, plan, greedy, use_cache=use_cache, sink=sink))
    return torch.stack([s.logits for s in steps], dim=2), plan.seq.clone()  # [B, N_c, n_steps, V]


LOGIT_ATOL = 1e-4  # float32; the two paths differ only in summation order (observed ~1e-6)


@pytest.mark.parametrize("pos", ["rope", "learned", "sinusoidal"])
@pytest.mark.parametrize("pattern", ["delay", "parallel"])
def test_cached_generation_equals_full_recompute_inside_the_context(pos, pattern):
    model = tiny_lm(pos, pattern, max_seq_len=24)
    p = prompt(2, 5)
    with torch.no_grad():
        plan_c = plan_generation(model, p, 12)
        logits_c, seq_c = collect(model, plan_c, use_cache=True)
        plan_r = plan_generation(model, p, 12)
        logits_r, seq_r = collect(model, plan_r, use_cache=False)
        assert torch.equal(seq_c, seq_r)  # greedy: same tokens
        assert torch.allclose(logits_c, logits_r, atol=LOGIT_ATOL, rtol=0)
        # ... and both equal ONE full forward pass over the final sequence.
        inputs = torch.cat([torch.full_like(seq_c[..., :1], model.config.bos_id), seq_c[..., :-1]], dim=-1)
        full = model(inputs)[:, :, plan_c.first_step:]
        assert torch.allclose(logits_c, full, atol=LOGIT_ATOL, rtol=0)


def test_each_cached_step_feeds_one_position_after_the_prefill(monkeypatch):
    model = tiny_lm(max_seq_len=32)
    lengths = []  # positions of each forward (the prefill) and of each decode_step (the steps after it)
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: lengths.append(("forward", args[0].shape[-1])),
                                             with_kwargs=True)
    step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda tokens, *a: lengths.append(("step", tokens.shape[-1]))
                        or step(tokens, *a))
    try:
        generate(model, prompt(2, 6), 10, sampling=SamplingOptions(greedy=True))
    finally:
        handle.remove()
    n_steps = model.pattern.sequence_length(16) - 6
    assert lengths == [("forward", 6 + 1)] + [("step", 1)] * (n_steps - 1)


# ---- past the trained context -----------------------------------------------------------------

def inputs_of(model, seq):
    """The model inputs of a filled pattern sequence [B, N_c, S]: bos, then seq shifted right by one."""
    return torch.cat([torch.full_like(seq[..., :1], model.config.bos_id), seq[..., :-1]], dim=-1)


def fresh_window(inputs, s, w):
    """What a training window ending at step s holds: bos + the last w - 1 inputs (positions 0..w-1)."""
    return inputs[..., :s + 1] if s < w else torch.cat([inputs[..., :1], inputs[..., s + 2 - w:s + 1]], dim=-1)


@pytest.mark.parametrize("pos", ["rope", "learned", "sinusoidal"])
def test_past_the_context_each_step_sees_a_fresh_training_window_with_bos(pos):
    """The default (sink=True), 1 layer: every step, inside the context and 3x past it, gives the logits of a plain
    forward over [bos] + the last w - 1 inputs at positions 0..w-1 (what training shows): the RoPE sink cache
    and the additive-position recompute both keep bos in view. Cached == recompute, same greedy tokens."""
    w = 10
    model = tiny_lm(pos, max_seq_len=w, n_layers=1)
    p = prompt(2, 3)
    with torch.no_grad():
        plan_c = plan_generation(model, p, 30)  # 32 steps, 3x the context
        logits_c, seq_c = collect(model, plan_c, use_cache=True)
        plan_r = plan_generation(model, p, 30)
        logits_r, seq_r = collect(model, plan_r, use_cache=False)
        assert torch.equal(seq_c, seq_r)
        assert torch.allclose(logits_c, logits_r, atol=LOGIT_ATOL, rtol=0)
        inputs = inputs_of(model, seq_c)
        for s in range(plan_c.first_step, seq_c.shape[-1]):
            expected = model(fresh_window(inputs, s, w))[:, :, -1]
            assert torch.allclose(logits_c[:, :, s - plan_c.first_step], expected, atol=LOGIT_ATOL, rtol=0), s
    out = model.pattern.revert(seq_c)
    assert out.shape == (2, N_C, 33) and out.max() < V
    assert len(out[..., 3 + w:].unique()) > 3  # still generating varied codes far past the context


def test_rope_sink_generation_with_several_layers_matches_inside_and_differs_from_the_plain_ring_past():
    """2 layers: inside the context the sink cache is the plain causal pass; past it, keeping bos in view changes
    the logits against the plain ring (bos dropped), whose tokens from the first step past the context on differ."""
    w = 10
    model = tiny_lm("rope", max_seq_len=w)
    p = prompt(2, 3)
    with torch.no_grad():
        plan_s = plan_generation(model, p, 30)
        logits_s, seq_s = collect(model, plan_s, use_cache=True)
        plan_p = plan_generation(model, p, 30)
        logits_p, seq_p = collect(model, plan_p, use_cache=True, sink=False)
        inside = w - plan_s.first_step
        full = model(inputs_of(model, seq_s)[..., :w])[:, :, plan_s.first_step:]
        assert torch.allclose(logits_s[:, :, :inside], full, atol=LOGIT_ATOL, rtol=0)
        assert torch.equal(seq_s[..., :w], seq_p[..., :w]) and torch.allclose(logits_s[:, :, :inside],
                                                                              logits_p[:, :, :inside], atol=LOGIT_ATOL)
        assert not torch.allclose(logits_s[:, :, inside], logits_p[:, :, inside], atol=1e-2)
    assert torch.equal(generate(model, p, 30,
                                sampling=SamplingOptions(greedy=True)), model.pattern.revert(seq_s))  # sink is the default
    assert torch.equal(generate(model, p, 30, sampling=SamplingOptions(greedy=True),
                                options=ARDecoding(sink=False)), model.pattern.revert(seq_p))


def test_rope_plain_ring_runs_past_the_context_and_equals_sliding_window_recompute():
    """sink=False: the plain ring cache equals the sliding-window recompute and one windowed full forward."""
    w = 10
    model = tiny_lm("rope", max_seq_len=w)
    p = prompt(2, 3)
    with torch.no_grad():
        plan_c = plan_generation(model, p, 30)  # 32 steps, 3x the context
        logits_c, seq_c = collect(model, plan_c, use_cache=True, sink=False)
        plan_r = plan_generation(model, p, 30)
        logits_r, seq_r = collect(model, plan_r, use_cache=False, sink=False)
        assert torch.equal(seq_c, seq_r)
        assert torch.allclose(logits_c, logits_r, atol=LOGIT_ATOL, rtol=0)
        # One windowed forward over everything gives the same logits: the plain ring cache IS a sliding window.
        full = model(inputs_of(model, seq_c), window=w)[:, :, plan_c.first_step:]
        assert torch.allclose(logits_c, full, atol=LOGIT_ATOL, rtol=0)
    out = model.pattern.revert(seq_c)
    assert out.shape == (2, N_C, 33) and out.max() < V
    assert len(out[..., 3 + w:].unique()) > 3


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
@pytest.mark.parametrize("sink", [True, False])
def test_additive_positions_slide_a_recomputed_window_past_the_context(pos, sink):
    w = 10
    model = tiny_lm(pos, max_seq_len=w)
    p = prompt(2, 3)
    with torch.no_grad():
        plan = plan_generation(model, p, 25)
        logits, seq = collect(model, plan, use_cache=True, sink=sink)
        inputs = inputs_of(model, seq)
        # A step s past the context sees w inputs at positions 0..w-1: bos + the last w - 1 (sink), or the last w.
        for s in (w, w + 7, seq.shape[-1] - 1):
            window = fresh_window(inputs, s, w) if sink else inputs[..., s + 1 - w:s + 1]
            expected = model(window)[:, :, -1]
            assert torch.allclose(logits[:, :, s - plan.first_step], expected, atol=LOGIT_ATOL, rtol=0)
        # Inside the context the cache is used and matches the plain forward.
        assert torch.allclose(logits[:, :, :w - plan.first_step], model(inputs[..., :w])[:, :, plan.first_step:],
                              atol=LOGIT_ATOL, rtol=0)
    out = generate(model, p, 25, sampling=SamplingOptions(greedy=True), options=ARDecoding(use_cache=False, sink=sink))
    assert torch.equal(out, model.pattern.revert(seq))


def test_prefill_reaching_past_the_context_with_the_sink_cache():
    """A parallel-pattern prompt can fill the whole context, so the prefill chunk crosses the window: the model
    feeds the part past it one position at a time and the result still equals the fresh-window recompute."""
    w = 8
    model = tiny_lm("rope", pattern="parallel", max_seq_len=w, n_layers=1)
    p = prompt(1, w)
    with torch.no_grad():
        plan_c = plan_generation(model, p, 6)
        assert plan_c.first_step + 1 > w  # the prefill is longer than the window
        logits_c, seq_c = collect(model, plan_c, use_cache=True)
        logits_r, seq_r = collect(model, plan_generation(model, p, 6), use_cache=False)
    assert torch.equal(seq_c, seq_r)
    assert torch.allclose(logits_c, logits_r, atol=LOGIT_ATOL, rtol=0)


# ---- bookkeeping and errors -------------------------------------------------------------------

def test_training_mode_is_restored_and_progress_bar_reports_rtf(capsys):
    model = tiny_lm().train()
    generate(model, prompt(1, 2), 5, sampling=SamplingOptions(greedy=True), progress=True, frame_rate=50)
    assert model.training
    err = capsys.readouterr().err
    assert "5/5" in err and "frame" in err and "rtf=" in err


def test_sampler_is_the_one_from_lm_sampling():
    # generate's draw for the first step equals sample_next on the same logits with the same generator.
    model = tiny_lm()
    p = prompt(1, 3)
    plan = plan_generation(model, p, 1)
    g = torch.Generator().manual_seed(11)
    choose = functools.partial(sample_next, temperature=0.7, top_k=5, top_p=0.8, greedy=False, generator=g)
    with torch.no_grad():
        step = next(iter_decode(model, plan, choose))
    out = generate(model, p, 1, sampling=SamplingOptions(temperature=0.7, top_k=5, top_p=0.8, seed=11))
    assert out[0, 0, 3] == step.tokens[0, 0]


@pytest.mark.parametrize(
    "codes, n, kwargs, match",
    [
        (torch.zeros(1, N_C, 15, dtype=torch.long), 1, {}, "context holds at most 14"),
        (torch.zeros(1, N_C + 1, 2, dtype=torch.long), 1, {}, "shape"),
        (torch.zeros(1, N_C, 2), 1, {}, "integer"),
        (torch.full((1, N_C, 2), V), 1, {}, r"0\.\.15"),
        (torch.zeros(1, N_C, 2, dtype=torch.long), -1, {}, "max_new_frames"),
        (torch.zeros(1, N_C, 2, dtype=torch.long), 1, dict(temperature=0.0), "temperature"),
        (torch.zeros(1, N_C, 2, dtype=torch.long), 1, dict(top_p=2.0), "top-p"),
        (torch.zeros(1, N_C, 2, dtype=torch.long), 1, dict(top_k=0), "top-k"),
    ],
)
def test_bad_requests_raise_clear_errors(codes, n, kwargs, match):
    model = tiny_lm(max_seq_len=16)
    with pytest.raises(ValueError, match=match):
        generate(model, codes, n, sampling=SamplingOptions(**kwargs))


# ---- the `rvqlm generate` command -------------------------------------------------------------

CLI_NC, CLI_V = 2, 16


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    """A tiny random codec (16 kHz, 50 frames/s, 2 codebooks of 16) and a tiny LM on its tokens."""
    from codec import Codec, CodecConfig

    root = tmp_path_factory.mktemp("pair")
    torch.manual_seed(0)
    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=2, latent_dim=8, n_codebooks=CLI_NC,
                              codebook_size=CLI_V, dilations=(1,)))).eval()
    codec.save_pretrained(root / "codec")
    cfg = LMConfig(n_codebooks=CLI_NC, codebook_size=CLI_V, d_model=16, n_layers=1, n_heads=2, max_seq_len=40,
                   codec_fingerprint=codec.token_fingerprint())
    MultiCodebookLM(cfg).save_pretrained(root / "lm")
    other = LMConfig(**{**cfg.to_dict(), "codec_fingerprint": "0" * 64})
    MultiCodebookLM(other).save_pretrained(root / "lm_other_codec")
    wider = LMConfig(**{**cfg.to_dict(), "codebook_size": 2 * CLI_V})
    MultiCodebookLM(wider).save_pretrained(root / "lm_other_vocab")
    return root


def run_cli(*argv):
    from rvqlm.cli import main

    return main(["generate", *map(str, argv)])


def wav_seconds(path) -> float:
    from codec.core.audio import audio_info

    return audio_info(path).duration


def test_cli_continues_a_real_speech_prompt(saved_pair, speech_files, tmp_path, capsys):
    prompt = speech_files["test"][0]
    out = tmp_path / "gen" / "out.wav"
    rc = run_cli("--lm", saved_pair / "lm", "--codec", saved_pair / "codec", "--prompt", prompt,
                 "--prompt-seconds", 0.3, "--seconds", 0.2, "--out", out, "--seed", 1, "--top-k", 8,
                 "--top-p", 0.9, "--temperature", 0.8, "--threads", 1, "--no-progress")
    assert rc == 0
    assert wav_seconds(out) == pytest.approx(0.2)  # 10 frames of 20 ms
    assert wav_seconds(tmp_path / "gen" / "out.full.wav") == pytest.approx(0.5)  # 15 prompt + 10 new frames
    printed = capsys.readouterr().out
    assert "real-time factor" in printed and "out.full.wav" in printed
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["out.full.wav", "out.wav"]  # no temp files


def test_cli_several_samples_are_numbered_and_seeded(saved_pair, speech_files, tmp_path):
    prompt = speech_files["test"][0]
    common = ("--lm", saved_pair / "lm", "--codec", saved_pair / "codec", "--prompt", prompt,
              "--prompt-seconds", 0.2, "--seconds", 0.1, "--num-samples", 3, "--seed", 7, "--no-progress")
    assert run_cli(*common, "--out", tmp_path / "a" / "x.wav") == 0
    assert run_cli(*common, "--out", tmp_path / "b" / "x.wav") == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["x-1.full.wav", "x-1.wav", "x-2.full.wav", "x-2.wav", "x-3.full.wav", "x-3.wav"]
    for name in names:  # same seed, same files
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_cli_without_prompt_writes_only_the_generation(saved_pair, tmp_path):
    out = tmp_path / "free.wav"
    assert run_cli("--lm", saved_pair / "lm", "--codec", saved_pair / "codec", "--seconds", 0.1,
                   "--out", out, "--greedy", "--no-progress") == 0
    assert wav_seconds(out) == pytest.approx(0.1)
    assert [p.name for p in tmp_path.iterdir()] == ["free.wav"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--temperature", 0), "temperature must be > 0"),
        (("--temperature", -0.5), "temperature must be > 0"),
        (("--top-p", 1.5), "top-p must be in (0, 1]"),
        (("--top-p", 0), "top-p must be in (0, 1]"),
        (("--top-k", 0), "top-k must be an integer >= 1"),
        (("--seconds", 0), "--seconds must be > 0"),
        (("--num-samples", 0), "--num-samples must be >= 1"),
        (("--threads", 0), "--threads must be >= 1"),
        (("--prompt-seconds", 1), "--prompt-seconds needs --prompt"),
    ],
)
def test_cli_bad_sampling_requests(saved_pair, tmp_path, capsys, extra, message):
    rc = run_cli("--lm", saved_pair / "lm", "--codec", saved_pair / "codec", "--out", tmp_path / "o.wav",
                 "--no-progress", *extra)
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqlm generate: error:") and message in err
    assert not any(tmp_path.iterdir())


def test_cli_generates_past_the_lm_context(saved_pair, tmp_path):
    # The LM's context is 40 positions (39 frames); 1.2 s is 60 frames: the RoPE ring cache slides on.
    out = tmp_path / "long.wav"
    assert run_cli("--lm", saved_pair / "lm", "--codec", saved_pair / "codec", "--seconds", 1.2,
                   "--out", out, "--seed", 0, "--no-progress") == 0
    assert wav_seconds(out) == pytest.approx(1.2)


def test_cli_greedy_accepts_zero_temperature(saved_pair, tmp_path):
    assert run_cli("--lm", saved_pair / "lm", "--codec", saved_pair / "codec", "--out", tmp_path / "o.wav",
                   "--greedy", "--temperature", 0, "--seconds", 0.04, "--no-progress") == 0


def test_cli_refuses_a_prompt_longer_than_the_context(saved_pair, speech_files, tmp_path, capsys):
    # max_seq_len 40 with 2 codebooks (delay) holds 39 frames = 0.78 s; the corpus file is longer.
    rc = run_cli("--lm", saved_pair / "lm", "--codec", saved_pair / "codec", "--prompt", speech_files["test"][0],
                 "--out", tmp_path / "o.wav", "--no-progress")
    assert rc == 2
    err = capsys.readouterr().err
    assert "context holds at most 39 frames (0.78 s" in err and "--prompt-seconds 0.78 or less" in err


@pytest.mark.parametrize("which", ["missing", "not_a_codec", "other_codec", "other_vocab"])
def test_cli_refuses_a_wrong_codec(saved_pair, tmp_path, capsys, which):
    lm_dir, codec_dir = saved_pair / "lm", saved_pair / "codec"
    if which == "missing":
        codec_dir, message = tmp_path / "nowhere", "no codec folder at"
    elif which == "not_a_codec":
        codec_dir, message = tmp_path / "empty", "is not a saved codec: config.json is missing"
        codec_dir.mkdir()
    elif which == "other_codec":
        lm_dir, message = saved_pair / "lm_other_codec", "codec mismatch: the LM was trained on tokens of codec 0000"
    else:
        lm_dir, message = saved_pair / "lm_other_vocab", "2 codebooks of 16 codes, the LM models N_c=2 of 32"
    rc = run_cli("--lm", lm_dir, "--codec", codec_dir, "--out", tmp_path / "o.wav", "--no-progress")
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.wav").exists()


# ---- a conditioned LM on the command line (issue 20) ----------------------------------------------

@pytest.fixture(scope="module")
def cond_lm(saved_pair):
    """A tiny conditioned LM on the tiny codec's tokens, trained until speaker font_small's files (all
    code 3, 5 frames, then the end) are what it says: greedy generation stops by itself after 0.1 s."""
    from codec import Codec

    codec = Codec.from_pretrained(saved_pair / "codec")
    torch.manual_seed(0)
    cfg = LMConfig(n_codebooks=CLI_NC, codebook_size=CLI_V, d_model=16, n_layers=1, n_heads=2, max_seq_len=40,
                   codec_fingerprint=codec.token_fingerprint(),
                   condition={"speakers": ["font_small", "font_big"], "text_max_bytes": 16, "encoder_layers": 1,
                              "text_dropout": 0.0, "speaker_dropout": 0.0})
    model = MultiCodebookLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    codes = torch.full((1, CLI_NC, 5), 3)
    cond = model.condition_inputs("ahoj", "font_small", 1)
    for _ in range(150):
        opt.zero_grad()
        model.loss(codes, None, cond, torch.tensor([True])).loss.backward()
        opt.step()
    model.save_pretrained(saved_pair / "lm_cond")
    return saved_pair / "lm_cond"


def test_cli_says_a_text_in_a_voice_and_stops_by_itself(saved_pair, cond_lm, tmp_path, capsys):
    out = tmp_path / "say.wav"
    assert run_cli("--lm", cond_lm, "--codec", saved_pair / "codec", "--text", "ahoj", "--speaker", "font_small",
                   "--cfg", 1, "--greedy", "--seconds", 0.6, "--out", out, "--no-progress") == 0
    assert wav_seconds(out) == pytest.approx(0.1)  # 5 frames of 20 ms, not the 0.6 s allowed
    assert "stopped at its end-of-audio token" in capsys.readouterr().out
    # guided sampling with the default scale runs and stays within --seconds
    assert run_cli("--lm", cond_lm, "--codec", saved_pair / "codec", "--text", "ahoj", "--speaker", "font_big",
                   "--seconds", 0.3, "--seed", 1, "--out", tmp_path / "big.wav", "--no-progress") == 0
    assert 0 < wav_seconds(tmp_path / "big.wav") <= 0.3 + 1e-9
    # the speaker guided on its own scale (three row groups) runs too
    assert run_cli("--lm", cond_lm, "--codec", saved_pair / "codec", "--text", "ahoj", "--speaker", "font_big",
                   "--cfg", 2, "--speaker-cfg", 1, "--seconds", 0.3, "--seed", 1, "--out", tmp_path / "two.wav",
                   "--no-progress") == 0
    assert 0 < wav_seconds(tmp_path / "two.wav") <= 0.3 + 1e-9


@pytest.mark.parametrize(
    "which, extra, message",
    [
        ("cond", ("--speaker", "nemo"), "unknown speaker 'nemo'; this LM knows: font_small, font_big"),
        ("cond", ("--text", "příliš dlouhý text"), "over this LM's limit of text_max_bytes=16"),
        ("cond", ("--cfg", -1), "guidance scale (cfg) must be a finite number >= 0"),
        ("plain", ("--text", "ahoj"), "--text: the LM"),
        ("plain", ("--speaker", "font_small", "--cfg", 2), "--speaker --cfg: the LM"),
        ("cond", ("--text", "ahoj", "--monotonic"), "monotonic reading needs an LM trained with guided attention"),
        ("plain", ("--no-monotonic",), "--monotonic: the LM"),
        ("cond", ("--speaker-cfg", -2), "speaker guidance scale must be a finite number >= 0"),
        ("plain", ("--speaker-cfg", 2), "--speaker-cfg: the LM"),
    ],
)
def test_cli_refuses_conditions_it_cannot_take(saved_pair, cond_lm, tmp_path, capsys, which, extra, message):
    lm_dir = cond_lm if which == "cond" else saved_pair / "lm"
    rc = run_cli("--lm", lm_dir, "--codec", saved_pair / "codec", "--out", tmp_path / "o.wav", "--no-progress", *extra)
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqlm generate: error:") and message in err and len(err.strip().splitlines()) == 1
    if which == "plain":
        assert "is not conditioned" in err
    assert not (tmp_path / "o.wav").exists()
