"""Does a codec keep the speaker's pitch? F0 of the decoded speech against the original's.

    .venv/bin/python benchmarks/codec_pitch.py --codec DIR [--split valid] [--max-files 8]
        [--n-codebooks 2 4 8] [--no-opus] [--no-codec2] [--json FILE]

Needs `make bench-setup` (librosa for pYIN; ffmpeg/libopus and codec2 for the reference rows).

For each file (`rvqlm.quality.roundtrips.pick_files`: `--max-files` files of `--split`, >= 1 s) the
script decodes it with our codec at each `--n-codebooks`, with Opus 6 kbps and with codec2 3200,
aligns every output to the original, tracks F0 on both with pYIN (`rvqlm.quality.metrics.pitch_track`:
10 ms frames, 60-500 Hz) and pools over all files' frames (`rvqlm.quality.metrics.pitch_agreement`):

    median / p90 cents    |1200 log2(f0_decoded / f0_original)| on the frames voiced in both
    > 50 cents            the share of those frames off by more than a quarter tone
    voicing recall        the share of the original's voiced frames that are voiced when decoded
    false voicing         the share of its unvoiced frames that become voiced

pYIN reports F0 on a 10-cent grid, so 10 cents is the best a row can score.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from rvqlm.quality.roundtrips import held_out_parser


def main(argv: list[str] | None = None) -> int:
    p = held_out_parser(__doc__.split("\n\n")[0], max_files=8)
    p.add_argument("--n-codebooks", type=int, nargs="*", help="our bitrates to score (default: 2, 4 and all)")
    p.add_argument("--no-opus", action="store_true", help="leave out the Opus 6 kbps row")
    p.add_argument("--no-codec2", action="store_true", help="leave out the codec2 3200 row")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from codec.core.audio import load_audio
    from rvqlm.quality.metrics import align, estimate_lag, pitch_agreement, pitch_track, pool_pitch
    from rvqlm.quality.roundtrips import SAMPLE_RATE, codec2_roundtrip, mono_codec_and_files, opus_roundtrip, ours_roundtrip

    t0 = time.perf_counter()
    codec, files = mono_codec_and_files(args.codec, args.corpus, args.split, args.max_files, "codec_pitch.py")
    ks = args.n_codebooks or sorted({min(2, codec.n_codebooks), min(4, codec.n_codebooks), codec.n_codebooks})
    bad = [k for k in ks if not 1 <= k <= codec.n_codebooks]
    if bad:
        raise SystemExit(f"--n-codebooks {bad}: this codec has 1..{codec.n_codebooks}")
    systems = [f"ours N_c={k}" for k in ks] + ([] if args.no_opus else ["opus 6k voip"]) + \
              ([] if args.no_codec2 else ["codec2 3200"])
    parts: dict[str, list] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="codec_pitch_") as tmp:
        for f in files:
            reference = load_audio(f, SAMPLE_RATE, 1)[0].numpy()  # [S]
            f0_ref, voiced_ref = pitch_track(reference, SAMPLE_RATE)
            for system in systems:
                if system.startswith("ours"):
                    decoded = ours_roundtrip(codec, reference, SAMPLE_RATE, int(system.split("=")[1])).decoded
                elif system.startswith("opus"):
                    decoded = opus_roundtrip(reference, SAMPLE_RATE, 6, Path(tmp)).decoded
                else:
                    decoded = codec2_roundtrip(reference, SAMPLE_RATE, "3200", Path(tmp)).decoded
                decoded = align(decoded, estimate_lag(reference, decoded, SAMPLE_RATE), len(reference))
                parts[system].append(pitch_agreement(f0_ref, voiced_ref, *pitch_track(decoded, SAMPLE_RATE)))
    results = {s: pool_pitch(v).summary() for s, v in parts.items()}
    frames = sum(p.ref_voiced for p in parts[systems[0]])
    print(f"codec {args.codec} ({codec.fingerprint()[:12]}), {len(files)} files of {args.corpus}/{args.split}, "
          f"{frames} voiced 10 ms frames in the originals; pooled over frames")
    print(f"{'system':<16} {'median c v':>10} {'p90 c v':>8} {'>50 c v':>8} {'voiced ^':>9} {'false v':>8}")
    for s, r in results.items():
        print(f"{s:<16} {r['median_cents']:>10.0f} {r['p90_cents']:>8.0f} {r['gross_error']:>8.3f} "
              f"{r['voicing_recall']:>9.3f} {r['false_voicing']:>8.3f}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(Path(args.json), {"codec": str(args.codec), "codec_fingerprint": codec.fingerprint(),
                                            "split": args.split, "files": [str(f) for f in files],
                                            "voiced_frames": frames, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
