"""`rvqlm train-lm`, `eval-lm` and `export-lm`: train the token LM from a recipe, score it on held-out
tokens, write it again (half precision for shipping).

    rvqlm train-lm --config recipes/lm_speech.yaml [--trainer.max_steps 2000] [--ckpt_path last]
    rvqlm train-lm --config recipes/lm_masked_speech.yaml     (the recipe's model.config.family: masked)
    rvqlm eval-lm --lm runs/lm_speech/pretrained --tokens data/tokens/fillets-cs-16k-2335577b91b5 --split valid
    rvqlm export-lm runs/lm_speech/pretrained models/lm-speech-16k --dtype float16
"""

from __future__ import annotations

import argparse
import inspect
import math

from rvqlm_core.weight_dtype import QUANTIZED_DTYPES, STORAGE_DTYPES

TRAIN_HELP = """Train the LM through LightningCLI `fit` of the LightningModule of the recipe's LM family
(model.config.family: ar or masked, lm.families). Every argument goes to LightningCLI:
  --config RECIPE.yaml (recipes/lm_tiny.yaml, recipes/lm_speech.yaml), overrides such as
  --trainer.max_steps 500 or --data.tokens_dir DIR, --ckpt_path last to resume the run in
  trainer.default_root_dir (a fresh run into a folder holding an earlier one is refused unless
  --overwrite true), --print_config to see the full configuration, --help for all options."""


def register(sub: argparse._SubParsersAction) -> None:
    # prefix_chars="\0": nothing here is an option of ours, so every argument (--help included)
    # reaches LightningCLI unchanged.
    train = sub.add_parser("train-lm", help="train the token LM from a YAML recipe (LightningCLI fit)",
                           description=TRAIN_HELP, prefix_chars="\0", add_help=False)
    train.add_argument("lightning_args", nargs="*")
    train.set_defaults(func=_train)

    ev = sub.add_parser("eval-lm", help="held-out NLL per codebook (nats/token) of a trained LM",
                        description="Score an LM on every frame of one split of a token folder: NLL per "
                                    "codebook in nats/token, perplexity, and optionally the unigram baseline.")
    ev.add_argument("--lm", required=True, help="an LM folder written by save_pretrained (e.g. RUN/pretrained)")
    ev.add_argument("--tokens", required=True, help="a token folder written by `rvqlm tokenize`")
    ev.add_argument("--split", default="valid", choices=("train", "valid", "test"))
    ev.add_argument("--split-by", default="prefix", choices=("prefix", "hash"),
                    help="prefix: files under SPLIT/ (the built-in corpus); hash: by path hash")
    ev.add_argument("--valid-fraction", type=float, default=0.1, help="for --split-by hash")
    ev.add_argument("--window-frames", type=int, default=None,
                    help="frames per scored window (default: the most the LM's context holds)")
    ev.add_argument("--batch-size", type=int, default=4)
    ev.add_argument("--unigram", action="store_true",
                    help="also score the unigram baseline (token frequencies of the train split)")
    ev.add_argument("--mask-ratio", type=float, default=None,
                    help="a masked LM: the share of each level hidden when it is scored (default 0.5)")
    ev.add_argument("--json", dest="json_out", default=None, help="also write the figures to this JSON file")
    ev.set_defaults(func=_eval)

    ex = sub.add_parser("export-lm", help="write an LM folder again, e.g. with half-precision weights",
                        description="Load an LM folder (save_pretrained) and write it to OUTPUT, its "
                                    "floating-point weights stored as --dtype (float16: half the file; they "
                                    "load back as float32; int8: a quarter, loaded as an inference-only int8 LM).")
    ex.add_argument("lm", help="an LM folder written by save_pretrained (e.g. RUN/pretrained)")
    ex.add_argument("output", help="the folder to write (replaced only once the new one is complete)")
    ex.add_argument("--dtype", choices=STORAGE_DTYPES + QUANTIZED_DTYPES, default="float32")
    ex.set_defaults(func=_export)


def _train(args: argparse.Namespace) -> int:
    """LightningCLI fit; SIGTERM mid-fit (Lightning stops at the next batch and raises SIGTERMException, a
    SystemExit whose status is 0) exits 143, as a process the signal ends, with one line."""
    import sys

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lm.training import train_main

    try:
        return train_main(args.lightning_args)
    except SIGTERMException:
        sys.stderr.write("rvqlm train-lm: terminated (SIGTERM) before the run's end: no pretrained/ written; its "
                         "checkpoints are kept (resume with --ckpt_path last)\n")
        return 143


def _export(args: argparse.Namespace) -> int:
    from lm.trunk import load_lm
    from rvqlm_core.atomic import check_folder_destination

    check_folder_destination(args.output, inputs=[args.lm])  # before loading: never onto the LM it reads
    out = load_lm(args.lm).save_pretrained(args.output, dtype=args.dtype)
    print(f"exported {args.lm} -> {out} ({args.dtype})")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from lm.families import family_of
    from lm.trunk import load_lm
    from rvqlm_core.atomic import atomic_write_json, check_file_destination

    if args.json_out:
        check_file_destination(args.json_out)  # before the work
    model = load_lm(args.lm)
    family = family_of(model.config.family)
    given = {"unigram": args.unigram or None, "ratio": args.mask_ratio}
    flags = {"unigram": "--unigram", "ratio": "--mask-ratio"}
    report_fn = family.resolve("held_out_report")
    params = inspect.signature(report_fn).parameters
    for key, value in given.items():
        if value is not None and key not in params:
            raise ValueError(f"{flags[key]} is not an option of the {family.name!r} LM family's score")
    extra = {k: v for k, v in given.items() if v is not None}
    report = {"lm": str(args.lm), **report_fn(model, args.tokens, args.split, split_by=args.split_by,
                                             valid_fraction=args.valid_fraction, window_frames=args.window_frames,
                                             batch_size=args.batch_size, **extra)}
    if "scored" in report:
        print(report["scored"])
    window, files, count = report["window_frames"], report["files"], report["tokens_per_codebook"]
    baseline = report.get("unigram_nll_per_codebook")
    cfg = model.config

    print(f"{args.split} split of {args.tokens}: {files} files, {int(count[0])} frames, "
          f"windows of {window} frames")
    header = f"{'codebook':>8}  {'NLL nats/tok':>12}  {'perplexity':>10}"
    if baseline is not None:
        header += f"  {'unigram NLL':>11}  {'LM - unigram':>12}"
    print(header)
    rows = [(str(k), report["nll_per_codebook"][k], None if baseline is None else baseline[k])
            for k in range(cfg.n_codebooks)]
    rows.append(("all", report["nll"], report.get("unigram_nll")))
    for name, value, base in rows:
        line = f"{name:>8}  {value:12.4f}  {math.exp(value):10.2f}"
        if base is not None:
            line += f"  {base:11.4f}  {value - base:+12.4f}"
        print(line)
    if args.json_out:
        atomic_write_json(args.json_out, report)
    return 0
