"""16-bit PCM WAV reading with Python's own `wave` module: what `codec.core.audio` reads where the
soundfile package (libsndfile) is not installed, e.g. a stock CUDA PyTorch image.

Samples come out as libsndfile gives them (int16 / 32768, float32 `[S, C]`), so tokens do not
depend on which reader ran. Other formats and sample widths raise `ValueError` naming soundfile.
"""

from __future__ import annotations

import os
import wave

import numpy as np

NEEDS_SOUNDFILE = "without the soundfile package only 16-bit PCM WAV is read (pip install soundfile)"


def _open(path: str | os.PathLike) -> wave.Wave_read:
    if os.path.splitext(str(path))[1].lower() != ".wav":
        raise ValueError(f"not a WAV file: {NEEDS_SOUNDFILE}")
    try:
        w = wave.open(str(path), "rb")
    except (wave.Error, EOFError) as e:
        raise ValueError(f"not a readable 16-bit PCM WAV file ({e}); {NEEDS_SOUNDFILE}") from None
    if w.getsampwidth() != 2:
        w.close()
        raise ValueError(f"{8 * w.getsampwidth()}-bit samples: {NEEDS_SOUNDFILE}")
    return w


def info(path: str | os.PathLike) -> tuple[int, int, int]:
    """(sample rate, channels, frames) from the header."""
    with _open(path) as w:
        return w.getframerate(), w.getnchannels(), w.getnframes()


def read(path: str | os.PathLike, start: int, frames: int) -> np.ndarray:
    """Frames start .. start + frames (-1: to the end) as float32 [S, C]."""
    with _open(path) as w:
        channels, total = w.getnchannels(), w.getnframes()
        w.setpos(min(start, total))
        raw = w.readframes(total - start if frames < 0 else frames)
    samples = np.frombuffer(raw, dtype="<i2")
    samples = samples[: len(samples) // channels * channels]
    return (samples.reshape(-1, channels).astype(np.float32) / 32768.0).astype(np.float32)
