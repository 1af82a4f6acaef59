"""Tokenization throughput (x real time) and peak RSS: (a) many short files, (b) one long file.

    .venv/bin/python benchmarks/tokenize_speed.py                 # default codec, random weights
    .venv/bin/python benchmarks/tokenize_speed.py --codec DIR --workers 2 --hours 0.25
    .venv/bin/python benchmarks/tokenize_speed.py --codec models/codec-speech-16k --cases a \
        --split valid --files 60 --workers 0 --ranks 2   # case (a) by 1 process, then by 2 torchrun ranks
    .venv/bin/python benchmarks/tokenize_speed.py --hf mimi --cases a --files 100   # a Hugging Face codec

(a) the first `--files` wav files of a split of the built-in corpus (real speech, 16 kHz), (b)
one file of `--hours` made by concatenating corpus audio. Each case runs `rvqlm tokenize`'s
entry (`codec.tokenize.distributed.tokenize`) in a fresh process, so its peak RSS (main process,
and the largest decoding worker) is the case's own. With `--ranks R`, case (a) runs again under
`torchrun --nproc-per-node R` (gloo; each rank gets `--threads` / R torch threads): files
per second, peak RSS of each rank, and their ratios against the one-process run of the same
invocation. Speed does not depend on the codec's weights, so without `--codec` a random default
`Codec(CodecConfig())` is timed; `--hf encodec|dac|mimi` times a random model of that family at the size
of facebook/encodec_24khz, descript/dac_16khz or kyutai/mimi (codec/hf/adapter.py: each file encoded whole;
`--codec` takes a downloaded folder of one too). The load average is printed: this machine may be shared, and then
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _make_short(folder: Path, corpus: Path, n: int, split: str = "train") -> None:
    from rvqlm.corpora.folder import corpus_files

    files = corpus_files(corpus, split)[:n]
    if len(files) < n:
        raise SystemExit(f"the corpus has only {len(files)} {split} files, asked for {n}")
    for i, f in enumerate(files):
        dest = folder / f"{i // 100:02d}" / f"{i:04d}.wav"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, dest) if f.stat().st_dev == dest.parent.stat().st_dev else dest.write_bytes(f.read_bytes())


def _make_long(folder: Path, corpus: Path, hours: float, sample_rate: int) -> None:
    """Concatenate corpus audio (looping over it if needed) into one 16-bit wav, streamed to disk."""
    import soundfile as sf

    from codec.core.audio import load_audio
    from rvqlm.corpora.folder import corpus_files

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


_CASE = """
import json, os, resource, sys, tempfile, time
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")  # as `rvqlm tokenize` does


def main():  # spawned decoding workers import this file: only run it as the script
    import torch
    from codec.loading import load_codec
    from codec.tokenize.distributed import Launch, tokenize
    from codec.tokenize.folder import TokenizeSettings
    launch = Launch.from_env()
    if {threads!r}:
        torch.set_num_threads(max(1, {threads!r} // launch.local_world))
    codec = load_codec({codec!r}, map_location=launch.device({device!r}))
    s = tokenize({audio!r}, {out!r}, codec, TokenizeSettings(workers={workers!r}, batch_seconds={batch!r},
                 progress=False), launch)
    self_, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    report = dict(rank=launch.rank, cpu_s=self_.ru_utime + self_.ru_stime + kids.ru_utime + kids.ru_stime,
                  files=s.files_tokenized, failed=s.files_failed, audio_s=s.audio_seconds, wall_s=s.wall_seconds,
                  threads=torch.get_num_threads(), rss_main_mb=self_.ru_maxrss / 1024,
                  rss_worker_mb=kids.ru_maxrss / 1024)
    sys.stdout.write("CASE " + json.dumps(report) + "\\n")  # one write: ranks share torchrun's unbuffered stdout


if __name__ == "__main__":
    main()
"""


def _run_case(audio: Path, out: Path, codec_dir: Path, workers: int, threads: int | None, batch_seconds: float,
              ranks: int = 1, device: str = "cpu", timeout: float | None = None) -> list[dict]:
    """Tokenize AUDIO into OUT in fresh processes (`ranks` > 1: under torchrun); each reports its
    summary and peak RSS as JSON, rank 0 first. `threads` is per node, split among its ranks; `device`
    as `rvqlm tokenize --device`. Adds `start_wall_s`: the whole command, process start and torch
    import included. Past `timeout` seconds the case is killed (subprocess.TimeoutExpired)."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "case.py"
        script.write_text(_CASE.format(threads=threads, codec=str(codec_dir), audio=str(audio),
                                       out=str(out), workers=workers, batch=batch_seconds, device=device))
        launcher = [] if ranks == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, *launcher, str(script)], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout)
        start_wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark case failed:\n{proc.stderr}")
    rows = [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("CASE ")]
    if len(rows) != ranks:
        raise SystemExit(f"expected {ranks} rank reports, got {len(rows)}:\n{proc.stdout}\n{proc.stderr}")
    rows.sort(key=lambda r: r["rank"])
    rows[0]["start_wall_s"] = start_wall
    return rows


