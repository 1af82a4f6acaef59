"""Codec quality on held-out real speech: our codec at every bitrate it offers against Opus and codec2.

    .venv/bin/python benchmarks/codec_quality.py --codec DIR [--corpus data/fillets-cs-16k] [--split test]
        [--max-files 20] [--opus-kbps 6 8] [--codec2-modes 3200 ... 450] [--json out.json]

Needs `make bench-setup` (PESQ, STOI; ffmpeg with libopus; codec2's c2enc/c2dec). Nothing is downloaded.

Data: `--max-files` files of the corpus's `--split` (default test: levels never seen in training),
spread evenly over its sorted file list so every level is represented, each at least
`--min-seconds` long, read at 16 kHz mono.

Systems (one table row each):
* ours @ N_c = k for k = 1..max: `codec.encode(wav, n_q=k)` then `codec.decode(codes)`;
  kbps = k * ceil(log2 |V|) * frame_rate / 1000, exactly the bits of the codes.
* Opus (ffmpeg + libopus, `-application voip`, VBR, 20 ms frames, decoded by ffmpeg back to
  16 kHz) at 6 kbps, libopus's floor (lower requests are clamped), and at every bitrate of ours
  that is 6 kbps or more. Measured kbps = the Opus packets' bytes (Ogg framing and the two header
  packets left out) * 8 / duration.
* codec2 (`c2enc` / `c2dec`, 8 kHz narrowband: the input is resampled to 8 kHz and the output
  back to 16 kHz; mode 450PWB decodes to 16 kHz itself) in its modes 3200..450 bit/s. Measured
  kbps = the size of the bit file, whose frames are padded to whole bytes (700C: 28 bits -> 4
  bytes per 40 ms, 0.8 kbps).

Alignment: every decoded file, ours included, goes through the same steps: the delay L that
best lines it up with the reference over the first 4 s, within +-100 ms, is removed
(`quality_metrics.estimate_lag`: the peak of the energy envelopes' cross-correlation, refined
to the sample by the waveforms' within +-1 ms), and the result is cut or zero-padded to the
reference's length (`quality_metrics.align`). The table's "lag ms" is the median L of each row:
~0.06 ms for Opus (ffmpeg drops its pre-skip; what remains is the 48 -> 16 kHz resampler),
15-28 ms for codec2, and ~0-2 ms for a trained codec of ours (causal, trained on aligned pairs;
its decoder makes its own phase, so only the envelope step means anything). Until 2026-11-30 the
lag was the waveforms' cross-correlation peak alone, which for our phase-free decoder is noise:
it shifted our files by up to 60 ms and cost the shipped codec ~0.07 STOI.

Metrics (means over files; see quality_metrics.py): mel distance (lower is better), SI-SDR dB,
STOI, wideband PESQ. The goal line compares our best configuration at <= 6 kbps (highest PESQ,
or lowest mel distance without PESQ) with Opus at 6 kbps, metric by metric.
"""

from __future__ import annotations

import argparse
import math
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality_metrics import HIGHER_IS_BETTER, METRICS, align, estimate_lag, mean_scores, score  # noqa: E402

SAMPLE_RATE = 16000  # the metrics' rate: PESQ wideband is defined at 16 kHz
OPUS_FLOOR_KBPS = 6.0
CODEC2_RATE = 8000
CODEC2_MODES = {"3200": 3.2, "2400": 2.4, "1600": 1.6, "1400": 1.4, "1300": 1.3, "1200": 1.2, "700C": 0.7,
                "450": 0.45, "450PWB": 0.45}
CODEC2_WIDEBAND_OUTPUT = {"450PWB"}  # decodes to 16 kHz


class ToolMissing(RuntimeError):
    """A reference codec's command-line tool (ffmpeg, c2enc, c2dec) is not installed."""


# ---- reference codecs -----------------------------------------------------------------------------

def _run(cmd: list[str]) -> None:
    if shutil.which(cmd[0]) is None:
        raise ToolMissing(f"{cmd[0]} is not installed (run `make bench-setup`)")
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")


def _resample(wav: np.ndarray, src: int, dst: int) -> np.ndarray:
    if src == dst:
        return wav
    import torchaudio.functional as AF

    return AF.resample(torch.from_numpy(np.ascontiguousarray(wav, np.float32)), src, dst).numpy()


def _to_int16(wav: np.ndarray) -> np.ndarray:
    return np.round(np.clip(wav, -1.0, 1.0) * 32767.0).astype("<i2")


