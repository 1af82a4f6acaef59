"""Train the aligner's CTC model on a corpus folder's own lines (`rvqlm train-aligner`).

Reads CORPUS/{train,valid}/metadata.jsonl (audiofolder rows: file_name relative to the split
folder, text); rows without a text, or whose text has no letter or digit, are skipped. Features are
computed once and kept in memory (9 h at 50 Hz x 80 floats is ~100 MB). Batches hold utterances of
nearly the same length (sorted, cut into groups, the groups shuffled). AdamW with a short warmup and
a cosine decay, for a fixed number of steps; the model folder is saved every `save_every` steps (a
killed run keeps the last one) and at the end. Validation prints the CTC loss and the greedy
decoding's character error rate (CER: edit distance over the reference's units, spaces included).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lm.text_units import build_alphabet, normalize, unit_ids
from rvqlm.align.ctc import BLANK, AlignerConfig, CTCAligner, greedy_decode
from rvqlm.align.durations import feasible
from rvqlm.align.features import SAMPLE_RATE, log_mel
from rvqlm.quality.asr import levenshtein

METADATA = "metadata.jsonl"


@dataclass
class Example:
    path: str
    feats: torch.Tensor  # [T, n_mels]
    targets: list[int]  # unit ids without the two edges: CTC classes


@dataclass
class TrainSettings:
    steps: int = 1000  # ~1 s a step on one thread of the shared 2-core machine: ~17 min
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 100
    save_every: int = 250
    eval_every: int = 500
    eval_lines: int = 400  # valid lines per evaluation during training (all of them at the end)
    seed: int = 0
    init: str | None = None  # a saved aligner to start from (its alphabet must be the corpus's)


def read_lines(corpus_dir: str | os.PathLike, split: str) -> tuple[list[tuple[str, str]], int]:
    """(relpath, text) of the rows of CORPUS/split/metadata.jsonl whose text has units, and the
    number of rows skipped (no text, or nothing to say)."""
    path = Path(corpus_dir) / split / METADATA
    if not Path(corpus_dir).is_dir():
        raise FileNotFoundError(f"no corpus folder at {corpus_dir}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the aligner trains on a corpus whose split folders have "
                                f"texts in {METADATA} (e.g. `rvqlm corpus prepare fillets`)")
    rows, skipped = [], 0
    for line in path.read_text(encoding="utf-8").split("\n"):  # not splitlines: texts may hold U+2028
        if not line.strip():
            continue
        row = json.loads(line)
        text = row.get("text")
        if not isinstance(text, str) or not normalize(text):
            skipped += 1
            continue
        rows.append((f"{split}/{row['file_name']}", text))
    return rows, skipped


def load_examples(corpus_dir: str | os.PathLike, rows: list[tuple[str, str]], alphabet: str,
                  what: str) -> list[Example]:
    """Features and targets of `rows`; lines too short for their text are left out (counted)."""
    from codec.core.audio import load_audio

    out, short, t0 = [], 0, time.time()
    for i, (rel, text) in enumerate(rows):
        feats = log_mel(load_audio(Path(corpus_dir) / rel, SAMPLE_RATE, 1))
        targets = unit_ids(text, alphabet)[1:-1]
        if feasible(targets, len(feats)):
            out.append(Example(rel, feats, targets))
        else:
            short += 1
        if (i + 1) % 2000 == 0:
            print(f"  {what}: features of {i + 1}/{len(rows)} lines ({time.time() - t0:.0f} s)", flush=True)
    hours = sum(len(e.feats) for e in out) / 50 / 3600
    print(f"{what}: {len(out)} lines, {hours:.2f} h ({short} too short for their text) in {time.time() - t0:.0f} s",
          flush=True)
    return out


def length_batches(examples: list[Example], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Indices of `examples` in groups of `batch_size` of nearly equal length, groups in random order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].feats), rng.random()))
    groups = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(groups)
    return groups


def collate(examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(feats [B, T_max, n_mels] zero-padded, frame lengths [B], targets concatenated, target lengths [B])."""
    lengths = torch.tensor([len(e.feats) for e in examples])
    feats = torch.zeros(len(examples), int(lengths.max()), examples[0].feats.shape[1])
    for b, e in enumerate(examples):
        feats[b, :len(e.feats)] = e.feats
    targets = torch.tensor([t for e in examples for t in e.targets])
    return feats, lengths, targets, torch.tensor([len(e.targets) for e in examples])


def ctc_loss(model: CTCAligner, batch: list[Example]) -> torch.Tensor:
    """The batch's CTC loss, per target unit (mean over utterances of loss / target length)."""
    feats, lengths, targets, target_lengths = collate(batch)
    log_probs = model(feats)
    return F.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=BLANK,
                      reduction="mean", zero_infinity=True)


