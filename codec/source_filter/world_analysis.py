"""The source-filter codec's training targets: speech analysed by the WORLD vocoder (pyworld, pysptk;
the `train` extra) at one frame per codec frame (frame j centred on sample j * 320 at 16 kHz).

    f0 = harvest_f0(x, sr)               # [T] Hz, 0 = unvoiced
    params = compact_params(x, f0, sr)   # [T, 26]: 24-order mel-cepstrum, WORLD's coded aperiodicity (dB)
    f0 = target_f0(f0, pyin_f0(x, sr, len(f0)))   # the F0 the codec learns: Harvest's, in pYIN's octave
"""

from __future__ import annotations

import numpy as np

WORLD_FRAME_MS = 20.0  # one vocoder frame per codec frame (50 frames/s)
WORLD_MCEP_ORDER = 24  # mel-cepstrum order: 25 coefficients a frame
WORLD_MCEP_ALPHA = 0.42  # frequency warping of the mel-cepstrum at 16 kHz
WORLD_F0_RANGE = (50.0, 550.0)  # Hz: the F0 search range


def _pyworld():
    try:
        import pysptk  # noqa: F401
        import pyworld
    except ImportError as e:
        raise ImportError("WORLD analysis needs pyworld and pysptk: pip install -e '.[train]'") from e
    return pyworld


def harvest_f0(x: np.ndarray, sample_rate: int, frame_ms: float = WORLD_FRAME_MS) -> np.ndarray:
    """Harvest's F0 (Hz, 0 = unvoiced) of float64 `x` at frames t_j = j * frame_ms (default 20 ms)."""
    lo, hi = WORLD_F0_RANGE
    return _pyworld().harvest(x, sample_rate, f0_floor=lo, f0_ceil=hi, frame_period=frame_ms)[0]


def compact_params(x: np.ndarray, f0: np.ndarray, sample_rate: int, frame_ms: float = WORLD_FRAME_MS) -> np.ndarray:
    """[T, 25 mel-cepstrum + coded aperiodicity bands] of float64 `x` at the frames of `f0` [T] (every
    frame_ms): CheapTrick's envelope as a 24-order mel-cepstrum, D4C's aperiodicity coded in WORLD's bands."""
    pyworld = _pyworld()
    import pysptk

    t = np.arange(len(f0)) * frame_ms / 1000
    envelope = pyworld.cheaptrick(x, f0, t, sample_rate, f0_floor=WORLD_F0_RANGE[0])  # [T, n_fft / 2 + 1]
    coded_ap = pyworld.code_aperiodicity(pyworld.d4c(x, f0, t, sample_rate), sample_rate)  # [T, bands]
    return np.concatenate([pysptk.sp2mc(envelope, WORLD_MCEP_ORDER, WORLD_MCEP_ALPHA), coded_ap], 1)


def pyin_f0(x: np.ndarray, sample_rate: int, frames: int) -> np.ndarray:
    """Probabilistic YIN's F0 (librosa; Hz, 0 = unvoiced) of `x` at frames t_j = j * 20 ms, [frames]."""
    try:
        import librosa
    except ImportError as e:
        raise ImportError("the F0 targets need librosa: pip install -e '.[train]'") from e
    hop = int(sample_rate * WORLD_FRAME_MS / 1000)
    f0, voiced, _ = librosa.pyin(np.asarray(x, np.float64), fmin=WORLD_F0_RANGE[0], fmax=WORLD_F0_RANGE[1],
                                 sr=sample_rate, frame_length=1 << int(np.ceil(np.log2(0.064 * sample_rate))),
                                 hop_length=hop)  # a 64 ms window
    f0 = np.where(voiced, np.nan_to_num(f0), 0.0)[:frames]
    return np.pad(f0, (0, frames - len(f0)))


def target_f0(harvest: np.ndarray, pyin: np.ndarray) -> np.ndarray:
    """Harvest's voicing and F0, each frame moved by whole octaves to pYIN's where pYIN hears a pitch
    too: WORLD's best-sounding track without Harvest's octave slips (docs/experiments.md, issue 38)."""
    harvest, pyin = np.asarray(harvest, np.float64), np.asarray(pyin, np.float64)
    both = (harvest > 0) & (pyin > 0)
    octaves = np.round(np.log2(np.where(both, pyin, 1.0) / np.where(both, harvest, 1.0)))
    return np.where(harvest > 0, harvest * 2.0 ** octaves, 0.0)
