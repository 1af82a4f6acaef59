"""Quality measures for decoded and generated speech (used by benchmarks/ and their tests).

Signals are 1-D float arrays in [-1, 1] at one rate.

* Alignment: `estimate_lag` finds the shift L with `decoded[n + L] ~ reference[n]` (coarse from
  the energy envelopes' cross-correlation, which also holds for decoders that make their own phase,
  then refined on the waveforms); `align` removes it and cuts or pads to the reference's length.
* Reconstruction: `score` gives mel distance (lower is better), SI-SDR dB, STOI (0..1) and wideband
  PESQ (1.04..4.64) of the pair, and on request the decoded signal's own DNSMOS (`dnsmos`: no
  reference, about 1..5);
  a metric that cannot be computed (no speech found, package missing) is NaN, and `mean_scores`
  averages the other files.
* Pitch: `pitch_track` (pYIN, 10 ms frames) and `pitch_agreement` (error in cents on frames voiced
  in both, voicing recall and false voicing), pooled over files by `pool_pitch`.
* Generated tokens and audio: `repetition` (copied n-grams, longest copied span) and
  `silence_share` (frames under -40 dBFS).

pesq, pystoi, librosa, speechmos and onnxruntime (`make bench-setup`) are imported inside the
functions that need them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import torch

from codec.neural.losses import mel_distance, si_sdr

REFERENCE_METRICS = ("mel", "si_sdr", "stoi", "pesq")  # of a decoded signal against its reference
DNSMOS_METRICS = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl", "dnsmos_p808")  # of one signal alone
METRICS = REFERENCE_METRICS + DNSMOS_METRICS
HIGHER_IS_BETTER = {"mel": False, "si_sdr": True, "stoi": True, "pesq": True, **{m: True for m in DNSMOS_METRICS}}


# ---- alignment ------------------------------------------------------------------------------------

def _cross_correlation(ref: np.ndarray, dec: np.ndarray) -> tuple[np.ndarray, int]:
    """(corr, n): corr[L % n] = sum_m ref[m] * dec[m + L], by FFT."""
    n = 1 << int(math.ceil(math.log2(len(ref) + len(dec))))
    return np.fft.irfft(np.conj(np.fft.rfft(ref, n)) * np.fft.rfft(dec, n), n), n


def _envelope(x: np.ndarray, sample_rate: int, window_s: float = 0.005) -> np.ndarray:
    """sqrt of the moving-average energy over window_s (same filter for both signals: no net delay), mean removed."""
    width = max(int(round(window_s * sample_rate)), 1)
    env = np.sqrt(np.convolve(x * x, np.ones(width) / width, mode="same"))
    return env - env.mean()


def estimate_lag(reference: np.ndarray, decoded: np.ndarray, sample_rate: int, *, max_lag_s: float = 0.1,
                 window_s: float = 4.0, refine_s: float = 0.001) -> int:
    """The shift L (samples, |L| <= max_lag_s * sample_rate) that lines decoded up with reference.

    Coarse: the peak of the energy envelopes' cross-correlation; fine: the peak of
    sum_n ref[n] * dec[n + L] within +-refine_s of it (see the module docstring). Only the first
    `window_s` seconds of the reference (and that plus the search range of the decoded signal) are
    used: delays of speech codecs are constant, and this keeps it cheap. Returns 0 when either
    window is silent (no peak to find).
    """
    reference, decoded = _mono(reference, "reference"), _mono(decoded, "decoded")
    max_lag = int(round(max_lag_s * sample_rate))
    ref = reference[: int(round(window_s * sample_rate))].astype(np.float64)
    dec = decoded[: len(ref) + max_lag].astype(np.float64)
    if not ref.any() or not dec.any():
        return 0
    corr, n = _cross_correlation(_envelope(ref, sample_rate), _envelope(dec, sample_rate))
    lags = np.arange(-max_lag, max_lag + 1)
    coarse = int(lags[np.argmax(corr[lags % n])])  # ties: the smallest lag
    refine = int(round(refine_s * sample_rate))
    corr, n = _cross_correlation(ref, dec)
    lags = np.arange(max(coarse - refine, -max_lag), min(coarse + refine, max_lag) + 1)
    return int(lags[np.argmax(corr[lags % n])])


def align(decoded: np.ndarray, lag: int, length: int) -> np.ndarray:
    """decoded shifted by `lag` (see estimate_lag) and cut or zero-padded to `length` samples."""
    decoded = _mono(decoded, "decoded")
    shifted = decoded[lag:] if lag >= 0 else np.concatenate([np.zeros(-lag, decoded.dtype), decoded])
    if len(shifted) >= length:
        return shifted[:length]
    return np.concatenate([shifted, np.zeros(length - len(shifted), decoded.dtype)])


def _mono(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of samples, got shape {x.shape}")
    return x


# ---- reconstruction metrics -----------------------------------------------------------------------

def have_package(name: str) -> bool:
    """Whether an optional metric package (pesq, pystoi: `make bench-setup`) is importable."""
    import importlib.util

    return importlib.util.find_spec(name) is not None


def pesq_wb(reference: np.ndarray, decoded: np.ndarray, sample_rate: int) -> float:
    """Wideband PESQ (ITU-T P.862.2) MOS-LQO, or NaN if PESQ cannot score the pair (no speech found,
    too short) or the `pesq` package is not installed (`make bench-setup`)."""
    if sample_rate != 16000:
        raise ValueError(f"wideband PESQ is defined at 16 kHz, got {sample_rate} Hz")
    try:
        from pesq import PesqError, pesq
    except ImportError:
        return float("nan")
    if not (reference.any() or decoded.any()):  # pesq would divide by a zero peak
        return float("nan")
    value = pesq(sample_rate, reference.astype(np.float64), decoded.astype(np.float64), "wb",
                 on_error=PesqError.RETURN_VALUES)
    return float(value) if value > 0 else float("nan")  # errors come back as negative codes


def stoi(reference: np.ndarray, decoded: np.ndarray, sample_rate: int) -> float:
    """Short-time objective intelligibility (0..1; pystoi resamples to 10 kHz inside), NaN without pystoi."""
    try:
        from pystoi import stoi as _stoi
    except ImportError:
        return float("nan")
    return float(_stoi(reference.astype(np.float64), decoded.astype(np.float64), sample_rate, extended=False))


DNSMOS_RATE = 16000
_DNSMOS_MIN_SECONDS = 10.0  # speechmos scores 9.01 s windows every 1 s from 0 to floor(seconds) - 9.01
_dnsmos_scorer = None  # speechmos.dnsmos.DNSMOS with our sessions, made on first use


def _dnsmos_model():
    """speechmos's DNSMOS scorer (P.835 sig_bak_ovr.onnx and P.808 model_v8.onnx, shipped in its wheel),
    made once per process with CPU sessions on torch's thread count; None without speechmos / onnxruntime."""
    global _dnsmos_scorer
    if _dnsmos_scorer is None:
        try:
            import onnxruntime as ort
            from speechmos import dnsmos as sm
        except ImportError:
            return None
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(torch.get_num_threads(), 1)
        options.inter_op_num_threads = 1
        folder = Path(sm.__file__).parent / "dnsmos_models"

        def session(name: str):
            return ort.InferenceSession(str(folder / name), sess_options=options, providers=["CPUExecutionProvider"])

        scorer = sm.DNSMOS.__new__(sm.DNSMOS)  # its __init__ would make sessions on every core
        scorer.primary_model_path = str(folder / "sig_bak_ovr.onnx")
        scorer.onnx_sess, scorer.p808_onnx_sess = session("sig_bak_ovr.onnx"), session("model_v8.onnx")
        _dnsmos_scorer = scorer
    return _dnsmos_scorer


