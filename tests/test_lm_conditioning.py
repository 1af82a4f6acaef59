"""Text and speaker conditioning (issue 20): the encoder-decoder of seed 000, condition dropout,
classifier-free guidance, the end-of-audio token, and unconditioned LMs left exactly as they were."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lm import LMConfig, MultiCodebookLM
from lm.ar_decode import iter_decode, plan_generation
from lm.conditioning import Condition, ConditionInputs, NULL_TEXT, PAD_BYTE, condition_inputs
from lm.end_of_audio import layout_with_end
from lm.generate import generate
from lm.guidance import GuidedDecoder
from lm.layers import Block, CrossAttention
from lm.patterns import get_pattern
from lm.sampling import SamplingOptions
from seed_helpers import randomized

REPO = Path(__file__).resolve().parents[1]
SPEAKERS = ["font_small", "font_big", "font_white"]


def cond_cfg(**overrides) -> LMConfig:
    condition = {"speakers": SPEAKERS, "text_max_bytes": 24, "encoder_layers": 2,
                 "text_dropout": 0.0, "speaker_dropout": 0.0}
    condition.update(overrides.pop("condition", {}))
    base = dict(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=4, max_seq_len=40,
                condition=condition)
    base.update(overrides)
    return LMConfig(**base)


def cond_model(seed: int = 0, **overrides) -> MultiCodebookLM:
    """A float64 conditioned model with every weight redrawn large, so conditions and tokens matter."""
    torch.manual_seed(seed)
    return randomized(MultiCodebookLM(cond_cfg(**overrides)), seed=seed)


def inputs_of(model, texts, speakers) -> ConditionInputs:
    return model.condition_inputs(texts, speakers, len(texts))


PAIR = (["ahoj", "loď"], ["font_small", "font_big"])  # two rows' texts and speakers


def guided(model, texts, speakers, scale=None, speaker_scale=None) -> GuidedDecoder:
    """The model bound to one text and speaker per row, at these guidance scales (lm.guidance)."""
    sampling = SamplingOptions(cfg_scale=scale, speaker_cfg_scale=speaker_scale)
    return GuidedDecoder(model, Condition(texts, speakers), sampling, len(texts))


def model_inputs(model, codes):
    seq, _ = model.pattern.build(codes, None, model.config.pad_id)
    return torch.cat([torch.full_like(seq[..., :1], model.config.bos_id), seq[..., :-1]], dim=-1)


# ---- the encoder-decoder of seed 000 -------------------------------------------------------------
def reference_cross_attention(xa: CrossAttention, x, memory, source_mask):
    """Seed 000's cross-attention written out for one sequence: queries from the decoder rows x [S, d],
    keys and values from the encoder output memory [M, d], per head softmax(q k^T / sqrt(d_k)) v over the
    real source positions only (no causal mask), heads concatenated, then W_O."""
    h, hkv, dh = xa.n_heads, xa.n_kv_heads, xa.head_dim
    w_k, w_v = xa.kv.weight.split([hkv * dh, hkv * dh])
    heads = []
    for head in range(h):
        g = head // (h // hkv)
        q = x @ xa.q.weight[head * dh:(head + 1) * dh].T
        k = memory @ w_k[g * dh:(g + 1) * dh].T
        v = memory @ w_v[g * dh:(g + 1) * dh].T
        scores = (q @ k.T / math.sqrt(dh)).masked_fill(~source_mask[None, :], float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return torch.cat(heads, dim=-1) @ xa.out.weight.T


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_cross_attention_is_seed_000s_definition(n_kv_heads):
    """Seed 000 (encoder-decoder): the decoder's "cross-attention whose queries come from the decoder and
    whose keys and values come from the encoder output", checked against a loop over heads; and the
    conditioned block is pre-norm with the cross-attention sublayer between self-attention and the FFN."""
    model = cond_model(n_kv_heads=n_kv_heads)
    block = model.blocks[1]
    cond = inputs_of(model, ["ahoj", "co je to za loď"], ["font_big", None])
    memory = model.encode_condition(cond)
    h = torch.randn(2, 7, 32, dtype=torch.float64)
    for b in range(2):
        k, v = block.cross_attn.keys_values(memory.states[b:b + 1])
        got = block.cross_attn(h[b:b + 1], k, v, memory.mask[b:b + 1])[0]
        want = reference_cross_attention(block.cross_attn, h[b], memory.states[b], memory.mask[b])
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    rope = model.rope.cos_sin(torch.arange(7), h.dtype)
    o = h + block.attn(block.attn_norm(h), rope)
    k, v = block.cross_attn.keys_values(memory.states)
    c = o + block.cross_attn(block.cross_norm(o), k, v, memory.mask)
    torch.testing.assert_close(block(h, rope, memory=memory), c + block.ffn(block.ffn_norm(c)))


def test_cross_attention_sees_the_whole_source_and_never_its_padding():
    """Seed 000: the decoder reads the encoder output without a causal mask: the first decoder row already
    depends on the last source position; source padding (past a shorter text) is no key at all."""
    xa = randomized(CrossAttention(cond_cfg()))
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    memory = torch.randn(1, 6, 32, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False, False]])
    changed_last_real, changed_padding = memory.clone(), memory.clone()
    changed_last_real[:, 3] += 1.0
    changed_padding[:, 4:] = torch.randn(1, 2, 32, dtype=torch.float64)

    def out(m):
        return xa(x, *xa.keys_values(m), mask)

    assert not torch.allclose(out(memory)[:, 0], out(changed_last_real)[:, 0])
    torch.testing.assert_close(out(memory), out(changed_padding), atol=0, rtol=0)


def test_the_decoder_stays_causal_in_audio():
    """Seed 000 (decoder-only / encoder-decoder): with the condition in place, the output at step t still
    depends only on the audio tokens up to t."""
    model = cond_model()
    memory = model.encode_condition(inputs_of(model, ["ahoj", "nazdar"], ["font_small", "font_big"]))
    tokens = torch.randint(0, model.config.embedding_rows, (2, 3, 12))
    changed = tokens.clone()
    changed[..., 7:] = torch.randint(0, model.config.embedding_rows, (2, 3, 5))
    a, b = model(tokens, memory=memory), model(changed, memory=memory)
    torch.testing.assert_close(a[..., :7, :], b[..., :7, :], atol=0, rtol=0)
    assert not torch.allclose(a[..., 7:, :], b[..., 7:, :])


def test_the_encoder_output_at_a_byte_depends_on_bytes_on_both_sides():
    """Seed 000 (encoder): "self-attention without a causal mask, so each position can use valid positions
    on both sides": the output at byte 3 moves when byte 1 or byte 5 changes, never with the padding."""
    model = cond_model()
    base, before, after = "abcdefg", "aXcdefg", "abcdeXg"
    mem = {t: model.encode_condition(inputs_of(model, [t, "a much longer text"], ["font_small"] * 2))
           for t in (base, before, after)}
    row = 1 + 3  # position 0 is the speaker token, byte i sits at position 1 + i
    for t in (before, after):
        assert (mem[t].states[0, row] - mem[base].states[0, row]).abs().max() > 1e-3
    # row 0's text is shorter than row 1's: its padding is masked, so what padding holds changes nothing
    cond = inputs_of(model, [base, "a much longer text"], ["font_small"] * 2)
    junk = ConditionInputs(cond.text.clone(), cond.text_len, cond.speaker)
    junk.text[0, len(base):] = 65
    torch.testing.assert_close(model.encode_condition(junk).states[0, :1 + len(base)],
                               mem[base].states[0, :1 + len(base)], atol=0, rtol=0)
    assert mem[base].mask[0].sum() == 1 + len(base) and mem[base].mask[1].all()


