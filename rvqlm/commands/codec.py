"""`rvqlm train-codec`, `rvqlm reconstruct`, `rvqlm encode`, `rvqlm decode`.

    rvqlm train-codec --config recipes/codec_speech.yaml [LightningCLI overrides, --ckpt_path CKPT]
    rvqlm train-source-filter recipes/codec_source_filter.yaml    (the source-filter codec: regression, no GAN)
    rvqlm reconstruct IN.wav OUT.wav --codec DIR [--n-codebooks k] [--stream [--chunk-ms 20]]
    rvqlm encode IN.wav OUT.rvq --codec DIR [--n-codebooks k]
    rvqlm decode IN.rvq OUT.wav --codec DIR

--codec DIR is rvqlm's own codec folder or a Hugging Face EnCodec, DAC or Mimi folder (codec.loading);
a Hugging Face codec does not stream (--stream is refused in one line).
"""

from __future__ import annotations

import argparse
import math

from rvqlm_core.weight_dtype import QUANTIZED_DTYPES, STORAGE_DTYPES

CODEC_HELP = ("codec folder (config.json + model.safetensors): rvqlm's own, or a Hugging Face EnCodec, DAC or "
              "Mimi folder (pip install -e '.[hf]')")

#: Whole-file commands hold the signal and the decoder's activations in memory; longer files
#: belong to `rvqlm tokenize` (chunked) or `reconstruct --stream` (block by block).
MAX_SECONDS = 180.0


