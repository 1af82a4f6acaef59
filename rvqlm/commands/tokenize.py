"""`rvqlm tokenize AUDIO_DIR OUT_DIR --codec CODEC_DIR`: a folder of audio -> token shards, in one
process or, under torchrun, in many (codec/tokenize/distributed.py, docs/distributed.md)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tokenize",
        help="encode every audio file under a folder into token shards for LM training",
        description="Encode every audio file under AUDIO_DIR (recursively) with a codec into token shards in "
                    "OUT_DIR (layout: docs/formats.md). Rerunning the same command resumes an interrupted run. "
                    "Files that cannot be read are listed in OUT_DIR/errors.jsonl; the exit code is 1 if any failed. "
                    "A Hugging Face audiofolder metadata.jsonl / metadata.csv in AUDIO_DIR (or a sub-folder) "
                    "gives each file it names a `metadata` object in the manifest (e.g. text, speaker); "
                    "rows that name no audio file, or a file twice, are listed in errors.jsonl too. "
                    "Under torchrun (`torchrun --nproc-per-node P -m rvqlm tokenize ...`) each rank tokenizes "
                    "its share of the files and rank 0 merges them into the one folder (docs/distributed.md). "
                    "OUT_DIR takes one run at a time: a second run into it is refused while the first runs "
                    "(or waits, with --wait).",
    )
    p.add_argument("audio_dir", metavar="AUDIO_DIR", help="folder of audio files (wav, flac, ogg, mp3, ...)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="token folder to create or resume")
    p.add_argument("--codec", required=True, metavar="CODEC_DIR",
                   help="a saved codec folder (save_pretrained): rvqlm's own, or a Hugging Face EnCodec, DAC or Mimi "
                        "folder, whose files are encoded whole (pip install -e '.[hf]')")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes decoding audio in parallel with encoding (0: decode inline; default 1)")
    p.add_argument("--batch-seconds", type=float, default=20.0, metavar="S",
                   help="audio per encoder call, short files batched together (default 20)")
    p.add_argument("--chunk-seconds", type=float, default=10.0, metavar="C",
                   help="longer files are encoded in overlapping chunks of this length; "
                        "the tokens do not depend on it (default 10)")
    p.add_argument("--max-file-seconds", type=float, default=None, metavar="X",
                   help="list files longer than this as errors instead of tokenizing them (default: no limit)")
    p.add_argument("--shard-frames", type=int, default=None, metavar="F",
                   help="token frames per shard before it is sealed (default 1048576, ~5.8 h at 50 Hz)")
    p.add_argument("--threads", type=int, default=None, metavar="T",
                   help="torch threads for encoding (default: CPU cores per process on this node minus --workers, "
                        "at least 1; oversubscribed cores make torch several times slower)")
    p.add_argument("--device", default="auto",
                   help="torch device for encoding: auto (cuda:LOCAL_RANK when CUDA is there, else cpu; the default), "
                        "cpu, cuda (cuda:LOCAL_RANK) or cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--wait", action="store_true",
                   help="when another run is writing OUT_DIR, wait for it to end instead of refusing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import contextlib
    import os

    # oneDNN caches one set of conv kernels per input shape; pieces come in many lengths, so the
    # cache would grow by ~9 MB per shape (1 GB+ on a long run). Building them afresh costs < 5%.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
    import torch

    from codec.loading import load_codec
    from codec.tokenize.distributed import Launch, tokenize
    from codec.tokenize.folder import TokenizeSettings
    from pathlib import Path

    from rvqlm_core.atomic import check_folder_destination
    from rvqlm_core.shard_writer import refuse_foreign_folder
    from rvqlm_core.token_shards import DEFAULT_SHARD_FRAMES

    check_folder_destination(args.out_dir)  # before loading anything
    refuse_foreign_folder(Path(args.out_dir))  # and before the folder's lock leaves its file there
    launch = Launch.from_env()
    cores = max(1, (os.cpu_count() or 1) // launch.local_world)
    threads = args.threads if args.threads is not None else max(1, cores - max(args.workers, 0))
    if threads < 1:
        raise ValueError("--threads must be >= 1")
    torch.set_num_threads(threads)
    settings = TokenizeSettings(workers=args.workers, batch_seconds=args.batch_seconds,
                                chunk_seconds=args.chunk_seconds, max_file_seconds=args.max_file_seconds,
                                shard_frames=DEFAULT_SHARD_FRAMES if args.shard_frames is None else args.shard_frames,
                                progress=not args.no_progress)
    codec = load_codec(args.codec, map_location=launch.device(args.device))
    with contextlib.ExitStack() as held:
        hold_out_dir(held, args.out_dir, launch, args.wait)
        summary = tokenize(args.audio_dir, args.out_dir, codec, settings, launch)
    if launch.rank == 0:
        for line in summary.lines():
            print(line)
        _show(summary.errors, f"file(s) failed (all listed in {args.out_dir}/errors.jsonl)")
        _show(summary.metadata_errors,
              f"metadata row(s) could not be attached (all listed in {args.out_dir}/errors.jsonl)")
    return 1 if summary.files_failed or summary.metadata_errors else 0


def hold_out_dir(held, out_dir: str, launch, wait: bool) -> None:
    """Take OUT_DIR's writer lock (rvqlm_core.folder_lock) into the ExitStack `held`: the one process,
    or rank 0 of a torchrun launch, which tells the other ranks over the process group whether it got
    it, so a refused launch ends on every rank with the same line before anything is written."""
    from rvqlm_core.folder_lock import FolderBusy, folder_lock

    if launch.world == 1:
        held.enter_context(folder_lock(out_dir, wait=wait))
        return
    import torch.distributed as dist

    from codec.tokenize.distributed import WAIT

    dist.init_process_group("gloo", timeout=WAIT)  # tokenize's Group finds it and leaves it to us
    held.callback(dist.destroy_process_group)
    refusal = [None]
    if launch.rank == 0:
        try:
            held.enter_context(folder_lock(out_dir, wait=wait))
        except FolderBusy as e:
            refusal = [str(e)]
    dist.broadcast_object_list(refusal, src=0)
    if refusal[0] is not None:
        raise FolderBusy(refusal[0])


def _show(errors: list[dict], what: str) -> None:
    """The first ten errors on stderr, under a line counting them."""
    if not errors:
        return
    print(f"{len(errors)} {what}:", file=sys.stderr)
    for e in errors[:10]:
        print(f"  {e['path']}: {e['reason']}", file=sys.stderr)
    if len(errors) > 10:
        print(f"  ... and {len(errors) - 10} more", file=sys.stderr)
