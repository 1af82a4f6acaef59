"""Mixture-of-experts FFN (lm.moe): the routed weighted sum, gradients to every chosen expert, the
Switch load-balancing loss, k = E as a dense average, cached generation, and training with it (the
aux loss in the objective, exact resume, DDP). Seed 001: "Mixture-of-Experts models, Grouped-Query
Attention (GQA), and quantization" (the mixture-of-experts part)."""

from __future__ import annotations

import math

import pytest
import torch

from lm import LMConfig, MultiCodebookLM
from lm.ar_decode import ARDecoding
from lm.generate import generate
from lm.layers import SwiGLU
from lm.moe import MoEFeedForward, balance_loss, moe_aux_loss
from lm.sampling import SamplingOptions


def moe_cfg(**overrides) -> LMConfig:
    base = dict(n_codebooks=2, codebook_size=16, d_model=16, n_layers=2, n_heads=2, max_seq_len=32,
                n_experts=4, moe_top_k=2, d_ff=24)
    return LMConfig(**{**base, **overrides})


def moe_layer(seed: int = 0, **overrides) -> MoEFeedForward:
    torch.manual_seed(seed)
    model = MultiCodebookLM(moe_cfg(**overrides))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model.blocks[0].ffn


def test_output_is_the_routed_experts_weighted_sum():
    """Seed 001 (mixture of experts): each position goes to its top-k experts by router logit, weighted by
    the softmax over those k logits; computed here position by position."""
    layer = moe_layer()
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = layer(x)
        logits = x @ layer.router.weight.T  # [3, 5, E]
        for b in range(3):
            for s in range(5):
                top = torch.topk(logits[b, s], 2)
                gates = torch.exp(top.values) / torch.exp(top.values).sum()
                want = sum(g * layer.experts[int(e)](x[b, s]) for g, e in zip(gates, top.indices))
                torch.testing.assert_close(y[b, s], want, rtol=1e-5, atol=1e-6)
    assert isinstance(layer.experts[0], SwiGLU) and len(layer.experts) == 4


def test_every_chosen_expert_gets_gradient_and_an_unchosen_one_a_zero_gradient():
    layer = moe_layer(moe_top_k=1)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[:3, 0] = torch.tensor([1.0, 2.0, 3.0])  # expert 3's logit stays 0
    x[..., 0] = torch.tensor([5.0, -5.0, 0.3] * 4).view(2, 6)  # x0 > 0: expert 2 (3x0), < 0: expert 3 (0)
    (layer(x).square().sum() + layer.aux_loss).backward()
    chosen = layer.route(x.reshape(-1, 16))[1].flatten().unique().tolist()
    assert chosen == [2, 3]
    for e, expert in enumerate(layer.experts):
        grads = [p.grad for p in expert.parameters()]
        assert all(g is not None for g in grads)  # in the graph even when unchosen (DDP needs every grad)
        assert any(g.abs().sum() > 0 for g in grads) == (e in chosen), e
    # k = 1: the gate is softmax over one logit, 1, so the router learns from the balance loss alone.
    assert layer.router.weight.grad[:, 0].abs().sum() > 0


