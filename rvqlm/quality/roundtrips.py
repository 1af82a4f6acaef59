"""Speech through a codec and back, for scoring against the original: ours at `n_q` codebooks,
Opus (ffmpeg + libopus) and codec2 (c2enc / c2dec), each with the size of its coded stream; and the
held-out files the codec benchmarks score.

Needs `make bench-setup` for the reference codecs (ffmpeg with libopus; codec2); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

SAMPLE_RATE = 16000  # the metrics' rate: PESQ wideband is defined at 16 kHz
OPUS_FLOOR_KBPS = 6.0
CODEC2_RATE = 8000
CODEC2_MODES = {"3200": 3.2, "2400": 2.4, "1600": 1.6, "1400": 1.4, "1300": 1.3, "1200": 1.2, "700C": 0.7,
                "450": 0.45, "450PWB": 0.45}
CODEC2_WIDEBAND_OUTPUT = {"450PWB"}  # decodes to 16 kHz


class ToolMissing(RuntimeError):
    """A reference codec's command-line tool (ffmpeg, c2enc, c2dec) is not installed."""


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
    bits_per_frame = round(codec.bitrate_kbps(codes.shape[1]) * 1000 / codec.frame_rate)
    bits = bits_per_frame * codes.shape[2]
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


# ---- held-out files ------------------------------------------------------------------------------

def pick_files(files: list[Path], max_files: int, min_seconds: float) -> list[Path]:
    """Up to max_files of the files at least min_seconds long, evenly spread over the sorted list."""
    from codec.core.audio import audio_info

    long_enough = [f for f in sorted(files) if audio_info(f).duration >= min_seconds]
    if not long_enough:
        raise ValueError(f"none of the {len(files)} files is at least {min_seconds:g} s long")
    if len(long_enough) <= max_files:
        return long_enough
    return [long_enough[i * len(long_enough) // max_files] for i in range(max_files)]


def mono_codec_and_files(codec_dir: str, corpus: str, split: str, max_files: int, script: str):
    """A saved codec in eval mode (SystemExit naming `script` unless it is mono) and the files of
    `corpus`/`split` that `pick_files` scores (>= 1 s)."""
    from codec.loading import load_codec
    from rvqlm.corpora.folder import corpus_files

    codec = load_codec(codec_dir)
    if codec.channels != 1:
        raise SystemExit(f"{script} scores mono codecs")
    return codec, pick_files(corpus_files(corpus, split), max_files, 1.0)


def held_out_parser(description: str, max_files: int,
                    codec_help: str = "a saved codec folder") -> argparse.ArgumentParser:
    """The options of the scripts that score one codec on held-out files: --codec, --corpus, --split
    (default valid), --max-files and --threads."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--codec", required=True, help=codec_help)
    p.add_argument("--corpus", default="data/fillets-cs-16k")
    p.add_argument("--split", default="valid", choices=("train", "valid", "test"))
    p.add_argument("--max-files", type=int, default=max_files)
    p.add_argument("--threads", type=int, default=1)
    return p