def dnsmos(wav: np.ndarray, sample_rate: int) -> dict[str, float]:
    """DNSMOS of one signal, no reference: P.835 signal, background and overall quality and P.808 MOS
    (each about 1..5, higher is better) -> {"dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl", "dnsmos_p808"}.

    Microsoft's DNSMOS models through the `speechmos` package, at 16 kHz only (ValueError otherwise);
    samples are clipped to [-1, 1]; a clip shorter than 10 s is repeated up to 10 s (speechmos would
    find no window in 9.01..10 s), longer ones are averaged over 9.01 s windows 1 s apart. NaN values
    when speechmos or onnxruntime is not installed (`make bench-setup`)."""
    if sample_rate != DNSMOS_RATE:
        raise ValueError(f"DNSMOS is defined at {DNSMOS_RATE} Hz, got {sample_rate} Hz: resample first")
    x = np.clip(_mono(wav, "wav").astype(np.float32), -1.0, 1.0)
    if not np.isfinite(x).all():
        raise ValueError("wav has NaN or infinite samples")
    scorer = _dnsmos_model()
    if scorer is None:
        return {m: float("nan") for m in DNSMOS_METRICS}
    while len(x) < _DNSMOS_MIN_SECONDS * sample_rate:
        x = np.concatenate([x, x])
    out = scorer(x, sample_rate, False)
    return {"dnsmos_sig": float(out["sig_mos"]), "dnsmos_bak": float(out["bak_mos"]),
            "dnsmos_ovrl": float(out["ovrl_mos"]), "dnsmos_p808": float(out["p808_mos"])}


