"""Does a codec invent sound above a telephone band? Held-out speech band-limited as a telephone
source resampled to 16 kHz would be (codec.augment.telephone_band), through the codec, against the
same speech at full band.

    .venv/bin/python benchmarks/codec_band_limit.py --codec DIR [--corpus data/voices-16k] [--split test]
        [--max-files 20] [--threads 1]

Per N_c it prints the mean share of the decoded energy above 4 kHz (the band-limited input's own
share, printed as "input", is the target: ~0) and the mel distance to the band-limited input.
"""

from __future__ import annotations

import time

import torch

from rvqlm.quality.roundtrips import held_out_parser


def main(argv: list[str] | None = None) -> int:
    p = held_out_parser(__doc__.split("\n\n")[0], max_files=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from codec.audio import load_audio
    from codec.augment import band_energy_above, telephone_band
    from codec.losses import mel_distance
    from rvqlm.quality.roundtrips import mono_codec_and_files

    t0 = time.perf_counter()
    codec, files = mono_codec_and_files(args.codec, args.corpus, args.split, args.max_files, "codec_band_limit.py")
    above: dict[str, list[float]] = {}
    mel: dict[str, list[float]] = {}
    with torch.inference_mode():
        for f in files:
            full = load_audio(f, codec.sample_rate, 1)  # [1, S]
            narrow = telephone_band(full, codec.sample_rate)
            above.setdefault("input", []).append(band_energy_above(narrow, codec.sample_rate))
            codes = codec.encode(narrow[None])
            for k in sorted({1, codec.n_codebooks // 2, codec.n_codebooks}):
                out = codec.decode(codes[:, :k])[0, :, :narrow.shape[-1]]
                name = f"N_c={k}"
                above.setdefault(name, []).append(band_energy_above(out, codec.sample_rate))
                mel.setdefault(name, []).append(float(mel_distance(out[None], narrow[None], codec.sample_rate)))
    print(f"codec {args.codec} ({codec.fingerprint()[:12]}), {len(files)} files of {args.corpus}/{args.split}, "
          "band-limited to 4 kHz; means over files")
    print(f"{'':<8} {'energy > 4 kHz':>15} {'mel distance':>13}")
    for name, values in above.items():
        m = f"{sum(mel[name]) / len(mel[name]):>13.4f}" if name in mel else f"{'-':>13}"
        print(f"{name:<8} {100 * sum(values) / len(values):>14.3f}% {m}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
