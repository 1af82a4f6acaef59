"""Which tokens can carry the words (issues 47, 48): oracles on held-out lines, read by a recognizer.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/words_oracle.py [--corpus data/fillets-cs-16k]
        [--codec models/codec-speech-16k] [--aligner runs/aligner] [--alignments FILE]
        [--lines-per-speaker 20] [--rows trunc-2 semantic-2 context-2 text-pitch text] [--steps 2500]
        [--extra-corpus data/fillets-synth-cs-16k] [--threads 2] [--json FILE]

Needs `pip install -e '.[bench]'`, an aligner (`rvqlm train-aligner`) and the forced alignments of the
corpus's train, valid and test lines (`rvqlm align`; default: the synthetic corpus's token folder's
alignments.jsonl, which holds the real lines too). Lines: `benchmarks/intelligibility.py`'s first
--lines-per-speaker of each fish in the test split. Every row rebuilds each line's codec latent
[T, D] (the codec's own encoder on the recording; level 0 its pitch grid) and synthesizes it with the
codec's decoder; Whisper base transcribes it. Fitted on the corpus's train split:
* trunc-2: level 0 and one envelope codebook of 1024, k-means of the envelope (the shipped layout's
  first two levels, refitted on these frames);
* semantic-2: that codebook's index from k-means of the aligner's hidden states (its bidirectional
  GRU: a semantic first level as Mimi distills one, with the teacher's own states, the ceiling of a
  distilled student), its vector the mean envelope of its frames;
* context-2: semantic-2's codes through a learned non-causal decoder (pitch and codes -> envelope);
* text-pitch: the envelope regressed from the forced alignment (units on frames), the speaker and
  the true pitch (FastSpeech 2's acoustic model given true durations and pitch);
* text: the same regressing the pitch too (the text, its durations and the speaker alone).
The regressions are 1-D convolution stacks trained by squared error on the latent (--steps; with
--extra-corpus also on its train lines of other speakers, e.g. the synthetic corpus's espeak-ng voices).
Prints pooled CER / WER per row and the held-out envelope error; the JSON keeps every transcript.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rvqlm.cli import run_script

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks/ is a package of the repository
    sys.path.insert(0, str(REPO))

ROWS = ("trunc-2", "semantic-2", "context-2", "text-pitch", "text")
CODES = 1024
ALIGNMENTS = "data/tokens/fillets-synth-cs-16k-2335577b91b5/alignments.jsonl"


@dataclass
class Item:
    speaker: str
    latent: torch.Tensor  # [T, D]: pitch, then the envelope's parameters
    hidden: torch.Tensor  # [T, H]: the aligner's states ([T, 0] without them)
    units: torch.Tensor | None = None  # [T]: the aligned unit of each frame


@torch.inference_mode()
def analyse(codec, aligner, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One recording -> (the codec latent [T, D], the aligner's hidden states [T, H] or [T, 0])."""
    from codec.core.audio import load_audio
    from rvqlm.align.features import log_mel

    wav = load_audio(path, codec.sample_rate, 1)
    latent = codec.encoder(codec.pad_to_hop(wav[None]))[0].T
    if aligner is None:
        return latent.clone(), latent.new_zeros(len(latent), 0)
    hidden = aligner.states(log_mel(wav)[None])[0]
    t = min(len(latent), len(hidden))
    return latent[:t].clone(), hidden[:t].clone()


def frame_units(row: dict, frames: int, alphabet: dict[str, int]) -> torch.Tensor | None:
    """An alignments.jsonl row -> the unit id of each frame (None when its durations miss `frames`)."""
    ids = [alphabet.setdefault(u, len(alphabet)) for u, d in zip(row["units"], row["durations"]) for _ in range(d)]
    return torch.tensor(ids) if len(ids) == frames else None


def load_items(corpus: str, split: str, codec, aligner, alignments: dict, alphabet: dict, rows=None,
               speakers=None) -> list[Item]:
    from benchmarks.intelligibility import read_metadata

    rows = read_metadata(Path(corpus) / split) if rows is None else rows
    items = []
    for r in rows:
        if speakers is not None and not speakers(r.get("speaker")):
            continue
        latent, hidden = analyse(codec, aligner, Path(corpus) / split / r["file_name"])
        al = alignments.get(f"{split}/{r['file_name']}")  # alignments.jsonl names a line split/file_name
        items.append(Item(r.get("speaker") or "", latent, hidden,
                          None if al is None else frame_units(al, len(latent), alphabet)))
    return items


# ---- codebooks ----------------------------------------------------------------------------------------