def test_the_source_is_speaker_then_bytes_and_null_text_is_one_learned_token():
    cfg = cond_cfg()
    cond = condition_inputs(cfg.condition, ["čau", None], ["font_white", None], 2)
    assert cond.text[0, :4].tolist() == list("čau".encode()) and cond.text_len.tolist() == [4, 0]
    assert cond.speaker.tolist() == [2, cfg.condition.null_speaker]
    model = MultiCodebookLM(cfg)
    ids_source, mask = model.condition_encoder.source(cond)
    assert mask.tolist() == [[True] * 5, [True, True, False, False, False]]
    null_row = model.condition_encoder.text_embedding.weight[NULL_TEXT]
    torch.testing.assert_close(ids_source[1, 1], null_row)
    torch.testing.assert_close(ids_source[1, 0], model.condition_encoder.speaker_embedding.weight[3])
    assert PAD_BYTE == 256


# ---- condition dropout and guidance --------------------------------------------------------------
def test_dropout_draws_null_conditions_at_the_configured_rate_independently():
    """Issue 20: text and speaker dropped independently, to the null conditions, at their rates (training only)."""
    model = MultiCodebookLM(cond_cfg(condition={"text_dropout": 0.3, "speaker_dropout": 0.2}))
    n = 20000
    cond = inputs_of(model, ["ahoj"] * n, ["font_big"] * n)
    dropped = model.condition_encoder.drop(cond)
    text_null = dropped.text_len == 0
    speaker_null = dropped.speaker == model.config.condition.null_speaker
    for frac, p in ((text_null, 0.3), (speaker_null, 0.2), (text_null & speaker_null, 0.06)):
        assert abs(frac.double().mean().item() - p) < 4 * math.sqrt(p * (1 - p) / n)
    kept = ~text_null & ~speaker_null
    assert (dropped.text_len[kept] == 4).all() and (dropped.speaker[kept] == 1).all()
    # train mode drops inside the encoder, eval mode never
    model.eval()
    small = inputs_of(model, ["ahoj"] * 64, ["font_big"] * 64)
    torch.testing.assert_close(model.encode_condition(small).states, model.encode_condition(small).states)
    model.train()
    torch.manual_seed(1)
    trained = model.encode_condition(small)
    model.eval()
    expect_null = model.encode_condition(small.nulled(3)).states[0]
    hits = [(trained.states[i] - expect_null).abs().max() < 1e-6 for i in range(64)]
    assert 0 < sum(hits) < 64  # some rows became the fully null condition (p = 0.06 each), not all


