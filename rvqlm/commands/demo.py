"""`rvqlm demo`: the whole pipeline on the built-in corpus (see rvqlm/demo/pipeline.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="corpus -> codec reconstructions -> tokens -> LM -> continuations -> runs/demo/")
    p.add_argument("--samples", type=Path, default=None,
                   help="report folder (default runs/demo/, untracked; `--samples samples` regenerates the committed "
                        "example report)")
    p.add_argument("--work-dir", type=Path, default=None, help="LM run and corpus subsets (default data/demo)")
    p.add_argument("--corpus", type=Path, default=None, help="prepared corpus folder (default data/fillets-cs-16k)")
    p.add_argument("--corpus-files", type=int, default=None,
                   help="a quick subset: only the first N files of each split (linked under --work-dir)")
    p.add_argument("--tokens", type=Path, default=None,
                   help="token folder (default data/tokens/fillets-cs-16k-<codec token fingerprint>, or under "
                        "--work-dir for a subset)")
    p.add_argument("--codec", type=Path, default=None,
                   help="codec folder (default models/codec-speech-16k; a Hugging Face EnCodec, DAC or Mimi folder too)")
    p.add_argument("--voices", type=Path, default=None,
                   help="prepared voices corpus for the foreign-speaker clips (default data/voices-16k; "
                        "`make voices` prepares it, and without it the page says so)")
    p.add_argument("--foreign-clips", type=int, default=4,
                   help="foreign-speaker clips from its test split (default 4: every test speaker)")
    p.add_argument("--lm-recipe", type=Path, default=None, help="default recipes/lm_demo.yaml")
    p.add_argument("--lm-minutes", type=float, default=4.0,
                   help="LM training time budget (default 4; 0: the shipped LM as it is)")
    p.add_argument("--prompts", type=int, default=3, help="held-out prompts to continue (default 3)")
    p.add_argument("--prompt-seconds", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=6.0, help="continuation length (default 6)")
    p.add_argument("--conditioned-lm", type=Path, default=None,
                   help="text- and speaker-conditioned LM for the \"Say it\" section (default "
                        "models/lm-speech-conditioned-16k; without one that fits the codec the page says how to get it)")
    p.add_argument("--masked-lm", type=Path, default=None,
                   help="masked LM whose continuations of the same prompts go beside the AR LM's (default "
                        "models/lm-masked-speech-16k; without one that fits the codec the page says how to get it)")
    p.add_argument("--say-it-lines", type=int, default=4,
                   help="held-out lines said in both voices (default 4; 0: leave the section out)")
    p.add_argument("--seed", type=int, default=1)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rvqlm.demo.pipeline import DemoSettings, run_demo

    if args.lm_minutes < 0 or args.prompts < 1 or args.prompt_seconds <= 0 or args.seconds <= 0:
        raise ValueError("--prompts, --prompt-seconds and --seconds must be positive, --lm-minutes >= 0")
    if args.corpus_files is not None and args.corpus_files < 1:
        raise ValueError("--corpus-files must be >= 1")
    if args.foreign_clips < 0 or args.say_it_lines < 0:
        raise ValueError("--foreign-clips and --say-it-lines must be >= 0")
    paths = {"samples_dir": args.samples, "work_dir": args.work_dir, "corpus_dir": args.corpus,
             "tokens_dir": args.tokens, "codec_dir": args.codec, "lm_recipe": args.lm_recipe,
             "voices_dir": args.voices, "conditioned_lm": args.conditioned_lm, "masked_lm": args.masked_lm}
    run_demo(DemoSettings(**{k: v for k, v in paths.items() if v is not None}, lm_minutes=args.lm_minutes,
                          corpus_files_per_split=args.corpus_files, foreign_clips=args.foreign_clips,
                          say_it_lines=args.say_it_lines,
                          n_prompts=args.prompts,
                          prompt_seconds=args.prompt_seconds, continuation_seconds=args.seconds, seed=args.seed))
    return 0