@torch.no_grad()
def evaluate(model: CTCAligner, examples: list[Example], batch_size: int = 16) -> tuple[float, float]:
    """(CTC loss per unit, pooled greedy CER) of `examples`."""
    was_training = model.training
    model.eval()
    alphabet, losses, errors, chars = model.config.alphabet, [], 0, 0
    ordered = sorted(examples, key=lambda e: len(e.feats))
    for i in range(0, len(ordered), batch_size):
        batch = ordered[i:i + batch_size]
        feats, lengths, targets, target_lengths = collate(batch)
        log_probs = model(feats)
        losses.append(float(F.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=BLANK,
                                       reduction="mean", zero_infinity=True)) * len(batch))
        for b, e in enumerate(batch):
            ref = "".join(alphabet[t] for t in e.targets)
            errors += levenshtein(greedy_decode(log_probs[b, :len(e.feats)], alphabet), ref)
            chars += len(ref)
    model.train(was_training)
    return sum(losses) / max(1, len(examples)), errors / max(1, chars)


def corpus_alphabet(corpus_dir: str | os.PathLike) -> str:
    """The alphabet of every text in the corpus's splits (the characters only: lines of every split
    can then be aligned; only train's audio is learned from)."""
    texts = []
    for split in ("train", "valid", "test"):
        if (Path(corpus_dir) / split / METADATA).is_file():
            texts += [t for _, t in read_lines(corpus_dir, split)[0]]
    return build_alphabet(texts)


def _schedule(settings: TrainSettings):
    def factor(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / settings.warmup
        progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


def _save(model: CTCAligner, out_dir: str | os.PathLike) -> None:
    was_training = model.training
    model.eval()
    model.save_pretrained(out_dir)
    model.train(was_training)


def train_aligner(corpus_dir: str | os.PathLike, out_dir: str | os.PathLike,
                  settings: TrainSettings = TrainSettings()) -> dict:
    """Train a CTC aligner on CORPUS/train, validate on CORPUS/valid, save it to OUT_DIR; the summary."""
    t0 = time.time()
    torch.manual_seed(settings.seed)
    alphabet = corpus_alphabet(corpus_dir)
    (train_rows, train_skipped), (valid_rows, _) = read_lines(corpus_dir, "train"), read_lines(corpus_dir, "valid")
    print(f"alphabet of {len(alphabet)} units: {alphabet!r}; {train_skipped} train rows without text skipped",
          flush=True)
    train = load_examples(corpus_dir, train_rows, alphabet, "train")
    valid = load_examples(corpus_dir, valid_rows, alphabet, "valid")
    if not train:
        raise ValueError(f"{corpus_dir}/train has no line with a text to learn from")
    model = _initial_model(alphabet, settings.init)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(settings))
    _steps(model, optimizer, scheduler, train, valid, settings, out_dir)
    loss, cer = evaluate(model, valid) if valid else (float("nan"), float("nan"))
    _save(model, out_dir)
    summary = {"steps": settings.steps, "valid_loss": loss, "valid_cer": cer, "train_lines": len(train),
               "valid_lines": len(valid), "seconds": time.time() - t0}
    print(f"done: {settings.steps} steps, valid CTC loss {loss:.3f}, greedy CER {cer:.3f} over {len(valid)} lines; "
          f"{summary['seconds'] / 60:.1f} min; saved {out_dir}", flush=True)
    return summary


def _initial_model(alphabet: str, init: str | None) -> CTCAligner:
    """A new model, or one started from a saved aligner: its weights, and its output rows for the units
    both alphabets have (units new to this corpus start untrained)."""
    model = CTCAligner(AlignerConfig(alphabet=alphabet)).train()
    if init is None:
        return model
    old = CTCAligner.from_pretrained(init)
    if {k: v for k, v in vars(old.config).items() if k != "alphabet"} != \
            {k: v for k, v in vars(model.config).items() if k != "alphabet"}:
        raise ValueError(f"{init} has other sizes than a new aligner ({old.config}); train from scratch (no --init)")
    state = old.state_dict()
    rows = [(i, old.config.alphabet.find(u)) for i, u in enumerate(alphabet)]
    new_out = model.state_dict()
    for name in ("out.weight", "out.bias"):
        for i, j in rows:
            if i == 0 or j > 0:
                new_out[name][i] = state[name][0 if i == 0 else j]
        state[name] = new_out[name]
    model.load_state_dict(state)
    print(f"starting from {init} ({sum(j > 0 for _, j in rows[1:])} of {len(alphabet) - 1} units known)", flush=True)
    return model


def _steps(model, optimizer, scheduler, train, valid, settings: TrainSettings, out_dir) -> None:
    rng, queue, running, t0 = random.Random(settings.seed), [], [], time.time()
    probe = random.Random(1).sample(valid, min(len(valid), settings.eval_lines))
    for step in range(1, settings.steps + 1):
        if not queue:
            queue = length_batches(train, settings.batch_size, rng)
        loss = ctc_loss(model, [train[i] for i in queue.pop()])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        running.append(float(loss.detach()))
        if step % 50 == 0:
            print(f"step {step}/{settings.steps}: train CTC loss {sum(running) / len(running):.3f}, "
                  f"{(time.time() - t0) / step:.2f} s/step", flush=True)
            running = []
        if step % settings.eval_every == 0 and probe and step < settings.steps:
            vloss, cer = evaluate(model, probe)
            print(f"step {step}: valid CTC loss {vloss:.3f}, greedy CER {cer:.3f} ({len(probe)} lines)", flush=True)
        if step % settings.save_every == 0 and step < settings.steps:
            _save(model, out_dir)