def test_the_null_conditions_are_learned():
    """The null text token and the null speaker row get gradients when training drops to them."""
    model = MultiCodebookLM(cond_cfg(condition={"text_dropout": 1.0, "speaker_dropout": 1.0})).train()
    codes = torch.randint(0, 16, (2, 3, 6))
    model.loss(codes, None, inputs_of(model, ["ahoj", "x"], ["font_small", "font_big"])).loss.backward()
    enc = model.condition_encoder
    assert enc.text_embedding.weight.grad[NULL_TEXT].abs().sum() > 0
    assert enc.speaker_embedding.weight.grad[3].abs().sum() > 0
    assert enc.speaker_embedding.weight.grad[:3].abs().sum() == 0  # the real speakers were all dropped


def test_cfg_scale_1_is_the_conditional_model_and_0_the_unconditional():
    """Issue 20: logits = uncond + s (cond - uncond), one batched forward of both; s = 1 runs no unconditional rows."""
    model = cond_model()
    cond = inputs_of(model, ["ahoj", "loď"], ["font_small", "font_big"])
    tokens = torch.randint(0, model.config.embedding_rows, (2, 3, 9))
    conditional = model(tokens, memory=model.encode_condition(cond))
    unconditional = model(tokens)  # no memory: the null conditions
    assert not torch.allclose(conditional, unconditional, atol=1e-3)
    one = guided(model, *PAIR, 1.0)
    assert one.memory.batch_size == 2 and one.groups == 1
    torch.testing.assert_close(one(tokens), conditional, atol=1e-12, rtol=0)
    torch.testing.assert_close(guided(model, *PAIR, 0.0)(tokens), unconditional, atol=1e-12, rtol=0)
    three = guided(model, *PAIR, 3.0)
    assert three.memory.batch_size == 4
    rows = []
    model.token_embedding.register_forward_hook(lambda m, a, o: rows.append(a[0].shape[0]))
    torch.testing.assert_close(three(tokens), unconditional + 3.0 * (conditional - unconditional))
    assert rows == [4]  # one forward over the conditional and the unconditional rows together