def _random_hf_codec(family: str, folder: Path) -> Path:
    """A random transformers model of `family` at the size of its released checkpoint, saved to `folder`."""
    from codec.hf.adapter import import_transformers

    tf = import_transformers()
    model = {"encodec": lambda: tf.EncodecModel(tf.EncodecConfig()),  # encodec_24khz's defaults
             "dac": lambda: tf.DacModel(tf.DacConfig(downsampling_ratios=[2, 4, 5, 8], n_codebooks=12)),  # dac_16khz
             "mimi": lambda: tf.MimiModel(tf.MimiConfig())}[family]()  # kyutai/mimi's defaults
    model.save_pretrained(folder)
    return folder


def _same_tokens(a: Path, b: Path) -> str:
    """Whether two token folders hold the same files with the same tokens, in words."""
    import numpy as np

    from rvqlm_core.token_shards import TokenShards

    x, y = TokenShards.open(a, verify=True), TokenShards.open(b, verify=True)
    if sorted(e.path for e in x.entries) != sorted(e.path for e in y.entries):
        return "no: other files"
    differ = [e.path for e in x.entries if not np.array_equal(x.read(e), y.read(e.path))]
    return f"no: {len(differ)} files differ" if differ else f"yes, all {len(x.entries)} files bit for bit"