def score(reference: np.ndarray, decoded: np.ndarray, sample_rate: int, *,
          with_dnsmos: bool = False) -> dict[str, float]:
    """The metrics of one aligned pair (same length 1-D arrays) -> {"mel", "si_sdr", "stoi", "pesq"},
    and with_dnsmos the decoded signal's `dnsmos` too (all of METRICS, in that order; it costs about
    0.3 s of CPU per 9 s window)."""
    reference, decoded = _mono(reference, "reference"), _mono(decoded, "decoded")
    if reference.shape != decoded.shape:
        raise ValueError(f"align the signals first: {reference.shape} vs {decoded.shape} samples")
    ref_t = torch.from_numpy(reference.astype(np.float32))[None, None]  # [1, 1, S]
    dec_t = torch.from_numpy(decoded.astype(np.float32))[None, None]
    return {"mel": float(mel_distance(dec_t, ref_t, sample_rate)[0]),
            "si_sdr": float(si_sdr(dec_t, ref_t)[0]),
            "stoi": stoi(reference, decoded, sample_rate),
            "pesq": pesq_wb(reference, decoded, sample_rate),
            **(dnsmos(decoded, sample_rate) if with_dnsmos else {})}


@dataclass
class MeanScores:
    """Per-metric means over files (NaN files left out) and how many files each mean covers."""

    means: dict[str, float]
    counts: dict[str, int]


def mean_scores(per_file: Iterable[Mapping[str, float]]) -> MeanScores:
    """Means of every metric of METRICS (NaN, count 0, for one that no file has)."""
    rows = list(per_file)
    means, counts = {}, {}
    for m in METRICS:
        values = [r[m] for r in rows if m in r and not math.isnan(r[m])]
        means[m] = float(np.mean(values)) if values else float("nan")
        counts[m] = len(values)
    return MeanScores(means, counts)


# ---- pitch ---------------------------------------------------------------------------------------

PITCH_HOP_S = 0.01
PITCH_WINDOW_S = 0.064
PITCH_FMIN, PITCH_FMAX = 60.0, 500.0
GROSS_PITCH_ERROR_CENTS = 50.0


