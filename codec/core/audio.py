"""Audio I/O, in one place: read anything libsndfile reads, write with soundfile.

Every reader returns float32 tensors shaped `[C, S]` (channels, samples) at the rate and channel
count the caller asks for (torchaudio resampling, mean downmix / repeat upmix). Every failure a
user can cause (missing, empty, truncated, non-audio, NaN/inf samples, too long) raises
`AudioError` whose message starts with the file's path; nothing deeper ever leaks a traceback
from torch or libsndfile. Without the soundfile package (a stock CUDA PyTorch image) 16-bit PCM
WAV is still read (codec/core/pcm_wav.py); other formats, and writing, then name the missing package.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torchaudio.functional as AF

from codec.core import pcm_wav
from rvqlm_core.atomic import atomic_path

#: File suffixes the folder walkers pick up (libsndfile's formats, mp3 included since 1.1).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".w64", ".caf")


class AudioError(ValueError):
    """A user-facing audio problem. The message names the file and says what is wrong."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class AudioInfo:
    path: str
    sample_rate: int
    channels: int
    frames: int
    format: str

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate


def audio_info(path: str | os.PathLike) -> AudioInfo:
    """Read the header only. Raises AudioError for missing, non-audio or empty files."""
    path = Path(path)
    if not path.is_file():
        raise AudioError(path, "no such file")
    if path.stat().st_size == 0:
        raise AudioError(path, "empty file (0 bytes)")
    sf = _soundfile()
    if sf is None:
        try:
            rate, channels, frames = pcm_wav.info(path)
        except ValueError as e:
            raise AudioError(path, str(e)) from None
        fmt = "WAV"
    else:
        try:
            info = sf.info(str(path))
        except (sf.LibsndfileError, RuntimeError, TypeError) as e:
            raise AudioError(path, f"not a readable audio file ({_short(e)})") from None
        rate, channels, frames, fmt = info.samplerate, info.channels, info.frames, info.format
    if frames <= 0:
        raise AudioError(path, "no audio samples (zero-length)")
    check_not_truncated(path)
    if rate <= 0 or channels <= 0:
        raise AudioError(path, f"invalid header (rate {rate}, channels {channels})")
    return AudioInfo(str(path), int(rate), int(channels), int(frames), str(fmt))


def _soundfile():
    """The soundfile module, or None where it (or its libsndfile) is not installed."""
    try:
        import soundfile
    except (ImportError, OSError):
        return None
    return soundfile


