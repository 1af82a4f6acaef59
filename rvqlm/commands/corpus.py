"""`rvqlm corpus prepare fillets|voices|synthetic`: decode and split a corpus (rvqlm/corpora/);
`rvqlm corpus text-tokens`: its transcripts as an N_c = 1 byte token folder (rvqlm/corpora/text_tokens.py)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("corpus", help="prepare a speech corpus (the built-in fillets-ng-data-cs, voices, synthetic)")
    csub = p.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    prep = csub.add_parser("prepare", help="decode a corpus to 16-bit mono wav, split it into train/valid/test and "
                                           "write its metadata.jsonl (text and speaker of each file)")
    prep.add_argument("corpus", choices=CORPORA, metavar="CORPUS",
                      help="fillets: the built-in Czech corpus, each file's Czech line, English line and speaker from "
                           "Debian's fillets-ng-data dialog scripts (data/fillets-cs-16k); voices: other speakers and "
                           "languages, Debian's asterisk-core-sounds-*-g722 and hedgewars-data's voice packs, which "
                           "`make voices` installs (data/voices-16k); synthetic: fillets plus its train and valid lines "
                           "spoken by six espeak-ng voices, volume for a conditioned LM, never for measuring quality "
                           "(data/fillets-synth-cs-16k)")
    prep.add_argument("--out", default=None, help="output folder (default: the one named above)")
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


CORPORA = ("fillets", "voices", "synthetic")  # each a module of rvqlm/corpora/


def run_prepare(args: argparse.Namespace) -> int:
    import json

    from rvqlm.corpora.fillets import DEFAULT_CORPUS_DIR, prepare_corpus

    if args.corpus == "voices":
        from rvqlm.corpora.voices import DEFAULT_VOICES_DIR, prepare_voices

        out = prepare_voices(args.out or DEFAULT_VOICES_DIR, args.sample_rate, max_files_per_split=args.max_files_per_split)
    else:  # fillets also writes metadata.jsonl (text and speaker of each file) and prints how many files have a line
        out = prepare_corpus(DEFAULT_CORPUS_DIR if args.corpus == "synthetic" else args.out or DEFAULT_CORPUS_DIR,
                             args.sample_rate, max_files_per_split=args.max_files_per_split, log=print)
    if args.corpus == "synthetic":
        from rvqlm.corpora.synthetic import DEFAULT_SYNTHETIC_DIR, prepare_synthetic

        out = prepare_synthetic(args.out or DEFAULT_SYNTHETIC_DIR, out)
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
