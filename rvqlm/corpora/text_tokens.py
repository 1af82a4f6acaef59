"""Transcripts as tokens: the texts of an audio folder's `audiofolder` metadata written as an N_c = 1
token folder of UTF-8 bytes (the byte tokenizer of seed 002's first example), so that the LM that
models codec tokens trains on text unchanged (recipes/lm_text_bytes.yaml).

The folder has the usual token format (rvqlm_core.token_shards): N_c = 1, |V| = 256, one byte a
frame, each file's text followed by one newline byte (so a window sees where a line ends),
frame_rate 1 (a manifest "second" is a byte), and `TEXT_FINGERPRINT` where a codec's fingerprint
would be. Each file keeps its audio path (the corpus's train/ valid/ test/ prefixes still split it)
and its speaker as metadata. A file without a text has no tokens: errors.jsonl lists it ("no
text"), as it lists metadata rows that could not be attached; nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rvqlm_core.audio_metadata import read_folder_metadata
from rvqlm_core.shard_writer import ShardWriter, write_errors

TEXT_FINGERPRINT = hashlib.sha256(b"rvqlm text tokens v1: UTF-8 bytes, one byte a frame, lines end in a newline"
                                  ).hexdigest()
LINE_END = b"\n"


def text_token_meta() -> dict:
    """The codec.json description of a text token folder (see the module docstring)."""
    return {"fingerprint": TEXT_FINGERPRINT, "n_codebooks": 1, "codebook_size": 256, "sample_rate": 1,
            "frame_rate": 1.0, "codec_config": {"tokenizer": "utf-8 bytes", "line_end": LINE_END.decode()}}


def text_to_tokens(text: str) -> np.ndarray:
    """A text -> its UTF-8 bytes and the line end as tokens [n_bytes + 1, 1] (uint8)."""
    return np.frombuffer(text.encode("utf-8") + LINE_END, dtype=np.uint8).reshape(-1, 1).copy()


@dataclass
class TextTokenSummary:
    """files: audio files found; written: files with tokens; bytes: tokens written; errors:
    errors.jsonl's rows (files without a text, metadata rows that could not be attached)."""

    files: int = 0
    written: int = 0
    bytes: int = 0
    errors: list[dict] = field(default_factory=list)


def write_text_tokens(audio_dir: str | os.PathLike, out_dir: str | os.PathLike, text_field: str = "text"
                      ) -> TextTokenSummary:
    """The `text_field` of every audio file under `audio_dir` (its metadata.jsonl / .csv) as a new text
    token folder at `out_dir` (seconds to write: never resumed, an existing folder is refused).
    Raises ValueError for metadata that cannot be parsed, FileNotFoundError without an audio folder."""
    from codec.tokenize.audio_folder import find_audio_files

    root, out = Path(audio_dir), Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another output folder")
    files = [f.rel for f in find_audio_files(root, exclude=out)]
    if not files:
        raise ValueError(f"{root} holds no audio files, so it has no transcripts to write")
    found = read_folder_metadata(root, files, exclude=out)
    summary = TextTokenSummary(files=len(files), errors=list(found.errors))
    listed = {row["path"] for row in found.errors}  # files whose metadata row was bad: in errors.jsonl already
    with ShardWriter(out, text_token_meta()) as writer:
        for rel in (f for f in files if f not in listed):
            columns = found.by_path.get(rel, {})
            text = columns.get(text_field)
            if text is not None and not isinstance(text, str):
                summary.errors.append({"path": rel, "reason": f"{text_field!r} is a {type(text).__name__}, "
                                                              "not a string", "kind": "metadata"})
            elif not text:
                summary.errors.append({"path": rel, "reason": f"no text (its metadata has no {text_field!r})",
                                       "kind": "no text"})
            else:
                tokens = text_to_tokens(text)
                speaker = columns.get("speaker")  # a string or absent (audio_metadata refuses other rows)
                writer.add(rel, tokens, seconds=float(len(tokens)), metadata={"speaker": speaker} if speaker else None)
                summary.bytes += len(tokens)
    write_errors(out, summary.errors)
    summary.written = len(writer.done)
    return summary
