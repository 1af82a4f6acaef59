"""Two codec_quality.py runs on the same files, compared file by file.

    .venv/bin/python benchmarks/compare_quality.py BEFORE.json AFTER.json [--rows "ours N_c=4" ...]
        [--metrics mel stoi pesq dnsmos_ovrl] [--json FILE]

A candidate codec's mean PESQ moving by 0.02 on 20 files says little by itself: files differ from
each other far more than two codecs differ on one file. Scored on the same files, the per-file
differences cancel that spread. For each row in both runs (default: every `ours` row and Opus 6k)
and each metric the script prints both means, the mean of the per-file differences AFTER - BEFORE,
its standard error (sample standard deviation / sqrt(n)), and on how many files AFTER is better
(lower mel, higher STOI / PESQ / SI-SDR / DNSMOS). By default the metrics are mel, STOI, PESQ and
DNSMOS OVRL, each where both runs scored it (runs from before DNSMOS have none; the "original" row
has DNSMOS only); metrics named with --metrics must be there. The two runs must have scored the same list of files
(`codec_quality.py --split S --max-files N` on the same corpus), else the script refuses.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

LOWER_IS_BETTER = {"mel", "cer"}
DEFAULT_METRICS = ("mel", "stoi", "pesq", "dnsmos_ovrl", "cer")  # cer: each file's own CER


def paired_difference(before: list[float], after: list[float], lower_is_better: bool = False) -> dict:
    """Mean of after - before over paired files, its standard error, and how many files got better.

    Files where either value is missing (None or NaN: a metric that could not be scored) are left out.
    """
    pairs = [(b, a) for b, a in zip(before, after, strict=True)
             if b is not None and a is not None and not math.isnan(b) and not math.isnan(a)]
    n = len(pairs)
    if n == 0:
        raise ValueError("no file has both values")
    diffs = [a - b for b, a in pairs]
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else float("nan")
    better = sum((d < 0) if lower_is_better else (d > 0) for d in diffs)
    return {"files": n, "before": sum(b for b, _ in pairs) / n, "after": sum(a for _, a in pairs) / n,
            "diff": mean, "se": se, "better": better}


def compare(before: dict, after: dict, rows: list[str] | None = None,
            metrics: tuple[str, ...] | None = None) -> list[dict]:
    """Paired differences for each (row, metric) of two codec_quality.py results (their JSON).

    metrics None: DEFAULT_METRICS, leaving out a (row, metric) that one of the runs has for no file."""
    if before["files"] != after["files"]:
        raise ValueError("the two runs scored different files: run codec_quality.py with the same "
                         "--corpus, --split and --max-files for both")
    common = [r for r in before["per_file"] if r in after["per_file"]]
    if rows is None:
        rows = [r for r in common if r.startswith("ours ") or r.startswith("opus 6k")]
    missing = [r for r in rows if r not in common]
    if missing:
        raise ValueError(f"rows {missing} are not in both runs; both have: {common}")
    out = []
    for row in rows:
        b_scores, a_scores = before["per_file"][row]["scores"], after["per_file"][row]["scores"]
        for metric in metrics or DEFAULT_METRICS:
            b_values, a_values = [s.get(metric) for s in b_scores], [s.get(metric) for s in a_scores]
            if metrics is None and (all(v is None for v in b_values) or all(v is None for v in a_values)):
                continue
            try:
                d = paired_difference(b_values, a_values, lower_is_better=metric in LOWER_IS_BETTER)
            except ValueError:
                raise ValueError(f"{row}: no file has {metric} in both runs") from None
            out.append({"row": row, "metric": metric, **d})
    return out


def _load_run(path: str) -> dict:
    """A codec_quality.py --json result, or a ValueError that says what is wrong with the file."""
    try:
        run = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(run, dict) or not {"files", "per_file"} <= run.keys():
        raise ValueError(f"{path} is not a codec_quality.py --json result (no 'files' / 'per_file')")
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", help="codec_quality.py --json output of the reference codec")
    p.add_argument("after", help="codec_quality.py --json output of the candidate, on the same files")
    p.add_argument("--rows", nargs="*", help='rows to compare, e.g. "ours N_c=4" (default: ours and Opus 6k)')
    p.add_argument("--metrics", nargs="*", help=f"default: {' '.join(DEFAULT_METRICS)}, where both runs have them")
    p.add_argument("--json", help="also write the comparison here")
    args = p.parse_args(argv)
    try:
        before, after = (_load_run(f) for f in (args.before, args.after))
        table = compare(before, after, args.rows, tuple(args.metrics) if args.metrics else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"before: {args.before} ({before.get('codec_fingerprint', '?')[:12]})")
    print(f"after:  {args.after} ({after.get('codec_fingerprint', '?')[:12]}), {len(before['files'])} files")
    print(f"{'row':<16} {'metric':<11} {'before':>8} {'after':>8} {'after-before':>13} {'+-se':>7} better")
    for r in table:
        print(f"{r['row']:<16} {r['metric']:<11} {r['before']:8.3f} {r['after']:8.3f} {r['diff']:+13.4f} "
              f"{r['se']:7.4f} {r['better']}/{r['files']}")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(args.json, {"before": args.before, "after": args.after, "rows": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
