"""Residual vector quantizer: the seed formula, k-means init, EMA, dead-code revival, commitment
gradients, quantizer dropout, state round trip and DDP synchronisation."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from einops import rearrange
from safetensors.torch import load_file, save_file

from codec.core.quantizer import QuantizerOutput, ResidualVectorQuantizer, kmeans, nearest_codes


# ----------------------------------------------------------------------------- data


def gaussian_mixture(batch: int, frames: int, dim: int, n_clusters: int, spread: float, seed: int) -> torch.Tensor:
    """[B, D, T] latents drawn from a fixed mixture (the centres depend only on n_clusters/dim)."""
    centres = torch.randn(n_clusters, dim, generator=torch.Generator().manual_seed(1234)) * 3
    g = torch.Generator().manual_seed(seed)
    which = torch.randint(n_clusters, (batch * frames,), generator=g)
    x = centres[which] + spread * torch.randn(batch * frames, dim, generator=g)
    return rearrange(x, "(b t) d -> b d t", b=batch)


@pytest.fixture(scope="module")
def speech_latents(speech_files) -> dict[str, torch.Tensor]:
    """Real speech as latents: 8 consecutive 16 kHz samples per vector, [B=8, D=8, T=256] per split,
    both splits scaled by the training split's standard deviation."""
    from codec.core.audio import load_audio

    n = 8 * 8 * 256
    raw = {}
    for split in ("train", "valid"):
        chunks, total = [], 0
        for path in speech_files[split]:
            wav = load_audio(path, 16000)[0]
            wav = wav[wav.abs() > 1e-3]  # drop digital silence so the vectors carry speech
            chunks.append(wav)
            total += wav.numel()
            if total >= n:
                break
        raw[split] = torch.cat(chunks)[:n]
    scale = raw["train"].std()
    return {split: rearrange(wav / scale, "(b t d) -> b d t", b=8, d=8) for split, wav in raw.items()}


