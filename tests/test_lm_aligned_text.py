"""Aligned text (issue 47): text units (lm.text_units), the text placed on the frames and the duration
predictor (lm.aligned_text), their data (alignments.jsonl) and their generation."""

from __future__ import annotations

import json

import pytest
import torch

from lm import LMConfig, MultiCodebookLM
from lm.aligned_text import aligned_durations, frame_units_from_durations, frames_at, run_offsets
from lm.conditioning import Condition
from lm.generate import generate
from lm.sampling import SamplingOptions
from lm.text_units import TextUnitError, build_alphabet, normalize, unit_ids, units
from seed_helpers import randomized

SPEAKERS = ["font_small", "font_big"]
ALPHABET = build_alphabet(["Ahoj, světe!", "loď je tu"])


def aligned_model(seed: int = 0, **condition) -> MultiCodebookLM:
    cond = {"speakers": SPEAKERS, "text_max_bytes": 32, "encoder_layers": 1, "text_dropout": 0.0,
            "speaker_dropout": 0.0, "alphabet": ALPHABET, **condition}
    torch.manual_seed(seed)
    cfg = LMConfig(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=4, max_seq_len=64,
                   condition=cond)
    return randomized(MultiCodebookLM(cfg), seed=seed).float().eval()


def test_units_lowercase_letters_words_and_edges():
    assert normalize("  Co je TO?! Loď…") == "co je to loď"
    assert units("Co je to?") == "_co je to_"
    assert ALPHABET.startswith("_ ") and "ď" in ALPHABET and "!" not in ALPHABET


@pytest.mark.parametrize("text", ["", "?!…", "🙂🙂"])
def test_a_text_with_nothing_to_say_is_refused(text):
    with pytest.raises(TextUnitError, match="no letter or digit"):
        units(text)


def test_characters_outside_the_alphabet_are_named():
    with pytest.raises(TextUnitError, match="'жзк'|never learned"):
        unit_ids("ахоj жзк", ALPHABET)
    assert unit_ids("ahoj", ALPHABET)[0] == 0 and unit_ids("ahoj", ALPHABET)[-1] == 0


def test_frame_units_repeat_each_unit_for_its_duration():
    got = frame_units_from_durations([[2, 0, 3], [1, 1]])
    assert got.tolist() == [[0, 0, 2, 2, 2], [0, 1, -1, -1, -1]]
    since, until = run_offsets(got)
    assert since[0].tolist() == [0, 1, 0, 1, 2] and until[0].tolist() == [1, 0, 2, 1, 0]


def test_frames_at_is_zero_past_the_stream():
    frames = torch.arange(6.0).view(1, 3, 2)
    out = frames_at(frames, torch.arange(5))
    assert out[0, :3].tolist() == frames[0].tolist() and out[0, 3:].abs().sum() == 0


def test_the_stream_reaches_the_decoder_where_the_units_are_said():
    """lm.aligned_text: frame t adds its unit's state; moving a unit's frames changes the logits there."""
    model = aligned_model()
    codes = torch.randint(0, 16, (1, 3, 10))
    cond = model.condition_inputs("ahoj", "font_small", 1, durations=[2, 2, 2, 2, 1, 1])
    other = model.condition_inputs("ahoj", "font_small", 1, durations=[2, 2, 2, 1, 2, 1])
    a = model.token_nll(codes, condition=cond)[0]
    b = model.token_nll(codes, condition=other)[0]
    assert torch.equal(a[..., :6], b[..., :6])  # frames 0..5 read the same units at the same offsets
    assert not torch.allclose(a, b)


def test_duration_loss_trains_the_predictor():
    model = aligned_model().train().requires_grad_(True)
    cond = model.condition_inputs(["ahoj", "loď je tu"], SPEAKERS, 2)
    cond.frame_units = frame_units_from_durations([[1, 3, 3, 3, 3, 1], [1] * 11])
    cond.durations = torch.full((2, 11), -1.0)
    cond.durations[0, :6] = torch.tensor([1.0, 3, 3, 3, 3, 1])
    cond.durations[1, :11] = 1.0
    out = model.loss(torch.randint(0, 16, (2, 3, 11)), condition=cond)
    assert out.duration is not None and out.duration > 0
    (out.loss + out.duration).backward()
    assert model.condition_encoder.frame_text.duration[-1].weight.grad.abs().sum() > 0


def test_generation_reads_given_or_predicted_durations_and_guides():
    model = aligned_model()
    sampling = SamplingOptions(seed=1, cfg_scale=2.0)
    given = generate(model, None, 12, sampling=sampling, condition=Condition("ahoj", "font_big", durations=[1, 2, 2, 2, 2, 1]))
    again = generate(model, None, 12, sampling=sampling, condition=Condition("ahoj", "font_big", durations=[1, 2, 2, 2, 2, 1]))
    assert torch.equal(given, again)
    predicted = generate(model, None, 12, sampling=sampling, condition=Condition("ahoj", "font_big"))
    assert predicted.shape[:2] == (1, 3)
    with pytest.raises(ValueError, match="one frame count per unit"):
        generate(model, None, 4, sampling=sampling, condition=Condition("ahoj", "font_big", durations=[1, 2]))


