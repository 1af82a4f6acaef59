"""Tokenization throughput (x real time) and peak RSS: (a) many short files, (b) one long file.

    .venv/bin/python benchmarks/tokenize_speed.py                 # default codec, random weights
    .venv/bin/python benchmarks/tokenize_speed.py --codec DIR --workers 2 --hours 0.25

(a) the first `--files` wav files of the built-in corpus (real speech, 16 kHz), (b) one file of
`--hours` made by concatenating corpus audio. Each case runs `tokenize_folder` in a fresh
process, so its peak RSS (main process, and the largest decoding worker) is the case's own.
Speed does not depend on the codec's weights, so without `--codec` a random default
`Codec(CodecConfig())` is timed. The load average is printed: this machine may be shared, and then
"audio s per CPU s" (CPU time of the whole case, torch import and decoding workers included) is
the steadier figure; x real time on N idle cores is at most N times it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _make_short(folder: Path, corpus: Path, n: int) -> None:
    from rvqlm.corpus import corpus_files

    files = corpus_files(corpus, "train")[:n]
    if len(files) < n:
        raise SystemExit(f"the corpus has only {len(files)} train files, asked for {n}")
    for i, f in enumerate(files):
        dest = folder / f"{i // 100:02d}" / f"{i:04d}.wav"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, dest) if f.stat().st_dev == dest.parent.stat().st_dev else dest.write_bytes(f.read_bytes())


def _make_long(folder: Path, corpus: Path, hours: float, sample_rate: int) -> None:
    """Concatenate corpus audio (looping over it if needed) into one 16-bit wav, streamed to disk."""
    import soundfile as sf

    from codec.audio import load_audio
    from rvqlm.corpus import corpus_files

    files = corpus_files(corpus, "train") + corpus_files(corpus, "valid")
    need = int(hours * 3600 * sample_rate)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    with sf.SoundFile(str(folder / "long.wav"), "w", sample_rate, 1, subtype="PCM_16") as out:
        while written < need:
            for f in files:
                wav = load_audio(f, sample_rate)[0].numpy()[: need - written]
                out.write(wav)
                written += len(wav)
                if written >= need:
                    break


def _run_case(audio: Path, codec_dir: Path, workers: int, threads: int | None, batch_seconds: float) -> dict:
    """Tokenize in a child process; it reports its summary and peak RSS as JSON."""
    code = f"""
import json, os, resource, sys, tempfile, time
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")  # as `rvqlm tokenize` does
import torch
{'torch.set_num_threads(%d)' % threads if threads else ''}
from codec.model import Codec
from codec.tokenize import tokenize_folder
codec = Codec.from_pretrained({str(codec_dir)!r})
with tempfile.TemporaryDirectory() as out:
    s = tokenize_folder({str(audio)!r}, out + "/tok", codec, workers={workers}, batch_seconds={batch_seconds},
                        progress=False)
self_, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps(dict(cpu_s=self_.ru_utime + self_.ru_stime + kids.ru_utime + kids.ru_stime,
                      files=s.files_tokenized, failed=s.files_failed, audio_s=s.audio_seconds,
                      wall_s=s.wall_seconds, threads=torch.get_num_threads(),
                      rss_main_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      rss_worker_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark case failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", type=Path, default=None, help="a saved codec folder (default: random default codec)")
    ap.add_argument("--corpus", type=Path, default=REPO / "data" / "fillets-cs-16k")
    ap.add_argument("--files", type=int, default=500, help="short files in case (a)")
    ap.add_argument("--hours", type=float, default=1.0, help="length of the file in case (b)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for encoding (default as `rvqlm tokenize`: cores minus workers, >= 1)")
    ap.add_argument("--batch-seconds", type=float, default=20.0)
    ap.add_argument("--cases", default="ab", help="which cases to run: a, b or ab")
    args = ap.parse_args()
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) - args.workers)

    from codec.config import CodecConfig
    from codec.model import Codec
    from rvqlm.corpus import prepare_corpus

    load_before = os.getloadavg()[0]
    corpus = prepare_corpus(args.corpus, 16000, progress=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        codec_dir = args.codec
        if codec_dir is None:
            codec_dir = Codec(CodecConfig()).save_pretrained(tmp / "codec")
        codec = Codec.from_pretrained(codec_dir)
        if "a" in args.cases:
            _make_short(tmp / "short", corpus, args.files)
            rows.append((f"(a) {args.files} short files", _run_case(tmp / "short", codec_dir, args.workers,
                                                                    args.threads, args.batch_seconds)))
        if "b" in args.cases:
            _make_long(tmp / "long", corpus, args.hours, codec.sample_rate)
            rows.append((f"(b) one {args.hours:g} h file", _run_case(tmp / "long", codec_dir, args.workers,
                                                                   args.threads, args.batch_seconds)))

    cfg = codec.config
    print(f"codec: {cfg.sample_rate} Hz, hop {codec.hop_length}, encoder_channels {cfg.encoder_channels}, "
          f"N_c={codec.n_codebooks}, |V|={codec.codebook_size}, causal={cfg.causal}"
          f"{' (random weights)' if args.codec is None else ''}")
    print(f"cpus: {os.cpu_count()}, workers: {args.workers}, batch_seconds: {args.batch_seconds}, "
          f"load average at start: {load_before:.1f}, at end: {os.getloadavg()[0]:.1f}")
    print("| case | files | audio (h) | wall (s) | x real time | audio s per CPU s | threads "
          "| peak RSS main (MB) | peak RSS worker (MB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['files']} | {r['audio_s'] / 3600:.3f} | {r['wall_s']:.1f} | "
              f"{r['audio_s'] / r['wall_s']:.0f} | {r['audio_s'] / r['cpu_s']:.0f} | {r['threads']} | {r['rss_main_mb']:.0f} | {r['rss_worker_mb']:.0f} |")


if __name__ == "__main__":
    main()
