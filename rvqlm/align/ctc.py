"""The CTC acoustic model of the aligner and its saved folder.

Log-mel frames [B, T, 80] -> two Conv1d layers (kernel 5) -> a bidirectional GRU -> log-probs
[B, T, C] over C = len(alphabet) classes: class 0 is the CTC blank, class i >= 1 is the alphabet's
unit i (WORD, then the letters). The EDGE unit "_" (silence around a line) has no class of its own:
silence is blank, so a line's unit ids without its two edges are its CTC targets as they are. No
time reduction: one output frame per codec token frame.

Saved as a model folder (rvqlm_core.persistence): config.json (the alphabet and the sizes) and
model.safetensors, written atomically, read without unpickling.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from lm.text_units import EDGE, WORD
from rvqlm.align.features import N_MELS
from rvqlm_core.persistence import FolderFormat, cpu_state, load_state, read_folder, save_folder

ALIGNER_FORMAT = FolderFormat("aligner", "model_type", "rvqlm.CTCAligner", 1)
BLANK = 0


@dataclass(frozen=True)
class AlignerConfig:
    alphabet: str  # EDGE, WORD, then letters (lm/text_units.py); class i >= 1 is alphabet[i]
    n_mels: int = N_MELS
    channels: int = 192
    hidden: int = 192
    layers: int = 2
    kernel: int = 5
    dropout: float = 0.1

    def __post_init__(self):
        if len(self.alphabet) < 3 or self.alphabet[:2] != EDGE + WORD or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"an aligner alphabet starts with {EDGE + WORD!r} and holds each unit once; "
                             f"got {self.alphabet[:20]!r}")

    @property
    def n_classes(self) -> int:
        return len(self.alphabet)


class CTCAligner(nn.Module):
    def __init__(self, config: AlignerConfig):
        super().__init__()
        self.config = c = config
        pad = c.kernel // 2
        self.convs = nn.Sequential(
            nn.Conv1d(c.n_mels, c.channels, c.kernel, padding=pad), nn.GELU(), nn.Dropout(c.dropout),
            nn.Conv1d(c.channels, c.channels, c.kernel, padding=pad), nn.GELU(), nn.Dropout(c.dropout))
        self.gru = nn.GRU(c.channels, c.hidden, num_layers=c.layers, batch_first=True, bidirectional=True,
                          dropout=c.dropout if c.layers > 1 else 0.0)
        self.out = nn.Linear(2 * c.hidden, c.n_classes)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [B, T, n_mels] -> log-probs [B, T, n_classes]. A batch is padded with zeros past each
        utterance's end, unpacked (packing costs ~3x on CPU): training batches utterances of nearly
        equal length, so the backward GRU starts at most a few padded frames early."""
        return self.out(self.states(feats)).log_softmax(dim=-1)

    def states(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [B, T, n_mels] -> the bidirectional GRU's states [B, T, 2 * hidden], before the classes."""
        x = self.convs(feats.transpose(1, 2)).transpose(1, 2)
        return self.gru(x)[0]

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        return save_folder(path, ALIGNER_FORMAT, asdict(self.config), cpu_state(self))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "CTCAligner":
        config, tensors = read_folder(path, ALIGNER_FORMAT)
        known = {f.name for f in fields(AlignerConfig)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"{Path(path) / 'config.json'}: unknown aligner settings {unknown}")
        model = cls(AlignerConfig(**config))
        load_state(model, tensors, path)
        return model.eval()


def greedy_decode(log_probs: torch.Tensor, alphabet: str) -> str:
    """log-probs [T, C] -> the best class per frame, repeats collapsed, blanks dropped, as units."""
    best = log_probs.argmax(dim=-1).tolist()
    out, prev = [], BLANK
    for k in best:
        if k != BLANK and k != prev:
            out.append(alphabet[k])
        prev = k
    return "".join(out)
