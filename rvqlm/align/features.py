"""Log-mel features with exactly one frame per codec token frame (16 kHz, hop 320: 50 Hz).

A file of S samples gives T = ceil(S / 320) frames, the number of token frames the codec makes of it
(codec/tokenize/pieces.py `Plan.frames`): the centred STFT makes 1 + S // 320, one more when 320 divides S,
which is dropped. Each utterance is normalised per mel bin (mean 0, variance 1 over its frames).
"""

from __future__ import annotations

import math

import torch

SAMPLE_RATE, HOP, N_FFT, N_MELS = 16000, 320, 1024, 80
_MEL: dict[str, torch.nn.Module] = {}


def frame_count(samples: int) -> int:
    """The codec's token frames of `samples` samples: ceil(samples / HOP)."""
    return math.ceil(samples / HOP)


def _mel() -> torch.nn.Module:
    if "mel" not in _MEL:
        import torchaudio

        # constant (zero) padding at the edges: reflection needs more than N_FFT / 2 samples
        _MEL["mel"] = torchaudio.transforms.MelSpectrogram(
            sample_rate=SAMPLE_RATE, n_fft=N_FFT, hop_length=HOP, n_mels=N_MELS, center=True, pad_mode="constant")
    return _MEL["mel"]


def log_mel(wav: torch.Tensor) -> torch.Tensor:
    """16 kHz audio [S] or [1, S] -> normalised log-mel frames [T, N_MELS], T = ceil(S / HOP)."""
    wav = wav.reshape(-1).float()
    if wav.numel() == 0:
        raise ValueError("no audio samples to align")
    with torch.no_grad():
        mel = _mel()(wav)  # [N_MELS, 1 + S // HOP]
    frames = frame_count(wav.numel())
    if mel.shape[1] not in (frames, frames + 1):
        raise AssertionError(f"{mel.shape[1]} STFT frames of {wav.numel()} samples; expected {frames} or {frames + 1}")
    feats = mel[:, :frames].clamp(min=1e-5).log().T  # [T, N_MELS]
    mean = feats.mean(dim=0, keepdim=True)
    std = feats.std(dim=0, unbiased=False, keepdim=True)
    return ((feats - mean) / (std + 1e-5)).contiguous()