def _print_ranks(one: dict, many: list[dict], same: str) -> None:
    """The one-process run of case (a) against the same files by len(many) ranks."""
    ranks = len(many)
    if one["threads"] != many[0]["threads"]:
        same += (f" (torch threads differ, {one['threads']} against {many[0]['threads']} per rank: the thread count "
                 "alone can change rare codes; --threads 1 compares like with like)")
    print(f"\n(a) by 1 process and by {ranks} torchrun ranks (wall: tokenize() call, rank 0 until the merge; "
          f"with start: the whole command); tokens equal: {same}")
    print("| run | files | wall (s) | files/s | x real time | wall with start (s) | audio s per CPU s | threads "
          "| peak RSS per rank (MB) | files/s ratio | peak RSS ratio (max rank) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base_fps, base_rss = one["files"] / one["wall_s"], one["rss_main_mb"]
    for name, rows in (("1 process", [one]), (f"{ranks} ranks", many)):
        r0 = rows[0]
        fps = r0["files"] / r0["wall_s"]
        cpu = sum(r["cpu_s"] for r in rows)
        rss = [r["rss_main_mb"] for r in rows]
        print(f"| {name} | {r0['files']} | {r0['wall_s']:.1f} | {fps:.1f} | {r0['audio_s'] / r0['wall_s']:.0f} | "
              f"{r0['start_wall_s']:.1f} | {r0['audio_s'] / cpu:.0f} | {r0['threads']} | "
              f"{' / '.join(f'{x:.0f}' for x in rss)} | {fps / base_fps:.2f} | {max(rss) / base_rss:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codec", type=Path, default=None,
                    help="a saved codec folder, rvqlm's or a Hugging Face one (default: random default codec)")
    ap.add_argument("--hf", choices=("encodec", "dac", "mimi"), default=None,
                    help="time a random Hugging Face codec of this family at its released size (needs transformers)")
    ap.add_argument("--corpus", type=Path, default=REPO / "data" / "fillets-cs-16k")
    ap.add_argument("--files", type=int, default=500, help="short files in case (a)")
    ap.add_argument("--split", default="train", help="corpus split the files of case (a) come from (default train)")
    ap.add_argument("--ranks", type=int, default=1,
                    help="also run case (a) under torchrun with this many ranks and print ratios (default 1: no)")
    ap.add_argument("--hours", type=float, default=1.0, help="length of the file in case (b)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for encoding (default as `rvqlm tokenize`: cores minus workers, >= 1)")
    ap.add_argument("--batch-seconds", type=float, default=20.0)
    ap.add_argument("--cases", default="ab", help="which cases to run: a, b or ab")
    args = ap.parse_args()
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) - args.workers)

    from codec.core.config import CodecConfig
    from codec.core.model import Codec
    from codec.loading import load_codec
    from rvqlm.corpora.fillets import prepare_corpus

    if args.hf and args.codec:
        raise SystemExit("give --codec or --hf, not both")

    load_before = os.getloadavg()[0]
    corpus = prepare_corpus(args.corpus, 16000, progress=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        codec_dir = args.codec
        if args.hf:
            codec_dir = _random_hf_codec(args.hf, tmp / args.hf)
        elif codec_dir is None:
            codec_dir = Codec(CodecConfig()).save_pretrained(tmp / "codec")
        codec = load_codec(codec_dir)
        if "a" in args.cases:
            _make_short(tmp / "short", corpus, args.files, args.split)
            rows.append((f"(a) {args.files} short {args.split} files",
                         _run_case(tmp / "short", tmp / "tok-a", codec_dir, args.workers, args.threads,
                                   args.batch_seconds)[0]))
            if args.ranks > 1:
                many = _run_case(tmp / "short", tmp / "tok-ranks", codec_dir, args.workers, args.threads,
                                 args.batch_seconds, args.ranks)
                same = _same_tokens(tmp / "tok-a", tmp / "tok-ranks")
        if "b" in args.cases:
            _make_long(tmp / "long", corpus, args.hours, codec.sample_rate)
            rows.append((f"(b) one {args.hours:g} h file", _run_case(tmp / "long", tmp / "tok-b", codec_dir,
                                                                   args.workers, args.threads, args.batch_seconds)[0]))

    kind = f"Hugging Face {codec.family}" if codec.tokenizes_whole_files else f"encoder {codec.config.encoder.kind}"
    print(f"codec: {codec.sample_rate} Hz, hop {codec.hop_length}, {kind}, "
          f"N_c={codec.n_codebooks}, |V|={codec.codebook_size}, causal={codec.causal}"
          f"{' (random weights)' if args.codec is None else ''}")
    print(f"cpus: {os.cpu_count()}, workers: {args.workers}, batch_seconds: {args.batch_seconds}, "
          f"load average at start: {load_before:.1f}, at end: {os.getloadavg()[0]:.1f}")
    print("| case | files | audio (h) | wall (s) | x real time | audio s per CPU s | threads "
          "| peak RSS main (MB) | peak RSS worker (MB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['files']} | {r['audio_s'] / 3600:.3f} | {r['wall_s']:.1f} | "
              f"{r['audio_s'] / r['wall_s']:.0f} | {r['audio_s'] / r['cpu_s']:.0f} | {r['threads']} | "
              f"{r['rss_main_mb']:.0f} | {r['rss_worker_mb']:.0f} |")
    if "a" in args.cases and args.ranks > 1:
        _print_ranks(rows[0][1], many, same)


if __name__ == "__main__":
    main()
