"""A second real-speech corpus for the codec: other speakers, languages and studios, from Debian's
`asterisk-core-sounds-*-g722` packages (16 kHz G.722 telephony prompts; CC-BY-SA-3.0 and CC-BY-3.0).

Speakers and their role (a speaker is never split between training and test):

* train (1 file in 10 to valid, by a hash of its name): fr-CA June (woman), it-IT Carlo (man);
* test, never trained or validated on: ru-RU Ivrvoice (woman), en-US and es-MX Allison (woman,
  one speaker in two languages).

Layout written (the same as the built-in corpus, so every corpus reader takes it)::

    OUT/corpus.json
    OUT/{train,valid,test}/SPEAKER/[SUBFOLDER/]NAME.wav
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from codec.audio import AudioError, load_audio
from rvqlm.corpus import CorpusError, CorpusFile, write_corpus

ASTERISK_SOUNDS = Path(os.environ.get("RVQLM_ASTERISK_DIR", "/usr/share/asterisk/sounds"))
DEFAULT_VOICES_DIR = Path("data/voices-16k")
VOICES_VERSION = 2
NOT_SPEECH = ("silence",)  # subfolders of the packages that hold no voice
# speaker folder under ASTERISK_SOUNDS -> (Debian package, role)
SPEAKERS = {
    "fr_CA_f_June": ("asterisk-core-sounds-fr-g722", "train"),
    "it_IT_m_Carlo": ("asterisk-core-sounds-it-g722", "train"),
    "ru_RU_f_IvrvoiceRU": ("asterisk-core-sounds-ru-g722", "test"),
    "en_US_f_Allison": ("asterisk-core-sounds-en-g722", "test"),
    "es_MX_f_Allison": ("asterisk-core-sounds-es-g722", "test"),
}


def split_of_voice(role: str, name: str) -> str:
    """A test speaker's files are all test; a training speaker's go 1 in 10 to valid by sha256(name)."""
    if role == "test":
        return "test"
    return "valid" if hashlib.sha256(name.encode()).digest()[0] % 10 == 0 else "train"


def list_voice_files(sounds_dir: Path = ASTERISK_SOUNDS) -> list[CorpusFile]:
    """Every prompt of the speakers in SPEAKERS (not the `silence/` files), with its split. Raises
    CorpusError naming the packages to install when a speaker is missing."""
    missing = [pkg for speaker, (pkg, _) in SPEAKERS.items() if not (sounds_dir / speaker).is_dir()]
    if missing:
        raise CorpusError(f"the voices corpus needs the Debian packages {' '.join(missing)} "
                          f"(under {sounds_dir}); install them with `make voices`")
    files = []
    for speaker, (_, role) in SPEAKERS.items():
        for src in sorted((sounds_dir / speaker).rglob("*.g722")):
            name = src.relative_to(sounds_dir / speaker).with_suffix(".wav").as_posix()
            if name.split("/")[0] in NOT_SPEECH:
                continue
            split = split_of_voice(role, name)
            files.append(CorpusFile(split, speaker, src, f"{split}/{speaker}/{name}"))
    return files


def decode_g722(source: Path, sample_rate: int) -> torch.Tensor:
    """A raw G.722 file -> [1, S] float at `sample_rate` (ffmpeg decodes, load_audio resamples)."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "decoded.wav"
        result = subprocess.run(["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-f", "g722",
                                 "-i", str(source), str(wav)], capture_output=True, text=True)
        if result.returncode != 0 or not wav.is_file():
            raise AudioError(str(source), f"ffmpeg could not decode it as G.722: {result.stderr.strip()[:200]}")
        return load_audio(wav, sample_rate, 1)


def prepare_voices(out_dir: str | os.PathLike = DEFAULT_VOICES_DIR, sample_rate: int = 16000, *,
                   max_files_per_split: int | None = None, sounds_dir: Path = ASTERISK_SOUNDS,
                   progress: bool = True) -> Path:
    """Decode and split the voices corpus into `out_dir` (resumable); return `out_dir`."""
    settings = {"version": VOICES_VERSION, "sample_rate": sample_rate, "max_files_per_split": max_files_per_split,
                "speakers": {s: role for s, (_, role) in SPEAKERS.items()}}
    return write_corpus(out_dir, lambda: list_voice_files(sounds_dir), settings, name="asterisk-core-sounds-g722",
                        license="CC-BY-SA-3.0 (en, es, fr), CC-BY-3.0 (it, ru)", decode=decode_g722, progress=progress)
