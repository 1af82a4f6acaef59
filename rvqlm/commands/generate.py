"""`rvqlm generate`: continue a spoken prompt (or start from nothing) with the token LM.

    rvqlm generate --lm runs/lm_speech/pretrained --codec runs/codec/pretrained \\
        --prompt prompt.wav --prompt-seconds 3 --seconds 10 --out out.wav \\
        [--temperature 1.0 --top-k 250 --top-p 0.95 | --greedy] [--seed 1] [--num-samples 4]

    rvqlm generate --lm LM_DIR --codec CODEC_DIR --text "Co je to za divnou loď?" \\
        --speaker font_small --cfg 3 --out say.wav        (a conditioned LM; --prompt optional)

A masked LM (a recipe of family `masked`) fills the continuation by iterative parallel decoding,
level by level (lm.masked_generate): --steps 16,4,2,1 gives the steps of the first levels (the
others take 1 each; default 8,2,1,1,1,1,1,1), --choice-temperature the Gumbel noise on the confidence
that picks which sampled codes a step keeps (MaskGIT's; default 4.5; 0: the most confident).

A conditioned LM reads --text (UTF-8, up to its text_max_bytes) and --speaker (a name from its
table) with classifier-free guidance --cfg (default 3; 1 = no guidance; --speaker-cfg gives the speaker
a scale of its own, lm.guidance), and stops by itself at
its end-of-audio token; --seconds is then the longest it may speak. An LM trained with guided
attention reads the text in order, start to end, and ends only once it has read it all
(lm.alignment.ReadingWindow; --no-monotonic leaves its attention free).

The prompt is encoded by the codec into frames of N_c codes, the LM continues them (lm.generate:
the codebook pattern it was trained with, a preallocated KV cache), and the codec decodes prompt +
continuation in one pass, so the continuation is decoded with the prompt as its left context.
Written, each atomically: `out.wav` (the continuation) and `out.full.wav` (prompt + continuation,
both as decoded by the codec); with --num-samples N > 1, `out-1.wav`, `out-1.full.wav`, ... Without
--prompt the LM starts from its start token and only `out.wav` is written.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue a speech prompt (or generate from scratch) with the LM",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lm", required=True, metavar="LM_DIR", help="an LM folder written by save_pretrained")
    p.add_argument("--codec", required=True, metavar="CODEC_DIR",
                   help="the saved codec whose tokens the LM was trained on (rvqlm's own, or a Hugging Face "
                        "EnCodec, DAC or Mimi folder)")
    p.add_argument("--prompt", default=None, metavar="AUDIO", help="audio to continue (default: none, start from bos)")
    p.add_argument("--prompt-seconds", type=float, default=None,
                   help="use only the first S seconds of the prompt (default: all of it)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="length of the continuation (default 10; a conditioned LM's longest, it may stop sooner)")
    p.add_argument("--text", default=None, help="what a conditioned LM should say")
    p.add_argument("--speaker", default=None, help="who says it: a speaker name from the conditioned LM's table")
    p.add_argument("--cfg", type=float, default=None, metavar="S",
                   help="classifier-free guidance scale, >= 0 (default 3 with --text/--speaker; 1 = none)")
    p.add_argument("--speaker-cfg", type=float, default=None, metavar="S",
                   help="the speaker's own guidance scale, >= 0 (multi-condition guidance; default: --cfg)")
    p.add_argument("--monotonic", action=argparse.BooleanOptionalAction, default=None,
                   help="read the text in order through a moving window (default: on for an LM trained with "
                        "guided attention)")
    p.add_argument("--out", required=True, metavar="OUT.wav", help="output file (see above for the names)")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature (> 0; default 1.0)")
    p.add_argument("--top-k", type=int, default=250, help="keep the k most probable codes (default 250)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="then keep the smallest top set with probability >= p, in (0, 1] (default 1: off)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding (ignores temperature, top-k, top-p)")
    p.add_argument("--seed", type=int, default=None, help="random seed for reproducible sampling")
    p.add_argument("--num-samples", type=int, default=1, help="continuations generated in one batch (default 1)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is often fastest on a busy machine)")
    p.add_argument("--steps", default=None, metavar="S0,S1,...",
                   help="a masked LM: decoding steps per level, e.g. 16,4,2,1 (later levels 1 each)")
    p.add_argument("--choice-temperature", type=float, default=None, metavar="TAU",
                   help="a masked LM: Gumbel noise x TAU on the confidence that ranks which codes a step keeps, "
                        "annealed to 0 by each level's last step (default: lm.masked_generate's; 0: most confident)")
    p.add_argument("--window", type=int, default=None, metavar="FRAMES",
                   help="a masked LM: frames per model pass (default: a RoPE model's whole clip in one pass up to "
                        "2.1x its context, else its context; lm.masked_generate.default_window)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole prefix every step (slow; a check)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--stream", action="store_true",
                   help="write the continuation's wav while it is generated, a valid file at every moment that a "
                        "player can follow (rvqlm/commands/stream_generate.py); same codes as without it")
    p.add_argument("--decode-codebooks", type=int, default=None, metavar="K",
                   help="decode only the first K generated codebooks (the finer codes left out, as the codec's "
                        "first-k decoding; default: all)")
    p.set_defaults(func=_generate)


@dataclass
class OutputPaths:
    continuation: Path
    full: Path | None  # prompt + continuation; None without a prompt


def output_paths(out: str | Path, num_samples: int, with_prompt: bool) -> list[OutputPaths]:
    """out.wav -> [out.wav (+ out.full.wav)], or out-1.wav, out-1.full.wav, ... for several samples."""
    out = Path(out)
    suffix = out.suffix or ".wav"
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    names = [stem] if num_samples == 1 else [f"{stem}-{i}" for i in range(1, num_samples + 1)]
    return [OutputPaths(out.with_name(n + suffix), out.with_name(n + ".full" + suffix) if with_prompt else None)
            for n in names]


def check_request(args: argparse.Namespace) -> None:
    """Every mistake that can be caught before loading a model: ValueError with the option's name."""
    sampling_options(args)
    if not (args.seconds > 0 and math.isfinite(args.seconds)):
        raise ValueError(f"--seconds must be > 0, got {args.seconds}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
    if args.decode_codebooks is not None and args.decode_codebooks < 1:
        raise ValueError(f"--decode-codebooks must be >= 1, got {args.decode_codebooks}")
    if args.decode_codebooks is not None and args.stream:
        raise ValueError("--decode-codebooks decodes the finished codes; it is not for --stream")
    if args.prompt_seconds is not None:
        if args.prompt is None:
            raise ValueError("--prompt-seconds needs --prompt")
        if not (args.prompt_seconds > 0 and math.isfinite(args.prompt_seconds)):
            raise ValueError(f"--prompt-seconds must be > 0, got {args.prompt_seconds}")
    if Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a folder; give a file name such as {Path(args.out) / 'out.wav'}")
    from rvqlm_core.atomic import check_file_destination

    for paths in output_paths(args.out, args.num_samples, args.prompt is not None):
        for out in (paths.continuation, paths.full):
            if out is not None:
                check_file_destination(out, args.prompt)  # out.wav or out.full.wav must not replace the prompt


def check_pair(lm_model, codec) -> None:
    """Refuse an LM and a codec that do not share tokens (ValueError naming both). An LM may model the
    first k of the codec's codebooks (data.keep_codebooks): the prompt is encoded and the output decoded
    with those k."""
    cfg = lm_model.config
    if codec.codebook_size != cfg.codebook_size or codec.n_codebooks < cfg.n_codebooks:
        raise ValueError(f"the codec makes N_c={codec.n_codebooks} codebooks of {codec.codebook_size} codes, "
                         f"the LM models N_c={cfg.n_codebooks} of {cfg.codebook_size}: not the LM's codec")
    if cfg.codec_fingerprint is None:
        print("rvqlm generate: warning: the LM records no codec fingerprint, so the codec cannot be checked",
              file=sys.stderr)
    elif not codec.accepts_tokens(cfg.codec_fingerprint):
        raise ValueError(f"codec mismatch: the LM was trained on tokens of codec {cfg.codec_fingerprint[:16]}, "
                         f"but the given codec's tokens are {codec.token_fingerprint()[:16]}; token ids of different codecs "
                         "mean different sounds")


def sampling_options(args: argparse.Namespace):
    """The SamplingOptions the flags ask for (ValueError naming the flags)."""
    from lm.sampling import SamplingOptions

    try:
        return SamplingOptions(args.temperature, args.top_k, args.top_p, args.greedy, args.seed, args.cfg,
                               args.speaker_cfg)
    except ValueError as e:
        raise ValueError(f"{e} (--temperature / --top-k / --top-p / --seed / --cfg / --speaker-cfg)") from None


def check_condition(args: argparse.Namespace, lm_model):
    """The Condition of --text / --speaker (None without either); ValueError for what the LM cannot take,
    naming what it allows."""
    from lm.conditioning import Condition

    asked = [f"--{name.replace('_', '-')}" for name in ("text", "speaker", "cfg", "speaker_cfg", "monotonic")
             if getattr(args, name) is not None]
    if lm_model.config.condition is None:
        if asked:
            raise ValueError(f"{' '.join(asked)}: the LM {args.lm} is not conditioned (no condition encoder); "
                             "it takes only --prompt and the sampling options")
        return None
    try:
        lm_model.condition_inputs(args.text, args.speaker, 1)
    except ValueError as e:
        raise ValueError(f"{e} (--text / --speaker)") from None
    return Condition(args.text, args.speaker)


# The flags of a family's own decoding options (lm.families: its `options` dataclass's fields).
FAMILY_FLAGS = {"steps": "--steps", "window": "--window", "choice_temperature": "--choice-temperature",
                "use_cache": "--no-cache", "monotonic": "--monotonic / --no-monotonic"}


def family_options(args: argparse.Namespace, lm_model):
    """The LM family's decoding options from the flags; ValueError for a flag its family has no use for,
    naming the flags it has (its options without a flag, such as the AR family's sink, are not offered)."""
    from dataclasses import fields

    from lm.families import family_of

    family = family_of(lm_model.config.family)
    if args.stream and not family.streams:
        raise ValueError(f"--stream is not an option of the {family.name!r} LM family ({args.lm}), which does not "
                         "make its frames one by one")
    given = {"steps": args.steps, "window": args.window, "choice_temperature": args.choice_temperature,
             "use_cache": False if args.no_cache else None, "monotonic": args.monotonic}
    known = [f.name for f in fields(family.resolve("options"))]
    for key, value in given.items():
        if value is not None and key not in known:
            flags = ", ".join(FAMILY_FLAGS[k] for k in known if k in FAMILY_FLAGS) or "none"
            raise ValueError(f"{FAMILY_FLAGS[key]} is not an option of the {family.name!r} LM family ({args.lm}; "
                             f"its decoding options: {flags})")
    return family.make_options(given, FAMILY_FLAGS)


def check_length(args: argparse.Namespace, lm_model, codec, prompt_frames: int, new_frames: int) -> None:
    """Refuse --seconds longer than the free memory can hold the codes of, naming the longest (ValueError)."""
    from lm.generate import longest_generation

    longest = longest_generation(lm_model, args.num_samples) - prompt_frames
    if new_frames > longest:
        raise ValueError(f"--seconds {args.seconds:g}: at most {max(longest, 0) / codec.frame_rate:.0f} s can be "
                         f"generated here ({args.num_samples} sample(s): longer codes would not fit in the free "
                         f"memory of {args.device})")


def load_prompt_codes(path: str, codec, lm_model, prompt_seconds: float | None):
    """Read, trim to whole frames and encode the prompt -> codes [1, N_c of the LM, T0] (LongTensor)."""
    from codec.core.audio import FullScale, audio_info, load_audio
    from rvqlm.commands.codec import warn_full_scale

    cfg, hop, rate = lm_model.config, codec.hop_length, codec.frame_rate
    info = audio_info(path)
    seconds = info.duration if prompt_seconds is None else min(prompt_seconds, info.duration)
    frames = int(seconds * codec.sample_rate) // hop
    if frames > cfg.max_frames:
        raise ValueError(f"the prompt is {seconds:.2f} s ({frames} frames) but the LM's context holds at most "
                         f"{cfg.max_frames} frames ({cfg.max_frames / rate:.2f} s at {rate} frames/s); "
                         f"pass --prompt-seconds {math.floor(cfg.max_frames / rate * 100) / 100:g} or less")
    level = FullScale()
    wav = load_audio(path, codec.sample_rate, codec.channels, duration_seconds=seconds, level=level)
    warn_full_scale(level, path, "generate")
    whole = wav.shape[-1] // hop * hop  # no zero-padded last frame: every prompt frame is real signal
    if whole == 0:
        raise ValueError(f"{path}: the prompt is shorter than one codec frame ({1000 / rate:.0f} ms)")
    return codec.encode(wav[None, :, :whole], n_q=cfg.n_codebooks)


def _generate(args: argparse.Namespace) -> int:
    check_request(args)
    import torch

    from codec.loading import load_codec
    from lm.trunk import load_lm

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lm_model = load_lm(args.lm, map_location=args.device)
    condition = check_condition(args, lm_model)
    options = family_options(args, lm_model)
    codec = load_codec(args.codec, map_location=args.device)
    check_pair(lm_model, codec)
    if args.stream and not codec.can_stream:
        raise ValueError(codec.stream_refusal)
    if args.stream:
        from rvqlm.commands.stream_generate import generate_streaming

        prompt, new_frames = prompt_and_length(args, lm_model, codec)
        request = dict(sampling=sampling_options(args), condition=condition, options=options)
        return generate_streaming(args, lm_model, codec, prompt, new_frames,
                                  output_paths(args.out, args.num_samples, args.prompt is not None), request)

    out = generate_audio(args, lm_model, codec, condition, options)
    _write_samples(args, codec, out.wav, out.lengths, out.prompt_frames, out.new_frames)
    # Per sample stream (the batch runs them side by side): RTF = compute time / audio time of one sample.
    made = max(max(out.lengths) - out.prompt_frames, 1)
    rate = made / out.seconds
    print(f"generated {args.num_samples} x {made} frames in {out.seconds:.2f} s: {rate:.1f} frames/s per sample "
          f"({rate * args.num_samples:.1f} in all), real-time factor {out.seconds * codec.frame_rate / made:.3f} "
          "(< 1 is faster than real time)")
    return 0


def prompt_and_length(args: argparse.Namespace, lm_model, codec):
    """The prompt codes [num_samples, N_c, T0] (T0 = 0 without --prompt) and the frames to add (--seconds),
    checked to fit in memory."""
    import torch

    if args.prompt is not None:
        prompt = load_prompt_codes(args.prompt, codec, lm_model, args.prompt_seconds)
        prompt = prompt.expand(args.num_samples, -1, -1)
    else:
        prompt = torch.zeros(args.num_samples, lm_model.config.n_codebooks, 0, dtype=torch.long, device=codec.device)
    new_frames = max(1, round(args.seconds * codec.frame_rate))
    check_length(args, lm_model, codec, prompt.shape[-1], new_frames)
    return prompt, new_frames


@dataclass
class Generated:
    """What `generate_audio` made: codes [B, N_c, T] (prompt included), each row's length in frames (prompt
    included; a row that chose its end is shorter than prompt_frames + new_frames), the decoded audio
    [B, C, T * hop], and the seconds the LM took (decoding not included)."""

    codes: object
    lengths: list[int]
    wav: object
    prompt_frames: int
    new_frames: int
    seconds: float

    def ended(self, row: int = 0) -> bool:
        """Whether the row stopped at its end-of-audio token before the length limit."""
        return self.lengths[row] < self.prompt_frames + self.new_frames


def generate_audio(args: argparse.Namespace, lm_model, codec, condition=None, options=None) -> Generated:
    """What `rvqlm generate` makes of its flags (`args`, checked by check_request; `parse_args` builds them
    in code) with a loaded LM and codec (check_pair), but without --stream and without writing: the
    prompt, the condition (--text / --speaker: check_condition, or given), the family's options
    (family_options, or given), the sampling; generated, then decoded in one pass. A benchmark that
    says texts goes through this path, so it hears what the command would write."""
    from lm.generate import generate

    condition = check_condition(args, lm_model) if condition is None else condition
    options = family_options(args, lm_model) if options is None else options
    n_c = lm_model.config.n_codebooks
    if (args.decode_codebooks or 0) > n_c:
        raise ValueError(f"--decode-codebooks {args.decode_codebooks}: the LM makes {n_c} codebooks")
    prompt, new_frames = prompt_and_length(args, lm_model, codec)
    start = time.perf_counter()
    codes, lengths = generate(lm_model, prompt, new_frames, progress=not args.no_progress,
                              frame_rate=codec.frame_rate, return_lengths=True, sampling=sampling_options(args),
                              condition=condition, options=options)
    elapsed = time.perf_counter() - start
    wav = codec.decode(codes[:, :args.decode_codebooks or n_c])  # [B, C, T * hop]
    return Generated(codes, lengths.tolist(), wav, prompt.shape[-1], new_frames, elapsed)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`rvqlm generate ARGV...` parsed as the command parses it (its defaults), then check_request'ed."""
    parser = argparse.ArgumentParser(prog="rvqlm")
    register(parser.add_subparsers())
    args = parser.parse_args(["generate", *argv])
    check_request(args)
    return args


def _write_samples(args: argparse.Namespace, codec, wav, lengths: list[int], t0: int, new_frames: int) -> None:
    """Write each sample's continuation (and prompt + continuation), cut at its own length in frames."""
    from codec.core.audio import save_audio

    hop, rate = codec.hop_length, codec.frame_rate
    for paths, sample, n in zip(output_paths(args.out, args.num_samples, args.prompt is not None), wav, lengths):
        stopped = "" if n == t0 + new_frames else ", stopped at its end-of-audio token"
        save_audio(paths.continuation, sample[:, t0 * hop:n * hop], codec.sample_rate)
        print(f"wrote {paths.continuation} ({(n - t0) / rate:.2f} s continuation{stopped})")
        if paths.full is not None:
            save_audio(paths.full, sample[:, :n * hop], codec.sample_rate)
            print(f"wrote {paths.full} ({n / rate:.2f} s prompt + continuation)")