def check_not_truncated(path: str | os.PathLike) -> None:
    """Raise AudioError for a WAV or Ogg file cut short; libsndfile would silently read what is left.

    WAV: the `data` chunk declares more bytes than the file holds (the sizes 0 and 0xFFFFFFFF that
    streaming writers leave are accepted). Ogg: the last page is incomplete or lacks the
    end-of-stream flag.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(12)
        if head[:4] in (b"RIFF", b"RIFX") and head[8:12] == b"WAVE":
            order = "little" if head[:4] == b"RIFF" else "big"
            pos = 12
            while pos + 8 <= size:
                f.seek(pos)
                chunk = f.read(8)
                n = int.from_bytes(chunk[4:8], order)
                if chunk[:4] == b"data":
                    if n not in (0, 0xFFFFFFFF) and pos + 8 + n > size:
                        raise AudioError(path, f"truncated: the header declares {n} bytes of audio, "
                                               f"the file holds {size - pos - 8}")
                    return
                pos += 8 + n + (n & 1)
        elif head[:4] == b"OggS":
            f.seek(max(0, size - 65536))
            tail = f.read()
            last = tail.rfind(b"OggS")
            page = tail[last:]
            if last < 0 or len(page) < 27:
                raise AudioError(path, "truncated: the last Ogg page is cut off")
            n_segments = page[26]
            if len(page) < 27 + n_segments or len(page) < 27 + n_segments + sum(page[27 : 27 + n_segments]):
                raise AudioError(path, "truncated: the last Ogg page is cut off")
            if not page[5] & 0x04:
                raise AudioError(path, "truncated: the Ogg stream has no end-of-stream page")


def load_audio(
    path: str | os.PathLike,
    sample_rate: int,
    channels: int = 1,
    *,
    max_seconds: float | None = None,
    offset_seconds: float = 0.0,
    duration_seconds: float | None = None,
    level: FullScale | None = None,
) -> torch.Tensor:
    """Read a file (or a slice of it) to float32 `[channels, S]` at `sample_rate`.

    max_seconds: refuse (AudioError) files longer than this instead of loading them whole; use
    `iter_audio_blocks` to stream long files. level: counts the file's own samples (before resampling,
    which may overshoot full scale a little) for `FullScale.warning`.
    """
    info = audio_info(path)
    if max_seconds is not None and info.duration > max_seconds:
        raise AudioError(path, f"too long ({info.duration:.1f} s > limit {max_seconds:.1f} s)")
    start = int(round(offset_seconds * info.sample_rate))
    if start >= info.frames:
        raise AudioError(path, f"offset {offset_seconds:.2f} s is past the end ({info.duration:.2f} s)")
    frames = -1 if duration_seconds is None else max(1, int(round(duration_seconds * info.sample_rate)))
    data = _read(path, start, frames, info.frames)
    wav = torch.from_numpy(np.ascontiguousarray(data.T))
    if level is not None:
        level.add(wav)
    return to_layout(wav, info.sample_rate, sample_rate, channels, path=path)


class FullScale:
    """The peak of a file's samples `add`ed block by block, and how many go past full scale (|x| > 1, which
    float files can hold; `load_audio` and `iter_audio_blocks` add them, given one as `level`)."""

    def __init__(self) -> None:
        self.peak, self.past, self.samples = 0.0, 0, 0

    def add(self, wav: torch.Tensor) -> None:
        if wav.numel():
            self.peak = max(self.peak, float(wav.abs().max()))
            self.past += int((wav.abs() > 1.0).sum())
        self.samples += wav.numel()

    def warning(self, path: str | os.PathLike) -> str | None:
        """One line when the audio went past full scale: audio is written within [-1, 1] (`save_audio`,
        `audio_writer`), so what a codec makes of it will be clipped. None within full scale."""
        if not self.peak > 1.0:
            return None
        share = 100.0 * self.past / max(self.samples, 1)
        return (f"{path} peaks at {self.peak:.2f}, past full scale (1.0) in {share:.2g} % of its samples: what is "
                f"made of it is written clipped to [-1, 1]; scale the file by {1 / self.peak:.3g} or less first")


def iter_audio_blocks(
    path: str | os.PathLike, sample_rate: int, channels: int = 1, block_seconds: float = 60.0,
    level: FullScale | None = None,
) -> Iterator[torch.Tensor]:
    """Stream a file as consecutive `[channels, S_block]` blocks at `sample_rate`.

    Memory stays bounded by the block size whatever the file's length. Resampling is done per
    block with a polyphase filter whose edges are handled by carrying `pad` input samples of
    context across block boundaries, so the concatenated blocks equal (up to float rounding at
    the block edges) resampling the whole file at once. level: counts the file's own samples
    (`load_audio`'s).
    """
    info = audio_info(path)
    count = level.add if level is not None else (lambda samples: None)
    if info.sample_rate == sample_rate:
        block = max(1, int(block_seconds * info.sample_rate))
        for start in range(0, info.frames, block):
            data = _read(path, start, min(block, info.frames - start), info.frames)
            count(torch.from_numpy(data))
            yield to_layout(torch.from_numpy(np.ascontiguousarray(data.T)), sample_rate, sample_rate, channels, path=path)
        return
    # Resampling path: work in units of the rates' gcd so block boundaries map exactly.
    g = math.gcd(info.sample_rate, sample_rate)
    unit_in, unit_out = info.sample_rate // g, sample_rate // g
    units = max(1, int(block_seconds * info.sample_rate) // unit_in)
    block_in = units * unit_in
    pad_units = max(1, math.ceil(0.05 * info.sample_rate / unit_in))  # 50 ms of context each side
    pad_in = pad_units * unit_in
    for start in range(0, info.frames, block_in):
        lo = max(0, start - pad_in)
        hi = min(info.frames, start + block_in + pad_in)
        data = _read(path, lo, hi - lo, info.frames)
        count(torch.from_numpy(data[start - lo: start - lo + min(block_in, info.frames - start)]))
        wav = to_layout(torch.from_numpy(np.ascontiguousarray(data.T)), info.sample_rate, sample_rate, channels, path=path)
        skip = (start - lo) // unit_in * unit_out
        n_out = math.ceil(min(block_in, info.frames - start) * sample_rate / info.sample_rate)
        yield wav[:, skip : skip + n_out]


def to_layout(
    wav: torch.Tensor, sr_in: int, sr_out: int, channels: int, *, path: str | os.PathLike = "<tensor>"
) -> torch.Tensor:
    """Convert `[C_in, S]` float audio to `[channels, S']` at `sr_out`.

    Downmix: mean over channels (to mono). Upmix: a mono signal is repeated. Other channel
    mappings are ambiguous and refused.
    """
    if wav.dim() != 2:
        raise AudioError(path, f"expected [channels, samples], got shape {tuple(wav.shape)}")
    wav = wav.to(torch.float32)
    if not torch.isfinite(wav).all():
        raise AudioError(path, "contains NaN or infinite sample values")
    c_in = wav.shape[0]
    if c_in != channels:
        if channels == 1:
            wav = wav.mean(dim=0, keepdim=True)
        elif c_in == 1:
            wav = wav.expand(channels, -1).contiguous()
        else:
            raise AudioError(path, f"cannot map {c_in} channels to {channels}; convert the file first")
    if sr_in != sr_out:
        wav = AF.resample(wav, sr_in, sr_out)
    return wav


def band_limited(wav: torch.Tensor, sample_rate: int, band_rate: int = 8000) -> torch.Tensor:
    """wav [..., S] resampled to `band_rate` and back, cut to its length (8 kHz: a telephone line's band)."""
    return AF.resample(AF.resample(wav, sample_rate, band_rate), band_rate, sample_rate)[..., : wav.shape[-1]]


def save_audio(path: str | os.PathLike, wav: torch.Tensor, sample_rate: int, subtype: str | None = None) -> Path:
    """Write `[C, S]` (or `[S]`) float audio atomically; the format follows the suffix (wav default PCM_16).

    Samples are clipped to [-1, 1] so integer formats never wrap around.
    """
    path = Path(path)
    wav = wav.detach().to("cpu", torch.float32)
    if wav.dim() == 1:
        wav = wav.unsqueeze(0)
    if wav.dim() != 2:
        raise ValueError(f"save_audio expects [C, S], got {tuple(wav.shape)}")
    if not torch.isfinite(wav).all():
        raise ValueError(f"{path}: refusing to write NaN or infinite samples")
    with audio_writer(path, sample_rate, wav.shape[0], subtype) as write:
        write(wav)
    return path


@contextlib.contextmanager
def audio_writer(path: str | os.PathLike, sample_rate: int, channels: int,
                 subtype: str | None = None) -> Iterator[Callable[[torch.Tensor], None]]:
    """Write audio block by block, in bounded memory: yields `write(block)` for float blocks [C, n], clipped
    to [-1, 1] as `save_audio`; the file (format from the suffix, wav default PCM_16) appears, complete,
    when the block ends without an error (written under a temporary name, then renamed)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").upper() or "WAV"
    if subtype is None and fmt == "WAV":
        subtype = "PCM_16"
    sf = _soundfile()
    if sf is None:
        raise RuntimeError(f"{path}: writing audio needs the soundfile package (pip install soundfile)")

    with atomic_path(path) as tmp, sf.SoundFile(str(tmp), "w", sample_rate, channels, subtype=subtype,
                                                format=fmt) as out:
        def write(block: torch.Tensor) -> None:
            block = block.detach().to("cpu", torch.float32)
            if not torch.isfinite(block).all():
                raise ValueError(f"{path}: refusing to write NaN or infinite samples")
            out.write(block.clamp(-1.0, 1.0).numpy().T)

        yield write


def _read(path: str | os.PathLike, start: int, frames: int, total: int | None = None) -> np.ndarray:
    """Samples start .. start + frames (-1: to the end) as float32 [S, C].

    total: the frame count the file's header declares. A read that ends more than
    `_SHORT_READ_TOLERANCE` short of what the header promises means the file was cut off (an MP3
    whose Xing/LAME header gives its length, a FLAC whose STREAMINFO does): AudioError, instead
    of silently returning the part that is left.
    """
    sf = _soundfile()
    errors = (RuntimeError, ValueError) if sf is None else (sf.LibsndfileError, RuntimeError, ValueError)
    try:
        if sf is None:
            data = pcm_wav.read(path, start, frames)
        else:
            data, _ = sf.read(str(path), start=start, frames=frames, dtype="float32", always_2d=True)
    except errors as e:
        raise AudioError(path, f"cannot decode audio ({_short(e)}); the file may be truncated or corrupt") from None
    if data.shape[0] == 0:
        raise AudioError(path, "no audio samples could be decoded (truncated or corrupt)")
    if total is not None:
        expected = total - start if frames < 0 else min(frames, total - start)
        if expected - data.shape[0] > max(_SHORT_READ_TOLERANCE, 0.01 * expected):
            raise AudioError(path, f"truncated: the header declares {total} samples, decoding stopped at "
                                   f"{start + data.shape[0]}")
    if not np.isfinite(data).all():
        raise AudioError(path, "contains NaN or infinite sample values")
    return data


# MP3 decoders may legitimately return up to a few frames (1,152 samples each) less than an
# estimated header count; a cut-off file misses far more.
_SHORT_READ_TOLERANCE = 4 * 1152


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return msg[-1] if msg else type(e).__name__
