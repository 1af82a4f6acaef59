"""`rvqlm corpus prepare`: decode and split the built-in speech corpus; `rvqlm corpus text-tokens`: its
transcripts as an N_c = 1 byte token folder (rvqlm/corpora/text_tokens.py)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("corpus", help="prepare the built-in real-speech corpus (fillets-ng-data-cs)")
    csub = p.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    prep = csub.add_parser("prepare", help="decode to 16-bit mono wav and split by level into train/valid/test; "
                                           "write metadata.jsonl (each file's Czech line, English line and "
                                           "speaker, from Debian's fillets-ng-data dialog scripts)")
    prep.add_argument("--voices", action="store_true",
                      help="prepare the voices corpus instead (other speakers and languages, Debian's "
                           "asterisk-core-sounds-*-g722 and hedgewars-data's voice packs; `make voices` installs them) "
                           "into data/voices-16k")
    prep.add_argument("--synthetic", action="store_true",
                      help="also prepare the built-in corpus plus its train and valid lines spoken by six espeak-ng "
                           "voices (rvqlm/corpora/synthetic.py; volume for a conditioned LM, never for measuring quality) "
                           "into data/fillets-synth-cs-16k")
    prep.add_argument("--out", default=None, help="output folder (default data/fillets-cs-16k, data/voices-16k or "
                                                  "data/fillets-synth-cs-16k)")
    prep.add_argument("--sample-rate", type=int, default=16000)
    prep.add_argument("--max-files-per-split", type=int, default=None, help="a quick subset")
    prep.set_defaults(func=run_prepare)
    text = csub.add_parser("text-tokens", help="write a corpus's transcripts (its metadata's text) as an N_c = 1 "
                                               "token folder of UTF-8 bytes, for an LM trained on text alone "
                                               "(recipes/lm_text_bytes.yaml)")
    text.add_argument("--corpus", default=None, help="audio folder with metadata.jsonl/.csv (default data/fillets-cs-16k)")
    text.add_argument("--out", default=None, help="new output folder (default data/tokens/<corpus name>-text-bytes)")
    text.add_argument("--field", default="text", help="the metadata column holding the text (default text)")
    text.set_defaults(func=run_text_tokens)


def run_prepare(args: argparse.Namespace) -> int:
    import json

    from rvqlm.corpora.fillets import DEFAULT_CORPUS_DIR, prepare_corpus
    from rvqlm.corpora.voices import DEFAULT_VOICES_DIR, prepare_voices

    if args.voices and args.synthetic:
        raise ValueError("--voices and --synthetic prepare different corpora: give one")
    if args.voices:
        out = prepare_voices(args.out or DEFAULT_VOICES_DIR, args.sample_rate, max_files_per_split=args.max_files_per_split)
    elif args.synthetic:
        from rvqlm.corpora.synthetic import DEFAULT_SYNTHETIC_DIR, prepare_synthetic

        source = prepare_corpus(DEFAULT_CORPUS_DIR, args.sample_rate, max_files_per_split=args.max_files_per_split,
                                log=print)
        out = prepare_synthetic(args.out or DEFAULT_SYNTHETIC_DIR, source)
    else:  # also writes metadata.jsonl (text and speaker of each file) and prints how many files have a line
        out = prepare_corpus(args.out or DEFAULT_CORPUS_DIR, args.sample_rate,
                             max_files_per_split=args.max_files_per_split, log=print)
    meta = json.loads((out / "corpus.json").read_text())
    print(f"corpus ready in {out}: minutes per split {meta['minutes']}, {len(meta['skipped'])} files skipped")
    return 0


def run_text_tokens(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rvqlm.corpora.fillets import DEFAULT_CORPUS_DIR
    from rvqlm.corpora.text_tokens import write_text_tokens

    corpus = Path(args.corpus or DEFAULT_CORPUS_DIR)
    out = Path(args.out or Path("data") / "tokens" / f"{corpus.name}-text-bytes")
    done = write_text_tokens(corpus, out, args.field)
    kinds = {}
    for row in done.errors:
        kinds[row.get("kind", "error")] = kinds.get(row.get("kind", "error"), 0) + 1
    listed = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"
    print(f"text tokens in {out}: {done.written} of {done.files} files, {done.bytes} bytes; "
          f"left out (listed in {out}/errors.jsonl): {listed}")
    return 0
