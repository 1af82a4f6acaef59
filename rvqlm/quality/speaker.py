"""Who is speaking: speaker similarity with Resemblyzer's voice encoder (GE2E, 256-d embeddings).

    encoder = SpeakerEncoder()                       # resemblyzer's weights ship in its wheel; CPU
    reference = centroid([encoder.embed(w, 16000) for w in real_lines_of_the_speaker])
    similarity = cosine(encoder.embed(clip, 16000), reference)

`embed` runs resemblyzer's `preprocess_wav` (volume normalisation, long silences trimmed by
webrtcvad) and `embed_utterance` (the L2-normed mean of 1.6 s partial embeddings); a clip with no
speech left after trimming has no embedding (None), and its similarities are NaN. `centroid` is the
L2-normed mean of a set of embeddings, so `cosine` to it is the usual GE2E speaker score (about 0.6
to 0.95 for speech; higher: closer to the reference voice). `pip install -e '.[bench]'` installs it.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from rvqlm.quality.asr import missing

SPEAKER_RATE = 16000  # resemblyzer's own rate; other rates are resampled by its preprocess_wav
MIN_SECONDS = 0.1  # less speech than this after trimming: no embedding


class SpeakerEncoder:
    """resemblyzer's VoiceEncoder on the CPU; `embed(wav, sample_rate)` -> a unit 256-d vector or None."""

    def __init__(self, device: str = "cpu"):
        try:
            from resemblyzer import VoiceEncoder, preprocess_wav
        except ImportError:
            raise missing("resemblyzer", "the speaker similarity") from None
        self._preprocess = preprocess_wav
        self.encoder = VoiceEncoder(device=device, verbose=False)

    def embed(self, wav: np.ndarray, sample_rate: int = SPEAKER_RATE) -> np.ndarray | None:
        """The utterance embedding of a 1-D float clip, None when it holds no speech (empty, silent, or
        under MIN_SECONDS once resemblyzer has trimmed its silences)."""
        x = np.asarray(wav, dtype=np.float32).reshape(-1)
        if x.size == 0 or not np.isfinite(x).all() or not np.abs(x).max() > 0:
            return None
        with np.errstate(all="ignore"):
            x = self._preprocess(x, source_sr=sample_rate)
        if len(x) < MIN_SECONDS * SPEAKER_RATE or not np.isfinite(x).all():
            return None
        return np.asarray(self.encoder.embed_utterance(x), dtype=np.float64)


def centroid(embeddings: Iterable[np.ndarray | None]) -> np.ndarray:
    """The L2-normed mean of the embeddings given (None ones skipped); ValueError when there are none."""
    kept = [np.asarray(e, dtype=np.float64) for e in embeddings if e is not None]
    if not kept:
        raise ValueError("no embedding to take a centroid of (every clip was silent)")
    mean = np.mean(kept, axis=0)
    return mean / np.linalg.norm(mean)


def cosine(a: np.ndarray | None, b: np.ndarray | None) -> float:
    """Cosine similarity of two vectors, NaN when either is missing or zero."""
    if a is None or b is None:
        return float("nan")
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norm if norm > 0 else float("nan")
