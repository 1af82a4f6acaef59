"""The speaker bias of a conditioned LM (ConditionConfig.speaker_bias): the encoder's speaker-slot
output, projected, added to every decoder input. It starts at zero and is read at every frame."""

from __future__ import annotations

import torch

from lm import MultiCodebookLM
from lm.generate import iter_decode, plan_generation
from lm.guidance import ConditionedDecoder
from test_lm_conditioning import cond_cfg, cond_model, inputs_of, model_inputs


def test_a_fresh_speaker_bias_is_zero_so_a_warm_started_decoder_starts_as_it_was():
    torch.manual_seed(0)
    plain = MultiCodebookLM(cond_cfg())
    torch.manual_seed(0)
    biased = MultiCodebookLM(cond_cfg(condition={"speaker_bias": True}))
    missing = biased.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing == ["speaker_bias.weight"] and not biased.speaker_bias.weight.any()
    plain.eval(), biased.eval()
    codes = torch.randint(0, 16, (2, 3, 6))
    cond = inputs_of(plain, ["ahoj", "hele"], ["font_small", "font_big"])
    with torch.no_grad():
        torch.testing.assert_close(biased(codes, memory=biased.encode_condition(cond)),
                                   plain(codes, memory=plain.encode_condition(cond)))


def test_the_speaker_reaches_every_frame_through_the_bias_without_cross_attention():
    """With every cross-attention output zeroed, the speaker still changes the logits at each frame."""
    model = cond_model(condition={"speaker_bias": True}).eval()
    for block in model.blocks:
        block.cross_attn.out.weight.data.zero_()
    codes = torch.randint(0, 16, (1, 3, 8))
    with torch.no_grad():
        small, big = (model(codes, memory=model.encode_condition(inputs_of(model, ["ahoj"], [s])))
                      for s in ("font_small", "font_big"))
    assert ((small - big).abs().amax(dim=(0, 1, 3)) > 1e-3).all()
    model.speaker_bias.weight.data.zero_()
    with torch.no_grad():
        small, big = (model(codes, memory=model.encode_condition(inputs_of(model, ["ahoj"], [s])))
                      for s in ("font_small", "font_big"))
    torch.testing.assert_close(small, big)


def test_cached_generation_with_the_speaker_bias_gives_the_full_forward_logits():
    model = cond_model(max_seq_len=64, condition={"speaker_bias": True}).float()
    cond = inputs_of(model, ["ahoj", "hele"], ["font_small", "font_white"])
    prompt = torch.randint(0, 16, (2, 3, 4))
    plan = plan_generation(model, prompt, 12)
    plan.end = None
    with torch.no_grad():
        decoder = ConditionedDecoder(model, cond, 2.0)
        steps = list(iter_decode(decoder, plan, lambda logits: logits.argmax(-1)))
        full = decoder(model_inputs(model, model.pattern.revert(plan.seq)))
    for step in steps:
        torch.testing.assert_close(step.logits, full[:, :, step.step], atol=1e-4, rtol=1e-4)