def ogg_packet_bytes(data: bytes) -> list[int]:
    """Sizes of the packets of an Ogg stream (one logical stream), in order, from the pages' lacing values."""
    sizes, current, pos = [], 0, 0
    while pos < len(data):
        if data[pos:pos + 4] != b"OggS" or pos + 27 > len(data):
            raise ValueError(f"not an Ogg page at byte {pos}")
        n_segments = data[pos + 26]
        lacing = data[pos + 27:pos + 27 + n_segments]
        for value in lacing:
            current += value
            if value < 255:  # a lacing value below 255 ends a packet
                sizes.append(current)
                current = 0
        pos += 27 + n_segments + sum(lacing)
    return sizes


@dataclass
class Roundtrip:
    """decoded: 1-D float at the input's rate (not yet aligned); bits: the size of the coded stream."""

    decoded: np.ndarray
    bits: int


def ours_roundtrip(codec, wav: np.ndarray, sample_rate: int, n_q: int) -> Roundtrip:
    """Encode 1-D `wav` (at `sample_rate`) with the first `n_q` codebooks of a mono codec and decode it
    back to `sample_rate`. bits = every code, the zero-padded last frame included."""
    x = torch.from_numpy(np.ascontiguousarray(_resample(wav, sample_rate, codec.sample_rate)))[None, None]  # [1, 1, S]
    codes = codec.encode(x, n_q=n_q)  # [1, k, T]
    decoded = codec.decode(codes)[0, 0, : x.shape[-1]].float().cpu().numpy()
    bits = codes.shape[1] * codes.shape[2] * math.ceil(math.log2(codec.codebook_size))
    return Roundtrip(_resample(decoded, codec.sample_rate, sample_rate), bits)


def opus_roundtrip(wav: np.ndarray, sample_rate: int, kbps: float, workdir: Path) -> Roundtrip:
    """Encode 1-D `wav` with libopus (ffmpeg, voip, VBR) at `kbps` and decode it back to `sample_rate`.

    bits counts the Opus packets only (no Ogg framing, no OpusHead / OpusTags header packets).
    """
    if not kbps >= OPUS_FLOOR_KBPS:
        raise ValueError(f"Opus (libopus 1.3) cannot go below {OPUS_FLOOR_KBPS:g} kbps, got {kbps:g}")
    src, coded, out = workdir / "opus_in.wav", workdir / "opus.opus", workdir / "opus_out.wav"
    sf.write(src, _to_int16(wav), sample_rate, subtype="PCM_16")
    quiet = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y"]
    _run(quiet + ["-i", str(src), "-c:a", "libopus", "-b:a", str(int(round(kbps * 1000))), "-application", "voip",
                  "-vbr", "on", "-frame_duration", "20", str(coded)])
    _run(quiet + ["-i", str(coded), "-ar", str(sample_rate), "-ac", "1", "-c:a", "pcm_f32le", str(out)])
    decoded, _ = sf.read(out, dtype="float32")
    packets = ogg_packet_bytes(coded.read_bytes())
    return Roundtrip(decoded=decoded, bits=8 * sum(packets[2:]))


def codec2_roundtrip(wav: np.ndarray, sample_rate: int, mode: str, workdir: Path) -> Roundtrip:
    """Encode 1-D `wav` with codec2 (c2enc, 8 kHz input) in `mode` and decode it back to `sample_rate`.

    bits = 8 * the size of c2enc's bit file (each frame padded to whole bytes).
    """
    if mode not in CODEC2_MODES:
        raise ValueError(f"unknown codec2 mode {mode!r}; choose from {list(CODEC2_MODES)}")
    raw_in, bits_file, raw_out = workdir / "c2_in.raw", workdir / "c2.bit", workdir / "c2_out.raw"
    _to_int16(_resample(wav, sample_rate, CODEC2_RATE)).tofile(raw_in)
    _run(["c2enc", mode, str(raw_in), str(bits_file)])
    _run(["c2dec", mode, str(bits_file), str(raw_out)])
    out_rate = 2 * CODEC2_RATE if mode in CODEC2_WIDEBAND_OUTPUT else CODEC2_RATE
    decoded = np.fromfile(raw_out, dtype="<i2").astype(np.float32) / 32768.0
    return Roundtrip(decoded=_resample(decoded, out_rate, sample_rate), bits=8 * bits_file.stat().st_size)


# ---- the benchmark --------------------------------------------------------------------------------

