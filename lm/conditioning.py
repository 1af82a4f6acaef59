"""The condition encoder of a conditioned LM: what to say (text) and who says it (speaker), read
once per sequence by the decoder's cross-attention (docs/theory.md, seed 000: an encoder-decoder
model encodes a source sequence without a causal mask).

Source sequence, [B, M] ids with M = 1 + max(1, longest text in bytes):

    position 0        the speaker: a row of the speaker table (ids 0..n-1 for ConditionConfig.speakers,
                      id n the learned null speaker: no speaker, or a dropped one)
    positions 1..L    the text's UTF-8 bytes (the N_c = 1 byte tokenizer; no language frontend);
                      an empty or dropped text is one learned NULL_TEXT token instead
    after the end     PAD_BYTE, masked out of every attention (never a key)

The encoder is the decoder's pre-norm Block without a causal mask (only the padding is masked),
RoPE over source positions, and a final norm of the rows centred over the real positions (the
row mean is removed first: without it the encoder learned one large constant for every row, which
the norm turned into the same vector everywhere, so no condition reached the decoder; see
docs/experiments.md). The speaker also has a direct path: a row of the voice table, added to
every decoder input (WaveNet's global conditioning), zero at initialisation so that a decoder
started from an unconditioned LM starts as it was. Training drops the text and the speaker
independently to their null conditions (`ConditionConfig.text_dropout` / `speaker_dropout`), so
one model is conditional and unconditional and classifier-free guidance (lm.guidance) can
compare the two. Null text plus null speaker is the unconditional model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from lm.aligned_text import FrameText, frame_units_from_durations
from lm.config import ConditionConfig, LMConfig
from lm.kv_cache import CrossMemory
from lm.layers import Block, make_norm
from lm.rope import RotaryEmbedding
from lm.text_units import unit_ids

PAD_BYTE = 256  # text rows past a text's end
NULL_TEXT = 257  # the learned "no text" token
TEXT_ROWS = 258  # 256 byte values + PAD_BYTE + NULL_TEXT


@dataclass
class ConditionInputs:
    """A batch of conditions. text [B, L] long byte values (PAD_BYTE past each text's end);
    text_len [B] long, 0 = null text; speaker [B] long, ConditionConfig.null_speaker = null."""

    text: Tensor
    text_len: Tensor
    speaker: Tensor
    frame_units: Tensor | None = None  # aligned text (lm.aligned_text): [B, F] unit index per frame, -1 none
    durations: Tensor | None = None  # [B, L] float frames per unit (< 0 unknown), the duration targets

    def __len__(self) -> int:
        return self.speaker.shape[0]

    def to(self, device: torch.device | str) -> "ConditionInputs":
        move = (lambda x: None if x is None else x.to(device))
        return ConditionInputs(self.text.to(device), self.text_len.to(device), self.speaker.to(device),
                               move(self.frame_units), move(self.durations))

    def nulled(self, null_speaker: int, text: Tensor | None = None, speaker: Tensor | None = None
               ) -> "ConditionInputs":
        """These conditions with the rows where `text` / `speaker` ([B] bool) is True set to null
        (None: every row)."""
        drop_text = torch.ones_like(self.text_len, dtype=torch.bool) if text is None else text
        drop_speaker = torch.ones_like(self.speaker, dtype=torch.bool) if speaker is None else speaker
        return ConditionInputs(self.text, self.text_len.masked_fill(drop_text, 0),
                               self.speaker.masked_fill(drop_speaker, null_speaker), self.frame_units, self.durations)

    def cat(self, other: "ConditionInputs") -> "ConditionInputs":
        """Rows of self, then rows of other ([2B] when both hold B)."""
        return ConditionInputs(_cat_padded(self.text, other.text, PAD_BYTE), torch.cat([self.text_len, other.text_len]),
                               torch.cat([self.speaker, other.speaker]),
                               _cat_optional(self.frame_units, other.frame_units, len(self), len(other), -1),
                               _cat_optional(self.durations, other.durations, len(self), len(other), -1.0))


def _cat_padded(a: Tensor, b: Tensor, value) -> Tensor:
    """[B1, W1] and [B2, W2] -> [B1 + B2, max(W1, W2)], the shorter rows padded with `value`."""
    width = max(a.shape[1], b.shape[1])
    return torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value) for x in (a, b)])


def _cat_optional(a: Tensor | None, b: Tensor | None, rows_a: int, rows_b: int, value) -> Tensor | None:
    """_cat_padded where either side may be None (then rows of `value`); None when both are."""
    if a is None and b is None:
        return None
    like = a if a is not None else b
    a = like.new_full((rows_a, 1), value) if a is None else a
    b = like.new_full((rows_b, 1), value) if b is None else b
    return _cat_padded(a, b, value)


@dataclass(frozen=True)
class Condition:
    """What a conditioned LM is asked to say at generation: `text` and `speaker`, each one for every row,
    a list of one per row, or None (the null condition)."""

    text: str | Sequence[str | None] | None = None
    speaker: str | Sequence[str | None] | None = None
    durations: Sequence[int] | Sequence[Sequence[int]] | None = None  # aligned text: frames per unit (None: predicted)

    @property
    def given(self) -> bool:
        return self.text is not None or self.speaker is not None

    def rows(self) -> int | None:
        """The number of rows a list of texts or speakers asks for (None: any)."""
        for values in (self.text, self.speaker):
            if values is not None and not isinstance(values, str):
                return len(list(values))
        return None


def _per_row(values: str | Sequence[str | None] | None, batch_size: int, what: str) -> list[str | None]:
    if values is None or isinstance(values, str):
        return [values] * batch_size
    values = list(values)
    if len(values) != batch_size:
        raise ValueError(f"{len(values)} {what}s for a batch of {batch_size} sequences; give one per sequence "
                         "(or a single one for all)")
    return values


def condition_inputs(cond: ConditionConfig, texts: str | Sequence[str | None] | None,
                     speakers: str | Sequence[str | None] | None, batch_size: int,
                     durations: Sequence[int] | Sequence[Sequence[int]] | None = None) -> ConditionInputs:
    """Texts and speaker names (one per row, or one for all; None or "" = null) -> ConditionInputs.
    An aligned-text LM (cond.alphabet) reads units (lm.text_units) and may be given each row's
    `durations` (frames per unit, edges included; None: the LM predicts them).

    Raises ValueError for a text longer than `text_max_bytes` (UTF-8 bytes, or units), a text the
    alphabet cannot say, or a speaker not in the model's table, naming the limit or what is known.
    """
    texts = _per_row(texts, batch_size, "text")
    speakers = _per_row(speakers, batch_size, "speaker")
    encoded = [_encode_text(cond, t) for t in texts]
    width = max([1, *(len(d) for d in encoded)])
    text = torch.full((batch_size, width), PAD_BYTE, dtype=torch.long)
    for row, data in enumerate(encoded):
        text[row, :len(data)] = torch.tensor(list(data), dtype=torch.long)
    text_len = torch.tensor([len(d) for d in encoded], dtype=torch.long)
    speaker = torch.tensor([cond.null_speaker if s in (None, "") else cond.speaker_id(s) for s in speakers],
                           dtype=torch.long)
    frame_units = None
    if durations is not None:
        if not cond.alphabet:
            raise ValueError("durations are for an aligned-text LM (condition.alphabet); this LM reads free text")
        rows = [list(durations)] * batch_size if durations and isinstance(list(durations)[0], int) \
            else [list(d) for d in durations]
        if len(rows) != batch_size or any(len(d) != len(e) for d, e in zip(rows, encoded)):
            raise ValueError(f"durations must give one frame count per unit of each text "
                             f"({[len(e) for e in encoded]} units), got {[len(d) for d in rows]}")
        if any(int(x) < 0 for d in rows for x in d):
            raise ValueError("durations must be frame counts >= 0")
        frame_units = frame_units_from_durations(rows)
    return ConditionInputs(text, text_len, speaker, frame_units)


def _encode_text(cond: ConditionConfig, t: str | None) -> list[int] | bytes:
    """One row's text -> its ids: UTF-8 bytes, or an aligned-text LM's unit ids ([] / b"" for a null text)."""
    if t is not None and not isinstance(t, str):
        raise ValueError(f"a text must be a string, got {type(t).__name__}")
    if cond.alphabet:
        ids = unit_ids(t, cond.alphabet) if t else []
        if len(ids) > cond.text_max_bytes:
            raise ValueError(f"text of {len(ids)} units is over this LM's limit of text_max_bytes="
                             f"{cond.text_max_bytes}: {t[:40]!r}...")
        return ids
    try:
        data = (t or "").encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text {t[:40]!r} is not encodable as UTF-8 ({e.reason})") from None
    if len(data) > cond.text_max_bytes:
        raise ValueError(f"text of {len(data)} UTF-8 bytes is over this LM's limit of text_max_bytes="
                         f"{cond.text_max_bytes}: {t[:40]!r}...")
    return data


class ConditionEncoder(nn.Module):
    """Bidirectional transformer over [speaker, text bytes]: ConditionInputs -> CrossMemory
    (states [B, M, d], mask [B, M], voice [B, d]). Training mode drops text / speaker to null at their rates."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        if cfg.condition is None:
            raise ValueError("a ConditionEncoder needs LMConfig.condition")
        self.cond = cfg.condition
        self.text_embedding = nn.Embedding(TEXT_ROWS, cfg.d_model)
        self.speaker_embedding = nn.Embedding(len(self.cond.speakers) + 1, cfg.d_model)  # last row: null
        self.voice = nn.Embedding(len(self.cond.speakers) + 1, cfg.d_model)  # zero at start (reset_voice)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_base)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(self.cond.encoder_layers))
        self.norm = make_norm(cfg)
        self.frame_text = FrameText(cfg.d_model) if self.cond.alphabet else None  # lm.aligned_text

    @torch.no_grad()
    def reset_voice(self) -> None:
        nn.init.zeros_(self.voice.weight)

    def null_inputs(self, batch_size: int) -> ConditionInputs:
        """B rows of null text and null speaker (the unconditional model)."""
        device = self.text_embedding.weight.device
        return ConditionInputs(torch.full((batch_size, 1), PAD_BYTE, dtype=torch.long, device=device),
                               torch.zeros(batch_size, dtype=torch.long, device=device),
                               torch.full((batch_size,), self.cond.null_speaker, dtype=torch.long, device=device))

    def drop(self, inputs: ConditionInputs) -> ConditionInputs:
        """Condition dropout: each row's text becomes null with probability text_dropout and, drawn
        independently, its speaker with probability speaker_dropout (torch's global RNG)."""
        b, device = len(inputs), inputs.speaker.device
        drop_text = torch.rand(b, device=device) < self.cond.text_dropout
        drop_speaker = torch.rand(b, device=device) < self.cond.speaker_dropout
        return inputs.nulled(self.cond.null_speaker, drop_text, drop_speaker)

    def source(self, inputs: ConditionInputs) -> tuple[Tensor, Tensor]:
        """-> embedded source [B, M, d] and its mask [B, M] bool (see the module docstring)."""
        text, text_len = inputs.text, inputs.text_len
        b, width = text.shape
        positions = torch.arange(max(width, 1), device=text.device)
        real = positions[None, :] < text_len[:, None]
        ids = torch.where(real, text[:, :max(width, 1)], PAD_BYTE)
        ids[:, 0] = torch.where(text_len == 0, NULL_TEXT, ids[:, 0])
        text_mask = real | ((text_len == 0)[:, None] & (positions[None, :] == 0))
        source = torch.cat([self.speaker_embedding(inputs.speaker)[:, None], self.text_embedding(ids)], dim=1)
        mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=text.device), text_mask], dim=1)
        return source, mask

    def forward(self, inputs: ConditionInputs) -> CrossMemory:
        if bool((inputs.speaker < 0).any() | (inputs.speaker > self.cond.null_speaker).any()):
            raise ValueError(f"speaker ids must be in 0..{self.cond.null_speaker} (the null speaker)")
        if bool((inputs.text_len < 0).any() | (inputs.text_len > inputs.text.shape[1]).any()):
            raise ValueError(f"text lengths must be in 0..{inputs.text.shape[1]} (the text tensor's width)")
        if self.training:
            inputs = self.drop(inputs)
        h, mask = self.source(inputs)
        h = self.dropout(h)
        rope = self.rope.cos_sin(torch.arange(h.shape[1], device=h.device), h.dtype)
        key_mask = mask[:, None, None, :]  # every real position sees every real position: no causal mask
        for block in self.blocks:
            h = block(h, rope, None, key_mask)
        states = self.norm(centred(h, mask))
        memory = CrossMemory(states, mask, voice=self.voice(inputs.speaker), text_len=inputs.text_len)
        if self.frame_text is not None:
            frame_units = inputs.frame_units
            if frame_units is None:  # generation: the predicted durations place the text
                frame_units = frame_units_from_durations(self.frame_text.predict(states, inputs.text_len)).to(h.device)
            memory.frames = self.frame_text.frames(states, frame_units, inputs.text_len)
            said = (frame_units >= 0) & (frame_units < inputs.text_len[:, None])
            memory.frame_len = torch.where(inputs.text_len > 0, said.sum(1), 0)
        return memory


def centred(h: Tensor, mask: Tensor) -> Tensor:
    """h [B, M, d] minus its mean over the real positions (mask [B, M] True): what differs between
    source positions; padding rows are left as they are (no query ever reads them)."""
    weights = mask.to(h.dtype)[..., None]
    mean = (h * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True).clamp_min(1.0)
    return torch.where(mask[..., None], h - mean, h)
