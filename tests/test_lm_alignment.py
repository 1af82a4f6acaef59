"""Guided attention (lm.alignment): DC-TTS's diagonal penalty on the conditioned decoder's cross-attention."""

from __future__ import annotations

import math

import pytest
import torch

from lm import LMConfig, MultiCodebookLM
from lm.alignment import forward_recording, guide_penalty, noisy_context, off_diagonal_mass
from lm.ar_decode import ARDecoding
from lm.conditioning import Condition
from lm.sampling import SamplingOptions
from test_lm_conditioning import cond_cfg, cond_model, inputs_of


def test_the_penalty_is_dc_ttss_w_with_the_speaker_at_full_cost_and_padding_free():
    """Tachibana et al. 2017, eq. (W_nt = 1 - exp(-(n/N - t/T)^2 / 2g^2)), at position centres, written out."""
    g, text_len, seq_len, n_pos, width = 0.3, torch.tensor([3, 5]), torch.tensor([4, 6]), 6, 7
    w = guide_penalty(text_len, seq_len, n_pos, width, g)
    for b in range(2):
        L, S = int(text_len[b]), int(seq_len[b])
        for s in range(n_pos):
            assert w[b, s, 0] == 1.0  # the speaker's source position
            for j in range(L):
                want = 1 - math.exp(-(((j + 0.5) / L - (s + 0.5) / S) ** 2) / (2 * g * g))
                assert w[b, s, 1 + j].item() == pytest.approx(want, abs=1e-6)
            assert (w[b, s, 1 + L:] == 0).all()  # padding past the text


def one_hot_maps(text_len: int, n_pos: int, column_of) -> torch.Tensor:
    a = torch.zeros(1, 1, n_pos, 1 + text_len)
    for s in range(n_pos):
        a[0, 0, s, column_of(s)] = 1.0
    return a


