"""The fast generation paths give the tokens of the straightforward ones, bit for bit (issue 40).

* lm.decode_step (`MultiCodebookLM.decode_step`, used by lm.ar_decode after the prefill) against the model's
  forward with the KV cache: equal logits (torch.equal, not a tolerance) for every configuration, and equal
  tokens and logits of whole generations, `iter_decode(fast=True)` against `fast=False`, on the shipped AR LM
  (float32 and int8), the shipped conditioned LM at cfg 3 with monotonic reading, and past the context.
  Its float32 RMSNorm against torch's, torch.equal.
* sampling (`SamplingOptions.sample`, `draw`) and the masked family's chooser against the code they
  replaced, kept here as the reference.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lm import LMConfig, MultiCodebookLM, load_lm
from lm.alignment import ReadingWindow
from lm.ar_decode import iter_decode, plan_generation
from lm.conditioning import Condition
from lm.guidance import GuidedDecoder
from lm.int8 import to_int8
from lm.masked_generate import _chooser, with_choice_noise
from lm.rope import RotaryEmbedding
from lm.sampling import SamplingOptions, filter_logits

MODELS = Path(__file__).resolve().parents[1] / "models"


def tiny(**overrides) -> MultiCodebookLM:
    base = dict(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=4, max_seq_len=24)
    base.update(overrides)
    torch.manual_seed(0)
    model = MultiCodebookLM(LMConfig(**base)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model


def test_rope_table_equals_the_angles_computed_per_position():
    rope = RotaryEmbedding(64)
    for p in [*range(0, 3000, 7), 1023, 1024, 2047, 2048, 70_001]:
        assert all(torch.equal(a, b) for a, b in zip(rope.cos_sin(torch.tensor([p]), torch.float32),
                                                     rope.cos_sin_at(p, torch.float32))), p


COND = {"speakers": ["a", "b"], "text_max_bytes": 16, "encoder_layers": 1}


def test_the_steps_rms_norm_equals_torchs_bit_for_bit():
    from lm.decode_step import _norm
    from lm.layers import RMSNorm

    norm = RMSNorm(256)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3, generator=g)
        for shape in [(1, 1, 256), (2, 1, 256), (1, 157, 256)]:
            for scale in (1e-3, 1.0, 30.0):
                x = torch.randn(*shape, generator=g) * scale
                assert torch.equal(_norm(norm, x), norm(x)), (shape, scale)


@pytest.mark.parametrize("overrides", [
    {}, {"pos": "learned"}, {"pos": "sinusoidal", "norm": "layernorm", "ffn": "gelu"}, {"n_kv_heads": 2},
    {"n_experts": 2, "moe_top_k": 1}, {"condition": COND}, {"bias": True, "tie_weights": True},
])
@pytest.mark.parametrize("int8", [False, True])
def test_decode_step_logits_equal_the_cached_forward_bit_for_bit(overrides, int8):
    model = tiny(**overrides)
    model = to_int8(model) if int8 else model
    tokens = torch.randint(0, model.config.codebook_size, (2, 3, 24), generator=torch.Generator().manual_seed(1))
    memory = model.cross_memory(model.condition_inputs(["ahoj", "loď"], ["a", "b"], 2)) \
        if "condition" in overrides else None
    with torch.inference_mode():
        ref, fast = model.new_cache(2), model.new_cache(2)
        assert torch.equal(model(tokens[..., :5], cache=ref, memory=memory),
                           model(tokens[..., :5], cache=fast, memory=memory))
        for i in range(5, 24):
            step = tokens[..., i:i + 1]
            assert torch.equal(model(step, cache=ref, memory=memory), model.decode_step(step, fast, memory)), i
    assert fast.length == ref.length == 24 and torch.equal(fast.keys, ref.keys) and torch.equal(fast.values, ref.values)


def generations(model, prompt, frames: int, sampling: SamplingOptions, condition=None, reading=False):
    """(seq, logits of every step) of iter_decode with fast=True and with fast=False (an eval-mode model, as
    `generate` makes it)."""
    assert not model.training
    out = []
    for fast in (True, False):
        plan = plan_generation(model, prompt, frames)
        decoder = GuidedDecoder(model, condition, sampling, prompt.shape[0], ReadingWindow if reading else None)
        generator = sampling.generator("cpu")
        with torch.inference_mode():
            steps = list(iter_decode(decoder, plan, lambda logits: sampling.sample(logits, generator), fast=fast))
        out.append((plan.seq, torch.stack([s.logits for s in steps])))
    return out


def assert_same(pair) -> None:
    (seq_fast, logits_fast), (seq_ref, logits_ref) = pair
    assert torch.equal(seq_fast, seq_ref)
    assert torch.equal(logits_fast, logits_ref)


def test_past_the_context_the_sink_ring_and_additive_recompute_decode_the_same():
    prompt = torch.randint(0, 16, (2, 3, 3), generator=torch.Generator().manual_seed(2))
    for pos in ("rope", "learned"):
        assert_same(generations(tiny(pos=pos, max_seq_len=12), prompt, 30, SamplingOptions(seed=3)))


@pytest.fixture(scope="module")
def shipped_lm() -> MultiCodebookLM:
    return load_lm(MODELS / "lm-speech-16k").eval()


@pytest.mark.parametrize("int8", [False, True])
def test_the_shipped_lm_generates_the_same_tokens_fast_and_by_its_forward(shipped_lm, int8):
    model = to_int8(load_lm(MODELS / "lm-speech-16k")) if int8 else shipped_lm  # to_int8: eval mode
    prompt = torch.randint(0, 1024, (1, 8, 20), generator=torch.Generator().manual_seed(5))
    assert_same(generations(model, prompt, 40, SamplingOptions(top_k=250, seed=1)))


def test_the_shipped_lm_past_its_context_generates_the_same_tokens(shipped_lm):
    prompt = torch.randint(0, 1024, (1, 8, 300), generator=torch.Generator().manual_seed(6))
    assert_same(generations(shipped_lm, prompt, 30, SamplingOptions(seed=2)))  # steps 300..336 of a 320 window


def test_the_shipped_conditioned_lm_at_cfg_3_reading_in_order_generates_the_same_tokens():
    model = load_lm(MODELS / "lm-speech-conditioned-16k").eval()
    prompt = torch.zeros(1, 8, 0, dtype=torch.long)
    condition = Condition("Co je to za divnou loď?", "font_small")
    for sampling in (SamplingOptions(seed=0, cfg_scale=3.0), SamplingOptions(seed=1, cfg_scale=3.0,
                                                                             speaker_cfg_scale=2.0, top_k=250)):
        assert_same(generations(model, prompt, 40, sampling, condition, reading=True))


# ---- sampling: the code before issue 40, kept as the reference -----------------------------------
def reference_sample_next(logits, temperature=1.0, top_k=None, top_p=None, greedy=False, generator=None):
    if greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def reference_chooser(sampling, generator, choice_temperature=0.0):
    def choose(logits, anneal=0.0):
        filtered = logits.float() if sampling.greedy else filter_logits(logits, sampling.temperature, sampling.top_k,
                                                                       sampling.top_p)
        codes = reference_sample_next(logits, sampling.temperature, sampling.top_k, sampling.top_p, sampling.greedy,
                                      generator)
        confidence = filtered.log_softmax(dim=-1).gather(-1, codes[..., None])[..., 0]
        return codes, with_choice_noise(confidence, choice_temperature * anneal, generator)
    return choose


OPTIONS = [SamplingOptions(), SamplingOptions(top_k=250), SamplingOptions(temperature=0.7, top_k=50, top_p=0.9),
           SamplingOptions(greedy=True)]


@pytest.mark.parametrize("sampling", OPTIONS)
def test_sampling_draws_the_ids_of_the_reference_from_the_same_generator(sampling):
    logits = torch.randn(40, 3, 8, 1024, generator=torch.Generator().manual_seed(7)) * 3
    g_new, g_ref = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for row in logits:
        assert torch.equal(sampling.sample(row, g_new), reference_sample_next(
            row, sampling.temperature, sampling.top_k, sampling.top_p, sampling.greedy, g_ref))


@pytest.mark.parametrize("sampling", OPTIONS)
def test_the_masked_chooser_equals_the_reference(sampling):
    logits = torch.randn(6, 2, 30, 1024, generator=torch.Generator().manual_seed(8)) * 3
    new = _chooser(sampling, torch.Generator().manual_seed(3), 4.5)
    ref = reference_chooser(sampling, torch.Generator().manual_seed(3), 4.5)
    for i, row in enumerate(logits):
        anneal = 1 - (i + 1) / len(logits)
        (codes, conf), (codes_ref, conf_ref) = new(row, anneal), ref(row, anneal)
        assert torch.equal(codes, codes_ref) and torch.equal(conf, conf_ref)
        assert not math.isnan(float(conf.sum()))
