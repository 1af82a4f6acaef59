"""The source-filter design's ceiling for the codec benchmarks: speech analysed by the WORLD vocoder
(pyworld) into a compact per-frame parameter set and resynthesized. Needs `make bench-setup`
(pyworld, pysptk).
"""

from __future__ import annotations

import numpy as np

from codec.source_filter.world_analysis import (WORLD_F0_RANGE, WORLD_FRAME_MS,  # noqa: F401
                                                WORLD_MCEP_ALPHA, WORLD_MCEP_ORDER, compact_params, harvest_f0)
from rvqlm.quality.roundtrips import Roundtrip

WORLD_F0_BITS = 6


def quantize_log_f0(f0: np.ndarray, bits: int = WORLD_F0_BITS, f0_range=WORLD_F0_RANGE) -> np.ndarray:
    """Voiced frames (f0 > 0) rounded to one of 2^bits log-spaced values over `f0_range`; unvoiced stay 0."""
    lo, hi = np.log(f0_range[0]), np.log(f0_range[1])
    levels = 2 ** bits - 1
    voiced = f0 > 0
    index = np.round((np.log(np.clip(f0, *f0_range)) - lo) / (hi - lo) * levels)
    return np.where(voiced, np.exp(lo + index / levels * (hi - lo)), 0.0)


def synthesize_compact(f0: np.ndarray, params: np.ndarray, sample_rate: int, length: int,
                       frame_ms: float = WORLD_FRAME_MS) -> np.ndarray:
    """WORLD resynthesis from F0 [T] (coded as 6-bit log-F0 with voicing) and `compact_params` [T, P], a
    frame every frame_ms: float32 [length]."""
    import pysptk
    import pyworld

    n_fft = pyworld.get_cheaptrick_fft_size(sample_rate, WORLD_F0_RANGE[0])
    params = np.asarray(params, np.float64)
    envelope = pysptk.mc2sp(np.ascontiguousarray(params[:, :WORLD_MCEP_ORDER + 1]), WORLD_MCEP_ALPHA, n_fft)
    aperiodicity = pyworld.decode_aperiodicity(np.ascontiguousarray(params[:, WORLD_MCEP_ORDER + 1:]),
                                               sample_rate, n_fft)
    y = pyworld.synthesize(quantize_log_f0(f0), np.ascontiguousarray(envelope), aperiodicity, sample_rate,
                           frame_ms)
    return y[:length].astype(np.float32)


def world_compact_roundtrip(wav: np.ndarray, sample_rate: int, frame_ms: float = WORLD_FRAME_MS) -> Roundtrip:
    """The source-filter ceiling: `wav` analysed by WORLD (Harvest F0, CheapTrick envelope, D4C
    aperiodicity) every frame_ms (default 20 ms, the codec's token frame) into the compact set (24-order mel-cepstrum, WORLD's coded
    aperiodicity bands, 6-bit log-F0 with voicing), then resynthesized. It is fed the original, so it is
    an oracle, not a codec: bits is 0 (the mel-cepstrum is not quantized). Needs pyworld and pysptk."""
    x = np.ascontiguousarray(wav, np.float64)
    f0 = harvest_f0(x, sample_rate, frame_ms)
    params = compact_params(x, f0, sample_rate, frame_ms)
    return Roundtrip(decoded=synthesize_compact(f0, params, sample_rate, len(wav), frame_ms), bits=0)
