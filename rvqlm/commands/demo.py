"""`rvqlm demo`: the whole pipeline on the built-in corpus (see rvqlm/demo.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="corpus -> codec reconstructions -> tokens -> LM -> continuations -> samples/")
    p.add_argument("--samples", type=Path, default=None, help="output folder (default samples/)")
    p.add_argument("--work-dir", type=Path, default=None, help="tokens and LM run (default data/demo)")
    p.add_argument("--codec", type=Path, default=None, help="codec folder (default models/codec-speech-16k)")
    p.add_argument("--lm-recipe", type=Path, default=None, help="default recipes/lm_demo.yaml")
    p.add_argument("--lm-minutes", type=float, default=4.0, help="LM training time budget (default 4)")
    p.add_argument("--prompts", type=int, default=3, help="held-out prompts to continue (default 3)")
    p.add_argument("--prompt-seconds", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=6.0, help="continuation length (default 6)")
    p.add_argument("--seed", type=int, default=1)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rvqlm.demo import DemoSettings, run_demo

    if args.lm_minutes <= 0 or args.prompts < 1 or args.prompt_seconds <= 0 or args.seconds <= 0:
        raise ValueError("--lm-minutes, --prompts, --prompt-seconds and --seconds must be positive")
    paths = {"samples_dir": args.samples, "work_dir": args.work_dir, "codec_dir": args.codec,
             "lm_recipe": args.lm_recipe}
    run_demo(DemoSettings(**{k: v for k, v in paths.items() if v is not None}, lm_minutes=args.lm_minutes,
                          n_prompts=args.prompts, prompt_seconds=args.prompt_seconds,
                          continuation_seconds=args.seconds, seed=args.seed))
    return 0
