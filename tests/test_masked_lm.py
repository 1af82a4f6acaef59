"""The masked LM (lm.masked_model, lm.masked_generate): seed 000's masked language modeling (loss over
the hidden positions only, an encoder without a causal mask) and MaskGIT-style decoding level by level."""

from __future__ import annotations

import math

import pytest
import torch

from lm import LMConfig, MaskedLM, MultiCodebookLM, load_lm
from lm.ar_decode import ARDecoding
from lm.conditioning import Condition
from lm.generate import generate
from lm.masked_generate import MaskedDecoding, default_window, model_calls, steps_per_level, unmask_schedule
from lm.masked_model import draw_masking
from lm.sampling import SamplingOptions

NC, V = 3, 16


def tiny_masked(seed: int = 0, max_seq_len: int = 24, **kw) -> MaskedLM:
    torch.manual_seed(seed)
    cfg = LMConfig(n_codebooks=NC, codebook_size=V, d_model=32, n_layers=2, n_heads=2, max_seq_len=max_seq_len,
                   pattern="parallel", family="masked", **kw)
    return MaskedLM(cfg).eval()


def codes_of(b: int = 2, t: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, NC, t), generator=torch.Generator().manual_seed(seed))


def gen(seed: int = 3) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- the objective (seed 000: "the mean of -ln P(x_i | visible) over the hidden positions only") ----------

def test_masking_follows_soundstorm_levels_prefix_and_ratio():
    codes = codes_of(b=64, t=20)
    fm = torch.ones(64, 20, dtype=torch.bool)
    fm[1::2, 15:] = False
    m = draw_masking(codes, fm, mask_id=V + 1, pad_id=V, generator=gen())
    lengths = fm.sum(1)
    frames = torch.arange(20)
    for b in range(64):
        q, p, n = int(m.level[b]), int(m.prefix[b]), int(lengths[b])
        assert 0 <= p < n
        assert not m.hidden[b, :p].any() and not m.hidden[b, n:].any() and m.hidden[b].sum() >= 1
        visible_prefix = m.inputs[b, :, :p]
        assert torch.equal(visible_prefix, codes[b, :, :p])  # the prompt-like prefix: every level visible
        after = (frames >= p) & (frames < n)
        assert torch.equal(m.inputs[b, :q][:, after], codes[b, :q][:, after])  # coarser levels visible
        assert (m.inputs[b, q + 1:][:, after] == V + 1).all()  # finer levels all masked
        assert torch.equal(m.inputs[b, q] == V + 1, m.hidden[b])  # level q: masked exactly where hidden
        assert (m.inputs[b, :, n:] == V).all()  # padding
    assert set(m.level.tolist()) == set(range(NC))
    # A fixed ratio hides ceil(r x frames after the prefix) frames.
    fixed = draw_masking(codes, fm, V + 1, V, gen(), level=1, ratio=0.3, prefix_prob=0.0)
    assert (fixed.level == 1).all() and (fixed.prefix == 0).all()
    assert torch.equal(fixed.hidden.sum(1), torch.ceil(0.3 * lengths).long())


def test_loss_counts_the_hidden_positions_of_level_q_and_nothing_else():
    """Seed 000: the loss is over hidden positions only. With the embedding replaced by a fixed tensor the
    model's output cannot depend on its input ids, so what moves the loss is what it takes as targets."""
    model = tiny_masked()
    fixed = torch.randn(1, 12, 32, generator=gen(9))
    model.embed = lambda tokens: fixed
    codes = codes_of(b=1, t=12)
    fm = torch.ones(1, 12, dtype=torch.bool)
    m = draw_masking(codes, fm, model.mask_id, V, gen(), level=1, ratio=0.5, prefix_prob=0.0)
    base = model.loss(codes, fm, generator=gen(), level=1, ratio=0.5, prefix_prob=0.0)
    assert base.count.tolist() == [0, 6, 0] and base.nll_sum[0] == 0 and base.nll_sum[2] == 0
    hidden_t = int(m.hidden[0].nonzero()[0])
    visible_t = int((~m.hidden[0]).nonzero()[0])
    for level, t, moves in ((1, visible_t, False), (0, hidden_t, False), (2, hidden_t, False), (1, hidden_t, True)):
        changed = codes.clone()
        changed[0, level, t] = (changed[0, level, t] + 5) % V
        out = model.loss(changed, fm, generator=gen(), level=1, ratio=0.5, prefix_prob=0.0)
        assert (out.loss != base.loss) == moves, (level, t)
        assert torch.equal(out.count, base.count)