def test_a_speaker_scale_of_its_own_guides_the_voice_and_the_text_apart():
    """lm.guidance: uncond + s_v (speaker - uncond) + s (cond - speaker), one forward of 3B rows; s_v = s is
    plain guidance (2B rows)."""
    model = cond_model()
    cond = inputs_of(model, ["ahoj", "loď"], ["font_small", "font_big"])
    tokens = torch.randint(0, model.config.embedding_rows, (2, 3, 9))
    conditional = model(tokens, memory=model.encode_condition(cond))
    alone = model(tokens, memory=model.encode_condition(model.condition_inputs(None, ["font_small", "font_big"], 2)))
    unconditional = model(tokens)
    same = guided(model, *PAIR, 2.0, 2.0)
    assert same.memory.batch_size == 4
    torch.testing.assert_close(same(tokens), guided(model, *PAIR, 2.0)(tokens), atol=1e-12, rtol=0)
    split = guided(model, *PAIR, 3.0, 1.5)
    assert split.memory.batch_size == 6 and split.new_cache(2).batch_size == 6
    rows = []
    model.token_embedding.register_forward_hook(lambda m, a, o: rows.append(a[0].shape[0]))
    want = unconditional + 1.5 * (alone - unconditional) + 3.0 * (conditional - alone)
    torch.testing.assert_close(split(tokens), want)
    assert rows == [6]
    torch.testing.assert_close(guided(model, *PAIR, 1.0, 0.0)(tokens),
                               unconditional + conditional - alone)
    with pytest.raises(ValueError, match="speaker guidance scale must be a finite number >= 0"):
        guided(model, *PAIR, 2.0, -1)


def test_cached_generation_with_cross_attention_gives_the_full_forward_logits():
    """Issue 20: each cached step's logits equal a full forward over the final sequence (float32, 1e-4),
    and every block's cross-attention keys/values are computed once for the whole generation."""
    model = cond_model(max_seq_len=64).float()
    projections = []
    for block in model.blocks:
        block.cross_attn.kv.register_forward_hook(lambda m, a, o: projections.append(1))
    prompt = torch.randint(0, 16, (2, 3, 4))
    plan = plan_generation(model, prompt, 12)
    plan.end = None  # run to the length, so the whole sequence is there to compare with
    with torch.no_grad():
        decoder = guided(model, ["ahoj", "hele"], ["font_small", "font_white"], 2.0)
        steps = list(iter_decode(decoder, plan, lambda logits: logits.argmax(-1)))
        assert len(projections) == model.config.n_layers
        full = decoder(model_inputs(model, model.pattern.revert(plan.seq)))
    for step in steps:
        torch.testing.assert_close(step.logits, full[:, :, step.step], atol=1e-4, rtol=1e-4)


# ---- end of audio ---------------------------------------------------------------------------------
def test_the_end_token_follows_the_last_frame_in_codebook_0():
    """lm.end_of_audio's picture: delay, N_c = 3, T = 4 -> k=0: 0 1 2 3 E ., k=1: . 0 1 2 3 ., k=2: . . 0 1 2 3."""
    e, pad = 16, 17
    codes = torch.arange(4).view(1, 1, 4).expand(1, 3, 4)
    seq, valid = layout_with_end(get_pattern("delay", 3), codes, None, torch.tensor([True]), e, pad)
    assert seq[0].tolist() == [[0, 1, 2, 3, e, pad], [pad, 0, 1, 2, 3, pad], [pad, pad, 0, 1, 2, 3]]
    assert valid[0, 0].tolist() == [True] * 5 + [False]
    # a window that stops before its file ends has no end token; a padded row ends after its real frames
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    seq, valid = layout_with_end(get_pattern("delay", 3), codes.expand(2, 3, 4), mask, torch.tensor([False, True]),
                                 e, pad)
    assert (seq[0] != e).all() and seq[1, 0].tolist() == [0, 1, e, pad, pad, pad]
    # the parallel pattern needs one more step for it
    seq, valid = layout_with_end(get_pattern("parallel", 3), codes, None, torch.tensor([True]), e, pad)
    assert seq.shape[-1] == 5 and seq[0, :, 4].tolist() == [e, pad, pad] and valid[0, :, 4].tolist() == [True, False, False]


