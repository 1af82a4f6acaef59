"""init_from a conditioned LM from an unconditioned one (lm.warm_start): the decoder is copied
strictly, only the encoder, the cross-attention and the end-of-audio rows start fresh, and the
started model's code logits are the old LM's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lm import LMConfig, MultiCodebookLM
from lm.conditioning import ConditionInputs
from lm.training import LMTrainingModule
from lm.warm_start import warm_start
from seed_helpers import randomized

CONDITION = {"speakers": ["font_small", "font_big"], "text_max_bytes": 16, "encoder_layers": 1,
             "text_dropout": 0.0, "speaker_dropout": 0.0}


def plain_cfg(**overrides) -> LMConfig:
    base = dict(n_codebooks=3, codebook_size=11, d_model=16, n_layers=2, n_heads=2, max_seq_len=24,
                codec_fingerprint="f" * 64)
    return LMConfig(**{**base, **overrides})


def inputs(model, codes):
    """[bos, pattern sequence shifted right] in the model's own ids (pad and bos differ between the two)."""
    seq, _ = model.pattern.build(codes, None, model.config.pad_id)
    return torch.cat([torch.full_like(seq[..., :1], model.config.bos_id), seq[..., :-1]], dim=-1)


@pytest.mark.parametrize("tie", [False, True])
def test_a_conditioned_lm_starts_as_the_unconditioned_one_whatever_the_condition(tie):
    old = randomized(MultiCodebookLM(plain_cfg(tie_weights=tie)), seed=1)
    new = MultiCodebookLM(plain_cfg(tie_weights=tie, condition=CONDITION)).double().eval()
    fresh = warm_start(new, old, "old")
    assert fresh and all(k.startswith("condition_encoder.") or ".cross_attn." in k or ".cross_norm." in k
                         for k in fresh)
    assert any(k.startswith("condition_encoder.") for k in fresh) and any(".cross_attn.q." in k for k in fresh)
    for name, tensor in old.state_dict().items():  # every shared tensor copied (the two resized ones below)
        if name not in ("token_embedding.weight", "head_weight"):
            assert torch.equal(new.state_dict()[name], tensor), name
    v = old.config.codebook_size
    old_tables = old.token_embedding.weight.view(3, v + 2, -1)
    new_tables = new.token_embedding.weight.view(3, v + 3, -1)
    assert torch.equal(new_tables[:, :v], old_tables[:, :v])
    assert torch.equal(new_tables[:, new.config.pad_id], old_tables[:, old.config.pad_id])
    assert torch.equal(new_tables[:, new.config.bos_id], old_tables[:, old.config.bos_id])
    codes = torch.randint(0, v, (2, 3, 9))
    want = old(inputs(old, codes))
    for text, speaker in ((["ahoj", "loď"], ["font_small", "font_big"]), ([None, None], [None, None])):
        memory = new.encode_condition(new.condition_inputs(text, speaker, 2))
        got = new(inputs(new, codes), memory=memory)
        assert got.shape[-1] == v + 1  # the end-of-audio logit is new
        torch.testing.assert_close(got[..., :v], want, rtol=0, atol=1e-12)


def test_the_conditions_get_a_gradient_from_the_first_step():
    """Zero cross-attention output projections still learn: their gradient is not zero, and one step
    later the conditions change the logits."""
    old = MultiCodebookLM(plain_cfg())
    new = MultiCodebookLM(plain_cfg(condition=CONDITION))
    warm_start(new, old, "old")
    codes = torch.randint(0, 11, (2, 3, 8))
    cond = new.condition_inputs(["ahoj", "loď"], ["font_small", "font_big"], 2)
    new.loss(codes, condition=cond, ends=torch.tensor([True, False])).loss.backward()
    grad = new.blocks[0].cross_attn.out.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    with torch.no_grad():
        for block in new.blocks:
            block.cross_attn.out.weight -= 0.5 * block.cross_attn.out.weight.grad.sign()
    other = ConditionInputs(cond.text, cond.text_len, cond.speaker.flip(0))
    a = new(inputs(new, codes), memory=new.encode_condition(cond))
    b = new(inputs(new, codes), memory=new.encode_condition(other))
    assert not torch.allclose(a, b)


def test_the_training_module_warm_starts_from_a_saved_unconditioned_lm(tmp_path):
    old = MultiCodebookLM(plain_cfg())
    old.save_pretrained(tmp_path / "src")
    module = LMTrainingModule(plain_cfg(dropout=0.1, condition=CONDITION), init_from=str(tmp_path / "src"))
    for name, tensor in old.state_dict().items():
        if name not in ("token_embedding.weight", "head_weight"):
            assert torch.equal(module.model.state_dict()[name], tensor), name
    assert all(b.cross_attn.out.weight.abs().sum() == 0 for b in module.model.blocks)


def test_other_pairs_are_refused_with_every_difference_named(tmp_path):
    plain = MultiCodebookLM(plain_cfg())
    conditioned = MultiCodebookLM(plain_cfg(condition=CONDITION))
    with pytest.raises(ValueError, match=r"init_from src: .* condition .*only in `condition`"):
        warm_start(MultiCodebookLM(plain_cfg()), conditioned, "src")  # conditioned -> unconditioned
    with pytest.raises(ValueError, match=r"condition .*d_model \(16 vs 32\)"):
        warm_start(MultiCodebookLM(plain_cfg(d_model=32, condition=CONDITION)), plain, "src")
    other_speakers = dataclasses.replace(conditioned.config.condition, speakers=["x"])
    with pytest.raises(ValueError, match="condition"):  # conditioned -> conditioned with another table
        warm_start(MultiCodebookLM(plain_cfg(condition=other_speakers)), conditioned, "src")
    plain.save_pretrained(tmp_path / "src")
    with pytest.raises(ValueError, match="codec_fingerprint"):
        LMTrainingModule(plain_cfg(condition=CONDITION), codec_fingerprint="0" * 64, init_from=str(tmp_path / "src"))


def test_fresh_lr_scale_trains_only_the_fresh_parameters_faster(tmp_path):
    MultiCodebookLM(plain_cfg()).save_pretrained(tmp_path / "src")
    module = LMTrainingModule(plain_cfg(condition=CONDITION), init_from=str(tmp_path / "src"), lr=1e-3,
                              fresh_lr_scale=10.0, total_steps=20, warmup_steps=0, measure_peak=False)
    optimizer = module.configure_optimizers()["optimizer"]
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(module.model.named_parameters())
    assert len(lr_of) == sum(len(g["params"]) for g in optimizer.param_groups) == len(names)  # each once
    for name, p in names.items():
        fresh = name.startswith("condition_encoder.") or ".cross_attn." in name or ".cross_norm." in name
        assert lr_of[id(p)] == pytest.approx(1e-2 if fresh else 1e-3), name
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.0, 0.1}  # decay stays on matrices only
    with pytest.raises(ValueError, match="give init_from"):
        LMTrainingModule(plain_cfg(condition=CONDITION), fresh_lr_scale=10.0)
