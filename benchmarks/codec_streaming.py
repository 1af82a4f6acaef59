"""The streaming codec against real time: compute per chunk of live audio, and against the offline codec.

    .venv/bin/python benchmarks/codec_streaming.py [--codec models/codec-speech-16k] [--chunk-ms 20]
        [--seconds 10] [--threads 1] [--json out.json]

Audio: the first `--seconds` of held-out speech (the built-in corpus's test split, files joined),
or noise when the corpus is not prepared. It goes through `codec.core.streaming.stream_roundtrip` in
chunks of `--chunk-ms` as a live source would deliver them; each chunk's encoder and decoder time
is measured on the wall clock and in this thread's CPU time (the CPU time leaves out waits for a
busy machine's cores). The same audio is then encoded and decoded whole by `Codec.encode` /
`Codec.decode` in the same process, and its time spread over the same chunks: the ratio is what
streaming costs over batching every frame at once. The load average is recorded at both ends.

Algorithmic latency: the decoder's `latency_ms`, frame length + look-ahead, what a listener waits
at least, compute aside. The run also checks the streamed audio against the offline round trip
(max abs difference: ~1e-6, where one differing code would show as ~1e-2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from codec import Codec
from codec.core.streaming import StreamingDecoder, stream_roundtrip

REPO = Path(__file__).resolve().parents[1]


def speech(codec: Codec, seconds: float) -> tuple[torch.Tensor, str]:
    """[1, C, seconds * rate] of test-split speech (files joined), or noise without the corpus."""
    from codec.core.audio import load_audio

    need, parts = int(seconds * codec.sample_rate), []
    for path in sorted((REPO / "data" / "fillets-cs-16k" / "test").rglob("*.wav")):
        parts.append(load_audio(path, codec.sample_rate, codec.channels))
        if sum(p.shape[-1] for p in parts) >= need:
            return torch.cat(parts, dim=-1)[None, :, :need], f"{len(parts)} test-split files"
    return torch.randn(1, codec.channels, need) * 0.1, "noise (corpus not prepared)"


def quantiles(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"median": statistics.median(s), "p95": s[min(len(s) - 1, int(0.95 * len(s)))], "max": s[-1]}


def offline_seconds(codec: Codec, wav: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median wall and CPU seconds of Codec.encode and Codec.decode on the whole signal."""
    enc, dec, enc_cpu, dec_cpu = [], [], [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        codes = codec.encode(wav)
        t1, c1 = time.perf_counter(), time.thread_time()
        codec.decode(codes)
        enc.append(t1 - t0), enc_cpu.append(c1 - c0)
        dec.append(time.perf_counter() - t1), dec_cpu.append(time.thread_time() - c1)
    return {k: statistics.median(v) for k, v in
            (("encode", enc), ("decode", dec), ("encode_cpu", enc_cpu), ("decode_cpu", dec_cpu))}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    codec = Codec.from_pretrained(args.codec)
    wav, source = speech(codec, args.seconds)
    chunk = round(args.chunk_ms * codec.sample_rate / 1000)
    stream_roundtrip(codec, wav[..., : chunk * 10], chunk)  # warm-up (allocator, oneDNN primitives)
    load_before = os.getloadavg()[0]
    audio, times = stream_roundtrip(codec, wav, chunk)
    offline = offline_seconds(codec, wav, args.repeats)
    load_after = os.getloadavg()[0]
    n = len(times)
    per_chunk = {name: quantiles([1000 * getattr(t, name) for t in times])
                 for name in ("encode", "decode", "encode_cpu", "decode_cpu")}
    per_chunk["total"] = quantiles([1000 * (t.encode + t.decode) for t in times])
    per_chunk["total_cpu"] = quantiles([1000 * (t.encode_cpu + t.decode_cpu) for t in times])
    offline_ms = {k: 1000 * v / n for k, v in offline.items()}  # spread over the same chunks
    decoder = StreamingDecoder(codec)
    return {
        "codec": str(args.codec), "audio": source, "seconds": wav.shape[-1] / codec.sample_rate,
        "chunk_ms": 1000 * chunk / codec.sample_rate, "chunks": n, "threads": args.threads,
        "latency_ms": decoder.latency_ms,
        "frame_ms": 1000 * codec.hop_length / codec.sample_rate,
        "lookahead_ms": 1000 * decoder.lookahead_samples / codec.sample_rate,
        "stream_ms_per_chunk": per_chunk,
        "offline_ms_per_chunk": offline_ms,
        "stream_over_offline": {"wall": per_chunk["total"]["median"] / (offline_ms["encode"] + offline_ms["decode"]),
                                "cpu": per_chunk["total_cpu"]["median"]
                                / (offline_ms["encode_cpu"] + offline_ms["decode_cpu"])},
        "real_time_factor": sum(t.encode + t.decode for t in times) / (wav.shape[-1] / codec.sample_rate),
        "audio_max_abs_diff": float((audio - codec.decode(codec.encode(wav))[..., : wav.shape[-1]]).abs().max()),
        "loadavg": [load_before, load_after], "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
    }


def report(r: dict) -> None:
    s, o = r["stream_ms_per_chunk"], r["offline_ms_per_chunk"]
    print(f"{r['codec']}: {r['seconds']:.1f} s of {r['audio']} in {r['chunks']} chunks of {r['chunk_ms']:.1f} ms, "
          f"{r['threads']} thread(s), load average {r['loadavg'][0]:.2f} -> {r['loadavg'][1]:.2f}")
    print(f"algorithmic latency {r['latency_ms']:.1f} ms = frame {r['frame_ms']:.1f} ms + decoder look-ahead "
          f"{r['lookahead_ms']:.1f} ms")
    print("ms per chunk          median     p95     max   offline (whole signal, per chunk)")
    for name, off in (("encode", "encode"), ("decode", "decode"), ("total", None)):
        for clock, suffix in (("wall", ""), ("cpu", "_cpu")):
            q = s[name + suffix]
            ref = o[off + suffix] if off else o["encode" + suffix] + o["decode" + suffix]
            print(f"{name:>7} {clock:<4}        {q['median']:7.2f} {q['p95']:7.2f} {q['max']:7.2f}   {ref:7.3f}")
    print(f"stream / offline (median total): wall {r['stream_over_offline']['wall']:.1f}x, "
          f"CPU {r['stream_over_offline']['cpu']:.1f}x; real-time factor {r['real_time_factor']:.3f}")
    print(f"streamed audio against Codec.decode(Codec.encode(.)): max |diff| {r['audio_max_abs_diff']:.2e}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--codec", default=str(REPO / "models" / "codec-speech-16k"))
    p.add_argument("--chunk-ms", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=10.0, help="audio streamed (default 10 s: 500 chunks of 20 ms)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="offline runs (median)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    r = run(args)
    report(r)
    if args.json:
        from rvqlm_core.atomic import atomic_write_text

        atomic_write_text(args.json, json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