def pitch_track(wav: np.ndarray, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """wav [S] -> (f0 [F] in Hz, NaN where unvoiced; voiced [F] bool), one frame per 10 ms.

    Probabilistic YIN (Mauch & Dixon 2014, `librosa.pyin`; `make bench-setup` installs librosa) over
    PITCH_FMIN..PITCH_FMAX with a 64 ms window: the speaking range of the corpus's voices."""
    try:
        import librosa
    except ImportError as e:
        raise RuntimeError("pitch_track needs librosa: run `make bench-setup`") from e
    x = _mono(wav, "wav").astype(np.float64)
    hop = int(round(PITCH_HOP_S * sample_rate))
    frame = 1 << int(np.ceil(np.log2(PITCH_WINDOW_S * sample_rate)))  # pYIN wants a power of two
    f0, voiced, _ = librosa.pyin(x, fmin=PITCH_FMIN, fmax=PITCH_FMAX, sr=sample_rate, frame_length=frame,
                                 hop_length=hop)
    return f0, voiced.astype(bool)


@dataclass
class PitchAgreement:
    """See `pitch_agreement`. Frame counts are kept so that files can be pooled (`pool_pitch`)."""

    cents: np.ndarray  # |error| in cents on the frames voiced in both
    ref_voiced: int  # frames voiced in the reference
    ref_unvoiced: int
    missed: int  # voiced in the reference, unvoiced in the decoded file
    false_voiced: int  # unvoiced in the reference, voiced in the decoded file

    def summary(self) -> dict[str, float]:
        c = self.cents
        return {"median_cents": float(np.median(c)) if c.size else float("nan"),
                "p90_cents": float(np.percentile(c, 90)) if c.size else float("nan"),
                "gross_error": float(np.mean(c > GROSS_PITCH_ERROR_CENTS)) if c.size else float("nan"),
                "voicing_recall": 1 - self.missed / self.ref_voiced if self.ref_voiced else float("nan"),
                "false_voicing": self.false_voiced / self.ref_unvoiced if self.ref_unvoiced else float("nan")}


def pitch_agreement(f0_ref: np.ndarray, voiced_ref: np.ndarray, f0_dec: np.ndarray,
                    voiced_dec: np.ndarray) -> PitchAgreement:
    """Compare two pitch tracks of aligned signals (same frames; the shorter length is used).

    cents = |1200 log2(f0_dec / f0_ref)| on every frame voiced in both; missed / false_voiced count
    the voicing decisions that differ."""
    n = min(len(f0_ref), len(f0_dec))
    f0_ref, f0_dec = np.asarray(f0_ref[:n], dtype=np.float64), np.asarray(f0_dec[:n], dtype=np.float64)
    vr, vd = np.asarray(voiced_ref[:n], dtype=bool), np.asarray(voiced_dec[:n], dtype=bool)
    both = vr & vd & np.isfinite(f0_ref) & np.isfinite(f0_dec) & (f0_ref > 0) & (f0_dec > 0)
    cents = np.abs(1200 * np.log2(f0_dec[both] / f0_ref[both]))
    return PitchAgreement(cents=cents, ref_voiced=int(vr.sum()), ref_unvoiced=int((~vr).sum()),
                          missed=int((vr & ~vd).sum()), false_voiced=int((~vr & vd).sum()))


def pool_pitch(parts: Iterable[PitchAgreement]) -> PitchAgreement:
    """One PitchAgreement over all frames of several files."""
    parts = list(parts)
    if not parts:
        raise ValueError("no pitch agreements to pool")
    return PitchAgreement(cents=np.concatenate([p.cents for p in parts]),
                          ref_voiced=sum(p.ref_voiced for p in parts), ref_unvoiced=sum(p.ref_unvoiced for p in parts),
                          missed=sum(p.missed for p in parts), false_voiced=sum(p.false_voiced for p in parts))


# ---- generated tokens and audio -------------------------------------------------------------------

@dataclass
class Repetition:
    """See `repetition`. share: repeated n-gram share (0..1); longest: longest copied span, in frames."""

    share: float
    longest: int


def repetition(stream: np.ndarray, start: int, n: int = 8) -> Repetition:
    """How much of `stream[start:]` (a continuation) repeats what came before it, in one token stream.

    stream: 1-D ids, one per frame (continuation_quality.py passes codebook 0, the coarsest, whose
    loops are the audible ones; fine codebooks vary even inside a loop). stream[:start] is the
    prompt, stream[start:] the continuation.

    share: of the continuation's n-grams (n consecutive frames, all inside the continuation), the
    share that occur somewhere earlier in the stream (starting at an earlier frame, in the prompt or
    the continuation, overlap allowed). 0 = never copies n frames in a row, 1 = every n-gram is a
    copy; NaN if the continuation is shorter than n frames.
    longest: the longest span inside the continuation that also occurs starting at an earlier frame
    (in the prompt or the continuation), in frames: a model stuck in a loop scores about the whole
    continuation, fresh speech a few frames.
    """
    x = np.asarray(stream)
    if x.ndim != 1:
        raise ValueError(f"stream must be 1-D (one id per frame), got shape {x.shape}")
    if not 0 <= start <= len(x):
        raise ValueError(f"start must be in 0..{len(x)}, got {start}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    # suffix[j] (j < i) = length of the longest common suffix of x[:i+1] and x[:j+1], row i from row i-1.
    suffix = np.zeros(0, dtype=np.int64)
    longest, copied, counted = 0, 0, 0
    for i in range(len(x)):
        before = np.concatenate([[0], suffix[: i - 1]]) if i else suffix
        suffix = np.where(x[:i] == x[i], before + 1, 0)
        if i < start:
            continue
        best = int(suffix.max()) if i else 0  # longest span ending at i that also ends earlier
        longest = max(longest, min(best, i - start + 1))  # the part inside the continuation
        if i - n + 1 >= start:
            counted += 1
            copied += best >= n
    return Repetition(share=copied / counted if counted else float("nan"), longest=longest)


def silence_share(wav: np.ndarray, sample_rate: int, *, frame_s: float = 0.02, threshold_dbfs: float = -40.0) -> float:
    """Share of the whole `frame_s` frames of `wav` (1-D, full scale 1.0) whose RMS is below
    `threshold_dbfs` (20 log10 RMS). A trailing part frame is left out; NaN if no whole frame."""
    x = _mono(wav, "wav").astype(np.float64)
    size = int(round(frame_s * sample_rate))
    frames = len(x) // size
    if frames == 0:
        return float("nan")
    rms = np.sqrt(np.mean(x[: frames * size].reshape(frames, size) ** 2, axis=1))
    return float(np.mean(rms < 10 ** (threshold_dbfs / 20)))
