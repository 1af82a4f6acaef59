"""Where does a codec lose quality: in the quantizer, or in the encoder/decoder pair?

    .venv/bin/python benchmarks/codec_bottleneck.py --codec DIR [--split valid] [--max-files 20] [--threads 1]

For each held-out file the script decodes (a) the encoder's latent itself, with no quantization at
all, and (b) the latent quantized with the first k codebooks for every k, and prints per row the
mean mel distance to the original (`codec.losses.mel_distance`, lower is better) and the
quantization error ||z - q_k|| / ||z||. If row (a) is about as far from the original as the
N_c-codebook row, more bitrate cannot help: the autoencoder is the limit (train longer, widen the
encoder or decoder). If (a) is much better, the quantizer is (more codebooks, larger codebooks).
"""

from __future__ import annotations

import time

import torch

from rvqlm.quality.roundtrips import held_out_parser


def main(argv: list[str] | None = None) -> int:
    p = held_out_parser(__doc__.split("\n\n")[0], max_files=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from codec import Codec
    from codec.audio import load_audio
    from codec.data import evenly_spaced
    from codec.losses import mel_distance
    from rvqlm.corpora.folder import corpus_files

    t0 = time.perf_counter()
    codec = Codec.from_pretrained(args.codec).eval()
    files = evenly_spaced(corpus_files(args.corpus, args.split), args.max_files)
    rows: dict[str, list[float]] = {}
    errors: dict[int, list[float]] = {}
    seconds = 0.0
    with torch.inference_mode():
        for f in files:
            wav = codec.pad_to_hop(load_audio(f, codec.sample_rate, codec.channels)[None])  # [1, C, S]
            seconds += wav.shape[-1] / codec.sample_rate
            z = codec.encoder(wav)  # [1, D, T]
            rows.setdefault("latent, not quantized", []).append(float(mel_distance(codec.decoder(z), wav, codec.sample_rate)))
            codes = codec.quantizer.encode(z)
            for k in range(1, codec.n_codebooks + 1):
                q = codec.quantizer.decode(codes[:, :k])
                rows.setdefault(f"N_c={k} ({codec.bitrate_kbps(k):.1f} kbps)", []).append(
                    float(mel_distance(codec.decoder(q), wav, codec.sample_rate)))
                errors.setdefault(k, []).append(float((z - q).norm() / z.norm()))
    print(f"codec {args.codec} ({codec.fingerprint()[:12]}), {len(files)} files of {args.corpus}/{args.split} "
          f"({seconds:.1f} s), means over files")
    print(f"{'decoded from':<26} {'mel distance':>12} {'||z-q||/||z||':>14}")
    for i, (name, values) in enumerate(rows.items()):
        err = f"{sum(errors[i]) / len(errors[i]):>14.3f}" if i else f"{0.0:>14.3f}"
        print(f"{name:<26} {sum(values) / len(values):>12.4f} {err}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