def test_cached_decoding_equals_the_forward_with_the_stream():
    model = aligned_model()
    sampling = SamplingOptions(seed=3)
    from lm.ar_decode import ARDecoding
    cond = Condition("loď je tu", "font_small", durations=[1] + [1] * 9 + [1])
    fast = generate(model, None, 10, sampling=sampling, condition=cond)
    slow = generate(model, None, 10, sampling=sampling, condition=cond, options=ARDecoding(use_cache=False))
    assert torch.equal(fast, slow)


def test_alignments_file_is_read_and_checked(tmp_path):
    class Entry:
        def __init__(self, path, n_frames):
            self.path, self.n_frames = path, n_frames

    (tmp_path / "alignments.jsonl").write_text(json.dumps({"path": "a.wav", "units": "_ahoj_",
                                                           "durations": [1, 2, 2, 2, 2, 1]}) + "\n")
    got = aligned_durations(tmp_path, [Entry("a.wav", 10), Entry("b.wav", 5)], ["Ahoj!", ""])
    assert got == ((1, 2, 2, 2, 2, 1), ())
    with pytest.raises(ValueError, match="does not fit"):
        aligned_durations(tmp_path, [Entry("a.wav", 11)], ["Ahoj!"])
    with pytest.raises(ValueError, match="no alignment of b.wav"):
        aligned_durations(tmp_path, [Entry("b.wav", 5)], ["loď"])


