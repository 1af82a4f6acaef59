"""Source-filter ceilings: which F0 estimator and which envelope a source-filter decoder should
predict, measured as oracles (each fed the original file) beside codec2 3200, paired per file.

    .venv/bin/python benchmarks/source_filter_oracle.py [--corpus data/voices-16k] [--split test]
        [--max-files 24] [--min-seconds 2] [--json out.json]

Every variant is WORLD (pyworld) at 20 ms frames with D4C's coded aperiodicity and 6-bit log-F0;
they differ in the F0 track (Harvest, DIO + StoneMask, or `codec.source_filter.pitch.yin`, the torch YIN an encoder
can run) and in the envelope (a 24-order mel-cepstrum, or N log-mel bands read off CheapTrick's
envelope and interpolated back). Each F0 track is also scored against pYIN (librosa) on the frames
both call voiced (gross error: > 50 cents), with its voicing agreement and its speed.

With `--rvq-fit-files N` it also scores a codec with no network at all: the [mel-cepstrum, coded
aperiodicity] vector of each frame residual-vector-quantized (k-means codebooks of 1024 fitted on the
Harvest analyses of N train files of each of `--fit-corpora`, squared error on the raw mel-cepstrum,
i.e. log-spectral distance, the aperiodicity in dB / 10) plus one 10-bit stream for the 6-bit log-F0
and voicing: "rvq N_c=k" codes k - 1 envelope stages, k * 10 bits a frame. Needs `make bench-setup`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rvqlm.cli import run_script
from rvqlm.quality.metrics import align, estimate_lag, score
from rvqlm.quality.roundtrips import SAMPLE_RATE, codec2_roundtrip, pick_files

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks/ is a package of the repository
    sys.path.insert(0, str(REPO))

from benchmarks.world_oracle import (WORLD_F0_RANGE, WORLD_FRAME_MS, WORLD_MCEP_ORDER,  # noqa: E402
                                     compact_params, harvest_f0, quantize_log_f0, synthesize_compact)

HOP = int(SAMPLE_RATE * WORLD_FRAME_MS / 1000)
METRICS = ("stoi", "pesq", "dnsmos_ovrl")


def f0_track(x: np.ndarray, method: str) -> np.ndarray:
    """F0 (Hz, 0 = unvoiced) at WORLD's frames t_j = j * 20 ms, j = 0 .. len(x) // HOP."""
    import pyworld

    lo, hi = WORLD_F0_RANGE
    if method == "harvest":
        return harvest_f0(x, SAMPLE_RATE)
    if method == "dio":
        f0, t = pyworld.dio(x, SAMPLE_RATE, f0_floor=lo, f0_ceil=hi, frame_period=WORLD_FRAME_MS)
        return pyworld.stonemask(x, f0, t, SAMPLE_RATE)
    if method == "yin":
        from codec.source_filter.pitch import yin

        f0, voiced = yin(torch.from_numpy(x.astype(np.float32)), SAMPLE_RATE, HOP, fmin=lo, fmax=hi)
        return np.where(voiced.numpy(), f0.numpy(), 0.0).astype(np.float64)
    if method == "pyin":
        import librosa

        f0, voiced, _ = librosa.pyin(x, fmin=lo, fmax=hi, sr=SAMPLE_RATE, frame_length=1024, hop_length=HOP)
        return np.where(voiced, np.nan_to_num(f0), 0.0)
    raise ValueError(method)


def mixed_track(tracks: dict[str, np.ndarray], method: str) -> np.ndarray:
    """"yin_hv": YIN's F0 (filled through its unvoiced frames) on Harvest's voiced frames; "harvest_yv":
    Harvest's F0 (YIN's where Harvest calls the frame unvoiced) on YIN's voiced frames. They part the
    F0 values' share of a track's loss from the voicing decisions'."""
    from codec.source_filter.pitch import _fill_unvoiced

    yin = tracks["yin"]
    yin_filled = _fill_unvoiced(torch.from_numpy(yin)[None], torch.from_numpy(yin > 0)[None], WORLD_F0_RANGE[0])
    yin_filled = yin_filled[0].numpy()
    harvest = tracks["harvest"][: len(yin)]
    if method == "yin_hv":
        return np.where(harvest > 0, yin_filled[: len(harvest)], 0.0)
    return np.where(yin[: len(harvest)] > 0, np.where(harvest > 0, harvest, yin_filled[: len(harvest)]), 0.0)


MIXED = ("yin_hv", "harvest_yv")


