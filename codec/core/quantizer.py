"""Residual vector quantizer (RVQ) with EMA codebooks, k-means init, dead-code revival and dropout.

The formula (docs/theory.md, seed 002; codes counted from 0 here): with codebooks V_1..V_{N_c}
of |V| vectors,

    r_1 = e,    i_c = argmin_i |r_c - e_i^(c)|,    q_c = e_{i_c}^(c),    r_{c+1} = r_c - q_c

and the quantized latent is q_1 + ... + q_k (k <= N_c gives a lower bitrate).

Training (train mode, unless `frozen`): k-means initialises each codebook once on the first batch's
residuals; dead codes (EMA cluster size < `dead_code_threshold`) move onto random residuals of the
batch before it is assigned, their EMA statistics reset to match; codebooks follow EMAs of cluster
sizes and embedding sums (Laplace-smoothed, no gradient); with probability `quantizer_dropout` an
example uses only the first k ~ U{1..N_c} codebooks (a `frozen` quantizer too).

Commitment loss: mean over levels of mean((r_c - sg(q_c))^2). One straight-through estimator, on the
sum: quantized = z + sg(q_sum - z). Under torch.distributed the EMA statistics are summed over
ranks, and k-means centroids and revived vectors broadcast from one rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn


@dataclass
class QuantizerOutput:
    """What `ResidualVectorQuantizer.forward` returns.

    quantized: [B, D, T] z + sg(q_sum - z): the quantized values, gradient passes straight to z.
    codes: LongTensor [B, N_c_used, T], N_c_used = largest k used in the batch; in training with
        quantizer dropout, the levels an example dropped hold -1 (they were neither used nor coded).
    commit_loss: scalar, commitment_weight * mean over used levels of `commit_per_level`.
    metrics: detached scalars: `perplexity/c{i}`, `entropy_norm/c{i}` (usage entropy / log |V|) for
        used levels, `dead_codes/c{i}` (EMA cluster size under the threshold when the forward began;
        in training these were revived), their means `perplexity`, `entropy_norm`, `dead_codes`, and
        `n_q` (mean number of codebooks per example, the bitrate factor).
    commit_per_level: [N_c_used] unweighted per-level terms mean((r_c - sg(q_c))^2), each with a
        gradient to z.
    n_q_per_example: LongTensor [B], how many codebooks each example used.
    """

    quantized: Tensor
    codes: Tensor
    commit_loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    commit_per_level: Tensor | None = None
    n_q_per_example: Tensor | None = None


# ----------------------------------------------------------------------------- helpers


def nearest_codes(x: Tensor, codebook: Tensor, candidates: int = 4) -> Tensor:
    """Index of the nearest codebook vector (Euclidean) for each row, exactly the formula's argmin.

    x [N, D], codebook [V, D] -> LongTensor [N]. A fast pass ranks codes by ||e||^2 - 2 x.e (one
    fused addmm; ||x||^2 is the same for every code of a row) after moving the origin to the
    codebook's mean, which cancels any large common offset. That expansion loses float precision
    when |x| is large next to the gaps between codes, so the `candidates` best codes of the fast
    pass are then re-ranked by their direct distances sum((x - e)^2), which have no cancellation.
    Nothing of size [N, V, D] is built. Ties go to the lowest index.
    """
    center = codebook.mean(dim=0, keepdim=True)
    xc, ec = x - center, codebook - center
    scores = torch.addmm(ec.pow(2).sum(1).unsqueeze(0), xc, ec.t(), alpha=-2.0)
    k = min(candidates, codebook.shape[0])
    if k == 1:
        return scores.argmin(dim=1)
    cand = scores.topk(k, dim=1, largest=False, sorted=True).indices  # [N, k], best first
    exact = (xc.unsqueeze(1) - ec[cand]).pow(2).sum(-1)  # [N, k]
    # Among equal exact distances prefer the lowest code index (argmin over index-sorted candidates).
    order = cand.argsort(dim=1)
    cand, exact = cand.gather(1, order), exact.gather(1, order)
    return cand.gather(1, exact.argmin(dim=1, keepdim=True)).squeeze(1)


def kmeans(x: Tensor, k: int, iters: int) -> tuple[Tensor, Tensor]:
    """Lloyd's k-means. x [N, D] -> (centroids [k, D], counts [k] of the final assignment).

    Starts from k distinct random rows (with replacement when N < k). A centroid whose cluster
    empties keeps its previous position.
    """
    n = x.shape[0]
    if n >= k:
        start = torch.randperm(n, device=x.device)[:k]
    else:
        start = torch.randint(n, (k,), device=x.device)
    centroids = x[start].clone()
    for _ in range(iters):
        codes = nearest_codes(x, centroids)
        counts = torch.bincount(codes, minlength=k).to(x.dtype)
        sums = torch.zeros_like(centroids).index_add_(0, codes, x)
        filled = counts > 0
        centroids = torch.where(filled[:, None], sums / counts.clamp(min=1)[:, None], centroids)
    counts = torch.bincount(nearest_codes(x, centroids), minlength=k).to(x.dtype)
    return centroids, counts


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce_sum(t: Tensor) -> Tensor:
    if _distributed():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _broadcast(t: Tensor, src: int = 0) -> Tensor:
    if _distributed():
        dist.broadcast(t, src=src)
    return t


def _first_rank_with(has_data: bool, device: torch.device) -> int | None:
    """The lowest rank that has data (all ranks agree), or None when no rank has any."""
    if not _distributed():
        return 0 if has_data else None
    flags = torch.zeros(dist.get_world_size(), device=device)
    flags[dist.get_rank()] = float(has_data)
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)
    ranks = flags.nonzero().flatten()
    return int(ranks[0]) if len(ranks) else None


# ----------------------------------------------------------------------------- the module


class ResidualVectorQuantizer(nn.Module):
    """N_c codebooks of |V| vectors in R^D, applied greedily to successive residuals.

    Buffers (all in the state_dict): `embed` [N_c, |V|, D] the codebook vectors,
    `cluster_size` [N_c, |V|] and `embed_sum` [N_c, |V|, D] their EMA statistics, and
    `initialized` (bool) whether k-means initialisation has run. `dead_code_threshold` is in
    frames per training step (the EMA of a code's count). The step that runs k-means revives nothing.
    """

    def __init__(
        self,
        dim: int,
        n_codebooks: int,
        codebook_size: int,
        *,
        decay: float = 0.99,
        epsilon: float = 1e-5,
        kmeans_init: bool = True,
        kmeans_iters: int = 10,
        dead_code_threshold: float = 2.0,
        quantizer_dropout: float = 1.0,
        commitment_weight: float = 1.0,
    ):
        super().__init__()
        for name, value in (("dim", dim), ("n_codebooks", n_codebooks), ("codebook_size", codebook_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if kmeans_iters < 0:
            raise ValueError(f"kmeans_iters must be >= 0, got {kmeans_iters}")
        if dead_code_threshold < 0:
            raise ValueError(f"dead_code_threshold must be >= 0, got {dead_code_threshold}")
        if not 0.0 <= quantizer_dropout <= 1.0:
            raise ValueError(f"quantizer_dropout must be in [0, 1], got {quantizer_dropout}")
        if commitment_weight < 0:
            raise ValueError(f"commitment_weight must be >= 0, got {commitment_weight}")

        self.dim = dim
        self.n_codebooks = n_codebooks
        self.codebook_size = codebook_size
        self.decay = decay
        self.epsilon = epsilon
        self.kmeans_init = kmeans_init
        self.kmeans_iters = kmeans_iters
        self.dead_code_threshold = dead_code_threshold
        self.quantizer_dropout = quantizer_dropout
        self.commitment_weight = commitment_weight
        # Frozen: codebooks, EMA statistics and k-means state stay as they are even in train mode
        # (quantizer dropout still applies): a decoder fine-tune keeps the token space unchanged.
        self.frozen = False

        embed = torch.randn(n_codebooks, codebook_size, dim) / math.sqrt(dim)
        self.register_buffer("embed", embed)
        # Zero cluster sizes: without k-means init the first training step revives every code.
        self.register_buffer("cluster_size", torch.zeros(n_codebooks, codebook_size))
        self.register_buffer("embed_sum", embed.clone())
        self.register_buffer("initialized", torch.tensor(not kmeans_init))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, n_codebooks={self.n_codebooks}, codebook_size={self.codebook_size}, "
            f"decay={self.decay}, kmeans_init={self.kmeans_init}, "
            f"dead_code_threshold={self.dead_code_threshold}, quantizer_dropout={self.quantizer_dropout}"
        )

    @property
    def codebooks(self) -> Tensor:
        """[N_c, |V|, D]: the vectors the codes index (the EMA-normalised embeddings)."""
        return self.embed

    # ------------------------------------------------------------------ checks

    def _check_latents(self, z: Tensor) -> None:
        if not isinstance(z, Tensor) or z.dim() != 3 or z.shape[1] != self.dim:
            shape = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
            raise ValueError(f"expected latents of shape [B, {self.dim}, T], got {shape}")
        if not z.is_floating_point():
            raise ValueError(f"expected floating-point latents, got {z.dtype}")

    def _check_n_q(self, n_q: int | None) -> int:
        if n_q is None:
            return self.n_codebooks
        if isinstance(n_q, bool) or not isinstance(n_q, int) or not 1 <= n_q <= self.n_codebooks:
            raise ValueError(f"n_q must be an integer in 1..{self.n_codebooks}, got {n_q!r}")
        return n_q

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def encode(self, z: Tensor, n_q: int | None = None) -> Tensor:
        """Seed formula, deterministic. z [B, D, T] -> LongTensor [B, n_q, T] in 0..|V|-1."""
        self._check_latents(z)
        n_q = self._check_n_q(n_q)
        b = z.shape[0]
        residual = rearrange(z.float(), "b d t -> (b t) d")
        codes = []
        for c in range(n_q):
            idx = nearest_codes(residual, self.embed[c])
            residual = residual - self.embed[c][idx]
            codes.append(idx)
        return rearrange(torch.stack(codes), "k (b t) -> b k t", b=b)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, k, T], 1 <= k <= N_c -> [B, D, T]: sum of the chosen vectors of codebooks 1..k."""
        if not isinstance(codes, Tensor) or codes.dim() != 3:
            shape = tuple(codes.shape) if isinstance(codes, Tensor) else type(codes).__name__
            raise ValueError(f"expected codes of shape [B, k, T], got {shape}")
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"expected integer codes, got {codes.dtype}")
        k = codes.shape[1]
        if not 1 <= k <= self.n_codebooks:
            raise ValueError(f"codes have {k} codebooks; this quantizer decodes 1..{self.n_codebooks}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(
                f"codes must lie in 0..{self.codebook_size - 1}, "
                f"got values in {int(codes.min())}..{int(codes.max())}"
            )
        codes = codes.long()
        out = torch.zeros(codes.shape[0], codes.shape[2], self.dim, device=self.embed.device)
        for c in range(k):
            out = out + F.embedding(codes[:, c], self.embed[c])
        return rearrange(out, "b t d -> b d t")

    # ------------------------------------------------------------------ training state

    @torch.no_grad()
    def _init_codebooks(self, x: Tensor) -> None:
        """k-means on each level's residuals of x [N, D], level by level; one rank's result wins."""
        residual = x
        for c in range(self.n_codebooks):
            centroids, counts = kmeans(residual, self.codebook_size, self.kmeans_iters)
            self.embed[c].copy_(_broadcast(centroids))
            self.cluster_size[c].copy_(_broadcast(counts))
            self.embed_sum[c].copy_(self.embed[c] * self.cluster_size[c, :, None])
            residual = residual - self.embed[c][nearest_codes(residual, self.embed[c])]
        self.initialized.fill_(True)

    @torch.no_grad()
    def _revive_dead_codes(self, c: int, residual: Tensor, dead: Tensor) -> None:
        """Move the dead codes of level c onto random rows of residual [N, D], stats reset to match."""
        n_dead = int(dead.sum())  # the same on every rank: cluster sizes are synchronised
        if n_dead == 0:
            return
        src = _first_rank_with(residual.shape[0] > 0, self.embed.device)
        if src is None:
            return
        n = residual.shape[0]
        if n >= n_dead:  # distinct rows, so two revived codes do not land on the same vector
            picks = residual[torch.randperm(n, device=residual.device)[:n_dead]]
        elif n > 0:
            picks = residual[torch.randint(n, (n_dead,), device=residual.device)]
        else:
            picks = residual.new_zeros(n_dead, self.dim)
        picks = _broadcast(picks.contiguous(), src=src)
        self.embed[c, dead] = picks
        self.cluster_size[c, dead] = self.dead_code_threshold
        self.embed_sum[c, dead] = picks * self.dead_code_threshold

    @torch.no_grad()
    def _ema_update(self, c: int, residual: Tensor, codes: Tensor) -> Tensor:
        """EMA step of level c from residual [N, D] and its codes [N]; returns the global counts [|V|]."""
        counts = torch.bincount(codes, minlength=self.codebook_size).float()
        sums = torch.zeros_like(self.embed_sum[c]).index_add_(0, codes, residual)
        _all_reduce_sum(counts)
        _all_reduce_sum(sums)
        self.cluster_size[c].mul_(self.decay).add_(counts, alpha=1 - self.decay)
        self.embed_sum[c].mul_(self.decay).add_(sums, alpha=1 - self.decay)
        size = self.cluster_size[c]
        total = size.sum()
        smoothed = (size + self.epsilon) / (total + self.codebook_size * self.epsilon) * total
        self.embed[c].copy_(self.embed_sum[c] / smoothed.clamp(min=self.epsilon)[:, None])
        return counts

    def _codebooks_per_example(self, batch: int, n_q: int | None, device: torch.device) -> Tensor:
        """LongTensor [B]: how many codebooks each example uses (quantizer dropout in training)."""
        if n_q is not None:
            return torch.full((batch,), n_q, dtype=torch.long, device=device)
        k = torch.full((batch,), self.n_codebooks, dtype=torch.long, device=device)
        if self.training and self.quantizer_dropout > 0:
            drop = torch.rand(batch, device=device) < self.quantizer_dropout
            k = torch.where(drop, torch.randint_like(k, 1, self.n_codebooks + 1), k)
        return k

    # ------------------------------------------------------------------ forward

    def forward(self, z: Tensor, n_q: int | None = None) -> QuantizerOutput:
        """z [B, D, T] -> QuantizerOutput (see there). `n_q` forces the number of codebooks."""
        self._check_latents(z)
        if n_q is not None:
            self._check_n_q(n_q)
        b, _, t = z.shape
        if b == 0 or t == 0:
            raise ValueError(f"cannot quantize an empty batch of latents of shape {tuple(z.shape)}")
        with torch.autocast(device_type=z.device.type, enabled=False):
            x = rearrange(z.float(), "b d t -> b t d")
            update = self.training and not self.frozen
            just_initialized = update and not bool(self.initialized)
            if just_initialized:
                self._init_codebooks(x.detach().reshape(-1, self.dim))
            k = self._codebooks_per_example(b, n_q, z.device)
            q_sum, codes, commit_terms, metrics = self._quantize_levels(
                x, k, self._levels_in_use(k), update=update, revive=update and not just_initialized)

        # Level 1 is used by every example, so commit_terms is never empty.
        commit_per_level = torch.stack(commit_terms)
        quantized = x + (q_sum - x).detach()  # the single straight-through estimator
        return QuantizerOutput(
            quantized=rearrange(quantized, "b t d -> b d t").to(z.dtype),
            codes=codes,
            commit_loss=self.commitment_weight * commit_per_level.mean(),
            metrics=self._summary(metrics, k),
            commit_per_level=commit_per_level,
            n_q_per_example=k,
        )

    def _levels_in_use(self, k: Tensor) -> int:
        """The largest k of the batch; in distributed training the largest over all ranks, so every
        rank runs the same levels (and the same collective operations)."""
        n_used = int(k.max())
        if self.training and _distributed():
            n_used_t = torch.tensor(n_used, device=k.device)
            dist.all_reduce(n_used_t, op=dist.ReduceOp.MAX)
            n_used = int(n_used_t)
        return n_used

    def _quantize_levels(self, x: Tensor, k: Tensor, n_used: int, *, update: bool,
                         revive: bool) -> tuple[Tensor, Tensor, list[Tensor], dict[str, Tensor]]:
        """Quantize x [B, T, D] greedily with levels 0..n_used-1, each on the examples whose k exceeds it.

        Returns q_sum [B, T, D], codes [B, n_used, T] (-1 where dropped), the per-level commitment
        terms and the per-level metrics."""
        b, t, _ = x.shape
        residual, q_sum = x, torch.zeros_like(x)
        codes = torch.full((b, n_used, t), -1, dtype=torch.long, device=x.device)
        commit_terms: list[Tensor] = []
        metrics: dict[str, Tensor] = {}
        for c in range(n_used):
            active = k > c  # [B]
            r = residual[active]  # [b_c, T, D]
            idx, q, usage = self._quantize_level(c, r, metrics, update=update, revive=revive)
            if r.shape[0] > 0:
                commit_terms.append(F.mse_loss(r, q.detach()))
            metrics.update(self._usage_metrics(c, usage))
            q_full = torch.zeros_like(x)
            q_full[active] = q
            codes[active, c] = idx.view(-1, t)
            q_sum = q_sum + q_full
            residual = residual - q_full
        for c in range(n_used, self.n_codebooks):
            metrics[f"dead_codes/c{c}"] = (self.cluster_size[c] < self.dead_code_threshold).sum().float()
        return q_sum, codes, commit_terms, metrics

    def _quantize_level(self, c: int, r: Tensor, metrics: dict[str, Tensor], *, update: bool,
                        revive: bool) -> tuple[Tensor, Tensor, Tensor]:
        """Level c on its residuals r [b_c, T, D]: revive dead codes (recorded in `metrics`), assign,
        and update the codebook. Returns codes [b_c * T], their vectors [b_c, T, D], usage counts [|V|]."""
        flat = r.detach().reshape(-1, self.dim)
        dead = self.cluster_size[c] < self.dead_code_threshold
        metrics[f"dead_codes/c{c}"] = dead.sum().float()
        if revive:
            self._revive_dead_codes(c, flat, dead)
        codebook = self.embed[c].clone()  # the vectors this step quantizes with
        idx = nearest_codes(flat, codebook)
        q = F.embedding(idx, codebook).view_as(r)
        if update:
            usage = self._ema_update(c, flat, idx)
        else:
            usage = torch.bincount(idx, minlength=self.codebook_size).float()
        return idx, q, usage

    def _usage_metrics(self, c: int, usage: Tensor) -> dict[str, Tensor]:
        """Perplexity and normalised entropy of level c's code usage counts [|V|]."""
        log_v = math.log(self.codebook_size) if self.codebook_size > 1 else 1.0
        probs = usage / usage.sum().clamp(min=1)
        entropy = -(probs * torch.log(probs.clamp(min=1e-12))).sum()
        return {f"perplexity/c{c}": entropy.exp(), f"entropy_norm/c{c}": entropy / log_v}

    @staticmethod
    def _summary(metrics: dict[str, Tensor], k: Tensor) -> dict[str, Tensor]:
        """The per-level metrics, their means over levels, and `n_q`; all detached."""
        metrics = dict(metrics)
        for name in ("perplexity", "entropy_norm", "dead_codes"):
            values = [v for key, v in metrics.items() if key.startswith(name + "/")]
            metrics[name] = torch.stack(values).mean()
        metrics["n_q"] = k.float().mean()
        return {key: v.detach() for key, v in metrics.items()}
