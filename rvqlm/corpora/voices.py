"""A second real-speech corpus for the codec: other speakers, languages and studios, from Debian's
`asterisk-core-sounds-*-g722` packages (16 kHz G.722 telephony prompts; CC-BY-SA-3.0 and CC-BY-3.0)
and the voice packs of `hedgewars-data` (acted game taunts, Ogg Vorbis at 44.1/48 kHz; GFDL-1.3).

Speakers and their role (a speaker is never split between training and test):

* train (1 file in 10 to valid, by a hash of its name): fr-CA June (woman) and the hedgewars packs
  in VOICE_PACKS (English accents, es, pl, ru, uk);
* test, never trained or validated on: ru-RU Ivrvoice (woman), en-US and es-MX Allison (woman,
  one speaker in two languages): the foreign-speaker set; it-IT Carlo (a man), tested alone.

Left out of the hedgewars packs: Robot (a robotized voice: pitch held within half a semitone,
channels decorrelated by the effect) and Singer (sung with a pitch steady to the sample); the
non-verbal taunts (NOT_SPEECH_TAUNTS: grunts, pain cries, laughs, coughs); a file whose bytes
another pack already holds (the packs share some); clips under MIN_SECONDS or silent (skipped,
listed in corpus.json's `skipped`).

Layout written (the same as the built-in corpus, so every corpus reader takes it)::

    OUT/corpus.json
    OUT/{train,valid,test}/SPEAKER/[SUBFOLDER/]NAME.wav     (SPEAKER hedgewars_PACK for a pack)
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from codec.core.audio import AudioError, load_audio
from rvqlm.corpora.folder import CorpusError, CorpusFile, write_corpus

ASTERISK_SOUNDS = Path(os.environ.get("RVQLM_ASTERISK_DIR", "/usr/share/asterisk/sounds"))
HEDGEWARS_VOICES = Path(os.environ.get("RVQLM_HEDGEWARS_DIR", "/usr/share/games/hedgewars/Data/Sounds/voices"))
DEFAULT_VOICES_DIR = Path("data/voices-16k")
VOICES_VERSION = 4  # 4: it-IT Carlo moved from train to test
NOT_SPEECH = ("silence",)  # subfolders of the packages that hold no voice
# speaker folder under ASTERISK_SOUNDS -> (Debian package, role)
SPEAKERS = {
    "fr_CA_f_June": ("asterisk-core-sounds-fr-g722", "train"),
    "it_IT_m_Carlo": ("asterisk-core-sounds-it-g722", "test"),
    "ru_RU_f_IvrvoiceRU": ("asterisk-core-sounds-ru-g722", "test"),
    "en_US_f_Allison": ("asterisk-core-sounds-en-g722", "test"),
    "es_MX_f_Allison": ("asterisk-core-sounds-es-g722", "test"),
}
HEDGEWARS_PACKAGE = "hedgewars-data"
# the packs under HEDGEWARS_VOICES taken (all train/valid); Robot and Singer are left out (see above)
VOICE_PACKS = ("British", "Classic", "Default", "Default_es", "Default_pl", "Default_ru", "Default_uk",
               "HillBilly", "Mobster", "Pirate", "Russian", "Russian_pl", "Surfer")
PACK_PREFIX = "hedgewars_"
# taunt file stems (less a trailing number) that are no words: Jump1..3, Ooff1..3, Ow1..4, ...
NOT_SPEECH_TAUNTS = ("Hmm", "Jump", "Laugh", "Ooff", "Ow", "PoisonCough", "PoisonMoan")
MIN_SECONDS = 0.3  # a shorter pack clip is skipped
SILENT_PEAK = 1e-3  # a pack clip whose peak is under -60 dBFS is skipped


def split_of_voice(role: str, name: str) -> str:
    """A test speaker's files are all test; a training speaker's go 1 in 10 to valid by sha256(name)."""
    if role == "test":
        return "test"
    return "valid" if hashlib.sha256(name.encode()).digest()[0] % 10 == 0 else "train"


def list_voice_files(sounds_dir: Path = ASTERISK_SOUNDS, packs_dir: Path = HEDGEWARS_VOICES) -> list[CorpusFile]:
    """Every prompt of the speakers in SPEAKERS (not the `silence/` files), then every spoken taunt
    of VOICE_PACKS, with its split. Raises CorpusError naming the packages to install when a
    speaker or pack is missing."""
    missing = [pkg for speaker, (pkg, _) in SPEAKERS.items() if not (sounds_dir / speaker).is_dir()]
    if any(not (packs_dir / pack).is_dir() for pack in VOICE_PACKS):
        missing.append(HEDGEWARS_PACKAGE)
    if missing:
        raise CorpusError(f"the voices corpus needs the Debian packages {' '.join(missing)} "
                          f"(under {sounds_dir} and {packs_dir}); install them with `make voices`")
    files = []
    for speaker, (_, role) in SPEAKERS.items():
        for src in sorted((sounds_dir / speaker).rglob("*.g722")):
            name = src.relative_to(sounds_dir / speaker).with_suffix(".wav").as_posix()
            if name.split("/")[0] in NOT_SPEECH:
                continue
            split = split_of_voice(role, name)
            files.append(CorpusFile(split, speaker, src, f"{split}/{speaker}/{name}"))
    return files + list_pack_files(packs_dir)


def is_speech_taunt(stem: str) -> bool:
    """Whether a taunt file stem ("Amazing", "Ow3") is words rather than a grunt, cry or laugh."""
    return re.sub(r"\d+$", "", stem) not in NOT_SPEECH_TAUNTS


def list_pack_files(packs_dir: Path = HEDGEWARS_VOICES) -> list[CorpusFile]:
    """The spoken taunts of VOICE_PACKS (train/valid by sha256 of "hedgewars_PACK/NAME.wav"); a
    file with the same bytes as one listed before is left out."""
    files, seen = [], set()
    for pack in VOICE_PACKS:
        speaker = PACK_PREFIX + pack
        for src in sorted((packs_dir / pack).glob("*.ogg")):
            digest = hashlib.sha256(src.read_bytes()).digest()
            if not is_speech_taunt(src.stem) or digest in seen:
                continue
            seen.add(digest)
            name = f"{speaker}/{src.stem}.wav"
            split = split_of_voice("train", name)
            files.append(CorpusFile(split, speaker, src, f"{split}/{name}"))
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


def decode_pack_clip(source: Path, sample_rate: int) -> torch.Tensor:
    """A voice-pack clip (Ogg Vorbis, stereo or mono) -> [1, S] at `sample_rate`; AudioError when it
    is shorter than MIN_SECONDS or silent (peak under SILENT_PEAK)."""
    wav = load_audio(source, sample_rate, 1)
    seconds = wav.shape[-1] / sample_rate
    if seconds < MIN_SECONDS:
        raise AudioError(source, f"too short for the corpus ({seconds:.2f} s < {MIN_SECONDS} s)")
    if float(wav.abs().max()) < SILENT_PEAK:
        raise AudioError(source, f"silent (peak under {SILENT_PEAK})")
    return wav


def decode_voice(source: Path, sample_rate: int) -> torch.Tensor:
    """Either source of the corpus -> [1, S]: a `.g722` prompt or a voice-pack clip."""
    return decode_g722(source, sample_rate) if source.suffix == ".g722" else decode_pack_clip(source, sample_rate)


def prepare_voices(out_dir: str | os.PathLike = DEFAULT_VOICES_DIR, sample_rate: int = 16000, *,
                   max_files_per_split: int | None = None, sounds_dir: Path = ASTERISK_SOUNDS,
                   packs_dir: Path = HEDGEWARS_VOICES, progress: bool = True) -> Path:
    """Decode and split the voices corpus into `out_dir` (resumable); return `out_dir`."""
    settings = {"version": VOICES_VERSION, "sample_rate": sample_rate, "max_files_per_split": max_files_per_split,
                "speakers": {s: role for s, (_, role) in SPEAKERS.items()},
                "voice_packs": list(VOICE_PACKS), "min_seconds": MIN_SECONDS}
    return write_corpus(out_dir, lambda: list_voice_files(sounds_dir, packs_dir), settings,
                        name="asterisk-core-sounds-g722 + hedgewars-data voices",
                        license="CC-BY-SA-3.0 (asterisk en, es, fr), CC-BY-3.0 (asterisk it, ru), GFDL-1.3 (hedgewars)",
                        decode=decode_voice, progress=progress)
