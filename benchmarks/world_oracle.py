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


def world_compact_roundtrip(wav: np.ndarray, sample_rate: int) -> Roundtrip:
    """The source-filter ceiling: `wav` analysed by WORLD (Harvest F0, CheapTrick envelope, D4C
    aperiodicity) at 20 ms frames into the compact set (24-order mel-cepstrum, WORLD's coded
    aperiodicity bands, 6-bit log-F0 with voicing), then resynthesized. It is fed the original, so it is
    an oracle, not a codec: bits is 0 (the mel-cepstrum is not quantized). Needs pyworld and pysptk."""
    import pysptk
    import pyworld

    x = np.ascontiguousarray(wav, np.float64)
    f0, t = pyworld.harvest(x, sample_rate, f0_floor=WORLD_F0_RANGE[0], f0_ceil=WORLD_F0_RANGE[1],
                            frame_period=WORLD_FRAME_MS)
    envelope = pyworld.cheaptrick(x, f0, t, sample_rate, f0_floor=WORLD_F0_RANGE[0])  # [T, n_fft / 2 + 1]
    coded_ap = pyworld.code_aperiodicity(pyworld.d4c(x, f0, t, sample_rate), sample_rate)  # [T, bands]
    mcep = pysptk.sp2mc(envelope, WORLD_MCEP_ORDER, WORLD_MCEP_ALPHA)  # [T, order + 1]
    n_fft = pyworld.get_cheaptrick_fft_size(sample_rate, WORLD_F0_RANGE[0])
    envelope = np.ascontiguousarray(pysptk.mc2sp(mcep, WORLD_MCEP_ALPHA, n_fft))
    aperiodicity = pyworld.decode_aperiodicity(np.ascontiguousarray(coded_ap), sample_rate, n_fft)
    y = pyworld.synthesize(quantize_log_f0(f0), envelope, aperiodicity, sample_rate, WORLD_FRAME_MS)
    return Roundtrip(decoded=y[: len(wav)].astype(np.float32), bits=0)
