"""A new LM family is one registration (lm.families), made here from this test file alone: a toy family
trains through `rvqlm train-lm` (which reads the family from the recipe) and generates through
`rvqlm generate`, the same code paths the shipped families take, with no edit of the packages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from lm.families import Family, family_of, register_family
from lm.generate import DecodeRequest, generate
from lm.guidance import GuidedDecoder
from lm.sampling import SamplingOptions
from lm.training import LMTrainingModule, held_out_report
from lm.trunk import LMLoss, LMTrunk, load_lm
from rvqlm.cli import main as rvqlm_main
from test_lm_data import make_token_corpus

REPO = Path(__file__).resolve().parents[1]


class ToyLM(LMTrunk):
    """The toy family: the shared trunk read causally over whole frames (parallel pattern), every code of
    frame t predicted from the frames before it. forward: tokens [B, N_c, T] -> logits [B, N_c, T, |V|]."""

    family = "toy"

    def forward(self, tokens, memory=None):
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        return self.logits(self.trunk(tokens, positions, None, None, self._memory_for(tokens.shape[0], memory)))

    def loss(self, codes, frame_mask=None, guide=None):
        """codes [B, N_c, T] -> LMLoss of the next-frame NLL over the real frames (guide: none here)."""
        self._check_codes(codes, frame_mask)
        inputs = torch.cat([torch.full_like(codes[..., :1], self.config.bos_id), codes[..., :-1]], dim=-1).long()
        logits = self(inputs)
        valid = torch.ones_like(codes, dtype=torch.bool) if frame_mask is None else frame_mask[:, None].expand_as(codes)
        nll = F.cross_entropy(logits.flatten(0, 2).float(), codes.long().flatten(), reduction="none").view_as(codes)
        nll_sum, count = (nll * valid).sum(dim=(0, 2)), valid.sum(dim=(0, 2))
        return LMLoss(loss=nll_sum.sum() / count.sum().clamp(min=1), nll_sum=nll_sum, count=count)


@dataclass(frozen=True)
class ToyDecoding:
    """The toy family's own decoding options: none."""


DECODED = []  # each toy decode's request, so a test can see the CLI went through it


def toy_decode(model, request: DecodeRequest):
    """Frame by frame from bos: the last frame's logits, sampled as the request's SamplingOptions say."""
    DECODED.append(request)
    decoder = GuidedDecoder(model, request.condition, request.sampling, request.prompt.shape[0])
    codes = request.prompt
    for _ in range(request.new_frames):
        inputs = torch.cat([codes.new_full((*codes.shape[:2], 1), model.config.bos_id), codes], dim=-1)
        logits = decoder(inputs[..., -model.config.max_seq_len:])[:, :, -1]
        codes = torch.cat([codes, request.sampling.sample(logits, request.generator)[..., None]], dim=-1)
    return codes, torch.full((codes.shape[0],), codes.shape[-1], dtype=torch.long)


register_family(Family("toy", ToyLM, toy_decode, ToyDecoding, LMTrainingModule, held_out_report,
                       patterns=("parallel",)))


@pytest.fixture(scope="module")
def trained_toy(tmp_path_factory):
    """A tiny random codec of 3 codebooks of 16 codes, its (synthetic) tokens, and a toy LM trained on them
    for 6 steps by `rvqlm train-lm` from a recipe whose model.config.family is "toy"."""
    from codec import Codec, CodecConfig

    root = tmp_path_factory.mktemp("toy_family")
    torch.manual_seed(0)
    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=2, latent_dim=8, n_codebooks=3,
                                             codebook_size=16, dilations=(1,)))).eval()
    codec.save_pretrained(root / "codec")
    make_token_corpus(root / "tokens", fingerprint=codec.token_fingerprint())
    recipe = yaml.safe_load((REPO / "recipes" / "lm_masked_tiny.yaml").read_text())
    recipe["model"]["config"]["family"] = "toy"
    recipe["trainer"].update(max_steps=6, val_check_interval=3)
    (root / "toy.yaml").write_text(yaml.safe_dump(recipe))
    assert rvqlm_main(["train-lm", "--config", str(root / "toy.yaml"), "--data.tokens_dir", str(root / "tokens"),
                       "--trainer.default_root_dir", str(root / "run")]) == 0
    return root


def test_a_toy_family_trains_through_train_lm_and_loads_as_itself(trained_toy):
    model = load_lm(trained_toy / "run" / "pretrained")
    assert isinstance(model, ToyLM) and model.config.family == "toy" and model.config.end_id is None
    assert (trained_toy / "run" / "checkpoints" / "last.ckpt").is_file()
    report = held_out_report(model, str(trained_toy / "tokens"), "valid")
    assert 0 < report["nll"] < 2 * torch.log(torch.tensor(16.0)).item()


def test_a_toy_family_generates_through_the_generate_command(trained_toy, tmp_path, capsys):
    from codec.core.audio import audio_info

    root, DECODED[:] = trained_toy, []
    argv = ["generate", "--lm", str(root / "run" / "pretrained"), "--codec", str(root / "codec"), "--seconds", "0.4",
            "--seed", "3", "--top-k", "5", "--no-progress"]
    assert rvqlm_main([*argv, "--out", str(tmp_path / "toy.wav")]) == 0
    assert len(DECODED) == 1 and DECODED[0].sampling == SamplingOptions(top_k=5, top_p=1.0, seed=3)
    assert audio_info(tmp_path / "toy.wav").duration == pytest.approx(0.4)
    # from Python, the same front door: reproducible with the seed, and the family's decode again
    model = load_lm(root / "run" / "pretrained")
    codes = generate(model, None, DECODED[0].new_frames, sampling=SamplingOptions(top_k=5, seed=3))
    assert codes.shape == (1, 3, DECODED[0].new_frames) and len(DECODED) == 2
    assert torch.equal(codes, generate(model, None, codes.shape[-1], sampling=SamplingOptions(top_k=5, seed=3)))
    for flag in (["--steps", "2"], ["--stream"], ["--no-cache"]):
        assert rvqlm_main([*argv, *flag, "--out", str(tmp_path / "no.wav")]) == 2
        assert "not an option of the 'toy' LM family" in capsys.readouterr().err
    assert not (tmp_path / "no.wav").exists()


def test_a_family_is_registered_once_and_builds_only_its_own_class():
    toy = family_of("toy")
    assert register_family(toy) is toy  # the same family again: nothing changes
    with pytest.raises(ValueError, match="registered already"):
        register_family(Family("toy", ToyLM, toy_decode, ToyDecoding, LMTrainingModule, held_out_report))
    with pytest.raises(ValueError, match="family is 'toy'"):
        register_family(Family("other", ToyLM, toy_decode, ToyDecoding, LMTrainingModule, held_out_report))
    with pytest.raises(ValueError, match="unknown LM family 'nope'; known: ar, masked, toy"):
        family_of("nope")