def test_padding_changes_neither_the_sum_nor_the_count():
    model = tiny_masked()
    codes = codes_of(b=2, t=12)
    fm = torch.ones(2, 12, dtype=torch.bool)
    fm[0, 8:] = False
    base = model.loss(codes, fm, generator=gen())
    other = codes.clone()
    other[0, :, 8:] = (other[0, :, 8:] + 7) % V
    out = model.loss(other, fm, generator=gen())
    assert torch.equal(out.nll_sum, base.nll_sum) and torch.equal(out.count, base.count)
    # and the row's loss equals the same row scored alone, unpadded, under the same masking
    m = draw_masking(codes, fm, model.mask_id, V, gen())
    alone = model(m.inputs[:1, :, :8])
    padded = model(m.inputs[:1], frame_mask=fm[:1])
    assert torch.allclose(alone, padded[:, :, :8], atol=1e-5)


def test_a_masked_lm_has_no_sequence_likelihood_nor_cache_and_refuses_ar_options():
    """seed 000: its losses are no chain rule's factors; it attends to every frame at once. Those are the AR
    family's capabilities, which the masked family does not have (rather than has and refuses)."""
    model = tiny_masked()
    assert not any(hasattr(model, name) for name in ("log_likelihood", "token_nll", "new_cache"))
    with pytest.raises(TypeError, match="takes MaskedDecoding options"):
        generate(model, codes_of(), 2, options=ARDecoding(use_cache=False))


# ---- bidirectional (seed 000: an encoder uses self-attention without a causal mask) -----------------------

def test_the_output_at_frame_t_depends_on_frame_t_plus_1_unlike_the_ar_model():
    masked = tiny_masked()
    ar_cfg = LMConfig(n_codebooks=NC, codebook_size=V, d_model=32, n_layers=2, n_heads=2, max_seq_len=24,
                      pattern="parallel")
    ar = MultiCodebookLM(ar_cfg).eval()
    tokens = codes_of(b=1, t=10)
    later = tokens.clone()
    later[..., 6] = (later[..., 6] + 3) % V
    with torch.no_grad():
        assert not torch.allclose(masked(tokens)[..., 5, :], masked(later)[..., 5, :])
        assert torch.equal(ar(tokens)[..., 5, :], ar(later)[..., 5, :])


def test_without_positions_the_encoder_is_permutation_equivariant():
    model = tiny_masked()
    model.rope = None  # no position information at all
    tokens = codes_of(b=1, t=10)
    perm = torch.randperm(10, generator=gen())
    with torch.no_grad():
        assert torch.allclose(model(tokens)[..., perm, :], model(tokens[..., perm]), atol=1e-5)


# ---- decoding ------------------------------------------------------------------------------------------

def test_unmask_schedule_is_the_cosine_and_fixes_everything():
    assert unmask_schedule(100, 4) == [100 - 92, 92 - 70, 70 - 38, 38]
    for n, s in ((1, 16), (5, 16), (313, 16), (40, 1), (7, 3)):
        fixed = unmask_schedule(n, s)
        assert sum(fixed) == n and len(fixed) == s
        assert all(f >= 1 for f in fixed[:min(n, s)])


def test_steps_per_level_and_its_one_line_refusals():
    assert steps_per_level(None, 8) == [8, 2, 1, 1, 1, 1, 1, 1]
    assert steps_per_level("16,4", 3) == [16, 4, 1]
    for bad, match in (("", "at least one"), ("4,0", "at least 1 step"), ("1,2,3,4", "at most 3"),
                       ("4,x", "comma-separated")):
        with pytest.raises(ValueError, match=match):
            steps_per_level(bad, 3)


