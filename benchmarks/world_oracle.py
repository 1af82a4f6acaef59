"""The source-filter design's ceiling for the codec benchmarks: speech analysed by the WORLD vocoder
(pyworld) into a compact per-frame parameter set and resynthesized. Needs `make bench-setup`
(pyworld, pysptk).
"""

from __future__ import annotations

import numpy as np

from rvqlm.quality.roundtrips import Roundtrip

WORLD_FRAME_MS = 20.0  # one vocoder frame per codec frame (50 frames/s)
WORLD_MCEP_ORDER = 24  # mel-cepstrum order: 25 coefficients a frame
WORLD_MCEP_ALPHA = 0.42  # frequency warping of the mel-cepstrum at 16 kHz
WORLD_F0_RANGE = (50.0, 550.0)  # Hz: the span of the log-F0 quantizer and of the F0 search
WORLD_F0_BITS = 6


def quantize_log_f0(f0: np.ndarray, bits: int = WORLD_F0_BITS, f0_range=WORLD_F0_RANGE) -> np.ndarray:
    """Voiced frames (f0 > 0) rounded to one of 2^bits log-spaced values over `f0_range`; unvoiced stay 0."""
    lo, hi = np.log(f0_range[0]), np.log(f0_range[1])
    levels = 2 ** bits - 1
    voiced = f0 > 0
    index = np.round((np.log(np.clip(f0, *f0_range)) - lo) / (hi - lo) * levels)
    return np.where(voiced, np.exp(lo + index / levels * (hi - lo)), 0.0)


def harvest_f0(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """Harvest's F0 (Hz, 0 = unvoiced) of float64 `x` at frames t_j = j * 20 ms."""
    import pyworld

    lo, hi = WORLD_F0_RANGE
    return pyworld.harvest(x, sample_rate, f0_floor=lo, f0_ceil=hi, frame_period=WORLD_FRAME_MS)[0]


def compact_params(x: np.ndarray, f0: np.ndarray, sample_rate: int) -> np.ndarray:
    """[T, 25 mel-cepstrum + coded aperiodicity bands] of float64 `x` at the frames of `f0` [T]:
    CheapTrick's envelope as a 24-order mel-cepstrum, D4C's aperiodicity coded in WORLD's bands."""
    import pysptk
    import pyworld

    t = np.arange(len(f0)) * WORLD_FRAME_MS / 1000
    envelope = pyworld.cheaptrick(x, f0, t, sample_rate, f0_floor=WORLD_F0_RANGE[0])  # [T, n_fft / 2 + 1]
    coded_ap = pyworld.code_aperiodicity(pyworld.d4c(x, f0, t, sample_rate), sample_rate)  # [T, bands]
    return np.concatenate([pysptk.sp2mc(envelope, WORLD_MCEP_ORDER, WORLD_MCEP_ALPHA), coded_ap], 1)


def synthesize_compact(f0: np.ndarray, params: np.ndarray, sample_rate: int, length: int) -> np.ndarray:
    """WORLD resynthesis from F0 [T] (coded as 6-bit log-F0 with voicing) and `compact_params` [T, P]:
    float32 [length]."""
    import pysptk
    import pyworld

    n_fft = pyworld.get_cheaptrick_fft_size(sample_rate, WORLD_F0_RANGE[0])
    params = np.asarray(params, np.float64)
    envelope = pysptk.mc2sp(np.ascontiguousarray(params[:, :WORLD_MCEP_ORDER + 1]), WORLD_MCEP_ALPHA, n_fft)
    aperiodicity = pyworld.decode_aperiodicity(np.ascontiguousarray(params[:, WORLD_MCEP_ORDER + 1:]),
                                               sample_rate, n_fft)
    y = pyworld.synthesize(quantize_log_f0(f0), np.ascontiguousarray(envelope), aperiodicity, sample_rate,
                           WORLD_FRAME_MS)
    return y[:length].astype(np.float32)


def world_compact_roundtrip(wav: np.ndarray, sample_rate: int) -> Roundtrip:
    """The source-filter ceiling: `wav` analysed by WORLD (Harvest F0, CheapTrick envelope, D4C
    aperiodicity) at 20 ms frames into the compact set (24-order mel-cepstrum, WORLD's coded
    aperiodicity bands, 6-bit log-F0 with voicing), then resynthesized. It is fed the original, so it is
    an oracle, not a codec: bits is 0 (the mel-cepstrum is not quantized). Needs pyworld and pysptk."""
    x = np.ascontiguousarray(wav, np.float64)
    f0 = harvest_f0(x, sample_rate)
    return Roundtrip(decoded=synthesize_compact(f0, compact_params(x, f0, sample_rate), sample_rate, len(wav)),
                     bits=0)