def register(sub: argparse._SubParsersAction) -> None:
    # Everything after `train-codec` goes to LightningCLI untouched (its own --help included):
    # a prefix char no argument starts with keeps argparse from reading `--config` itself.
    p = sub.add_parser("train-codec", add_help=False, prefix_chars="\x00",
                       help="train a codec with LightningCLI (e.g. --config recipes/codec_speech.yaml)")
    p.add_argument("lightning_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_train)

    p = sub.add_parser("train-source-filter", help="train the source-filter codec from a recipe (WORLD targets, "
                                                   "an analysis network, k-means codebooks; each step resumes)")
    p.add_argument("recipe", help="e.g. recipes/codec_source_filter.yaml")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.set_defaults(func=_train_source_filter)

    p = sub.add_parser("export-codec", help="Lightning checkpoint of a codec run -> from_pretrained folder")
    p.add_argument("checkpoint", help="e.g. runs/codec_speech/version_0/checkpoints/last.ckpt, or a saved "
                                      "codec folder to write again (e.g. with --dtype float16)")
    p.add_argument("output", help="folder to write (config.json, model.safetensors, discriminator.safetensors)")
    p.add_argument("--dtype", choices=STORAGE_DTYPES + QUANTIZED_DTYPES, default="float32",
                   help="store the decoder's weights in this precision (half the file with float16; they "
                        "load as float32; int8: the iSTFT decoder's linear layers in int8, an inference-only "
                        "codec; the encoder and quantizer, hence the tokens, are always exact)")
    p.set_defaults(func=_export)

    p = sub.add_parser("reconstruct", help="encode and decode an audio file (hear what the codec keeps)")
    p.add_argument("input", help="audio file (any format libsndfile reads; resampled to the codec's rate)")
    p.add_argument("output", help="output audio file (format from the suffix, e.g. .wav, .flac)")
    _common(p)
    p.add_argument("--stream", action="store_true",
                   help="run the streaming encoder and decoder on chunks as live audio would come, and print "
                        "each chunk's compute time against its duration (same output, within 1e-5; in bounded "
                        f"memory, so files past the {MAX_SECONDS:.0f} s of a whole-file run are taken)")
    p.add_argument("--chunk-ms", type=float, default=20.0, metavar="MS",
                   help="with --stream: chunk length in milliseconds (default 20)")
    p.set_defaults(func=_reconstruct)

    p = sub.add_parser("encode", help="audio file -> .rvq codes file")
    p.add_argument("input", help="audio file")
    p.add_argument("output", help="output .rvq file")
    _common(p)
    p.set_defaults(func=_encode)

    p = sub.add_parser("decode", help=".rvq codes file -> audio file (refuses codes of another codec)")
    p.add_argument("input", help=".rvq file written by `rvqlm encode`")
    p.add_argument("output", help="output audio file")
    p.add_argument("--codec", required=True, help=CODEC_HELP)
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.set_defaults(func=_decode)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--codec", required=True, help=CODEC_HELP)
    p.add_argument("--n-codebooks", type=int, default=None, metavar="K",
                   help="use only the first K codebooks (lower bitrate); default all")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")


def _train(args: argparse.Namespace) -> int:
    from codec.neural.training import train_codec

    train_codec(args.lightning_args)
    return 0


def _train_source_filter(args: argparse.Namespace) -> int:
    import torch

    from codec.source_filter.training import train_source_filter

    torch.set_num_threads(args.threads)
    train_source_filter(args.recipe)
    return 0


def _export(args: argparse.Namespace) -> int:
    from codec.neural.training import export_checkpoint
    from rvqlm_core.atomic import check_folder_destination

    check_folder_destination(args.output, inputs=[args.checkpoint])  # never onto the codec it reads

    out = export_checkpoint(args.checkpoint, args.output, decoder_dtype=args.dtype)
    print(f"exported {args.checkpoint} -> {out}")
    return 0


def _load(args: argparse.Namespace):
    from codec.loading import load_codec
    from rvqlm_core.atomic import check_file_destination

    check_file_destination(args.output, args.input)  # before any work
    codec = load_codec(args.codec, map_location=args.device)
    k = getattr(args, "n_codebooks", None)
    if k is not None and not 1 <= k <= codec.n_codebooks:
        raise ValueError(f"--n-codebooks must be in 1..{codec.n_codebooks} for this codec, got {k}")
    return codec


def _read_audio(path: str, codec, command: str):
    from codec.core.audio import FullScale, load_audio

    level = FullScale()
    wav = load_audio(path, codec.sample_rate, codec.channels, max_seconds=MAX_SECONDS, level=level)
    warn_full_scale(level, path, command)
    return wav


def warn_full_scale(level, path: str, command: str) -> None:
    """`rvqlm COMMAND: warning: ...` on stderr for a file past full scale (codec.core.audio.FullScale)."""
    import sys

    warning = level.warning(path)
    if warning:
        sys.stderr.write(f"rvqlm {command}: warning: {warning}\n")


def _reconstruct(args: argparse.Namespace) -> int:
    from codec.core.audio import save_audio

    codec = _load(args)
    k = args.n_codebooks or codec.n_codebooks
    if args.stream:
        seconds = _reconstruct_streaming(args, codec, k)
    else:
        wav = _read_audio(args.input, codec, args.command)  # [C, S]
        save_audio(args.output, codec.decode(codec.encode(wav[None], n_q=k))[0, :, : wav.shape[-1]], codec.sample_rate)
        seconds = wav.shape[-1] / codec.sample_rate
    print(f"{args.output}: {seconds:.2f} s through {k} codebooks ({codec.bitrate_kbps(k):.2f} kbps)")
    return 0


def _reconstruct_streaming(args: argparse.Namespace, codec, n_q: int) -> float:
    """args.input through the streaming codec in chunks of --chunk-ms as live audio would come, read and
    written block by block (bounded memory, so no MAX_SECONDS); prints the compute per chunk -> seconds."""
    from codec.core.audio import FullScale, audio_info, audio_writer, iter_audio_blocks
    from codec.core.streaming import rechunk, stream_chunks

    if not codec.can_stream:
        raise ValueError(codec.stream_refusal)
    if not (math.isfinite(args.chunk_ms) and round(args.chunk_ms * codec.sample_rate / 1000) >= 1):
        raise ValueError(f"--chunk-ms must be at least one sample ({1000 / codec.sample_rate:.3f} ms), "
                         f"got {args.chunk_ms}")
    chunk = round(args.chunk_ms * codec.sample_rate / 1000)
    audio_info(args.input)  # a missing or broken file is refused before the output is opened
    level, times, read, written = FullScale(), [], [0], 0

    def counted(blocks):
        for block in blocks:
            read[0] += block.shape[-1]
            yield block

    blocks = counted(iter_audio_blocks(args.input, codec.sample_rate, codec.channels, level=level))
    with audio_writer(args.output, codec.sample_rate, codec.channels) as write:
        for audio, spent in stream_chunks(codec, rechunk(blocks, chunk), n_q=n_q):
            audio = audio[0, :, : read[0] - written]  # the last frame is zero-padded past the input's end
            write(audio)
            written += audio.shape[-1]
            times.append(spent)
    warn_full_scale(level, args.input, args.command)
    _print_stream_times(codec, times, chunk, written / codec.sample_rate)
    return written / codec.sample_rate


def _print_stream_times(codec, times: list, chunk: int, duration: float) -> None:
    """The compute per chunk of `codec.core.streaming.stream_chunks`' ChunkTimes, and the latency."""
    import statistics

    import torch

    from codec.core.streaming import StreamingDecoder

    ms = sorted(1000 * (t.encode + t.decode) for t in times)
    cpu = sorted(1000 * (t.encode_cpu + t.decode_cpu) for t in times)
    p95 = ms[min(len(ms) - 1, math.ceil(0.95 * len(ms)) - 1)]
    decoder = StreamingDecoder(codec)
    print(f"streamed {len(ms)} chunks of {1000 * chunk / codec.sample_rate:.1f} ms on {torch.get_num_threads()} "
          f"thread(s): compute per chunk median {statistics.median(ms):.2f} ms, p95 {p95:.2f} ms, max {ms[-1]:.2f} ms "
          f"(CPU time median {statistics.median(cpu):.2f} ms); real-time factor {sum(ms) / 1000 / duration:.3f}; "
          f"algorithmic latency {decoder.latency_ms:.1f} ms (frame {1000 * codec.hop_length / codec.sample_rate:.1f} "
          f"ms + decoder look-ahead {1000 * decoder.lookahead_samples / codec.sample_rate:.1f} ms)")


def _encode(args: argparse.Namespace) -> int:
    from pathlib import Path

    from codec.core.rvq_file import write_rvq

    codec = _load(args)
    wav = _read_audio(args.input, codec, args.command)
    codes = codec.encode(wav[None], n_q=args.n_codebooks)[0]  # [k, T]
    header = {"codec_fingerprint": codec.token_fingerprint(), "sample_rate": codec.sample_rate,
              "frame_rate": codec.frame_rate, "codebook_size": codec.codebook_size,
              "channels": codec.channels, "n_samples": int(wav.shape[-1]), "source": Path(args.input).name}
    write_rvq(args.output, codes, header)
    print(f"{args.output}: {codes.shape[1]} frames x {codes.shape[0]} codebooks "
          f"({codec.bitrate_kbps(codes.shape[0]):.2f} kbps)")
    return 0


def _decode(args: argparse.Namespace) -> int:
    from codec.core.audio import save_audio
    from codec.core.rvq_file import read_rvq

    codec = _load(args)
    codes, header = read_rvq(args.input)
    if not codec.accepts_tokens(header["codec_fingerprint"]):
        raise ValueError(f"{args.input} was made by codec {header['codec_fingerprint'][:16]}..., but {args.codec} "
                         f"is codec {codec.token_fingerprint()[:16]}... (tokens); decode it with the codec that "
                         "encoded it (or one fine-tuned from it with train_decoder_only)")
    if codes.shape[1] == 0:
        raise ValueError(f"{args.input} holds no frames")
    wav = codec.decode(codes[None])[0, :, : int(header["n_samples"])]
    save_audio(args.output, wav, codec.sample_rate)
    print(f"{args.output}: {wav.shape[-1] / codec.sample_rate:.2f} s from {codes.shape[0]} codebooks")
    return 0
