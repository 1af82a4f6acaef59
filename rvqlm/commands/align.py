"""`rvqlm train-aligner CORPUS_DIR OUT_DIR` and `rvqlm align TOKENS_DIR --corpus CORPUS_DIR --aligner DIR`:
a small CTC model trained on a corpus's own lines places each line's text units on the token frames
(rvqlm/align/, issue 47)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "train-aligner",
        help="train the forced aligner's small CTC model on a corpus folder's lines",
        description="Train a small CTC model (log-mel frames at the codec's 50 Hz -> blank + text units) on the "
                    "lines with a text in CORPUS_DIR/train/metadata.jsonl, validate on valid/ (CTC loss, greedy "
                    "CER), and save it to OUT_DIR (config.json + model.safetensors), also every 250 steps.")
    t.add_argument("corpus_dir", metavar="CORPUS_DIR", help="a prepared corpus folder with texts (train/, valid/)")
    t.add_argument("out_dir", metavar="OUT_DIR", help="the aligner folder to write")
    t.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training steps (default 1000: ~17 min on one busy core)")
    t.add_argument("--batch-size", type=int, default=16, metavar="B", help="lines per step (default 16)")
    t.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    t.add_argument("--init", default=None, metavar="DIR",
                   help="start from this saved aligner (its alphabet must be the corpus's) instead of from scratch")
    t.add_argument("--threads", type=int, default=2, metavar="T", help="torch threads (default 2)")
    t.set_defaults(func=run_train)
    a = sub.add_parser(
        "align",
        help="place each line's text units on its token frames: TOKENS_DIR/alignments.jsonl",
        description="For every file of a token folder whose metadata has a text, force-align the text's units "
                    "(lm/text_units.py) to the file's frames with a trained aligner and write one JSON line "
                    "{path, units, durations, confidence} to TOKENS_DIR/alignments.jsonl; durations has one "
                    "entry per unit, edges included, and sums to the file's token frames.")
    a.add_argument("tokens_dir", metavar="TOKENS_DIR", help="a token folder (rvqlm tokenize)")
    a.add_argument("--corpus", required=True, metavar="CORPUS_DIR", help="the audio folder the tokens were made from")
    a.add_argument("--aligner", required=True, metavar="DIR", help="an aligner folder (rvqlm train-aligner)")
    a.add_argument("--splits", nargs="+", default=["train", "valid", "test"], metavar="SPLIT",
                   help="the first path component of the files to align (default: train valid test)")
    a.add_argument("--threads", type=int, default=2, metavar="T", help="torch threads (default 2)")
    a.set_defaults(func=run_align)


def _threads(n: int) -> None:
    import torch

    if n < 1:
        raise ValueError("--threads must be >= 1")
    torch.set_num_threads(n)


def run_train(args: argparse.Namespace) -> int:
    from rvqlm.align.train import TrainSettings, train_aligner

    _threads(args.threads)
    settings = TrainSettings(batch_size=args.batch_size, lr=args.lr, init=args.init)
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError("--steps must be >= 1")
        settings.steps = args.steps
    train_aligner(args.corpus_dir, args.out_dir, settings)
    return 0


def run_align(args: argparse.Namespace) -> int:
    from rvqlm.align.folder import ALIGNMENTS, align_token_folder

    _threads(args.threads)
    summary = align_token_folder(args.tokens_dir, args.corpus, args.aligner, tuple(args.splits))
    for line in summary.lines():
        print(line)
    print(f"wrote {args.tokens_dir.rstrip('/')}/{ALIGNMENTS}")
    return 0