@dataclass
class Row:
    """One system at one bitrate: per-file scores and lags, bits and seconds summed over files."""

    system: str
    setting: str
    kbps: float  # nominal
    group: str  # "ours" | "opus" | "codec2"
    param: int | float | str  # ours: n_q; opus: kbps; codec2: mode
    scores: list[dict[str, float]] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    bits: int = 0
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.system} {self.setting}"

    def add(self, reference: np.ndarray, decoded: np.ndarray, bits: int) -> None:
        lag = estimate_lag(reference, decoded, SAMPLE_RATE)
        self.scores.append(score(reference, align(decoded, lag, len(reference)), SAMPLE_RATE))
        self.lags.append(lag)
        self.bits += bits
        self.seconds += len(reference) / SAMPLE_RATE

    def summary(self) -> dict:
        mean = mean_scores(self.scores)
        return {"system": self.system, "setting": self.setting, "group": self.group, "kbps": self.kbps,
                "kbps_measured": self.bits / self.seconds / 1000 if self.seconds else float("nan"),
                "lag_ms_median": float(np.median(self.lags)) * 1000 / SAMPLE_RATE if self.lags else float("nan"),
                "files": len(self.scores), "metrics": mean.means, "metric_files": mean.counts}


def pick_files(files: list[Path], max_files: int, min_seconds: float) -> list[Path]:
    """Up to max_files of the files at least min_seconds long, evenly spread over the sorted list."""
    from codec.audio import audio_info

    long_enough = [f for f in sorted(files) if audio_info(f).duration >= min_seconds]
    if not long_enough:
        raise ValueError(f"none of the {len(files)} files is at least {min_seconds:g} s long")
    if len(long_enough) <= max_files:
        return long_enough
    return [long_enough[i * len(long_enough) // max_files] for i in range(max_files)]


def mono_codec_and_files(codec_dir: str, corpus: str, split: str, max_files: int, script: str):
    """A saved codec in eval mode (SystemExit naming `script` unless it is mono) and the files of
    `corpus`/`split` that `pick_files` scores (>= 1 s): the setup of the scripts that score our
    codec alone on held-out speech (codec_phase.py, codec_pitch.py)."""
    from codec import Codec
    from rvqlm.corpus import corpus_files

    codec = Codec.from_pretrained(codec_dir).eval()
    if codec.channels != 1:
        raise SystemExit(f"{script} scores mono codecs")
    return codec, pick_files(corpus_files(corpus, split), max_files, 1.0)


def opus_bitrates(requested: list[float] | None, ours: list[float]) -> list[float]:
    """The requested Opus bitrates, or by default its 6 kbps floor plus each of ours at or above it."""
    if requested:
        low = [k for k in requested if k < OPUS_FLOOR_KBPS]
        if low:
            raise ValueError(f"--opus-kbps {low}: Opus (libopus 1.3) cannot go below {OPUS_FLOOR_KBPS:g} kbps")
        return sorted(set(requested))
    return sorted({OPUS_FLOOR_KBPS, *(k for k in ours if k >= OPUS_FLOOR_KBPS)})


def run_benchmark(codec, files: list[Path], opus_kbps: list[float], codec2_modes: list[str],
                  progress: bool = True) -> list[Row]:
    from tqdm import tqdm

    from codec.audio import load_audio

    rows = [Row("ours", f"N_c={k}", codec.bitrate_kbps(k), "ours", k) for k in range(1, codec.n_codebooks + 1)]
    rows += [Row("opus", f"{k:g}k voip", k, "opus", k) for k in opus_kbps]
    rows += [Row("codec2", mode, CODEC2_MODES[mode], "codec2", mode) for mode in codec2_modes]
    with tempfile.TemporaryDirectory(prefix="codec_quality_") as tmp:
        workdir = Path(tmp)
        for path in tqdm(files, desc="files", unit="file", disable=not progress, dynamic_ncols=True):
            reference = load_audio(path, SAMPLE_RATE, 1)[0].numpy()  # [S]
            for row in rows:
                if row.group == "ours":
                    rt = ours_roundtrip(codec, reference, SAMPLE_RATE, row.param)
                elif row.group == "opus":
                    rt = opus_roundtrip(reference, SAMPLE_RATE, row.param, workdir)
                else:
                    rt = codec2_roundtrip(reference, SAMPLE_RATE, row.param, workdir)
                row.add(reference, rt.decoded, rt.bits)
    return rows


def goal_verdict(summaries: list[dict]) -> dict:
    """Our best row at <= 6 kbps against Opus at 6 kbps, metric by metric."""
    ours = [s for s in summaries if s["group"] == "ours" and s["kbps"] <= OPUS_FLOOR_KBPS + 1e-9]
    opus = [s for s in summaries if s["group"] == "opus" and abs(s["kbps"] - OPUS_FLOOR_KBPS) < 1e-9]
    if not ours or not opus:
        return {"met": None, "line": "goal: not evaluated (needs our codec at <= 6 kbps and Opus at 6 kbps)"}
    key = "pesq" if not all(math.isnan(s["metrics"]["pesq"]) for s in ours) else "mel"
    sign = 1 if HIGHER_IS_BETTER[key] else -1
    def goodness(s: dict) -> float:
        value = s["metrics"][key]
        return -math.inf if math.isnan(value) else sign * value

    best = max(ours, key=goodness)
    wins, losses = [], []
    for m in METRICS:
        a, b = best["metrics"][m], opus[0]["metrics"][m]
        if math.isnan(a) or math.isnan(b):
            continue
        better = a > b if HIGHER_IS_BETTER[m] else a < b
        (wins if better else losses).append(m)
    met = bool(wins) and not losses
    line = (f"goal (beat Opus 6 kbps at <= 6 kbps): {'MET' if met else 'NOT MET'} - ours {best['setting']} "
            f"({best['kbps']:g} kbps, best {key}) vs Opus 6 kbps: wins on {', '.join(wins) or 'nothing'}"
            f"{'; loses on ' + ', '.join(losses) if losses else ''}")
    return {"met": met, "ours": best["setting"], "ours_kbps": best["kbps"], "chosen_by": key, "wins": wins,
            "losses": losses, "line": line}


def format_table(summaries: list[dict], n_files: int) -> str:
    head = (f"{'system':<22} {'kbps':>6} {'meas.':>6} {'lag ms':>7} {'mel v':>7} {'SI-SDR ^':>9} {'STOI ^':>7} "
            f"{'PESQ ^':>7}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        m = s["metrics"]
        note = "" if min(s["metric_files"].values()) == n_files else f"  (PESQ on {s['metric_files']['pesq']} files)"
        lines.append(f"{s['system'] + ' ' + s['setting']:<22} {s['kbps']:>6.2f} {s['kbps_measured']:>6.2f} "
                     f"{s['lag_ms_median']:>7.2f} {m['mel']:>7.3f} {m['si_sdr']:>9.2f} {m['stoi']:>7.3f} "
                     f"{m['pesq']:>7.2f}{note}")
    return "\n".join(lines)


def tool_versions() -> dict[str, str]:
    versions = {}
    try:
        first_line = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0]
        versions["ffmpeg"] = first_line
    except OSError:
        versions["ffmpeg"] = "missing"
    for pkg in ("pesq", "pystoi"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:  # noqa: BLE001 - not installed: reported, the metric becomes NaN
            versions[pkg] = "missing"
    return versions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", required=True, help="a saved codec folder (Codec.save_pretrained)")
    p.add_argument("--corpus", default="data/fillets-cs-16k", help="the prepared corpus folder")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--max-files", type=int, default=20,
                   help="files scored (evenly spread); 20 (~90 s of speech) took 3 min on the busy 2-core machine")
    p.add_argument("--min-seconds", type=float, default=1.0, help="skip files shorter than this")
    p.add_argument("--opus-kbps", type=float, nargs="*", help="Opus bitrates (default: 6 and each of ours >= 6)")
    p.add_argument("--codec2-modes", nargs="*", default=list(CODEC2_MODES), choices=list(CODEC2_MODES))
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a busy 2-core machine two threads made each metric and "
                        "decode call 5-25x slower, as OpenMP threads wait on each other)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.max_files < 1:
        p.error("--max-files must be >= 1")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)

    from codec import Codec
    from rvqlm.corpus import corpus_files

    t0 = time.perf_counter()
    codec = Codec.from_pretrained(args.codec).eval()
    files = pick_files(corpus_files(args.corpus, args.split), args.max_files, args.min_seconds)
    ours_kbps = [codec.bitrate_kbps(k) for k in range(1, codec.n_codebooks + 1)]
    opus_kbps = opus_bitrates(args.opus_kbps, ours_kbps)
    rows = run_benchmark(codec, files, opus_kbps, args.codec2_modes, progress=not args.no_progress)
    summaries = [r.summary() for r in rows]
    verdict = goal_verdict(summaries)
    seconds = rows[0].seconds
    wall = time.perf_counter() - t0
    print(f"codec {args.codec} ({codec.fingerprint()[:12]}), {len(files)} files of {args.corpus}/{args.split} "
          f"({seconds:.1f} s of speech), metrics at {SAMPLE_RATE} Hz, means over files")
    print(format_table(summaries, len(files)))
    print(verdict["line"])
    print(f"wall time {wall:.0f} s")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(args.json, {
            "codec": str(args.codec), "codec_fingerprint": codec.fingerprint(), "corpus": str(args.corpus),
            "split": args.split, "files": [str(f) for f in files], "speech_seconds": seconds,
            "sample_rate": SAMPLE_RATE, "rows": summaries, "goal": verdict, "wall_seconds": wall,
            "per_file": {r.label: {"scores": r.scores, "lag_samples": r.lags} for r in rows},
            "tools": tool_versions(), "torch_threads": torch.get_num_threads(), "machine": platform.platform()})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"codec_quality: error: {e}", file=sys.stderr)
        sys.exit(1)
