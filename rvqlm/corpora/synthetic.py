"""The built-in corpus plus synthetic transcribed speech: each train and valid line's Czech text also
spoken by VOICES, six espeak-ng voices (formant synthesis; Debian `espeak-ng`, GPL-3+). Volume for
a conditioned LM to learn who speaks and what is said from; never a test file, and never a measure
of speech quality.

Layout written (the built-in corpus's, so every corpus reader takes it)::

    OUT/corpus.json
    OUT/{train,valid,test}/LEVEL/NAME.wav          the built-in corpus's files (decoded again)
    OUT/{train,valid}/VOICE/LEVEL-NAME.wav         the same line in a synthetic voice
    OUT/{train,valid,test}/metadata.jsonl          text, text_en and speaker (VOICE for synthetic files)
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import soundfile as sf
import torch
import torchaudio

from codec.core.audio import AudioError, load_audio
from rvqlm.corpora.fillets import DEFAULT_CORPUS_DIR
from rvqlm.corpora.folder import METADATA, SPLITS, CorpusError, CorpusFile, read_corpus_json, write_corpus, \
    write_if_changed

DEFAULT_SYNTHETIC_DIR = Path("data/fillets-synth-cs-16k")
SYNTHETIC_VERSION = 1
# speaker name -> (espeak-ng voice, words per minute, pitch 0-99): three men's and three women's variants
VOICES = {"synth-m1": ("cs+m1", 165, 40), "synth-m3": ("cs+m3", 150, 30), "synth-m7": ("cs+m7", 180, 55),
          "synth-f2": ("cs+f2", 160, 60), "synth-f4": ("cs+f4", 145, 70), "synth-f5": ("cs+f5", 175, 50)}
PEAK = 0.5  # synthetic files are scaled to this peak


def espeak(text: str, voice: str, sample_rate: int) -> torch.Tensor:
    """`text` spoken by VOICES[voice] -> [1, S] float at `sample_rate`, peak PEAK (AudioError on failure)."""
    name, speed, pitch = VOICES[voice]
    try:
        out = subprocess.run(["espeak-ng", "--stdin", "--stdout", "-v", name, "-s", str(speed), "-p", str(pitch)],
                             input=text.encode("utf-8"), capture_output=True, timeout=60)
    except FileNotFoundError:
        raise CorpusError("espeak-ng is not installed (Debian package espeak-ng; scripts/system_deps.sh installs it)")
    if out.returncode != 0 or not out.stdout:
        why = out.stderr.decode(errors="replace")[:200]
        raise AudioError(f"espeak-ng {name}", f"no audio for {text[:40]!r}: {why}")
    wav, rate = sf.read(io.BytesIO(out.stdout), dtype="float32", always_2d=True)
    x = torchaudio.functional.resample(torch.from_numpy(wav.T.copy()).mean(0, keepdim=True), rate, sample_rate)
    peak = float(x.abs().max())
    if peak < 1e-4:
        raise AudioError(f"espeak-ng {name}", f"silence for {text[:40]!r}")
    return x * (PEAK / peak)


def synthetic_relpath(relpath: str, voice: str) -> str:
    """train/airplane/let-m-oko.wav, synth-f2 -> train/synth-f2/airplane-let-m-oko.wav"""
    split, level, name = relpath.split("/", 2)
    return f"{split}/{voice}/{level}-{name.replace('/', '-')}"


def _rows(corpus: Path, split: str) -> list[dict]:
    path = corpus / split / METADATA
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def prepare_synthetic(out_dir: str | os.PathLike = DEFAULT_SYNTHETIC_DIR, corpus_dir: str | os.PathLike =
                      DEFAULT_CORPUS_DIR, *, voices: tuple[str, ...] = tuple(VOICES), progress: bool = True) -> Path:
    """Write the corpus of the module docstring from a prepared built-in corpus (with its
    metadata.jsonl) into `out_dir`; resumable, and a folder made from other settings is refused."""
    corpus, out = Path(corpus_dir), Path(out_dir)
    meta = read_corpus_json(corpus)
    rows = {split: _rows(corpus, split) for split in SPLITS}
    if not any(r.get("text") for split in ("train", "valid") for r in rows[split]):
        raise CorpusError(f"{corpus} has no transcripts (metadata.jsonl with text); run `rvqlm corpus prepare fillets` with "
                          "Debian's fillets-ng-data installed")
    unknown = sorted(set(voices) - set(VOICES))
    if unknown:
        raise CorpusError(f"unknown synthetic voice(s) {unknown}; choose from {sorted(VOICES)}")
    rate = meta["settings"]["sample_rate"]
    settings = {"sample_rate": rate, "synthetic_of": str(corpus.resolve()), "corpus_settings": meta["settings"],
                "voices": {v: list(VOICES[v]) for v in voices}, "version": SYNTHETIC_VERSION}
    files = [CorpusFile(e["split"], e["level"], corpus / e["path"], e["path"]) for e in meta["files"]]
    spoken, out_rows = {}, {split: list(rows[split]) for split in SPLITS}
    for split in ("train", "valid"):
        for row in rows[split]:
            if not row.get("text"):
                continue
            for voice in voices:
                relpath = synthetic_relpath(f"{split}/{row['file_name']}", voice)
                source = Path("espeak-ng") / relpath
                spoken[source] = (row["text"], voice)
                files.append(CorpusFile(split, voice, source, relpath))
                name = relpath.split("/", 1)[1]
                out_rows[split].append({"file_name": name, "text": row["text"], "text_en": row.get("text_en", ""),
                                        "speaker": voice})

    def decode(source: Path, sample_rate: int) -> torch.Tensor:
        if source in spoken:
            return espeak(*spoken[source], sample_rate)
        return load_audio(source, sample_rate, 1)

    write_corpus(out, lambda: files, settings, name="fillets-cs plus espeak-ng voices",
                 license="GPL-2+ (fillets-ng-data-cs); synthetic files: espeak-ng output", decode=decode,
                 progress=progress)
    kept = {e["path"] for e in json.loads((out / "corpus.json").read_text())["files"]}
    for split in SPLITS:
        lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in out_rows[split]
                 if f"{split}/{r['file_name']}" in kept]
        if lines:
            write_if_changed(out / split / METADATA, "".join(lines))
    return out