class FirstLevels:
    """Level 0 (the codec's pitch grid) and one envelope codebook; `semantic` [V, H] picks its index from the
    aligner's states (centred by `mean`) instead of the envelope."""

    def __init__(self, pitch: torch.Tensor, book: torch.Tensor, semantic=None, mean=None):
        self.pitch, self.book, self.semantic, self.mean = pitch, book, semantic, mean

    @classmethod
    def fit(cls, items: list[Item], pitch: torch.Tensor, semantic: bool, iters: int) -> "FirstLevels":
        from codec.core.quantizer import kmeans, nearest_codes

        latent = torch.cat([it.latent for it in items])
        residual = latent - pitch[nearest_codes(latent, pitch)]
        if not semantic:
            return cls(pitch, kmeans(residual, CODES, iters)[0])
        hidden = torch.cat([it.hidden for it in items])
        mean = hidden.mean(0)
        centres, _ = kmeans(hidden - mean, CODES, iters)
        code = nearest_codes(hidden - mean, centres)
        count = torch.bincount(code, minlength=CODES).clamp(min=1).to(latent.dtype)
        book = torch.zeros(CODES, latent.shape[1]).index_add_(0, code, residual) / count[:, None]
        return cls(pitch, book, centres, mean)

    def codes(self, item: Item) -> torch.Tensor:
        """[2, T]: level 0 and level 1."""
        from codec.core.quantizer import nearest_codes

        c0 = nearest_codes(item.latent, self.pitch)
        if self.semantic is None:
            c1 = nearest_codes(item.latent - self.pitch[c0], self.book)
        else:
            c1 = nearest_codes(item.hidden - self.mean, self.semantic)
        return torch.stack([c0, c1])

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        return self.pitch[codes[0]] + self.book[codes[1]]


# ---- regressions --------------------------------------------------------------------------------------

class Regression(nn.Module):
    """Per-frame inputs (summed embeddings) -> a 1-D convolution stack (pre-norm residual, kernel 5, not
    causal) -> the latent's channels from `first` on [B, T, D - first]."""

    def __init__(self, dim: int, first: int, inputs: dict[str, int], width: int = 256, layers: int = 6):
        super().__init__()
        self.first = first
        self.embed = nn.ModuleDict({k: nn.Embedding(n, width) for k, n in inputs.items()})
        self.pitch = nn.Linear(1, width) if first == 1 else None
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.convs = nn.ModuleList(nn.Conv1d(width, width, 5, padding=2) for _ in range(layers))
        self.out = nn.Linear(width, dim - first)

    def forward(self, inputs: dict[str, torch.Tensor], pitch: torch.Tensor) -> torch.Tensor:
        """inputs: name -> ids [B, T]; pitch [B, T] (the latent's channel 0, used when first == 1)."""
        x = sum(e(inputs[k]) for k, e in self.embed.items())
        if self.pitch is not None:
            x = x + self.pitch(pitch[..., None] / 4)
        x = x.transpose(1, 2)
        for norm, conv in zip(self.norms, self.convs):
            x = x + F.gelu(conv(norm(x.transpose(1, 2)).transpose(1, 2)))
        return self.out(x.transpose(1, 2))


def train_regression(model: Regression, examples: list[tuple[dict, torch.Tensor]], steps: int, seed: int,
                     window: int = 96, batch: int = 32, lr: float = 2e-3) -> Regression:
    """examples: (inputs name -> ids [T], latent [T, D]); AdamW, warmup 100 steps, cosine decay."""
    gen = torch.Generator().manual_seed(seed)
    usable = [e for e in examples if len(e[1]) >= window]
    opt = torch.optim.AdamW(model.parameters(), lr, weight_decay=0.01)
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / steps))
        picks = torch.randint(len(usable), (batch,), generator=gen).tolist()
        starts = [int(torch.randint(len(usable[i][1]) - window + 1, (1,), generator=gen)) for i in picks]
        inputs = {k: torch.stack([usable[i][0][k][s:s + window] for i, s in zip(picks, starts)]) for k in usable[0][0]}
        latent = torch.stack([usable[i][1][s:s + window] for i, s in zip(picks, starts)])
        loss = (model(inputs, latent[..., 0]) - latent[..., model.first:]).pow(2).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 500 == 0 or step == steps - 1:
            print(f"  step {step}: squared error {loss.item():.3f}", flush=True)
    return model.eval()


@torch.no_grad()
def regress(model: Regression, inputs: dict, latent: torch.Tensor) -> torch.Tensor:
    """The model's latent [T, D] of one line: its true pitch kept where the model does not predict it."""
    out = model({k: v[None] for k, v in inputs.items()}, latent[None, :, 0])[0]
    return out if model.first == 0 else torch.cat([latent[:, :1], out], 1)


# ---- rows ---------------------------------------------------------------------------------------------

