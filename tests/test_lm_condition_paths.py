"""How the conditions reach a conditioned LM's decoder: the encoder's memory is centred over the
source positions (so a constant the encoder adds to every row cannot stand in for the condition),
and the speaker also reaches every decoder input through the voice table."""

from __future__ import annotations

import torch

from lm import MultiCodebookLM
from lm.conditioning import centred
from test_lm_conditioning import cond_cfg, cond_model, inputs_of


def test_centred_removes_the_mean_of_the_real_rows_and_leaves_padding_alone():
    h = torch.randn(2, 5, 8)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = centred(h, mask)
    assert torch.allclose(out[0].mean(0), torch.zeros(8), atol=1e-6)
    assert torch.allclose(out[1, :2].mean(0), torch.zeros(8), atol=1e-6)
    assert torch.equal(out[1, 2:], h[1, 2:])
    # a constant added to every real row changes nothing: the memory carries only what differs
    shifted = h + 1000.0 * torch.randn(1, 1, 8)
    assert torch.allclose(centred(shifted, mask)[0], out[0], atol=1e-3)


def test_a_constant_from_the_encoder_blocks_does_not_reach_the_memory():
    """The encoder's last block adding one large vector to every row (what the collapsed encoder of
    docs/experiments.md learned) leaves the memory as it was."""
    model = cond_model().eval()
    enc = model.condition_encoder
    cond = inputs_of(model, ["ahoj", "hele"], ["font_small", "font_big"])
    with torch.no_grad():
        before = enc(cond).states
        last = enc.blocks[-1]
        offset = 50.0 * torch.randn(model.config.d_model)
        original = last.forward
        last.forward = lambda *a, **k: original(*a, **k) + offset
        after = enc(cond).states
    mask = enc(cond).mask
    torch.testing.assert_close(after[mask], before[mask], atol=1e-4, rtol=1e-4)


def test_the_voice_table_starts_at_zero_and_carries_the_speaker_to_every_frame():
    assert not MultiCodebookLM(cond_cfg()).condition_encoder.voice.weight.any()  # a warm start starts as it was
    model = cond_model().eval()
    with torch.no_grad():
        model.condition_encoder.voice.weight.zero_()
    for block in model.blocks:
        block.cross_attn.out.weight.data.zero_()            # no cross-attention at all
    codes = torch.randint(0, 16, (1, 3, 8))
    forward = lambda s: model(codes, memory=model.encode_condition(inputs_of(model, ["ahoj"], [s])))
    with torch.no_grad():
        torch.testing.assert_close(forward("font_small"), forward("font_big"))
        model.condition_encoder.voice.weight.normal_()
        small, big = forward("font_small"), forward("font_big")
    assert ((small - big).abs().amax(dim=(0, 1, 3)) > 1e-3).all()  # every frame hears the voice


def test_the_voice_is_saved_and_loaded_with_the_lm(tmp_path):
    model = cond_model()
    with torch.no_grad():
        model.condition_encoder.voice.weight.normal_()
    model.save_pretrained(tmp_path / "lm")
    loaded = MultiCodebookLM.from_pretrained(tmp_path / "lm")
    torch.testing.assert_close(loaded.condition_encoder.voice.weight.double(), model.condition_encoder.voice.weight.double())
