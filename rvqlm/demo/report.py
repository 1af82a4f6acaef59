"""The listening report: one static HTML page with audio players and spectrograms side by side.

The page (`index.html`) references wav and png files by relative path, so the whole folder can be
opened from disk, zipped or served as is. Spectrograms are log-mel images drawn with matplotlib
(Agg backend, no display needed). All files are written atomically.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rvqlm_core.atomic import atomic_path, atomic_write_text


@dataclass
class ReportClip:
    """One audio clip on the page: a player, its spectrogram and a few figures under it."""

    label: str
    wav: Path  # relative to the report folder
    spectrogram: Path  # relative to the report folder
    metrics: dict[str, str] = field(default_factory=dict)


@dataclass
class Section:
    """One section of the page: its heading, the line under it (or the one line saying why it is
    left out), rows of clips shown side by side, and its table of figures (shown on top under
    `table_title`, and in the demo's metrics.json)."""

    title: str
    description: str
    rows: list[list[ReportClip]] = field(default_factory=list)
    table: list[dict[str, str]] = field(default_factory=list)
    table_title: str = ""


def render_spectrogram(wav: torch.Tensor, sample_rate: int, path: str | os.PathLike, title: str = "") -> Path:
    """Draw the log-mel spectrogram of `wav` `[C, S]` (channels averaged) into a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torchaudio.transforms as T

    mono = wav.detach().float().cpu().reshape(-1, wav.shape[-1]).mean(0)
    n_fft = 1024 if sample_rate >= 16000 else 512
    mel = T.MelSpectrogram(sample_rate, n_fft=n_fft, hop_length=n_fft // 4, n_mels=80)(mono)
    db = 10 * torch.log10(mel.clamp_min(1e-10))
    db = db.clamp_min(db.max() - 80)
    seconds = mono.shape[-1] / sample_rate
    fig, ax = plt.subplots(figsize=(4.8, 2.0), dpi=100)
    ax.imshow(db.numpy(), origin="lower", aspect="auto", cmap="magma", extent=(0, seconds, 0, 80))
    ax.set_xlabel("seconds", fontsize=7)
    ax.set_ylabel("mel bin", fontsize=7)
    ax.tick_params(labelsize=6)
    if title:
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


def write_clip(out_dir: str | os.PathLike, stem: str, wav: torch.Tensor, sample_rate: int, label: str,
               metrics: dict[str, str]) -> ReportClip:
    """Write one clip `[C, S]` as `audio/<stem>.wav` and its spectrogram as `img/<stem>.png` under
    `out_dir`, and describe it for the page."""
    from codec.core.audio import save_audio

    out = Path(out_dir)
    wav_rel, png_rel = Path("audio") / f"{stem}.wav", Path("img") / f"{stem}.png"
    save_audio(out / wav_rel, wav, sample_rate)
    render_spectrogram(wav, sample_rate, out / png_rel, title=label)
    return ReportClip(label, wav_rel, png_rel, metrics)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
.row { display: flex; gap: 1em; flex-wrap: wrap; margin: 1em 0; }
.clip { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em; width: 480px; }
.clip img { width: 100%; display: block; }
.clip audio { width: 100%; margin: 0.4em 0; }
.label { font-weight: 600; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.metrics { font-size: 0.85em; color: #555; }
"""


def write_report(
    out_dir: str | os.PathLike,
    title: str,
    sections: list[Section],
    tables: dict[str, list[dict[str, str]]] | None = None,
    notes: str = "",
) -> Path:
    """Write `out_dir/index.html` and return its path. Clip paths must exist inside out_dir.

    tables: named tables of metrics (each a list of rows, dicts with the same keys) shown on top.
    """
    out = Path(out_dir)
    for section in sections:
        for row in section.rows:
            for clip in row:
                for rel in (clip.wav, clip.spectrogram):
                    if not (out / rel).is_file():
                        raise FileNotFoundError(f"report clip file missing: {out / rel}")
    e = html.escape
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>"]
    if notes:
        parts.append(f"<p>{e(notes)}</p>")
    for name, rows in (tables or {}).items():
        if not rows:
            continue
        keys = list(rows[0].keys())
        parts.append(f"<h2>{e(name)}</h2><table><tr>" + "".join(f"<th>{e(k)}</th>" for k in keys) + "</tr>")
        for r in rows:
            parts.append("<tr>" + "".join(f"<td>{e(str(r.get(k, '')))}</td>" for k in keys) + "</tr>")
        parts.append("</table>")
    for section in sections:
        parts.append(f"<h2>{e(section.title)}</h2><p>{e(section.description)}</p>")
        for row in section.rows:
            parts.append("<div class='row'>")
            for clip in row:
                metrics = " &middot; ".join(f"{e(k)}: {e(str(v))}" for k, v in clip.metrics.items())
                parts.append(
                    "<div class='clip'>"
                    f"<div class='label'>{e(clip.label)}</div>"
                    f"<audio controls preload='metadata' src='{e(clip.wav.as_posix())}'></audio>"
                    f"<img alt='spectrogram: {e(clip.label)}' src='{e(clip.spectrogram.as_posix())}'>"
                    f"<div class='metrics'>{metrics}</div></div>"
                )
            parts.append("</div>")
    parts.append("</body></html>\n")
    path = out / "index.html"
    atomic_write_text(path, "\n".join(parts))
    return path