def row_latents(row: str, train: list[Item], test: list[Item], args) -> list[torch.Tensor]:
    """The row's latent [T, D] of each test line."""
    from codec.source_filter.parts import pitch_codebook

    pitch = pitch_codebook(CODES, train[0].latent.shape[1])
    speakers = {s: i for i, s in enumerate(sorted({it.speaker for it in train}))}
    if row in ("trunc-2", "semantic-2", "context-2"):
        levels = FirstLevels.fit([it for it in train if it.hidden.shape[1] or row == "trunc-2"], pitch,
                                 row != "trunc-2", args.kmeans_iters)
        codes = [levels.codes(it) for it in test]
        if row != "context-2":
            return [levels.latent(c) for c in codes]
        model = Regression(train[0].latent.shape[1], 1, {"code": CODES})
        examples = [({"code": levels.codes(it)[1]}, it.latent) for it in train if it.hidden.shape[1]]
        train_regression(model, examples, args.steps, args.seed)
        return [regress(model, {"code": c[1]}, it.latent) for c, it in zip(codes, test)]
    first = 1 if row == "text-pitch" else 0
    model = Regression(train[0].latent.shape[1], first, {"unit": 256, "speaker": max(len(speakers), 1)})
    examples = [({"unit": it.units, "speaker": torch.full_like(it.units, speakers[it.speaker])}, it.latent)
                for it in train if it.units is not None]
    train_regression(model, examples, args.steps, args.seed)
    return [regress(model, {"unit": it.units, "speaker": torch.full_like(it.units, speakers.get(it.speaker, 0))},
                    it.latent) for it in test]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="data/fillets-cs-16k")
    p.add_argument("--codec", default="models/codec-speech-16k")
    p.add_argument("--aligner", default="runs/aligner", help="an aligner folder (rvqlm train-aligner)")
    p.add_argument("--alignments", default=ALIGNMENTS, help="alignments.jsonl holding the corpus's lines")
    p.add_argument("--extra-corpus", default=None, help="also train the text rows on this corpus's train lines of "
                   "speakers not in --corpus")
    p.add_argument("--lines-per-speaker", type=int, default=20)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    p.add_argument("--steps", type=int, default=2500, help="training steps of each regression")
    p.add_argument("--kmeans-iters", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default="runs/words_oracle.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    return run(args)


def run(args) -> int:
    from benchmarks.intelligibility import FISH, pick_lines, read_metadata
    from codec.loading import load_codec
    from rvqlm.align.ctc import CTCAligner
    from rvqlm.quality.asr import WhisperASR, error_counts, pooled_rates
    from rvqlm_core.atomic import atomic_write_json

    t0 = time.perf_counter()
    asr = WhisperASR(language="cs", threads=args.threads)
    codec = load_codec(args.codec)
    aligner = CTCAligner.from_pretrained(args.aligner) if {"semantic-2", "context-2"} & set(args.rows) else None
    path = Path(args.alignments)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no alignments (rvqlm align TOKENS --corpus CORPUS --aligner DIR)")
    alignments = {r["path"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if r}
    alphabet: dict[str, int] = {}
    train = load_items(args.corpus, "train", codec, aligner, alignments, alphabet)
    if args.extra_corpus:
        own = {it.speaker for it in train}
        train += load_items(args.extra_corpus, "train", codec, None, alignments, alphabet,
                            speakers=lambda s: bool(s) and s not in own)
    lines = pick_lines(read_metadata(Path(args.corpus) / "test"), FISH, args.lines_per_speaker)
    test = load_items(args.corpus, "test", codec, aligner, alignments, alphabet,
                      rows=[{"file_name": x.file, "speaker": x.speaker} for x in lines])
    print(f"{len(train)} train lines ({sum(len(it.latent) for it in train)} frames), {len(test)} test lines; "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    results = {}
    for row in args.rows:
        latents = row_latents(row, train, test, args)
        counts, transcripts, error = [], [], 0.0
        first = 0 if row == "text" else 1  # the channels the row rebuilds (the others keep the true pitch)
        for line, item, z in zip(lines, test, latents):
            error += (z[:, first:] - item.latent[:, first:]).pow(2).sum().item()
            with torch.inference_mode():
                wav = codec.decoder(z.T[None].float())[0, 0].numpy()
            heard = asr.transcribe(wav)
            counts.append(error_counts(line.text, heard))
            transcripts.append({"file": line.file, "speaker": line.speaker, "text": line.text, "heard": heard})
        cer, wer = pooled_rates(counts)
        frames = sum(len(it.latent) for it in test)
        results[row] = {"cer": cer, "wer": wer, "squared_error": error / frames, "lines": transcripts}
        print(f"{row}: CER {cer:.3f}  WER {wer:.3f}  squared error {error / frames:.3f}  "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        atomic_write_json(args.json, {"settings": vars(args), "rows": results})
    return 0


if __name__ == "__main__":
    run_script(main, "words_oracle")