@pytest.mark.parametrize("new", [9, 40])  # one window, and chunks past the 24-frame context
def test_decoding_follows_the_schedule_fills_every_code_and_keeps_the_prompt(new):
    model = tiny_masked()
    prompt = codes_of(b=2, t=5)
    steps = []
    out = generate(model, prompt, new, sampling=SamplingOptions(top_k=8, seed=0),
                   options=MaskedDecoding(steps=[4, 2], window=24, on_step=steps.append))
    assert out.shape == (2, NC, 5 + new)
    assert torch.equal(out[..., :5], prompt)
    assert ((out >= 0) & (out < V)).all()
    assert len(steps) == model_calls(5, new, 24, [4, 2, 1])
    for chunk in {s.chunk for s in steps}:
        for q, s_q in enumerate([4, 2, 1]):
            mine = [s for s in steps if s.chunk == chunk and s.level == q]
            hidden0 = mine[0].hidden.sum(1)[0] + mine[0].fixed
            assert [s.fixed for s in mine] == unmask_schedule(int(hidden0), s_q)
            assert all(int(s.hidden.sum(1)[0]) == int(hidden0) - sum(x.fixed for x in mine[:i + 1])
                       for i, s in enumerate(mine))
            assert not mine[-1].hidden.any()


def test_a_stretched_window_decodes_a_long_clip_in_one_chunk_as_a_longer_context_would():
    import dataclasses

    model = tiny_masked()
    prompt = codes_of(b=2, t=5)
    steps = []
    out = generate(model, prompt, 40, sampling=SamplingOptions(greedy=True),
                   options=MaskedDecoding(steps=[3, 2], window=45, on_step=steps.append))
    assert len(steps) == 3 + 2 + 1 and {s.chunk for s in steps} == {0}
    wide = MaskedLM(dataclasses.replace(model.config, max_seq_len=45)).eval()
    wide.load_state_dict(model.state_dict())
    assert torch.equal(out, generate(wide, prompt, 40, sampling=SamplingOptions(greedy=True),
                                     options=MaskedDecoding(steps=[3, 2])))
    assert torch.equal(out[..., :5], prompt)
    learned = tiny_masked(pos="learned")
    with pytest.raises(ValueError, match="only a RoPE model"):
        generate(learned, prompt, 40, options=MaskedDecoding(window=45))
    with pytest.raises(ValueError, match="exceed the masked LM's context"):
        model(codes_of(b=1, t=30))


def test_by_default_a_rope_model_decodes_a_clip_of_up_to_2_1_contexts_in_one_pass_and_longer_ones_in_chunks():
    model, learned = tiny_masked(), tiny_masked(pos="learned")  # contexts of 24 frames: one pass up to 50
    prompt = codes_of(b=1, t=5)
    for m, new, window in ((model, 45, 50), (model, 46, 24), (learned, 45, 24), (model, 10, 24)):
        steps = []
        out = generate(m, prompt, new, sampling=SamplingOptions(seed=3),
                       options=MaskedDecoding(steps=[2, 1], on_step=steps.append))
        assert default_window(m.config, 5 + new) == window
        assert len(steps) == model_calls(5, new, window, [2, 1, 1])
        assert torch.equal(out, generate(m, prompt, new, sampling=SamplingOptions(seed=3),
                                         options=MaskedDecoding(steps=[2, 1], window=window)))


def test_same_seed_same_codes_and_batch_rows_are_independent():
    model = tiny_masked()
    prompt = codes_of(b=3, t=4)
    a = generate(model, prompt, 10, sampling=SamplingOptions(temperature=1.3, seed=5))
    assert torch.equal(a, generate(model, prompt, 10, sampling=SamplingOptions(temperature=1.3, seed=5)))
    assert not torch.equal(a, generate(model, prompt, 10, sampling=SamplingOptions(temperature=1.3, seed=6)))
    together = generate(model, prompt, 10, sampling=SamplingOptions(greedy=True))
    alone = torch.cat([generate(model, prompt[i:i + 1], 10, sampling=SamplingOptions(greedy=True)) for i in range(3)])
    assert torch.equal(together, alone)


def plain_maskgit(model, prompt, new, steps, generator, top_k):
    """The decoder before the choice temperature: keep the n_fix sampled codes of highest log-probability."""
    from lm.sampling import filter_logits, sample_next

    b, t0 = prompt.shape[0], prompt.shape[-1]
    tokens = torch.cat([prompt, torch.full((b, NC, new), model.mask_id)], dim=-1)
    for q, s_q in enumerate(steps):
        hidden = torch.ones(b, new, dtype=torch.bool)
        for n_fix in unmask_schedule(new, s_q):
            logits = model(tokens, level=q)[:, 0, t0:]
            codes = sample_next(logits, 1.0, top_k, None, generator=generator)
            conf = filter_logits(logits, 1.0, top_k, None).log_softmax(-1).gather(-1, codes[..., None])[..., 0]
            keep = conf.masked_fill(~hidden, -math.inf).topk(n_fix, dim=1).indices
            tokens[:, q, t0:].scatter_(1, keep, codes.gather(1, keep))
            hidden.scatter_(1, keep, False)
    return tokens