def test_the_end_token_is_a_scored_target_of_codebook_0_only():
    model = cond_model()
    codes = torch.randint(0, 16, (2, 3, 5))
    nll, valid = model.token_nll(codes, None, None, torch.tensor([True, False]))
    plain_nll, plain_valid = model.token_nll(codes)
    assert valid.sum() == plain_valid.sum() + 1 and valid[0, 0, 5] and not valid[1, 0, 5]
    assert nll[0, 0, 5] > 0 and nll[1, 0, 5] == 0
    assert model.config.end_id == 16 and model(model_inputs(model, codes)).shape[-1] == 17


def rigged(model, end_logit):
    """Add `end_logit(rows)` to codebook 0's end-of-audio logit (a forward hook on the model)."""
    end = model.config.end_id

    def hook(module, args, out):
        out = out.clone()
        out[:, 0, :, end] += end_logit(out.shape[0])
        return out
    return model.register_forward_hook(hook)


def test_generation_stops_at_the_end_token_row_by_row_and_max_length_still_applies():
    model = cond_model()
    prompt = torch.randint(0, 16, (2, 3, 4))
    handle = rigged(model, lambda b: torch.tensor([1e4, -1e4] * (b // 2), dtype=torch.float64)[:, None])
    codes, lengths = generate(model, prompt, 10, sampling=SamplingOptions(seed=0, cfg_scale=1.0),
                              condition=Condition(text=["a", "b"], speaker="font_big"), return_lengths=True)
    handle.remove()
    assert lengths.tolist() == [4, 14]  # row 0 ended right after its prompt, row 1 ran to the maximum
    assert codes.shape == (2, 3, 14) and (codes[0, :, 4:] == 0).all() and torch.equal(codes[:, :, :4], prompt)
    assert int(codes.max()) < 16  # no special id reaches the caller
    # the later codebooks never choose the end, however likely they make it
    handle = model.register_forward_hook(lambda m, a, out: out.index_add(-1, torch.tensor([16]),
                                                                         torch.full_like(out[..., :1], 1e4)))
    plan = plan_generation(model, prompt, 6)
    with torch.no_grad():
        steps = list(iter_decode(guided(model, ["a", "b"], [None, None]), plan,
                                 lambda logits: logits.argmax(-1)))
    handle.remove()
    assert all((s.tokens[:, 1:] != 16).all() for s in steps)
    assert plan.end.ends.tolist() == [4, 4]  # codebook 0 ended at once
    # delay pattern: after the end at frame 4 (step 4) codebooks 1, 2 finish frames 3 (step 5), then stop
    assert steps[-1].step == 5 and (plan.seq[:, 0, 4] == 16).all() and (plan.seq[:, :, 5] != 16).all()
    assert (plan.seq[:, 0, 5] == model.config.pad_id).all() and (plan.seq[:, 1, 5] == model.config.pad_id).all()


def test_a_tiny_conditioned_lm_learns_what_each_speaker_says_and_when_to_stop():
    """End to end: speaker A's files are all code 3, speaker B's all code 7, 5 frames long; after training,
    greedy generation from each speaker says its code and stops by itself after 5 frames."""
    torch.manual_seed(0)
    model = MultiCodebookLM(cond_cfg(d_model=32, condition={"encoder_layers": 1}))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    codes = torch.tensor([3, 7]).view(2, 1, 1).expand(2, 3, 5)
    cond = inputs_of(model, [None, None], ["font_small", "font_big"])
    for _ in range(150):
        opt.zero_grad()
        model.loss(codes, None, cond, torch.tensor([True, True])).loss.backward()
        opt.step()
    out, lengths = generate(model, None, 12, sampling=SamplingOptions(greedy=True, cfg_scale=1.0),
                            condition=Condition(speaker=["font_small", "font_big"]), return_lengths=True)
    assert lengths.tolist() == [5, 5] and torch.equal(out, codes)


# ---- refusals ---------------------------------------------------------------------------------------
def test_unknown_speakers_long_texts_and_conditions_for_unconditioned_lms_are_refused():
    model = cond_model()
    with pytest.raises(ValueError, match="unknown speaker 'nemo'; this LM knows: font_small, font_big, font_white"):
        generate(model, None, 3, condition=Condition(text="a", speaker="nemo"))
    with pytest.raises(ValueError, match="25 UTF-8 bytes is over this LM's limit of text_max_bytes=24"):
        generate(model, None, 3, condition=Condition(text="ř" * 12 + "a"))
    with pytest.raises(ValueError, match="3 texts for a batch of 2"):
        generate(model, torch.zeros(2, 3, 1, dtype=torch.long), 3, condition=Condition(text=["a", "b", "c"]))
    with pytest.raises(ValueError, match="guidance scale"):
        generate(model, None, 3, sampling=SamplingOptions(cfg_scale=-1.0), condition=Condition(text="a"))
    plain = MultiCodebookLM(LMConfig(n_codebooks=3, codebook_size=16, d_model=32, n_layers=1, n_heads=4))
    for kwargs in ({"condition": Condition(text="a")}, {"condition": Condition(speaker="font_small")},
                   {"sampling": SamplingOptions(cfg_scale=3.0)}):
        with pytest.raises(ValueError, match="this LM is not conditioned"):
            generate(plain, None, 3, **kwargs)
    with pytest.raises(ValueError, match="takes no memory"):
        plain(torch.zeros(1, 3, 2, dtype=torch.long), memory=model.encode_condition(None, 1))
    with pytest.raises(ValueError, match="not conditioned: it takes no condition"):
        plain.loss(torch.zeros(1, 3, 2, dtype=torch.long), ends=torch.tensor([True]))
    with pytest.raises(ValueError, match="unknown ConditionConfig settings \\['speaker'\\]"):
        cond_cfg(condition={"speaker": ["x"]})
    with pytest.raises(ValueError, match="names a speaker twice"):
        cond_cfg(condition={"speakers": ["a", "a"]})


# ---- files ------------------------------------------------------------------------------------------
def test_a_conditioned_lm_saves_and_loads_with_its_speaker_table(tmp_path):
    model = MultiCodebookLM(cond_cfg()).eval()
    model.save_pretrained(tmp_path / "lm")
    saved = json.loads((tmp_path / "lm" / "config.json").read_text())["config"]["condition"]
    assert saved["speakers"] == SPEAKERS and saved["text_max_bytes"] == 24
    loaded = MultiCodebookLM.from_pretrained(tmp_path / "lm").eval()
    cond = inputs_of(model, ["ahoj"], ["font_white"])
    tokens = torch.randint(0, model.config.embedding_rows, (1, 3, 6))
    torch.testing.assert_close(loaded(tokens, memory=loaded.encode_condition(cond)),
                               model(tokens, memory=model.encode_condition(cond)), atol=0, rtol=0)


def test_an_unconditioned_lm_has_exactly_todays_parameters_and_config(tmp_path):
    cfg = LMConfig(n_codebooks=2, codebook_size=8, d_model=16, n_layers=1, n_heads=2)
    model = MultiCodebookLM(cfg)
    assert "condition" not in cfg.to_dict() and (cfg.pad_id, cfg.bos_id, cfg.end_id) == (8, 9, None)
    assert sorted(model.state_dict()) == [
        "blocks.0.attn.out.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn_norm.weight", "blocks.0.ffn.w1.weight",
        "blocks.0.ffn.w2.weight", "blocks.0.ffn.w3.weight", "blocks.0.ffn_norm.weight", "final_norm.weight",
        "head_weight", "token_embedding.weight"]
    model.save_pretrained(tmp_path / "lm")
    assert "condition" not in json.loads((tmp_path / "lm" / "config.json").read_text())["config"]


def test_the_shipped_lm_loads_and_gives_the_logits_and_generation_it_gave_before_conditioning():
    """Reference numbers recorded from models/lm-speech-16k (the two-envelope codec's tokens) with the code
    of 567282f, which gave the LM of the one-envelope codec's tokens (git 567282f) exactly the numbers
    recorded for it with the code of 35aea3a, the LM of stage 8's tokens (git 295b688) those of a03c611,
    and the stage-7 LM (git e2a65ea) those of the code before issue 20."""
    shipped = REPO / "models" / "lm-speech-16k"
    lm = MultiCodebookLM.from_pretrained(shipped).eval()
    on_disk = json.loads((shipped / "config.json").read_text())["config"]
    assert lm.config.to_dict() == on_disk and lm.condition_encoder is None
    codes = (torch.arange(8 * 40).view(1, 8, 40) * 37 + 11) % 1024
    with torch.no_grad():
        logits = lm(model_inputs(lm, codes))
        nll, valid = lm.token_nll(codes)
    assert logits.shape == (1, 8, 47, 1024) and int(valid.sum()) == 320
    assert float(nll.sum()) == pytest.approx(2593.61669921875, rel=1e-5)
    for (c, s, v), want in {(0, 0, 0): 5.2290825843811035, (0, 5, 17): -0.3582923412322998,
                            (3, 20, 500): -1.0198235511779785, (7, 46, 1023): 0.1436999887228012,
                            (5, 30, 7): -0.5045724511146545}.items():
        assert float(logits[0, c, s, v]) == pytest.approx(want, abs=2e-5)
    out = generate(lm, codes[..., :10], 12, sampling=SamplingOptions(greedy=True))
    assert out[0, :, 10:].tolist() == [
        [0] * 12, [60] * 12, [511, 511, 753, 753, 753, 511, 511, 511, 511, 511, 511, 753], [925] * 12,
        [98] * 9 + [192] * 3, [583] * 3 + [208] * 6 + [2] * 3, [688] * 7 + [174, 353, 353, 88, 756],
        [634] * 7 + [165, 634, 634, 165, 1014]]


# ---- training data: each window's condition from the token folder's metadata ------------------------

def conditioned_tokens(out: Path):
    """The synthetic token corpus of tests/test_lm_data.py, every 5th file without metadata, the others
    with a text and one of three speakers."""
    import numpy as np

    from rvqlm_core.shard_writer import write_token_corpus
    from test_lm_data import codec_meta, learnable_tokens

    rng = np.random.default_rng(0)
    arrays, meta = {}, {}
    for i in range(24):
        path = f"{'train' if i < 18 else 'valid'}/level{i % 4}/f{i:03d}.wav"
        arrays[path] = learnable_tokens(int(rng.integers(10, 120)), rng)
        if i % 5:
            meta[path] = {"text": f"věta {i}", "text_en": f"sentence {i}", "speaker": SPEAKERS[i % 3]}
    return write_token_corpus(out, arrays, codec_meta(), shard_frames=500, metadata=meta)


@pytest.fixture(scope="module")
def cond_tokens(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cond_tokens") / "tok"
    conditioned_tokens(out)
    return out


def test_a_window_gets_its_files_speaker_its_text_only_from_the_start_and_the_end_only_at_the_end(cond_tokens):
    """lm.data's rule: text for a window that starts its file, "" (null) inside it; speaker always; ends where the
    window reaches the file's last frame. The windows drawn are those of an unconditioned stream."""
    from lm.data import TokenDataModule, TokenFiles, TrainWindowStream, ValidWindows

    files = TokenFiles.of_split(cond_tokens, "train")
    kw = dict(n_codebooks=3, window_frames=40, batch_size=4, batches_per_epoch=10, seed=3)
    plain, cond = TrainWindowStream(files, **kw), TrainWindowStream(files, **kw, conditions=True)
    seen = {"start": 0, "inside": 0, "end": 0, "no metadata": 0}
    for b in range(10):
        batch, plain_batch = cond.batch(b), plain.batch(b)
        assert torch.equal(batch["codes"], plain_batch["codes"]) and "text" not in plain_batch
        for j in range(4):
            entry, start, length = cond.sample_span(b * 4 + j)
            f = files.entry_indices.index(entry)
            i = int(files.relpaths[f][-7:-4])  # f{i:03d}.wav
            meta = i % 5 != 0
            assert batch["speaker"][j] == (SPEAKERS[i % 3] if meta else "")
            assert batch["text"][j] == (f"věta {i}" if meta and start == 0 else "")
            assert bool(batch["ends"][j]) == (start + length == files.n_frames[f])
            seen["start"] += start == 0 and meta
            seen["inside"] += start > 0
            seen["end"] += bool(batch["ends"][j])
            seen["no metadata"] += not meta
    assert all(seen.values()), seen
    valid = TokenFiles.of_split(cond_tokens, "valid")
    windows = list(ValidWindows(valid, 3, 30, 50, conditions=True))[0]
    firsts = [start == 0 for _, start, _ in ValidWindows(valid, 3, 30, 50).spans]
    assert [bool(t) for t in windows["text"]] == [f and bool(valid.texts[k]) for k, f in
                                                   zip(_file_per_span(valid, 30), firsts)]
    assert int(windows["ends"].sum()) == len(valid)  # each file's last window, once
    dm = TokenDataModule(str(cond_tokens), window_frames=40, conditions=True)
    assert dm.speakers == sorted(SPEAKERS) and "conditions_sha256" in dm.state_dict()


def _file_per_span(files, window):
    return [k for k, n in enumerate(files.n_frames) for _ in range(0, n, window)]


def test_training_refuses_conditions_that_do_not_fit_the_lm(cond_tokens):
    from lm.data import TokenDataModule
    from lm.training import check_conditions

    dm = TokenDataModule(str(cond_tokens), window_frames=40, conditions=True)
    with pytest.raises(ValueError, match="its text has 7 UTF-8 bytes, over the LM's text_max_bytes=4"):
        check_conditions(cond_cfg(condition={"text_max_bytes": 4}), dm)
    with pytest.raises(ValueError, match="speaker 'font_(small|big|white)' is not in the LM's table \\(font_small\\)"):
        check_conditions(cond_cfg(condition={"speakers": ["font_small"]}), dm)
    with pytest.raises(ValueError, match="data.conditions is False"):
        check_conditions(cond_cfg(), TokenDataModule(str(cond_tokens), window_frames=40))
    check_conditions(cond_cfg(), dm)  # the table and the limit fit


CONDITION_ARGS = ["--data.conditions", "true", "--model.config.condition",
                  json.dumps({"text_max_bytes": 16, "encoder_layers": 1, "text_dropout": 0.3, "speaker_dropout": 0.3})]


def test_a_killed_conditioned_run_resumes_exactly(cond_tokens, tmp_path):
    """Issue 20: exact resume of a conditioned run (condition dropout draws from the restored RNG; the data
    position and the conditions are the checkpoint's): an uninterrupted 14 steps vs killed at 11 + resumed give
    the same loss at every step and the same weights; its speaker table comes from the token folder; a resume
    after the metadata changed is refused."""
    import shutil

    from lm.training import train_main
    from rvqlm_core.shard_writer import ShardWriter
    from rvqlm_core.token_shards import TokenShards
    from test_lm_data import codec_meta
    from test_lm_training import (RESUME_ARGS, KillAtStep, RecordLosses, callback_arg, read_losses, run_cli_subprocess,
                                  tiny_args)

    common = [*RESUME_ARGS, *CONDITION_ARGS]
    full_log, cut_log = tmp_path / "full.jsonl", tmp_path / "cut.jsonl"
    train_main(tiny_args(cond_tokens, tmp_path / "full", *common, callback_arg(RecordLosses, path=str(full_log))))
    killed = run_cli_subprocess(tiny_args(cond_tokens, tmp_path / "cut", *common,
                                          callback_arg(RecordLosses, path=str(cut_log)), callback_arg(KillAtStep, step=11)))
    assert killed.returncode == 137, killed.stderr[-3000:]
    train_main(tiny_args(cond_tokens, tmp_path / "cut", *common, callback_arg(RecordLosses, path=str(cut_log)),
                         "--ckpt_path", "last"))
    full, resumed = read_losses(full_log), read_losses(cut_log)
    assert sorted(full) == sorted(resumed) == list(range(1, 15))
    assert all(resumed[s] == full[s] for s in full), [(s, resumed[s], full[s]) for s in full]
    a = MultiCodebookLM.from_pretrained(tmp_path / "full" / "pretrained")
    b = MultiCodebookLM.from_pretrained(tmp_path / "cut" / "pretrained")
    assert a.config.condition.speakers == sorted(SPEAKERS) and a.config.end_id == 16
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    # new metadata under the same tokens: the stream would not be the one the checkpoint was in
    changed = tmp_path / "tok_changed"
    shutil.copytree(cond_tokens, changed)
    writer = ShardWriter(changed, codec_meta())
    writer.update_metadata({TokenShards.open(changed).entries[0].path: {"text": "jiná věta", "speaker": "font_big"}})
    with pytest.raises(ValueError, match="conditions_sha256"):
        train_main(tiny_args(changed, tmp_path / "cut", *common, "--trainer.max_steps", "16", "--ckpt_path", "last"))