def reference_codes(z: torch.Tensor, codebooks: torch.Tensor, n_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's greedy residual formula with plain loops and torch.cdist, independent of the module.

    z [B, D, T], codebooks [N_c, V, D] -> (codes [B, n_q, T], partial sums [n_q, B, D, T]).
    """
    b, d, t = z.shape
    codes = torch.empty(b, n_q, t, dtype=torch.long)
    partial = torch.zeros(n_q, b, d, t)
    for i in range(b):
        for j in range(t):
            residual = z[i, :, j].clone()
            total = torch.zeros(d)
            for c in range(n_q):
                dists = torch.cdist(residual[None], codebooks[c])[0]
                code = int(torch.argmin(dists))
                codes[i, c, j] = code
                residual = residual - codebooks[c, code]
                total = total + codebooks[c, code]
                partial[c, i, :, j] = total
    return codes, partial


def pairwise_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[N, D], [M, D] -> [N, M] Euclidean distances by direct subtraction (cdist switches to a
    less exact matmul form for large inputs)."""
    return (a[:, None] - b[None]).norm(dim=-1)


def decode_with(codebooks: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Sum of the chosen vectors: codebooks [N_c, V, D], codes [B, k, T] -> [B, D, T]."""
    picked = torch.stack([codebooks[c][codes[:, c]] for c in range(codes.shape[1])])  # [k, B, T, D]
    return rearrange(picked.sum(0), "b t d -> b d t")


def quantization_error(rvq: ResidualVectorQuantizer, z: torch.Tensor) -> float:
    return float((rvq.decode(rvq.encode(z)) - z).pow(2).mean())


# ----------------------------------------------------------------------------- the formula


def test_encode_and_forward_follow_the_seed_formula():
    z = gaussian_mixture(3, 20, 6, n_clusters=10, spread=0.5, seed=0)
    rvq = ResidualVectorQuantizer(6, 4, 16, quantizer_dropout=0.0, dead_code_threshold=0.0)
    rvq.train()
    rvq(z)  # k-means init + one EMA step: non-trivial codebooks
    rvq.eval()
    expected, _ = reference_codes(z, rvq.codebooks, 4)
    assert torch.equal(rvq.encode(z), expected)
    assert torch.equal(rvq(z).codes, expected)

    # In training the codes of a step come from the codebooks as they were before that step.
    rvq.train()
    before = rvq.codebooks.clone()
    out = rvq(z)
    assert not torch.equal(rvq.codebooks, before)  # the EMA step moved them
    assert torch.equal(out.codes, reference_codes(z, before, 4)[0])


def test_codes_are_long_in_range_with_the_requested_count():
    z = gaussian_mixture(2, 30, 5, n_clusters=50, spread=1.0, seed=1)
    rvq = ResidualVectorQuantizer(5, 3, 7)
    rvq.train()
    out = rvq(z, n_q=3)
    assert isinstance(out, QuantizerOutput)
    assert out.codes.dtype == torch.long and out.codes.shape == (2, 3, 30)
    assert out.quantized.shape == z.shape
    rvq.eval()
    for n_q in (1, 2, 3):
        codes = rvq.encode(z, n_q=n_q)
        assert codes.dtype == torch.long and codes.shape == (2, n_q, 30)
        assert int(codes.min()) >= 0 and int(codes.max()) < 7
        assert torch.equal(rvq(z, n_q=n_q).codes, codes)


def test_decode_with_every_k_is_the_partial_sum():
    z = gaussian_mixture(2, 15, 4, n_clusters=30, spread=0.7, seed=2)
    rvq = ResidualVectorQuantizer(4, 4, 8, quantizer_dropout=0.0)
    rvq.train()
    rvq(z)
    rvq.eval()
    codes, partial = reference_codes(z, rvq.codebooks, 4)
    errors = []
    for k in range(1, 5):
        decoded = rvq.decode(rvq.encode(z, n_q=k))
        assert decoded.shape == z.shape
        torch.testing.assert_close(decoded, partial[k - 1], rtol=0, atol=1e-6)
        torch.testing.assert_close(rvq.decode(codes[:, :k]), decoded, rtol=0, atol=0)
        # The forward pass with n_q=k returns the same values (straight-through: z + (q - z)).
        torch.testing.assert_close(rvq(z, n_q=k).quantized, decoded, rtol=0, atol=1e-5)
        errors.append(float((decoded - z).pow(2).mean()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[0]


def test_autocast_does_not_change_the_codes():
    z = gaussian_mixture(2, 40, 8, n_clusters=40, spread=0.3, seed=3)
    rvq = ResidualVectorQuantizer(8, 3, 32)
    rvq.train()
    rvq(z)
    rvq.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = rvq(z)
    assert torch.equal(out.codes, rvq.encode(z))
    assert out.quantized.dtype == z.dtype


# ----------------------------------------------------------------------------- training state


def test_kmeans_init_beats_random_init_on_real_speech(speech_latents):
    train, valid = speech_latents["train"], speech_latents["valid"]
    torch.manual_seed(0)
    # kmeans_iters=0 is initialisation from random training vectors, the same start k-means refines.
    random_init = ResidualVectorQuantizer(8, 2, 64, kmeans_iters=0, quantizer_dropout=0.0, decay=1.0)
    torch.manual_seed(0)
    kmeans_init = ResidualVectorQuantizer(8, 2, 64, kmeans_iters=10, quantizer_dropout=0.0, decay=1.0)
    for rvq in (random_init, kmeans_init):
        rvq.train()
        rvq(train)
        assert bool(rvq.initialized)
    err_random = quantization_error(random_init, valid)
    err_kmeans = quantization_error(kmeans_init, valid)
    assert err_kmeans < 0.9 * err_random, (err_kmeans, err_random)
    # Both are far better than quantizing with nothing.
    assert err_kmeans < 0.5 * float(valid.pow(2).mean())


def test_kmeans_helper_finds_separated_clusters():
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = centres.repeat_interleave(50, 0) + 0.1 * torch.randn(150, 2)
    found, counts = kmeans(x, 3, iters=10)
    assert sorted(counts.tolist()) == [50.0, 50.0, 50.0]
    assert pairwise_distance(found, centres).min(dim=0).values.max() < 0.2


def test_ema_lowers_the_quantization_error_on_a_fixed_distribution(speech_latents):
    train, valid = speech_latents["train"], speech_latents["valid"]
    rvq = ResidualVectorQuantizer(8, 2, 32, kmeans_iters=0, decay=0.8, quantizer_dropout=0.0,
                                  dead_code_threshold=0.0)
    rvq.train()
    rvq(train[:4])  # initialise from random vectors of the first batch (no k-means refinement)
    start = quantization_error(rvq, valid)
    for step in range(15):
        rvq(train[(step % 2) * 4 : (step % 2) * 4 + 4])
    end = quantization_error(rvq, valid)
    assert end < 0.85 * start, (start, end)


def test_eval_mode_changes_nothing():
    z = gaussian_mixture(2, 30, 4, n_clusters=5, spread=0.2, seed=4)
    rvq = ResidualVectorQuantizer(4, 2, 8)
    rvq.train()
    rvq(z)
    state = {k: v.clone() for k, v in rvq.state_dict().items()}
    rvq.eval()
    rvq(gaussian_mixture(2, 30, 4, n_clusters=5, spread=0.2, seed=5))
    rvq.encode(z)
    for key, value in rvq.state_dict().items():
        assert torch.equal(value, state[key]), key


@pytest.mark.parametrize("decay", [0.99, 1.0])
@pytest.mark.parametrize("level", [0, 1])
def test_a_dead_code_is_revived_and_survives(decay, level):
    """Kill one code; a training step must move it onto a current residual, and it must stay there
    through that step's EMA update and the next step (EnCodec's revival is overwritten at once)."""
    dim, size, threshold = 4, 4, 2.0
    batch = lambda seed: gaussian_mixture(4, 64, dim, n_clusters=4, spread=0.05, seed=seed)  # noqa: E731
    rvq = ResidualVectorQuantizer(dim, 2, size, decay=decay, quantizer_dropout=0.0,
                                  dead_code_threshold=threshold)
    rvq.train()
    rvq(batch(0))  # k-means init: 4 clusters, 4 codes per level
    dead = 2
    far = torch.full((dim,), 100.0)
    with torch.no_grad():
        rvq.embed[level, dead] = far
        rvq.embed_sum[level, dead] = far * 0.1
        rvq.cluster_size[level, dead] = 0.1

    z = batch(1)
    rvq.eval()
    # The residuals level `level` sees (the killed code is too far away to be chosen anywhere).
    first = rvq.encode(z, n_q=1)
    residuals = rearrange(z - rvq.decode(first) if level == 1 else z, "b d t -> (b t) d")
    rvq.train()
    out = rvq(z)
    assert float(out.metrics[f"dead_codes/c{level}"]) == 1.0
    revived = rvq.codebooks[level, dead].clone()
    nearest = pairwise_distance(revived[None], residuals)[0].min()
    if decay == 1.0:  # no EMA movement: the code is exactly a residual of the batch
        assert nearest < 1e-4
    else:  # it moved a little towards the mean of the vectors it won, within the cluster
        assert nearest < 0.1
    assert float(rvq.cluster_size[level, dead]) >= threshold
    assert (revived - far).norm() > 50
    assert int((out.codes[:, level] == dead).sum()) > 0  # it already served this batch

    out2 = rvq(batch(2))
    assert float(out2.metrics[f"dead_codes/c{level}"]) == 0.0  # nothing was revived again
    assert (rvq.codebooks[level, dead] - revived).norm() < 0.1
    assert float(rvq.cluster_size[level, dead]) >= threshold
    assert int((out2.codes[:, level] == dead).sum()) >= threshold


def test_without_kmeans_the_first_step_revives_every_code_from_the_batch():
    z = gaussian_mixture(2, 50, 3, n_clusters=8, spread=0.3, seed=6)
    rvq = ResidualVectorQuantizer(3, 1, 16, kmeans_init=False, decay=1.0, quantizer_dropout=0.0)
    rvq.train()
    out = rvq(z)
    assert float(out.metrics["dead_codes/c0"]) == 16.0
    rows = rearrange(z, "b d t -> (b t) d")
    assert pairwise_distance(rvq.codebooks[0], rows).min(dim=1).values.max() < 1e-4
    # 100 rows for 16 codes: each code got its own vector (no duplicates that would split a cell).
    between = pairwise_distance(rvq.codebooks[0], rvq.codebooks[0]) + torch.eye(16) * 1e9
    assert float(between.min()) > 1e-3


def test_state_dict_round_trip_gives_identical_codes(tmp_path):
    z = gaussian_mixture(2, 40, 6, n_clusters=20, spread=0.5, seed=7)
    rvq = ResidualVectorQuantizer(6, 3, 16)
    rvq.train()
    for seed in range(3):
        rvq(gaussian_mixture(2, 40, 6, n_clusters=20, spread=0.5, seed=10 + seed))
    rvq.eval()
    save_file(rvq.state_dict(), str(tmp_path / "rvq.safetensors"))

    torch.manual_seed(99)
    loaded = ResidualVectorQuantizer(6, 3, 16)
    loaded.load_state_dict(load_file(str(tmp_path / "rvq.safetensors")))
    loaded.eval()
    assert bool(loaded.initialized)
    assert torch.equal(loaded.encode(z), rvq.encode(z))
    assert torch.equal(loaded.codebooks, rvq.codebooks)
    # The initialisation flag survived: training again does not re-run k-means.
    frozen = ResidualVectorQuantizer(6, 3, 16, decay=1.0, dead_code_threshold=0.0)
    frozen.load_state_dict(loaded.state_dict())
    frozen.train()
    frozen(z)
    torch.testing.assert_close(frozen.codebooks, rvq.codebooks, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- losses and gradients


def test_every_level_gives_a_commitment_gradient_and_one_straight_through_estimator():
    rvq = ResidualVectorQuantizer(5, 4, 8, quantizer_dropout=0.0, commitment_weight=0.25,
                                  dead_code_threshold=0.0)  # no revival: `before` is what it uses
    rvq.train()
    rvq(gaussian_mixture(2, 25, 5, n_clusters=40, spread=1.0, seed=8))
    z = gaussian_mixture(2, 25, 5, n_clusters=40, spread=1.0, seed=9).requires_grad_(True)
    before = rvq.codebooks.clone()  # the step quantizes with these, then updates them
    out = rvq(z)
    assert out.commit_per_level.shape == (4,)
    torch.testing.assert_close(out.commit_loss, 0.25 * out.commit_per_level.mean())
    for c in range(4):
        (grad,) = torch.autograd.grad(out.commit_per_level[c], z, retain_graph=True)
        assert grad.abs().sum() > 0, f"level {c} gives no gradient to the encoder"
        # d/dz mean((r_c - q_c)^2) = 2 (r_c - q_c) / numel, with r_c the level's residual input
        previous = decode_with(before, out.codes[:, :c]) if c else 0
        residual = z.detach() - previous
        q_c = decode_with(before, out.codes[:, : c + 1]) - previous
        torch.testing.assert_close(grad, 2 * (residual - q_c) / z.numel(), rtol=1e-3, atol=1e-7)

    # The quantized output passes the gradient straight through, unchanged, exactly once.
    g = torch.randn_like(z)
    (grad,) = torch.autograd.grad(out.quantized, z, grad_outputs=g)
    assert torch.equal(grad, g)
    assert not rvq.codebooks.requires_grad


# ----------------------------------------------------------------------------- quantizer dropout


def test_quantizer_dropout_uses_a_prefix_of_codebooks_per_example():
    b, t, n_c = 32, 10, 4
    z = gaussian_mixture(b, t, 3, n_clusters=20, spread=0.5, seed=11)
    rvq = ResidualVectorQuantizer(3, n_c, 8, quantizer_dropout=1.0, decay=0.0, dead_code_threshold=0.0)
    rvq.train()
    rvq(z, n_q=n_c)  # k-means init
    before = rvq.codebooks.clone()
    out = rvq(z)
    k = out.n_q_per_example
    assert k.shape == (b,) and int(k.min()) >= 1 and int(k.max()) <= n_c
    assert len(set(k.tolist())) > 1  # random k per example
    assert float(out.metrics["n_q"]) == pytest.approx(k.float().mean().item())
    assert out.codes.shape == (b, int(k.max()), t)
    for i in range(b):
        used = out.codes[i, : int(k[i])]
        assert int(used.min()) >= 0
        assert bool((out.codes[i, int(k[i]) :] == -1).all())  # dropped levels are not coded
        torch.testing.assert_close(out.quantized[i], decode_with(before, used[None])[0], rtol=0, atol=1e-5)
    # With decay 0 the cluster sizes are this step's counts: only examples that used a level count.
    for c in range(int(k.max())):
        assert float(rvq.cluster_size[c].sum()) == pytest.approx(t * int((k > c).sum()))
    # Examples with k < N_c: their commitment only covers their levels, so the loss is finite.
    assert torch.isfinite(out.commit_loss)


def test_n_q_forces_the_number_of_codebooks_in_training():
    rvq = ResidualVectorQuantizer(3, 4, 8, quantizer_dropout=1.0)
    rvq.train()
    z = gaussian_mixture(8, 10, 3, n_clusters=20, spread=0.5, seed=12)
    out = rvq(z, n_q=2)
    assert out.codes.shape == (8, 2, 10) and int(out.codes.min()) >= 0
    assert out.n_q_per_example.tolist() == [2] * 8
    rvq.eval()
    assert rvq(z).codes.shape == (8, 4, 10)  # no dropout in eval


# ----------------------------------------------------------------------------- metrics


def test_usage_metrics_measure_the_code_histogram():
    points = torch.tensor([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [5.0, 5.0]])
    rvq = ResidualVectorQuantizer(2, 1, 4, kmeans_init=False)
    with torch.no_grad():
        rvq.embed[0] = points
        rvq.cluster_size[0] = torch.tensor([10.0, 10.0, 1.0, 0.0])
    rvq.eval()
    uniform = rearrange(points.repeat(5, 1), "(b t) d -> b d t", b=1)
    m = rvq(uniform).metrics
    assert float(m["perplexity/c0"]) == pytest.approx(4.0)
    assert float(m["entropy_norm/c0"]) == pytest.approx(1.0)
    assert float(m["dead_codes/c0"]) == 2.0
    skewed = rearrange(points[[0, 0, 0, 1]], "(b t) d -> b d t", b=1)
    m = rvq(skewed).metrics
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert float(m["perplexity/c0"]) == pytest.approx(math.exp(h), rel=1e-5)
    assert float(m["entropy_norm/c0"]) == pytest.approx(h / math.log(4), rel=1e-5)
    assert {"perplexity", "entropy_norm", "dead_codes", "n_q"} <= set(m)


def test_nearest_codes_matches_cdist():
    x, e = torch.randn(300, 7), torch.randn(50, 7)
    assert torch.equal(nearest_codes(x, e), pairwise_distance(x, e).argmin(dim=1))


# ----------------------------------------------------------------------------- bad input


def test_bad_input_gives_clear_errors():
    rvq = ResidualVectorQuantizer(4, 3, 8)
    with pytest.raises(ValueError, match=r"shape \[B, 4, T\]"):
        rvq(torch.randn(2, 5, 10))
    with pytest.raises(ValueError, match=r"shape \[B, 4, T\]"):
        rvq.encode(torch.randn(4, 10))
    with pytest.raises(ValueError, match="floating-point"):
        rvq(torch.ones(1, 4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        rvq(torch.randn(0, 4, 10))
    with pytest.raises(ValueError, match=r"n_q must be an integer in 1..3"):
        rvq(torch.randn(1, 4, 10), n_q=4)
    with pytest.raises(ValueError, match=r"n_q must be an integer in 1..3"):
        rvq.encode(torch.randn(1, 4, 10), n_q=0)
    with pytest.raises(ValueError, match=r"decodes 1..3"):
        rvq.decode(torch.zeros(1, 4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"decodes 1..3"):
        rvq.decode(torch.zeros(1, 0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"0..7"):
        rvq.decode(torch.full((1, 2, 5), 8))
    with pytest.raises(ValueError, match=r"0..7"):
        rvq.decode(torch.full((1, 2, 5), -1))
    with pytest.raises(ValueError, match="integer codes"):
        rvq.decode(torch.zeros(1, 2, 5))
    with pytest.raises(ValueError, match=r"shape \[B, k, T\]"):
        rvq.decode(torch.zeros(2, 5, dtype=torch.long))
    for kwargs, message in [
        (dict(dim=0, n_codebooks=1, codebook_size=2), "dim"),
        (dict(dim=2, n_codebooks=0, codebook_size=2), "n_codebooks"),
        (dict(dim=2, n_codebooks=1, codebook_size=2, decay=1.5), "decay"),
        (dict(dim=2, n_codebooks=1, codebook_size=2, quantizer_dropout=-0.1), "quantizer_dropout"),
        (dict(dim=2, n_codebooks=1, codebook_size=2, epsilon=0.0), "epsilon"),
    ]:
        with pytest.raises(ValueError, match=message):
            ResidualVectorQuantizer(**kwargs)


# ----------------------------------------------------------------------------- DDP


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(100 + rank)  # different data, dropout draws and revival picks per rank
        rvq = ResidualVectorQuantizer(4, 3, 8, decay=0.0, dead_code_threshold=3.0, quantizer_dropout=1.0)
        rvq.train()
        b, t = 3, 20
        sizes = []
        for step in range(4):
            z = gaussian_mixture(b, t, 4, n_clusters=12, spread=0.4, seed=1000 * rank + step)
            # Step 1: rank 0 uses one codebook, rank 1 all three: the ranks disagree on the levels
            # used and rank 0 has no residuals for levels 2-3 (revival must come from rank 1).
            n_q = (1 if rank == 0 else 3) if step == 1 else None
            rvq(z, n_q=n_q)
            sizes.append(float(rvq.cluster_size[0].sum()))
        state = {k: v.contiguous() for k, v in rvq.state_dict().items()}
        state["level0_sizes"] = torch.tensor(sizes)
        save_file(state, os.path.join(out_dir, f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def test_distributed_ranks_keep_identical_codebooks(tmp_path: Path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    world = 2
    procs = [
        ctx.Process(target=_ddp_worker, args=(r, world, str(tmp_path / "init"), str(tmp_path)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            pytest.fail("DDP workers hung (mismatched collectives)")
        assert p.exitcode == 0
    states = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(world)]
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    # decay 0: level-1 cluster sizes are the counts of the step, summed over both ranks' frames.
    assert states[0]["level0_sizes"].tolist() == [2 * 3 * 20] * 4
