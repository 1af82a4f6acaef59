"""Magnitude or phase: where does a codec with the iSTFT decoder lose quality?

    .venv/bin/python benchmarks/codec_phase.py --codec DIR [--split valid] [--max-files 8] [--json FILE]

The iSTFT decoder (codec/istft_decoder.py) predicts, for every short frame, a magnitude and a
phase per bin. This script swaps each half with the original audio's own STFT (same window, FFT
size and hop as the decoder) and scores every mix with the quality benchmark's metrics (mel
distance, SI-SDR, STOI, PESQ; the files `benchmarks/codec_quality.py` picks):

    ours                             the codec's output
    ours magnitude + true phase      what a perfect phase would give the decoder's magnitudes
    true magnitude + ours phase      what perfect magnitudes would give the decoder's phases
    true magnitude + random phase    the floor a phase can fall to
    true magnitude + Griffin-Lim     a phase found from the true magnitudes alone (100 iterations)
    ours magnitude + Griffin-Lim     the same from the decoder's magnitudes (started at its phase)
    ours magnitude + excitation      the phase of a source-filter decoder's excitation (codec/excitation.py:
                                     a harmonic pulse train at the original's YIN f0 where voiced, white
                                     noise elsewhere): what an explicit f0 stream could give the decoder
    ours magnitude + excitation of decoded f0    the same at the f0 of our own output (no side stream)
    ours below 4 kHz + true above    the decoder's bins below BAND_SPLIT_HZ, the original's above
    true below 4 kHz + ours above    the other way round: which band costs the quality

If "ours magnitude + true phase" is far above "ours", the phases are what costs quality (the
adversarial phase of `recipes/experiments/codec_speech_gan_decoder.yaml` aims at them); if "true
magnitude + ours phase" is far above "ours", the magnitudes are. The last row tells whether the decoder's
magnitudes are consistent (a real STFT could have them): if Griffin-Lim makes them worse while it
makes the true magnitudes nearly perfect, they are not. `--dnsmos` adds DNSMOS P.835 (no reference).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from codec.excitation import excitation_spectra
from codec.pitch import yin
from rvqlm.quality.roundtrips import held_out_parser


VARIANTS = ("ours", "ours magnitude + true phase", "true magnitude + ours phase", "true magnitude + random phase",
            "true magnitude + Griffin-Lim", "ours magnitude + Griffin-Lim",
            "ours below 4 kHz + true above", "true below 4 kHz + ours above", "ours magnitude + excitation",
            "ours magnitude + excitation of decoded f0")
BAND_SPLIT_HZ = 4000.0


def griffin_lim(magnitude: torch.Tensor, phase: torch.Tensor, stft, istft, n_iter: int = 100,
                momentum: float = 0.99) -> torch.Tensor:
    """Fast Griffin-Lim (Perraudin et al. 2013) started from `phase` (torchaudio's starts only from
    zero or random phases). magnitude, phase [B, bins, frames] -> waveform from istft."""
    angles = torch.polar(torch.ones_like(magnitude), phase)
    previous = torch.zeros_like(angles)
    for _ in range(n_iter):
        rebuilt = stft(istft(magnitude * angles))
        angles = rebuilt - (momentum / (1 + momentum)) * previous
        angles = angles / (angles.abs() + 1e-16)
        previous = rebuilt
    return istft(magnitude * angles)


def spectral_mixes(codec, wav: torch.Tensor, *, n_iter: int = 100, seed: int = 0) -> dict[str, torch.Tensor]:
    """wav [1, 1, S] -> {variant: waveform [S]} for every row of VARIANTS (see the module doc)."""
    decoder = codec.decoder
    if not hasattr(decoder, "spectrum"):
        raise ValueError("this codec's decoder does not predict a spectrum (decoder must be 'istft')")
    n_fft, hop, window = decoder.n_fft, decoder.istft_hop, decoder.window
    length = wav.shape[-1]
    with torch.inference_mode():
        ours = decoder.spectrum(codec.quantizer.decode(codec.encode(wav)))  # [C, bins, frames]
        n_frames = ours.shape[-1]
        total = n_frames * hop

        def stft(x: torch.Tensor) -> torch.Tensor:
            return torch.stft(x, n_fft, hop, n_fft, window, center=True, return_complex=True)[..., :n_frames]

        def istft(s: torch.Tensor) -> torch.Tensor:
            return torch.istft(s, n_fft, hop, n_fft, window, center=True, length=total)

        true = stft(torch.nn.functional.pad(wav[0].float(), (0, total - length)))
        random_phase = torch.rand(true.shape, generator=torch.Generator().manual_seed(seed)) * 2 * math.pi
        spectra = {
            "ours": ours,
            "ours magnitude + true phase": torch.polar(ours.abs(), true.angle()),
            "true magnitude + ours phase": torch.polar(true.abs(), ours.angle()),
            "true magnitude + random phase": torch.polar(true.abs(), random_phase),
        }
        low = (torch.arange(ours.shape[-2]) * codec.sample_rate / n_fft < BAND_SPLIT_HZ)[:, None]  # [bins, 1]
        spectra["ours below 4 kHz + true above"] = torch.where(low, ours, true)
        spectra["true below 4 kHz + ours above"] = torch.where(low, true, ours)
        out = {name: istft(s) for name, s in spectra.items()}
        out["true magnitude + Griffin-Lim"] = griffin_lim(true.abs(), random_phase, stft, istft, n_iter)
        out["ours magnitude + Griffin-Lim"] = griffin_lim(ours.abs(), ours.angle(), stft, istft, n_iter)
        generator = torch.Generator().manual_seed(seed)
        for name, source in (("ours magnitude + excitation", wav[0].float()),
                             ("ours magnitude + excitation of decoded f0", out["ours"])):
            f0, voiced = yin(torch.nn.functional.pad(source, (0, total - source.shape[-1])), codec.sample_rate, hop)
            harmonic, noise = excitation_spectra(f0[:, :n_frames], voiced[:, :n_frames], n_fft, hop, window,
                                                 codec.sample_rate, generator=generator)
            donor = torch.where(voiced[:, None, :n_frames], harmonic, noise)
            out[name] = istft(torch.polar(ours.abs(), donor.angle()))
    return {name: out[name][0, :length] for name in VARIANTS}


def main(argv: list[str] | None = None) -> int:
    p = held_out_parser(__doc__.split("\n\n")[0], max_files=8,
                        codec_help="a saved codec folder with the iSTFT decoder")
    p.add_argument("--griffin-lim-iters", type=int, default=100)
    p.add_argument("--dnsmos", action="store_true", help="also score DNSMOS P.835 (about 0.3 s per 9 s per row)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from codec.audio import load_audio
    from rvqlm.quality.metrics import METRICS, align, estimate_lag, mean_scores, score
    from rvqlm.quality.roundtrips import mono_codec_and_files

    t0 = time.perf_counter()
    codec, files = mono_codec_and_files(args.codec, args.corpus, args.split, args.max_files, "codec_phase.py")
    per_variant: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for f in files:
        reference = load_audio(f, codec.sample_rate, 1)  # [1, S]
        mixes = spectral_mixes(codec, reference[None], n_iter=args.griffin_lim_iters)
        ref = reference[0].numpy()
        for name, decoded in mixes.items():
            d = decoded.numpy()
            per_variant[name].append(score(ref, align(d, estimate_lag(ref, d, codec.sample_rate), len(ref)),
                                           codec.sample_rate, with_dnsmos=args.dnsmos))
    means = {name: mean_scores(rows).means for name, rows in per_variant.items()}
    print(f"codec {args.codec} ({codec.fingerprint()[:12]}), {len(files)} files of {args.corpus}/{args.split}, "
          f"all {codec.n_codebooks} codebooks, means over files")
    dns = f" {'SIG ^':>6} {'BAK ^':>6} {'OVRL ^':>7}" if args.dnsmos else ""
    print(f"{'spectrum':<42} {'mel v':>7} {'SI-SDR ^':>9} {'STOI ^':>7} {'PESQ ^':>7}{dns}")
    for name, m in means.items():
        dns = (f" {m['dnsmos_sig']:>6.2f} {m['dnsmos_bak']:>6.2f} {m['dnsmos_ovrl']:>7.2f}" if args.dnsmos else "")
        print(f"{name:<42} {m['mel']:>7.3f} {m['si_sdr']:>9.2f} {m['stoi']:>7.3f} {m['pesq']:>7.2f}{dns}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(Path(args.json), {"codec": str(args.codec), "codec_fingerprint": codec.fingerprint(),
                                            "split": args.split, "files": [str(f) for f in files],
                                            "means": {k: {m: float(v[m]) for m in METRICS if m in v} for k, v in means.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