def test_choice_temperature_0_is_plain_confidence_ranking_and_a_last_step_draws_no_noise():
    model = tiny_masked()
    prompt = codes_of(b=2, t=5)
    with torch.inference_mode():
        ref = plain_maskgit(model, prompt, 12, [4, 2, 1], gen(7), top_k=8)
    assert torch.equal(generate(model, prompt, 12, sampling=SamplingOptions(top_k=8),
                                options=MaskedDecoding(steps=[4, 2], choice_temperature=0), generator=gen(7)), ref)
    one_step = generate(model, prompt, 12, sampling=SamplingOptions(seed=2),
                        options=MaskedDecoding(steps=[1, 1, 1], choice_temperature=0))
    assert torch.equal(generate(model, prompt, 12, sampling=SamplingOptions(seed=2),
                                options=MaskedDecoding(steps=[1, 1, 1], choice_temperature=50.0)),
                       one_step)  # annealed: tau (1 - 1/1) = 0 at a level's only step


def test_choice_temperature_keeps_the_schedule_and_the_prompt_is_seeded_and_reorders_the_keeps():
    model = tiny_masked()
    prompt = codes_of(b=2, t=5)
    noisy, plain = [], []
    out = generate(model, prompt, 15, sampling=SamplingOptions(seed=4),
                   options=MaskedDecoding(steps=[5, 3], choice_temperature=4.5, on_step=noisy.append))
    generate(model, prompt, 15, sampling=SamplingOptions(seed=4),
             options=MaskedDecoding(steps=[5, 3], choice_temperature=0, on_step=plain.append))
    assert [s.fixed for s in noisy] == [s.fixed for s in plain] == (unmask_schedule(15, 5) + unmask_schedule(15, 3)
                                                                   + [15])
    assert all(int(s.hidden.sum(1).max()) == int(s.hidden.sum(1).min()) for s in noisy)
    assert not noisy[-1].hidden.any() and torch.equal(out[..., :5], prompt)
    assert ((out >= 0) & (out < V)).all()
    assert torch.equal(out, generate(model, prompt, 15, sampling=SamplingOptions(seed=4),
                                     options=MaskedDecoding(steps=[5, 3], choice_temperature=4.5)))
    assert not torch.equal(noisy[0].hidden, plain[0].hidden)  # same samples, other positions kept first
    for bad in (-0.5, math.nan, math.inf, True):
        with pytest.raises(ValueError, match="choice temperature must be a finite number >= 0"):
            generate(model, prompt, 4, options=MaskedDecoding(choice_temperature=bad))


def test_a_conditioned_masked_lm_decodes_with_guidance_and_has_no_end_id():
    from lm.config import ConditionConfig

    model = tiny_masked(condition=ConditionConfig(speakers=["a", "b"], text_max_bytes=16, encoder_layers=1))
    assert model.config.end_id is None and model.config.n_outputs == V
    out = generate(model, codes_of(b=2, t=3), 6, sampling=SamplingOptions(seed=0, cfg_scale=2.0),
                   condition=Condition(text="ahoj", speaker="b"))
    assert out.shape == (2, NC, 9)
    loss = model.train().loss(codes_of(b=2, t=8), condition=model.condition_inputs("ahoj", "a", 2))
    assert math.isfinite(float(loss.loss.detach()))
    with pytest.raises(ValueError, match="not conditioned"):
        generate(tiny_masked(), codes_of(), 4, condition=Condition(text="x"))


def test_saved_masked_lm_loads_by_family_and_the_ar_class_refuses_it(tmp_path):
    model = tiny_masked()
    model.save_pretrained(tmp_path / "m")
    loaded = load_lm(tmp_path / "m")
    assert isinstance(loaded, MaskedLM) and loaded.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(ValueError, match="'masked' LM family"):
        MultiCodebookLM.from_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="pattern 'parallel'"):
        LMConfig(family="masked")