def test_reading_in_order_costs_least_and_resting_on_the_speaker_costs_everything():
    L, S, g = 10, 30, 0.2
    args = (torch.tensor([L]), torch.tensor([S]), torch.tensor([True]), g)
    diagonal = one_hot_maps(L, S, lambda s: 1 + (s * L) // S)
    backwards = one_hot_maps(L, S, lambda s: L - (s * L) // S)
    uniform = torch.full((1, 1, S, 1 + L), 1.0 / (1 + L))
    speaker = one_hot_maps(L, S, lambda s: 0)
    costs = [off_diagonal_mass([a], *args).item() for a in (diagonal, uniform, backwards, speaker)]
    assert costs[0] < 0.02 and costs[0] < costs[1] < costs[2] < costs[3] == 1.0, costs


def test_only_guided_rows_and_real_positions_count():
    """A row without text or not ending in the window is left alone; positions past a row's end too."""
    L, S, g = 4, 8, 0.2
    good = one_hot_maps(L, S, lambda s: 1 + (s * L) // S)
    bad = one_hot_maps(L, S, lambda s: 0)
    lens, seqs = torch.tensor([L, L]), torch.tensor([S, S])
    alone = off_diagonal_mass([good], lens[:1], seqs[:1], torch.tensor([True]), g).item()
    both = torch.cat([good, bad])
    assert off_diagonal_mass([both], lens, seqs, torch.tensor([True, False]), g).item() == pytest.approx(alone)
    assert off_diagonal_mass([both], lens, seqs, torch.tensor([False, False]), g).item() == 0.0
    short = one_hot_maps(L, 6, lambda s: 1 + (s * L) // 6)
    garbage_after = torch.cat([short, bad[:, :, 6:]], dim=2)  # positions 6, 7 are past the row's end
    args = (torch.tensor([L]), torch.tensor([6]), torch.tensor([True]), g)
    assert off_diagonal_mass([garbage_after], *args).item() == pytest.approx(
        off_diagonal_mass([short], *args).item())


def test_recording_the_weights_changes_no_logit_and_they_are_the_softmax_the_heads_use():
    model = cond_model(condition={"guided_attention": 1.0, "guided_heads": 2}).eval()
    codes = torch.randint(0, 16, (2, 3, 9))
    cond = inputs_of(model, ["ahoj", "lod"], ["font_small", "font_big"])
    ends = torch.tensor([True, True])
    plain = model.loss(codes, None, cond, ends, guide=False)
    guided = model.loss(codes, None, cond, ends, guide=True)
    assert plain.guide is None and guided.guide is not None and 0 < guided.guide.item() < 1
    assert torch.allclose(plain.nll_sum, guided.nll_sum, atol=1e-9)
    memory = model.encode_condition(cond)
    _, recorded = forward_recording(model, torch.zeros(2, 3, 5, dtype=torch.long), memory, 2)
    w = recorded[0]
    assert model.blocks[0].cross_attn.record_heads == 0 and model.blocks[0].cross_attn.recorded is None
    assert w.shape == (2, 2, 5, memory.states.shape[1])
    assert torch.allclose(w.sum(-1), torch.ones(2, 2, 5, dtype=w.dtype))
    assert (w[1, :, :, 1 + 3:] == 0).all()  # "lod" is 3 bytes: padding after it gets no weight


def test_the_guide_is_on_in_training_only_when_weighted_and_trains_the_heads():
    off = MultiCodebookLM(cond_cfg()).train()
    on = MultiCodebookLM(cond_cfg(condition={"guided_attention": 1.0, "text_dropout": 0.0})).train()
    codes = torch.randint(0, 16, (2, 3, 9))
    for model, wanted in ((off, False), (on, True)):
        cond = inputs_of(model, ["ahoj", "lod"], ["font_small", "font_big"])
        out = model.loss(codes, None, cond, torch.tensor([True, True]))
        assert (out.guide is not None) == wanted
    out.guide.backward()
    assert on.blocks[0].cross_attn.q.weight.grad.abs().sum() > 0  # the guided heads' queries learn from it
    last_out = on.blocks[-1].cross_attn.out.weight.grad  # what the last layer writes feeds no guided head
    assert last_out is None or last_out.abs().sum() == 0
    assert on.eval().loss(codes, None, cond, torch.tensor([True, True])).guide is None


def test_guided_heads_must_exist_and_old_configs_load_without_a_guide():
    with pytest.raises(ValueError, match="guided_heads"):
        cond_cfg(condition={"guided_heads": 5})
    with pytest.raises(ValueError, match="guided_attention"):
        cond_cfg(condition={"guided_attention": -1.0})
    old = cond_cfg().to_dict()
    for key in ("guided_attention", "guided_sigma", "guided_heads"):
        old["condition"].pop(key)
    assert LMConfig.from_dict(old).condition.guided_attention == 0.0
    # the guided-alignment experiment's keys, off in the shipped conditioned LM, load as nothing; on, refused
    old["condition"].update(guided_alignment=False, guided_sigma_bytes=3.0)
    assert LMConfig.from_dict(old) == LMConfig.from_dict(cond_cfg().to_dict())
    old["condition"]["guided_alignment"] = True
    with pytest.raises(ValueError, match="guided_alignment"):
        LMConfig.from_dict(old)


def test_context_noise_replaces_codes_at_its_rate_in_training_only_and_never_special_ids():
    torch.manual_seed(0)
    inputs = torch.randint(0, 16, (4, 3, 5000))
    inputs[:, :, 0] = 18  # bos
    inputs[:, 2, -5:] = 17  # pad
    noisy = noisy_context(inputs, 0.25, 16)
    changed = noisy != inputs
    assert (noisy[:, :, 0] == 18).all() and (noisy[:, 2, -5:] == 17).all() and (noisy[changed] < 16).all()
    # a replacement is uniform over the 16 codes, so 1/16 of the drawn ones land on the same code
    assert abs(changed[:, :, 1:-5].float().mean().item() - 0.25 * 15 / 16) < 0.01
    model = MultiCodebookLM(cond_cfg(condition={"context_noise": 0.5})).eval()
    codes = torch.randint(0, 16, (2, 3, 9))
    cond = inputs_of(model, ["ahoj", "lod"], ["font_small", "font_big"])
    a, b = (model.loss(codes, None, cond).loss for _ in range(2))
    assert a == b  # eval: no noise
    model.train()
    torch.manual_seed(1)
    c = model.loss(codes, None, cond).loss
    torch.manual_seed(2)
    assert model.loss(codes, None, cond).loss != c  # training draws noise


# ---- monotonic reading at generation (lm.alignment.ReadingWindow) -----------------------------------
def guided_model(**condition):
    return cond_model(condition={"guided_attention": 1.0, "guided_heads": 2, **condition}).eval()


def test_a_focus_limits_only_the_guided_heads_last_rows_to_a_masked_softmax():
    model = guided_model()
    attn = model.blocks[0].cross_attn
    memory = model.cross_memory(inputs_of(model, ["ahoj lode", "lod"], ["font_small", "font_big"]))
    k, v = memory.kv[0]
    x = torch.randn(2, 5, model.config.d_model, dtype=torch.float64)
    focus = torch.zeros(2, 2, memory.mask.shape[1], dtype=torch.bool)
    focus[:, :, :4] = True  # the last two rows may see the speaker and bytes 0..2
    attn.record_heads = 4
    free = attn(x, k, v, memory.mask)
    w_free = attn.recorded
    attn.focus, attn.focus_heads = focus, 2
    windowed = attn(x, k, v, memory.mask)
    w = attn.recorded
    attn.record_heads = 0
    attn.focus_heads = 0
    plain = attn(x, k, v, memory.mask)  # the scaled_dot_product_attention path, focus left set but unused
    assert torch.allclose(plain, free)
    assert torch.allclose(w[:, 2:], w_free[:, 2:]) and torch.allclose(w[:, :, :3], w_free[:, :, :3])
    # the guided heads' last two rows: softmax over the focus alone = the free weights renormalised there
    kept = w_free[:, :2, 3:] * focus[:, None].double()
    assert torch.allclose(w[:, :2, 3:], kept / kept.sum(-1, keepdim=True))
    attn.focus_heads, attn.record_heads = 2, 0
    assert torch.allclose(attn(x, k, v, memory.mask), windowed)  # the fast path applies the same mask
    attn.focus, attn.focus_heads = None, 0


def reading_step(window, centre_bytes, logits):
    """One decoder step of `window` whose guided heads all put their weight on text byte centre_bytes[r]."""
    window.before()
    for attn in window.attns:
        w = torch.zeros(len(centre_bytes), window.heads, 1, window.width, dtype=torch.float64)
        for r, c in enumerate(centre_bytes):
            w[r, :, 0, 1 + c] = 1.0
        attn.recorded = w
    return window.after(logits.clone())


def test_the_reading_position_follows_the_attention_forward_only_a_byte_a_step():
    from lm.alignment import ReadingWindow

    model = guided_model()
    memory = model.cross_memory(inputs_of(model, ["a" * 20, None], ["font_small", "font_small"]))
    window = ReadingWindow(model, memory, back=2, front=6, step=1.0, linger=None, patience=None)
    logits = torch.zeros(2, 3, 1, model.config.n_outputs, dtype=torch.float64)
    positions = []
    for centre in (5, 5, 0, 0, 1, 3):  # attention jumps ahead, then back, then just past p
        reading_step(window, [centre, 15], logits)
        positions.append(window.pos[0].item())
    assert positions == [1.0, 2.0, 2.0, 2.0, 2.0, 3.0]  # never more than a byte a step, never back
    assert window.pos[1].item() == 0  # a row without a text has no position
    focus = window.focus()
    assert focus[0].nonzero().flatten().tolist() == [0] + [1 + j for j in range(3 - 2, 3 + 6 + 1)]
    assert focus[1].all()  # ... and sees everything


def test_the_end_waits_for_the_last_byte_is_forced_after_linger_and_patience_pushes_a_stuck_reader():
    from lm.alignment import ReadingWindow

    model = guided_model()
    end = model.config.end_id
    memory = model.cross_memory(inputs_of(model, ["a" * 10, None], ["font_small", "font_big"]))
    logits = torch.zeros(2, 3, 1, model.config.n_outputs, dtype=torch.float64)
    window = ReadingWindow(model, memory, back=2, front=6, step=1.0, linger=2, patience=3)
    out = reading_step(window, [0, 0], logits)
    assert out[0, 0, -1, end] == float("-inf") and out[1, 0, -1, end] == 0  # the text-less row is free
    assert (out[:, 1:] == 0).all()  # only codebook 0 is touched
    pushes = [reading_step(window, [0, 0], logits) is not None and window.pos[0].item() for _ in range(8)]
    assert pushes == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0]  # attention stuck: a byte on after 4 (> 3) steps
    window = ReadingWindow(model, memory, linger=2, patience=None)
    for centre in range(3):
        out = reading_step(window, [centre + 1, 0], logits)
    assert window.pos[0].item() == 3 and out[0, 0, -1, end] == 0  # byte 3 + front 6 is the last byte: may end
    out = reading_step(window, [9, 0], logits)
    assert out[0, 0, -1, end] == 0 and torch.isfinite(out[0, 0, -1]).all()
    out = reading_step(window, [9, 0], logits)  # the third step with the last byte in view: must end now
    assert out[0, 0, -1, end] == 0 and torch.isinf(out[0, 0, -1, :end]).all() and out[1, 0, -1, end] == 0
    window = ReadingWindow(model, memory, linger=None, patience=0)  # pushed every step, never past the text
    for _ in range(15):
        reading_step(window, [9, 0], logits)
    assert window.pos[0].item() == 9
    with pytest.raises(ValueError, match="back >= 0"):
        ReadingWindow(model, memory, back=-1)
    with pytest.raises(ValueError, match="guided attention"):
        ReadingWindow(cond_model().eval(), memory)


def test_monotonic_generation_recomputed_equals_cached_and_ends_only_having_read_the_text():
    from lm.generate import generate

    model = guided_model()
    texts, voices = ["ahoj lode, kam plujes?", "a", None], ["font_small", "font_big", "font_big"]
    common = dict(condition=Condition(texts, voices), sampling=SamplingOptions(cfg_scale=2.0, seed=3),
                  return_lengths=True)
    cached, n_cached = generate(model, None, 30, **common)
    recomputed, n_recomputed = generate(model, None, 30, options=ARDecoding(use_cache=False), **common)
    assert torch.equal(cached, recomputed) and torch.equal(n_cached, n_recomputed)
    free, _ = generate(model, None, 30, options=ARDecoding(monotonic=False), **common)
    assert not torch.equal(free, cached)  # the window changes what the guided heads read
    assert torch.equal(cached, generate(model, None, 30, options=ARDecoding(monotonic=True),
                                        **common)[0])  # on by default
    # a text of 22 bytes read at most a byte a step: with front 6 the end cannot come before step 15
    assert n_cached[0] >= 22 - 1 - 6


def test_monotonic_reading_is_refused_where_there_are_no_reading_heads_and_off_by_default_there():
    from lm.generate import generate

    unguided = cond_model().eval()
    with pytest.raises(ValueError, match="guided attention"):
        generate(unguided, None, 3, condition=Condition(text="a"), options=ARDecoding(monotonic=True))
    common = dict(condition=Condition("ahoj", "font_small"), sampling=SamplingOptions(seed=0))
    assert torch.equal(generate(unguided, None, 8,
                                **common), generate(unguided, None, 8, options=ARDecoding(monotonic=False), **common))
    plain = MultiCodebookLM(LMConfig(n_codebooks=3, codebook_size=16, d_model=32, n_layers=1, n_heads=4))
    with pytest.raises(ValueError, match="this LM is not conditioned"):
        generate(plain, None, 3, options=ARDecoding(monotonic=True))