def test_balance_loss_matches_its_formula_and_is_minimal_when_routing_is_uniform():
    """Switch Transformer: aux = E * sum_e f_e P_e; 1 at uniform routing, E when one expert takes all."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 4, generator=gen)
    chosen = logits.topk(2, dim=-1).indices
    f = torch.stack([(chosen == e).float().sum() for e in range(4)]) / chosen.numel()
    p = torch.softmax(logits, dim=-1).mean(dim=0)
    torch.testing.assert_close(balance_loss(logits, chosen), 4 * (f * p).sum())

    uniform = balance_loss(torch.zeros(8, 4), torch.arange(8).remainder(4)[:, None])
    assert uniform.item() == pytest.approx(1.0)
    collapsed = balance_loss(torch.tensor([[9.0, 0, 0, 0]] * 8), torch.zeros(8, 1, dtype=torch.long))
    assert collapsed.item() == pytest.approx(4 * math.exp(9) / (math.exp(9) + 3), rel=1e-5)
    # With confident routing (P_e = f_e) aux = E sum_e f_e^2 >= 1 (Cauchy-Schwarz), equal only when balanced.
    for seed in range(5):
        chosen = torch.randint(0, 4, (12, 1), generator=torch.Generator().manual_seed(seed))
        confident = torch.nn.functional.one_hot(chosen[:, 0], 4).float() * 50.0
        f = torch.bincount(chosen[:, 0], minlength=4).float() / 12
        assert balance_loss(confident, chosen).item() == pytest.approx(4 * float((f * f).sum()), rel=1e-5)
        assert balance_loss(confident, chosen).item() > 1.0 + 1e-3  # 12 random draws are never all equal here
    balanced = torch.arange(12).remainder(4)[:, None]
    confident = torch.nn.functional.one_hot(balanced[:, 0], 4).float() * 50.0
    assert balance_loss(confident, balanced).item() == pytest.approx(1.0)


def test_all_experts_with_equal_router_logits_is_the_dense_average():
    layer = moe_layer(moe_top_k=4)
    with torch.no_grad():
        layer.router.weight.zero_()
        x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(4))
        dense = torch.stack([expert(x) for expert in layer.experts]).mean(dim=0)
        torch.testing.assert_close(layer(x), dense, rtol=1e-5, atol=1e-6)
        assert layer.aux_loss.item() == pytest.approx(1.0)


def test_cached_generation_of_a_moe_lm_equals_full_recompute():
    torch.manual_seed(0)
    model = MultiCodebookLM(moe_cfg(moe_top_k=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    prompt = torch.randint(0, 16, (2, 2, 5), generator=torch.Generator().manual_seed(5))
    cached = generate(model, prompt, 8, sampling=SamplingOptions(greedy=True))
    full = generate(model, prompt, 8, sampling=SamplingOptions(greedy=True), options=ARDecoding(use_cache=False))
    assert torch.equal(cached, full)
    assert moe_aux_loss(model) is not None and moe_aux_loss(MultiCodebookLM(moe_cfg(n_experts=0))) is None


def test_config_keeps_a_dense_lms_dict_and_checks_the_mixture():
    assert "n_experts" not in moe_cfg(n_experts=0).to_dict()
    assert LMConfig.from_dict(moe_cfg().to_dict()) == moe_cfg()
    with pytest.raises(ValueError, match="moe_top_k must be in 1..n_experts=4"):
        moe_cfg(moe_top_k=5)
    with pytest.raises(ValueError, match="n_experts must be an integer >= 0"):
        moe_cfg(n_experts=-1)
    dense, moe = MultiCodebookLM(moe_cfg(n_experts=0, d_ff=24)), MultiCodebookLM(moe_cfg(moe_top_k=1))
    router = 2 * 4 * 16  # 2 layers of a [E, d] router
    assert moe.flops_per_token(8) == dense.flops_per_token(8) + 6 * router  # k = 1: one expert's worth


# ---- training: the aux loss in the objective, exact resume, DDP (the tiny recipe with 4 experts, top-2) ----

MOE_ARGS = ["--model.config.n_experts", "4", "--model.config.moe_top_k", "2", "--model.config.moe_aux_weight", "0.1"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from test_lm_data import make_token_corpus

    out = tmp_path_factory.mktemp("moe_train") / "tokens"
    make_token_corpus(out)
    return out


def test_training_adds_the_weighted_balance_loss_and_logs_it():
    from lm.training import LMTrainingModule

    module = LMTrainingModule(moe_cfg(moe_aux_weight=0.5), measure_peak=False)
    codes = torch.randint(0, 16, (2, 2, 6), generator=torch.Generator().manual_seed(6))
    batch = {"codes": codes, "frame_mask": torch.ones(2, 6, dtype=torch.bool)}
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)
    torch.manual_seed(0)
    loss = module.training_step(batch, 0)
    torch.manual_seed(0)
    plain = module.model.loss(codes, batch["frame_mask"]).loss
    aux = moe_aux_loss(module.model)
    torch.testing.assert_close(loss, plain + 0.5 * aux)
    assert logged["train/moe_aux"] == pytest.approx(float(aux))


def test_a_killed_moe_run_resumes_exactly_and_ddp_ranks_agree(tokens, tmp_path):
    from safetensors.torch import load_file

    from test_lm_training import (KillAtStep, RecordLosses, SaveRankWeights, callback_arg, read_losses,
                                  run_cli_subprocess, tiny_args)
    from lm.training import train_main

    steps = ["--trainer.max_steps", "8", "--trainer.callbacks.init_args.every_n_train_steps", "3"]
    full_log, cut_log = tmp_path / "full.jsonl", tmp_path / "cut.jsonl"
    torch.set_num_threads(1)
    train_main(tiny_args(tokens, tmp_path / "full", *MOE_ARGS, *steps, callback_arg(RecordLosses, path=str(full_log))))
    killed = run_cli_subprocess(tiny_args(tokens, tmp_path / "cut", *MOE_ARGS, *steps,
                                          callback_arg(RecordLosses, path=str(cut_log)), callback_arg(KillAtStep, step=7)))
    assert killed.returncode == 137, killed.stderr[-3000:]
    train_main(tiny_args(tokens, tmp_path / "cut", *MOE_ARGS, *steps, callback_arg(RecordLosses, path=str(cut_log)),
                         "--ckpt_path", "last"))
    full, resumed = read_losses(full_log), read_losses(cut_log)
    assert sorted(full) == sorted(resumed) == list(range(1, 9))
    assert all(resumed[s] == full[s] for s in full), (full, resumed)  # bit-exact, aux loss included
    assert MultiCodebookLM.from_pretrained(tmp_path / "full" / "pretrained").config.n_experts == 4

    out = tmp_path / "ranks"
    out.mkdir()
    proc = run_cli_subprocess(tiny_args(tokens, tmp_path / "ddp", *MOE_ARGS, "--trainer.strategy", "ddp",
                                        "--trainer.devices", "2", "--trainer.max_steps", "3",
                                        callback_arg(SaveRankWeights, out=str(out))), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    assert not torch.equal(r0.pop("first_batch"), r1.pop("first_batch"))
    assert any(".ffn.experts.3." in name for name in r0)
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
