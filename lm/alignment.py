"""Training aids that make a conditioned decoder read its text.

Guided attention (Tachibana et al. 2017, "Efficiently trainable text-to-speech ... with guided
attention", DC-TTS): a training loss that pulls cross-attention heads towards the diagonal of
text and audio, since speech reads its text in order, start to end.

For a row of S sequence positions reading a text of L bytes, the penalty of position s attending
to text byte j is

    W[s, j] = 1 - exp(-((j + 1/2) / L - (s + 1/2) / S)^2 / (2 g^2))

and the speaker's source position (index 0) costs W = 1, so a guided head cannot rest on it. The
loss is sum_j A[s, j] W[s, j], the attention mass a head puts off the diagonal (0..1), averaged
over the guided heads of every layer, the row's S positions and the guided rows. Only rows whose
window holds a whole file with its text are guided: elsewhere the diagonal is unknown.

Context noise replaces input codes by random ones (Tacotron's prenet-dropout bottleneck): with an
unreliable audio history the decoder leans on its conditions.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def guide_penalty(text_len: Tensor, seq_len: Tensor, n_positions: int, width: int, sigma: float) -> Tensor:
    """W [B, S, M] for texts of text_len [B] bytes and rows of seq_len [B] positions, over S =
    n_positions and M = width source positions (speaker, then bytes 1..L, then padding: W = 0 there)."""
    device = text_len.device
    s = torch.arange(n_positions, device=device, dtype=torch.float32)[None, :, None]
    j = torch.arange(width, device=device, dtype=torch.float32)[None, None, :] - 1  # byte index; -1: speaker
    L = text_len.clamp_min(1).float()[:, None, None]
    S = seq_len.clamp_min(1).float()[:, None, None]
    w = 1.0 - torch.exp(-((j + 0.5) / L - (s + 0.5) / S) ** 2 / (2.0 * sigma ** 2))
    w = torch.where(j < 0, torch.ones_like(w), w)
    return torch.where(j < L, w, torch.zeros_like(w))


def guided_attention_loss(weights: Sequence[Tensor], memory, ends: Tensor | None, valid: Tensor,
                          sigma: float) -> Tensor:
    """weights: per layer [B, h, S, M] attention (rows sum to 1 over M); memory: the CrossMemory read
    (its text_len [B], after condition dropout); ends [B] bool (the window holds its file's end; None:
    no row does); valid [B, N_c, S] the targets scored -> the mean off-diagonal mass (a scalar; 0 when
    no row is guided)."""
    rows = (memory.text_len > 0) & (ends.to(valid.device) if ends is not None else False)
    return off_diagonal_mass(weights, memory.text_len, valid.any(1).sum(-1), rows, sigma)


def off_diagonal_mass(weights: Sequence[Tensor], text_len: Tensor, seq_len: Tensor, rows: Tensor,
                      sigma: float) -> Tensor:
    """weights: per layer [B, h, S, M]; text_len [B] bytes read; seq_len [B] real positions of each
    row; rows [B] bool, the rows to guide -> the mean off-diagonal mass (0 when no row is guided)."""
    if not weights:
        raise ValueError("no recorded cross-attention weights to guide")
    b, _, n_positions, width = weights[0].shape
    penalty = guide_penalty(text_len, seq_len, n_positions, width, sigma)  # [B, S, M]
    real = torch.arange(n_positions, device=seq_len.device)[None, :] < seq_len[:, None]  # [B, S]
    take = (real & rows[:, None]).float()
    if not bool(take.any()):
        return weights[0].new_zeros(())
    total = weights[0].new_zeros(())
    for w in weights:
        off = (w.float() * penalty[:, None]).sum(-1).mean(1)  # [B, S]: off-diagonal mass, heads averaged
        total = total + (off * take).sum() / take.sum()
    return total / len(weights)


def forward_recording(model, inputs: Tensor, memory, heads: int) -> tuple[Tensor, list[Tensor]]:
    """model(inputs, memory=memory) keeping the first `heads` heads' weights of every cross-attention:
    -> logits, per layer [B, heads, S, M] (an empty list when heads = 0)."""
    attns = [block.cross_attn for block in model.blocks if block.cross_attn is not None] if heads else []
    for attn in attns:
        attn.record_heads = heads
    try:
        return model(inputs, memory=memory), [attn.recorded for attn in attns]
    finally:
        for attn in attns:
            attn.record_heads, attn.recorded = 0, None


def noisy_context(inputs: Tensor, rate: float, codebook_size: int) -> Tensor:
    """inputs [B, N_c, S] with each code (ids < codebook_size; not bos, pad or end) replaced by a uniformly
    random code with probability `rate` (torch's global RNG; rate 0 draws nothing). The targets stay true."""
    if rate <= 0:
        return inputs
    noise = (torch.rand(inputs.shape, device=inputs.device) < rate) & (inputs < codebook_size)
    return torch.where(noise, torch.randint_like(inputs, codebook_size), inputs)
