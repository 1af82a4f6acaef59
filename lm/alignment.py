"""Training aids that make a conditioned decoder read its text.

Guided attention (Tachibana et al. 2017, "Efficiently trainable text-to-speech ... with guided
attention", DC-TTS): a training loss that pulls cross-attention heads towards the diagonal of
text and audio, since speech reads its text in order, start to end.

For a row of S sequence positions reading a text of L bytes, the penalty of position s attending
to text byte j is

    W[s, j] = 1 - exp(-((j + 1/2) / L - (s + 1/2) / S)^2 / (2 g^2))

and the speaker's source position (index 0) costs W = 1, so a guided head cannot rest on it. The
loss is sum_j A[s, j] W[s, j], the attention mass a head puts off the diagonal (0..1), averaged
over the guided heads of every layer, the row's S positions and the guided rows. A row is guided
when it reads a text and its window holds the whole file: elsewhere the diagonal is unknown.
(Centring the penalty on a known alignment instead was tried: docs/experiments.md.)

Context noise replaces input codes by random ones (Tacotron's prenet-dropout bottleneck): with an
unreliable audio history the decoder leans on its conditions.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from lm.end_of_audio import bar_or_force_end


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
                          condition_cfg) -> Tensor:
    """weights: per layer [B, h, S, M] attention (rows sum to 1 over M); memory: the CrossMemory read
    (its text_len [B], after condition dropout); ends [B] bool (the window holds its file's end; None:
    no row does); valid [B, N_c, S] the targets scored; condition_cfg: the ConditionConfig (its width)
    -> the mean off-diagonal mass (a scalar; 0 when no row is guided). A row is guided when it reads a
    text and holds its file's end (the diagonal is known)."""
    known = ends.to(valid.device) if ends is not None else torch.zeros_like(memory.text_len, dtype=torch.bool)
    return off_diagonal_mass(weights, memory.text_len, valid.any(1).sum(-1), (memory.text_len > 0) & known,
                             condition_cfg.guided_sigma)


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


def reads_in_order(cfg, monotonic: bool | None) -> bool:
    """Whether generation with a conditioned LM config uses the ReadingWindow: `monotonic`, or by default
    exactly when the LM was trained with guided attention (ValueError: asked for without guided heads)."""
    if monotonic and not cfg.condition.guided:
        raise ValueError("monotonic reading needs an LM trained with guided attention (condition.guided_attention "
                         "> 0): this one was not, so leave monotonic unset")
    return cfg.condition.guided if monotonic is None else bool(monotonic)


class ReadingWindow:
    """Monotonic reading while generating (attention windowing: DC-TTS's forcibly incremental attention,
    Coqui TTS's `windowing`). Each row with a text keeps a reading position p (in bytes): the guided heads
    of every cross-attention see only the speaker and text bytes p - back .. p + front. p follows their
    attention's centre but never moves back, nor more than `step` bytes a decoder step, nor past the last
    byte, and is pushed on a byte when it has crossed none for over `patience` steps (None: never).
    Codebook 0 may choose the end only once the window holds the text's last byte, and must `linger`
    steps later (None: never forced). Rows without a text (the null rows of guidance included) are free.

    Call `before(n)` ahead of each decoder forward over n positions and `after(logits)` on its logits."""

    def __init__(self, model, memory, back: int = 2, front: int = 6, step: float = 1.0, linger: int | None = 30,
                 patience: int | None = 12):
        if back < 0 or front < 1 or not step > 0:
            raise ValueError(f"the reading window needs back >= 0, front >= 1, step > 0; got {back}, {front}, {step}")
        if (linger is not None and linger < 0) or (patience is not None and patience < 0):
            raise ValueError(f"the reading window needs linger >= 0 and patience >= 0 (or None); got {linger}, "
                             f"{patience}")
        self.attns = [block.cross_attn for block in model.blocks if block.cross_attn is not None]
        self.heads, self.end_id = model.config.condition.guided_heads, model.config.end_id
        if not model.config.condition.guided:
            raise ValueError("the reading window needs an LM trained with guided attention "
                             "(condition.guided_attention > 0 and guided_heads > 0)")
        self.back, self.front, self.step, self.linger, self.patience = back, front, float(step), linger, patience
        self.text_len = memory.text_len  # [R]
        self.width = memory.mask.shape[-1]  # M = 1 + the longest text
        self.pos = torch.zeros(len(self.text_len), device=self.text_len.device)  # [R] bytes read
        self.at_end = torch.zeros(len(self.text_len), dtype=torch.long, device=self.text_len.device)  # [R] steps
        self.still = torch.zeros_like(self.at_end)  # [R] steps since the position last crossed a byte
        self.history: list[Tensor] = []  # each decoder step's focus [R, M], for forwards that recompute
        self.pushed = torch.zeros_like(self.at_end, dtype=torch.bool)  # [R] the last step pushed the position
        self.forced = torch.zeros_like(self.pushed)  # [R] the last step forced the end

    def focus(self) -> Tensor:
        """[R, M] bool: the speaker and the bytes in each row's window (everything for rows without a text)."""
        j = torch.arange(self.width, device=self.pos.device)[None, :] - 1  # byte index; -1: speaker
        start = self.pos.floor()[:, None]
        inside = (j < 0) | ((j >= start - self.back) & (j <= start + self.front))
        return inside | (self.text_len == 0)[:, None]

    def before(self, n_positions: int = 1) -> None:
        """Limit the guided heads of the coming forward over n positions: its last row to the current
        window, the rows before it to the windows their own steps had (a recompute equals the cache)."""
        self.history.append(self.focus())
        focus = torch.stack(self.history[-n_positions:], dim=1)  # [R, F, M]
        for attn in self.attns:
            attn.focus, attn.focus_heads, attn.record_heads = focus, self.heads, self.heads

    def after(self, logits: Tensor) -> Tensor:
        """Move each row's position on from the recorded attention; -> logits [B, N_c, S, V] (B <= R: the
        rows the caller keeps) with the end barred from codebook 0's last position where not yet allowed."""
        centres, j = [], None
        for attn in self.attns:
            w = attn.recorded[:, :, -1, 1:].float()  # [R, heads, M - 1]: the last row's weights on the bytes
            attn.focus, attn.focus_heads, attn.record_heads, attn.recorded = None, 0, 0, None
            j = torch.arange(w.shape[-1], device=w.device, dtype=w.dtype) if j is None else j
            centres.append((w * j).sum(-1) / w.sum(-1).clamp_min(1e-9))  # [R, heads]
        centre = torch.stack(centres).mean(dim=(0, 2))  # [R]
        moved = torch.minimum(torch.maximum(self.pos, centre), self.pos + self.step)
        self.still = torch.where(moved.floor() > self.pos.floor(), 0, self.still + 1)
        if self.patience is not None:
            self.pushed = self.still > self.patience
            moved = torch.where(self.pushed, moved.floor() + 1, moved)
            self.still = torch.where(self.pushed, 0, self.still)
        last_byte = (self.text_len - 1).clamp_min(0).to(moved.dtype)
        self.pos = torch.where(self.text_len > 0, torch.minimum(moved, last_byte), torch.zeros_like(moved))
        reached = (self.pos.floor() + self.front >= self.text_len - 1) & (self.text_len > 0)
        self.at_end = torch.where(reached, self.at_end + 1, 0)
        if self.linger is not None:
            self.forced = self.at_end > self.linger
        rows = logits.shape[0]
        barred, forced = ~reached[:rows] & (self.text_len[:rows] > 0), self.forced[:rows]
        return bar_or_force_end(logits, barred, forced, self.end_id)