def aligned_tokens(out):
    """tests/test_lm_conditioning.py's token corpus with an alignments.jsonl: each text's units spread
    evenly over its file's frames."""
    from test_lm_conditioning import conditioned_tokens

    from lm.aligned_text import ALIGNMENTS
    from rvqlm_core.token_shards import TokenShards

    conditioned_tokens(out)
    lines = []
    for entry in TokenShards.open(out).entries:
        text = entry.metadata.get("text")
        if text:
            row = units(text)
            base, extra = divmod(entry.n_frames, len(row))
            lines.append(json.dumps({"path": entry.path, "units": row,
                                     "durations": [base + (i < extra) for i in range(len(row))]}))
    (out / ALIGNMENTS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def test_every_window_reads_its_whole_text_placed_on_its_frames(tmp_path):
    """lm.data with alignments: windows inside a file keep the text; frame_units index the units said there."""
    from lm.data import TokenDataModule, TokenFiles, TrainWindowStream

    tokens = aligned_tokens(tmp_path / "tok")
    files = TokenFiles.of_split(tokens, "train", alignments=True)
    stream = TrainWindowStream(files, n_codebooks=3, window_frames=40, batch_size=4, batches_per_epoch=10, seed=3,
                               conditions=True)
    inside = 0
    for b in range(10):
        batch = stream.batch(b)
        for j in range(4):
            entry, start, length = stream.sample_span(b * 4 + j)
            f = files.entry_indices.index(entry)
            expect = frame_units_from_durations([files.durations[f] or [0]], files.n_frames[f])[0, start:start + length]
            if files.durations[f]:
                assert batch["text"][j] == files.texts[f] and torch.equal(batch["frame_units"][j, :length], expect)
                inside += start > 0
            else:
                assert batch["text"][j] == "" and bool((batch["frame_units"][j] == -1).all())
    assert inside > 0
    dm = TokenDataModule(str(tokens), window_frames=40, conditions=True, alignments=True)
    assert dm.alphabet == build_alphabet(dm.train_files.texts + dm.valid_files.texts) and "ě" in dm.alphabet


@pytest.mark.parametrize("family", ["ar", "masked"])
def test_an_aligned_lm_trains_and_generates_from_text(tmp_path, family):
    """The CLI path: train-lm links the alphabet from the data, logs the duration loss, and the exported LM
    says a text in a voice through `generate` (either family)."""
    from test_lm_training import REPO, tiny_args

    from lm import load_lm
    from lm.training import train_main

    tokens = aligned_tokens(tmp_path / "tok")
    cond = json.dumps({"text_max_bytes": 40, "encoder_layers": 1})
    recipe = [] if family == "ar" else ["--config", str(REPO / "recipes" / "lm_masked_tiny.yaml"),
                                        "--data.tokens_dir", str(tokens), "--trainer.default_root_dir",
                                        str(tmp_path / "run")]
    train_main(tiny_args(tokens, tmp_path / "run", *recipe, "--data.conditions", "true", "--data.alignments", "true",
                         "--model.config.condition", cond, "--trainer.max_steps", "3"))
    logged = (next((tmp_path / "run").rglob("metrics.csv"))).read_text()
    assert "train/duration" in logged
    model = load_lm(tmp_path / "run" / "pretrained")
    assert model.config.family == family
    assert model.config.condition.alphabet.startswith("_ ") and "ě" in model.config.condition.alphabet
    codes = generate(model, None, 20, sampling=SamplingOptions(seed=1),
                     condition=Condition("věta", model.config.condition.speakers[0]))
    assert codes.shape[:2] == (1, 3)
    with pytest.raises(ValueError, match="never learned"):
        generate(model, None, 5, condition=Condition("ωω", model.config.condition.speakers[0]))


def test_an_aligned_lm_ends_once_its_text_has_been_said():
    """lm.aligned_text.AlignedEnd: no end before the units' frames run out, the end at most `linger` frames after
    (cached and recomputed decoding alike); rows of guidance without a text are free."""
    from lm.ar_decode import ARDecoding

    model = aligned_model(seed=2)
    durations = [2, 3, 3, 3, 3, 2]  # "ahoj": 16 frames
    for cache in (True, False):
        for seed in range(4):
            _, lengths = generate(model, None, 60, sampling=SamplingOptions(seed=seed, cfg_scale=2.0),
                                  condition=Condition("ahoj", "font_small", durations=durations),
                                  options=ARDecoding(use_cache=cache), return_lengths=True)
            assert 16 <= int(lengths[0]) <= 16 + 25, (cache, seed, lengths)


# ---- the masked family reading aligned text (SoundStorm's split: text on the frames, codes in parallel) ----

def aligned_masked(seed: int = 0):
    from lm.masked_model import MaskedLM

    cond = {"speakers": SPEAKERS, "text_max_bytes": 32, "encoder_layers": 1, "text_dropout": 0.0,
            "speaker_dropout": 0.0, "alphabet": ALPHABET}
    torch.manual_seed(seed)
    cfg = LMConfig(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=4, max_seq_len=64, pos="rope",
                   pattern="parallel", family="masked", condition=cond)
    return randomized(MaskedLM(cfg), seed=seed).float().eval()


def test_a_masked_lm_starts_from_the_plain_masked_lm_and_learns_durations():
    """lm.masked_training.masked_warm_start: the decoder copied, only the condition parts fresh, so under the
    null conditions the started LM is the plain one; its loss carries the duration predictor's (lm.aligned_text)."""
    import dataclasses

    from lm.masked_model import MaskedLM
    from lm.masked_training import masked_warm_start

    model = MaskedLM(aligned_masked().config).eval()  # fresh: the voice table at zero
    plain = randomized(MaskedLM(dataclasses.replace(model.config, condition=None)), seed=5).float().eval()
    fresh = masked_warm_start(model, plain, "plain")
    assert fresh and all(any(p in name for p in ("condition_encoder.", ".cross_attn.", ".cross_norm."))
                         for name in fresh)
    codes = torch.randint(0, 16, (2, 3, 12))
    torch.testing.assert_close(model(codes), plain(codes))  # null text adds no stream, zero cross output
    cond = model.condition_inputs(["ahoj", "loď je tu"], SPEAKERS, 2)
    cond.frame_units = frame_units_from_durations([[1, 2, 2, 2, 2, 1], [1] * 11], 12)
    cond.durations = torch.tensor([[1.0, 2, 2, 2, 2, 1] + [-1.0] * 5, [1.0] * 11])
    out = model.train().loss(codes, condition=cond, generator=torch.Generator().manual_seed(0))
    assert out.duration is not None and out.duration > 0


def test_a_masked_lm_says_each_text_in_its_own_frames():
    """lm.masked_generate: an aligned-text masked LM fills the frames its text's durations give (given or
    predicted), each row its own length, zero past it; chunked passes read the text where their frames are."""
    from lm.masked_generate import MaskedDecoding

    model = aligned_masked(seed=1)
    rows = [[1, 2, 2, 2, 2, 1], [2] * 11]  # "ahoj": 10 frames; "loď je tu": 22 frames
    cond = Condition(["ahoj", "loď je tu"], SPEAKERS, durations=rows)
    for options in (MaskedDecoding(), MaskedDecoding(window=8, context=3)):
        codes, lengths = generate(model, None, 40, sampling=SamplingOptions(seed=1, cfg_scale=2.0), condition=cond,
                                  options=options, return_lengths=True)
        assert lengths.tolist() == [10, 22] and codes.shape == (2, 3, 22)
        assert codes[0, :, 10:].abs().sum() == 0
    short, lengths = generate(model, None, 15, sampling=SamplingOptions(seed=1), condition=cond, return_lengths=True)
    assert lengths.tolist() == [10, 15] and short.shape[-1] == 15  # --seconds still caps it
    predicted, lengths = generate(model, None, 200, sampling=SamplingOptions(seed=1),
                                  condition=Condition("ahoj", "font_big"), return_lengths=True)
    assert 6 <= int(lengths[0]) == predicted.shape[-1] < 200
