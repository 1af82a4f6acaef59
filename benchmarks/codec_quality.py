"""Codec quality on held-out real speech: our codec at every bitrate it offers against Opus and codec2.

    .venv/bin/python benchmarks/codec_quality.py --codec DIR [--corpus data/fillets-cs-16k] [--split test]
        [--max-files 20] [--opus-kbps 6 8] [--codec2-modes 3200 ... 450] [--json out.json]

Needs `make bench-setup` (PESQ, STOI; ffmpeg with libopus; codec2's c2enc/c2dec). Nothing is downloaded.

Data: `--max-files` files of the corpus's `--split` (default test: levels never seen in training),
spread evenly over its sorted file list, each at least `--min-seconds` long, read at 16 kHz mono.

Systems (one table row each; rvqlm/roundtrips.py):
* ours @ N_c = k for k = 1..max; kbps = `codec.bitrate_kbps(k)`, exactly the bits of the codes.
* Opus (ffmpeg + libopus, voip, VBR, 20 ms frames) at 6 kbps, libopus's floor, and at every
  bitrate of ours from 6 kbps up. Measured kbps = the Opus packets' bytes * 8 / duration.
* codec2 (8 kHz narrowband; 450PWB decodes to 16 kHz) in its modes 3200..450 bit/s. Measured
  kbps = the size of the bit file, whose frames are padded to whole bytes.

Every decoded file, ours included, is aligned to the reference (`rvqlm.metrics.estimate_lag`
within +-100 ms, then `align`); "lag ms" is the median shift of each row. Metrics are means over
files (rvqlm/metrics.py). The goal line compares our best configuration at <= 6 kbps (highest
PESQ, or lowest mel distance without PESQ) with Opus at 6 kbps, metric by metric.
"""

from __future__ import annotations

import argparse
import math
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rvqlm.cli import run_script
from rvqlm.metrics import HIGHER_IS_BETTER, METRICS, align, estimate_lag, mean_scores, score
from rvqlm.roundtrips import (CODEC2_MODES, OPUS_FLOOR_KBPS, SAMPLE_RATE, codec2_roundtrip, opus_roundtrip,
                              ours_roundtrip, pick_files)


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
    p.add_argument("--max-files", type=int, default=20, help="files scored (evenly spread; 20: ~90 s of speech)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="skip files shorter than this")
    p.add_argument("--opus-kbps", type=float, nargs="*", help="Opus bitrates (default: 6 and each of ours >= 6)")
    p.add_argument("--codec2-modes", nargs="*", default=list(CODEC2_MODES), choices=list(CODEC2_MODES))
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
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
    run_script(main, "codec_quality")