def _mel_points(n_fft: int, bands: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin indices of `bands` mel-spaced points from 0 Hz to Nyquist, and every bin's index."""
    import librosa

    hz = librosa.mel_frequencies(bands, fmin=0.0, fmax=SAMPLE_RATE / 2)
    return hz / (SAMPLE_RATE / 2) * (n_fft // 2), np.arange(n_fft // 2 + 1)


def resynthesize(x: np.ndarray, f0: np.ndarray, envelope: str) -> np.ndarray:
    """WORLD resynthesis of x from the given F0 and an envelope kept as "mcep" or "mel<N>"."""
    import pyworld

    if envelope == "mcep":
        return synthesize_compact(f0, compact_params(x, f0, SAMPLE_RATE), SAMPLE_RATE, len(x))
    t = np.arange(len(f0)) * WORLD_FRAME_MS / 1000
    n_fft = pyworld.get_cheaptrick_fft_size(SAMPLE_RATE, WORLD_F0_RANGE[0])
    sp = pyworld.cheaptrick(x, f0, t, SAMPLE_RATE, fft_size=n_fft)
    ap = pyworld.decode_aperiodicity(pyworld.code_aperiodicity(pyworld.d4c(x, f0, t, SAMPLE_RATE), SAMPLE_RATE),
                                     SAMPLE_RATE, n_fft)
    points, bins = _mel_points(n_fft, int(envelope[3:]))
    coarse = np.stack([np.interp(points, bins, row) for row in np.log(sp)])  # [T, bands]
    sp = np.exp(np.stack([np.interp(bins, points, row) for row in coarse]))
    y = pyworld.synthesize(quantize_log_f0(f0), np.ascontiguousarray(sp), ap, SAMPLE_RATE, WORLD_FRAME_MS)
    return y[: len(x)].astype(np.float32)


def pitch_errors(f0: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Gross errors (> 50 cents) on frames voiced in both, and voicing agreement, against `ref` (pYIN)."""
    n = min(len(f0), len(ref))
    f0, ref = f0[:n], ref[:n]
    both = (f0 > 0) & (ref > 0)
    cents = np.abs(1200 * np.log2(f0[both] / ref[both]))
    return {"gross": float(np.mean(cents > 50)) if both.any() else np.nan,
            "voicing_agree": float(np.mean((f0 > 0) == (ref > 0))), "frames_both": int(both.sum())}


class ParamRVQ:
    """Residual k-means codebooks over compact_params vectors (the aperiodicity scaled by 1/10)."""

    def __init__(self, frames: np.ndarray, stages: int, size: int = 1024, iters: int = 25, seed: int = 0):
        if len(frames) < size:
            raise ValueError(f"{len(frames)} frames cannot fit {size} codes a stage: fit on more files")
        gen = torch.Generator().manual_seed(seed)
        self.scale = torch.ones(frames.shape[1])
        self.scale[WORLD_MCEP_ORDER + 1:] = 10.0
        residual, self.books = torch.from_numpy(frames).float() / self.scale, []
        for _ in range(stages):
            book = residual[torch.randperm(len(residual), generator=gen)[:size]].clone()
            for _ in range(iters):
                code = torch.cdist(residual, book).argmin(1)
                total = torch.zeros_like(book).index_add_(0, code, residual)
                count = torch.bincount(code, minlength=size).float()
                refill = residual[torch.randint(len(residual), (size,), generator=gen)]
                book = torch.where(count[:, None] > 0, total / count.clamp_min(1)[:, None], refill)
            self.books.append(book)
            residual = residual - book[torch.cdist(residual, book).argmin(1)]

    def roundtrip(self, frames: np.ndarray, stages: int) -> np.ndarray:
        residual = torch.from_numpy(frames).float() / self.scale
        out = torch.zeros_like(residual)
        for book in self.books[:stages]:
            q = book[torch.cdist(residual, book).argmin(1)]
            out, residual = out + q, residual - q
        return (out * self.scale).double().numpy()


def fit_rvq(corpora: list[str], n_files: int, stages: int) -> ParamRVQ:
    from codec.core.audio import load_audio
    from rvqlm.corpora.folder import corpus_files

    frames = []
    for corpus in corpora:
        for path in pick_files(corpus_files(corpus, "train"), n_files, 1.0):
            x = load_audio(path, SAMPLE_RATE, 1)[0].numpy().astype(np.float64)
            frames.append(compact_params(x, harvest_f0(x, SAMPLE_RATE), SAMPLE_RATE))
    print(f"RVQ fitted on {sum(len(f) for f in frames)} frames of {len(frames)} train files", flush=True)
    return ParamRVQ(np.concatenate(frames), stages)


def rvq_resynthesize(x: np.ndarray, f0: np.ndarray, rvq: ParamRVQ, stages: int) -> np.ndarray:
    """x coded as compact_params -> RVQ with `stages` envelope codebooks, F0 as 6-bit log-F0, resynthesized."""
    coded = rvq.roundtrip(compact_params(x, f0, SAMPLE_RATE), stages)
    return synthesize_compact(f0, coded, SAMPLE_RATE, len(x))


def _paired(a: list[float], b: list[float]) -> str:
    d = np.asarray(a) - np.asarray(b)
    return f"{d.mean():+.3f} +- {d.std(ddof=1) / np.sqrt(len(d)):.3f} ({int((d > 0).sum())}/{len(d)})"


def run(files: list[Path], estimators: list[str], envelopes: list[str], rvq: ParamRVQ | None = None) -> dict:
    from codec.core.audio import load_audio

    systems = ["codec2 3200"] + [f"{e}+{v}" for e in estimators for v in envelopes if e != "pyin"]
    n_cs = sorted({min(4, len(rvq.books) + 1), len(rvq.books) + 1}) if rvq else []
    systems += [f"rvq N_c={k}" for k in n_cs]
    scores = {s: [] for s in systems}
    pitch = {e: [] for e in estimators if e != "pyin"}
    seconds = {e: 0.0 for e in estimators}
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            ref = load_audio(path, SAMPLE_RATE, 1)[0].numpy()
            x = ref.astype(np.float64)
            total += len(x) / SAMPLE_RATE
            tracks = {}
            for e in [e for e in estimators if e not in MIXED]:
                t0 = time.perf_counter()
                tracks[e] = f0_track(x, e)
                seconds[e] += time.perf_counter() - t0
            tracks.update({e: mixed_track(tracks, e) for e in estimators if e in MIXED})
            decoded = {"codec2 3200": codec2_roundtrip(ref, SAMPLE_RATE, "3200", Path(tmp)).decoded}
            for s in systems[1:]:
                if s.startswith("rvq"):
                    f0 = tracks["harvest"] if "harvest" in tracks else f0_track(x, "harvest")
                    decoded[s] = rvq_resynthesize(x, f0, rvq, int(s.split("=")[1]) - 1)
                    continue
                e, v = s.split("+")
                decoded[s] = resynthesize(x, tracks[e], v)
            for s, y in decoded.items():
                scores[s].append(score(ref, align(y, estimate_lag(ref, y, SAMPLE_RATE), len(ref)), SAMPLE_RATE,
                                       with_dnsmos=True))
            for e in pitch:
                if "pyin" in tracks:
                    pitch[e].append(pitch_errors(tracks[e], tracks["pyin"]))
            print(f"{path.name}: " + ", ".join(f"{s} {scores[s][-1]['stoi']:.3f}" for s in systems), flush=True)
    return {"systems": systems, "scores": scores, "pitch": pitch,
            "seconds_per_second": {e: seconds[e] / total for e in estimators}, "audio_seconds": total}


def report(result: dict) -> str:
    scores, lines = result["scores"], []
    lines.append(f"{'system':<16} " + " ".join(f"{m:>12}" for m in METRICS) + "   paired - codec2 3200 (wins)")
    bar = scores["codec2 3200"]
    for s in result["systems"]:
        means = [np.mean([f[m] for f in scores[s]]) for m in METRICS]
        paired = "" if s == "codec2 3200" else "   " + "; ".join(
            f"{m} {_paired([f[m] for f in scores[s]], [f[m] for f in bar])}" for m in METRICS)
        lines.append(f"{s:<16} " + " ".join(f"{v:>12.3f}" for v in means) + paired)
    lines.append("F0 estimators against pYIN (frames voiced in both), seconds of CPU per second of audio:")
    for e, rows in result["pitch"].items():
        gross = np.nanmean([r["gross"] for r in rows]) if rows else np.nan
        agree = np.mean([r["voicing_agree"] for r in rows]) if rows else np.nan
        lines.append(f"  {e:<8} gross > 50 cents {gross:.3f}, voicing agreement {agree:.3f}, "
                     f"{result['seconds_per_second'][e]:.4f} s/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default="data/voices-16k")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--max-files", type=int, default=24)
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--estimators", nargs="+", default=["harvest", "dio", "yin", "pyin"],
                   choices=["harvest", "dio", "yin", "pyin", *MIXED], help=f"{', '.join(MIXED)} need harvest and yin")
    p.add_argument("--envelopes", nargs="+", default=["mcep", "mel40"])
    p.add_argument("--rvq-fit-files", type=int, default=0, help="also score RVQ-coded parameters fitted on "
                   "this many train files of each --fit-corpora corpus (0: not)")
    p.add_argument("--fit-corpora", nargs="+", default=["data/voices-16k", "data/fillets-cs-16k"])
    p.add_argument("--rvq-stages", type=int, default=7, help="envelope codebooks at the top bitrate (N_c - 1)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if set(MIXED) & set(args.estimators) and not {"harvest", "yin"} <= set(args.estimators):
        p.error(f"{' and '.join(MIXED)} need --estimators harvest and yin too")
    if any(v != "mcep" and not (v.startswith("mel") and v[3:].isdigit()) for v in args.envelopes):
        p.error("--envelopes takes mcep or melN (N log-mel bands)")
    if args.rvq_stages < 1 or args.rvq_fit_files < 0:
        p.error("--rvq-stages must be >= 1 and --rvq-fit-files >= 0")
    torch.set_num_threads(1)
    from rvqlm.corpora.folder import corpus_files

    files = pick_files(corpus_files(args.corpus, args.split), args.max_files, args.min_seconds)
    rvq = fit_rvq(args.fit_corpora, args.rvq_fit_files, args.rvq_stages) if args.rvq_fit_files > 0 else None
    result = run(files, args.estimators, args.envelopes, rvq)
    print(f"{len(files)} files of {args.corpus}/{args.split}, {result['audio_seconds']:.1f} s")
    print(report(result))
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(args.json, {**result, "files": [str(f) for f in files]})
    return 0


if __name__ == "__main__":
    run_script(main, "source_filter_oracle")
