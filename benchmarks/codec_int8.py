"""Would int8 pay in the codec's decoder? The shipped decoder in float32 against the same decoder with
its linear layers in int8 (rvqlm_core.int8_linear, as the int8 LM), in one process.

    .venv/bin/python benchmarks/codec_int8.py [--codec models/codec-speech-16k] [--seconds 10] [--threads 1]
        [--repeats 3] [--json out.json]

Audio: the first `--seconds` of held-out speech (the built-in corpus's test split, files joined),
encoded once. The iSTFT decoder's ConvNeXt MLPs (up / down) and its spectrum head are its nn.Linear layers
and most of its weights; the input convolution and the depthwise convolutions stay float32.

* offline: `Codec.decode` of the whole signal (median of --repeats), float32 vs int8.
* streaming: `StreamingDecoder.push` frame by frame (one 20 ms frame per call), median ms per frame.
* quality: PESQ (wideband) and STOI of each decode against the input speech, and the int8 decode's
  SNR against the float32 decode.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks/ is a package of the repository
    sys.path.insert(0, str(REPO))

from benchmarks.codec_streaming import speech as streaming_speech  # noqa: E402
from codec import Codec  # noqa: E402
from codec.streaming import StreamingDecoder  # noqa: E402
from rvqlm.quality.metrics import pesq_wb, stoi  # noqa: E402
from rvqlm_core.int8_linear import Int8Linear  # noqa: E402


def speech(codec: Codec, seconds: float) -> tuple[torch.Tensor, str]:
    """[1, C, seconds * rate] of test-split speech (files joined, as benchmarks/codec_streaming.py reads
    it); exits when the corpus is not prepared, since PESQ and STOI need speech."""
    wav, source = streaming_speech(codec, seconds)
    if source.startswith("noise"):
        raise SystemExit("the built-in corpus is not prepared (data/fillets-cs-16k/test): run `make demo` first")
    return wav, source


def int8_decoder(codec: Codec) -> tuple[Codec, int]:
    """A copy of `codec` whose decoder's nn.Linear layers are Int8Linear; (copy, weights swapped)."""
    codec = copy.deepcopy(codec).eval()
    swapped = 0
    for module in list(codec.decoder.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear.from_float(child))
                swapped += child.weight.numel()
    return codec, swapped


@torch.inference_mode()
def offline_decode(codec: Codec, codes: torch.Tensor, repeats: int) -> tuple[float, float, torch.Tensor]:
    """(median wall s, median CPU s, audio) of Codec.decode on all of `codes`."""
    codec.decode(codes[..., :50])  # warm-up
    times, cpu, wav = [], [], None
    for _ in range(repeats):
        t, c = time.perf_counter(), time.thread_time()
        wav = codec.decode(codes)
        times.append(time.perf_counter() - t), cpu.append(time.thread_time() - c)
    return statistics.median(times), statistics.median(cpu), wav


def streaming_ms_per_frame(codec: Codec, codes: torch.Tensor) -> tuple[float, float]:
    """(median wall ms, median CPU ms) of StreamingDecoder.push, one frame per call."""
    decoder = StreamingDecoder(codec)
    for i in range(10):  # warm-up
        decoder.push(codes[..., i:i + 1])
    decoder = StreamingDecoder(codec)
    times, cpu = [], []
    for i in range(codes.shape[-1]):
        t, c = time.perf_counter(), time.thread_time()
        decoder.push(codes[..., i:i + 1])
        times.append(time.perf_counter() - t), cpu.append(time.thread_time() - c)
    return 1000 * statistics.median(times), 1000 * statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default="models/codec-speech-16k")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    codec = Codec.from_pretrained(args.codec).eval()
    wav, source = speech(codec, args.seconds)
    with torch.inference_mode():
        codes = codec.encode(wav)
    quantized, swapped = int8_decoder(codec)
    total = sum(p.numel() for p in codec.decoder.parameters())
    print(f"{args.codec}: {wav.shape[-1] / codec.sample_rate:.1f} s of {source}, {codes.shape[-1]} frames, "
          f"{args.threads} thread(s), load average {os.getloadavg()[0]:.1f}; int8 takes {swapped / 1e6:.2f}M of "
          f"the decoder's {total / 1e6:.2f}M weights")
    ref = wav[0, 0].numpy()
    rows = {}
    for name, model in (("float32", codec), ("int8", quantized)):
        seconds, seconds_cpu, out = offline_decode(model, codes, args.repeats)
        frame_ms, frame_cpu_ms = streaming_ms_per_frame(model, codes)
        dec = out[0, 0, : ref.shape[-1]].numpy()
        rows[name] = {"decode_s": seconds, "decode_cpu_s": seconds_cpu, "stream_ms_per_frame": frame_ms,
                      "stream_cpu_ms_per_frame": frame_cpu_ms, "pesq": pesq_wb(ref, dec, codec.sample_rate),
                      "stoi": stoi(ref, dec, codec.sample_rate), "wav": out}
    diff = rows["int8"]["wav"] - rows["float32"]["wav"]
    snr = float(10 * torch.log10(rows["float32"]["wav"].square().sum() / diff.square().sum()))
    print(f"{'':8} {'offline decode s':>16} {'(CPU)':>7} {'stream ms/frame':>15} {'(CPU)':>7} {'PESQ':>6} {'STOI':>6}")
    for name, r in rows.items():
        print(f"{name:8} {r['decode_s']:16.3f} {r['decode_cpu_s']:7.3f} {r['stream_ms_per_frame']:15.2f} "
              f"{r['stream_cpu_ms_per_frame']:7.2f} {r['pesq']:6.3f} {r['stoi']:6.3f}")
    f, q = rows["float32"], rows["int8"]
    print(f"int8 / float32, wall (CPU time): offline {f['decode_s'] / q['decode_s']:.2f}x "
          f"({f['decode_cpu_s'] / q['decode_cpu_s']:.2f}x), streaming {f['stream_ms_per_frame'] / q['stream_ms_per_frame']:.2f}x "
          f"({f['stream_cpu_ms_per_frame'] / q['stream_cpu_ms_per_frame']:.2f}x) faster; int8 decode vs float32 decode "
          f"SNR {snr:.1f} dB")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(Path(args.json), {"snr_db": snr, "swapped_weights": swapped, "decoder_weights": total,
                                            **{k: {m: v for m, v in r.items() if m != "wav"} for k, r in rows.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
