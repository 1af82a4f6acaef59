"""A codec is composed of registered parts (codec.core.parts): a decoder defined and registered in this file
alone trains through codec.neural.training's real code path (`rvqlm train-codec`), encodes and decodes (any
first k codebooks), streams, exports to int8, and learns a saved codec's tokens; a version-1 folder
reads into the nested config with its fingerprints unchanged."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from codec import Codec, CodecConfig
from codec.core.config_v1 import flat_settings, nested_from_flat
from codec.core.parts import register_part
from codec.core.streaming import StreamingDecoder, stream_roundtrip
from codec.neural.training import CodecModule
from rvqlm.cli import main
from rvqlm_core.persistence import CONFIG_METADATA

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = REPO / "recipes" / "codec_tiny.yaml"


@dataclass(frozen=True)
class FrameDecoderConfig:
    """The toy decoder's settings."""

    width: int = 16

    def check(self, codec: CodecConfig) -> None:
        if self.width < 1:
            raise ValueError(f"frame decoder width must be >= 1, got {self.width}")


@register_part("decoder", "frame_mlp", FrameDecoderConfig)
class FrameDecoder(nn.Module):
    """Each latent frame to its hop of samples through a two-layer MLP: z [B, D, T] -> wav [B, C, T * hop]."""

    def __init__(self, latent_dim: int, channels: int, hop: int, width: int):
        super().__init__()
        self.channels = channels
        self.mlp = nn.Sequential(nn.Linear(latent_dim, width), nn.Tanh(), nn.Linear(width, channels * hop))

    @classmethod
    def from_config(cls, config: FrameDecoderConfig, codec: CodecConfig) -> "FrameDecoder":
        return cls(codec.latent_dim, codec.channels, codec.hop_length, config.width)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        y = self.mlp(z.transpose(1, 2))  # [B, T, C * hop]
        return y.reshape(z.shape[0], z.shape[-1], self.channels, -1).permute(0, 2, 1, 3).flatten(2)

    def streaming_step(self, exact: bool = False) -> "FrameDecoderStream":
        return FrameDecoderStream(self)


class FrameDecoderStream:
    """Frame by frame there is nothing to carry: each frame's audio is final at once."""

    lookahead_samples = 0

    def __init__(self, decoder: FrameDecoder):
        self.decoder = decoder

    def step(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)

    def flush(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, self.decoder.channels, 0)


TOY = {"kind": "frame_mlp", "width": 12}


def _train(tmp_path: Path, corpus_dir: Path, *overrides: str) -> Path:
    """`rvqlm train-codec` on the tiny recipe for 3 steps -> the exported codec folder."""
    assert main(["train-codec", "--config", str(TINY_RECIPE), "--trainer.max_steps", "3",
                 "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
                 "--trainer.val_check_interval", "3", "--data.corpus_dir", str(corpus_dir), *overrides]) == 0
    return tmp_path / "codec_tiny" / "version_0" / "pretrained"


@pytest.fixture(scope="module")
def toy_codec_dir(tmp_path_factory, corpus_dir) -> Path:
    return _train(tmp_path_factory.mktemp("toy"), corpus_dir, "--model.codec.decoder", json.dumps(TOY))


def test_a_decoder_registered_in_a_test_file_trains_encodes_decodes_and_streams(toy_codec_dir, speech_files):
    from codec.core.audio import load_audio

    saved = json.loads((toy_codec_dir / "config.json").read_text())
    assert saved["format_version"] == 2 and saved["decoder"] == TOY
    codec = Codec.from_pretrained(toy_codec_dir)
    assert isinstance(codec.decoder, FrameDecoder) and codec.config.decoder == FrameDecoderConfig(width=12)
    wav = load_audio(speech_files["test"][0], 16000)[None, :, :8000]
    codes = codec.encode(wav)
    assert codes.shape == (1, 4, 25)
    for k in (1, 2, 4):
        audio = codec.decode(codes[:, :k])
        assert audio.shape == (1, 1, 8000) and torch.isfinite(audio).all()
    streamed, _ = stream_roundtrip(codec, wav, chunk=333)
    assert (streamed - codec.decode(codes)).abs().max() < 1e-5
    assert StreamingDecoder(codec).latency_samples == codec.hop_length


def test_the_toy_decoder_learns_in_codec_training(corpus_dir):
    """CodecModule's training steps (losses, optimizer, schedule) move every decoder weight."""
    import lightning as L
    import yaml

    from codec.neural.data import CodecDataModule

    torch.manual_seed(0)
    settings = {**yaml.safe_load(TINY_RECIPE.read_text())["model"]["codec"], "decoder": TOY}
    module = CodecModule(settings, losses={"mel_n_ffts": [256, 1024]}, optim={"lr": 1e-2})
    before = {k: v.clone() for k, v in module.codec.decoder.state_dict().items()}
    data = CodecDataModule(corpus_dir=str(corpus_dir), crop_seconds=0.2, batch_size=2, max_train_files=4,
                           max_valid_files=1)
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False, limit_val_batches=0,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    after = module.codec.decoder.state_dict()
    assert trainer.global_step == 3 and all(not torch.equal(before[k], after[k]) for k in before)


def test_the_toy_decoder_exports_to_int8(toy_codec_dir, tmp_path):
    """Int8 export takes any decoder's linear layers; the tokens stay the float codec's."""
    codec = Codec.from_pretrained(toy_codec_dir)
    assert main(["export-codec", str(toy_codec_dir), str(tmp_path / "int8"), "--dtype", "int8"]) == 0
    int8 = Codec.from_pretrained(tmp_path / "int8")
    assert int8.token_fingerprint() == codec.token_fingerprint()
    codes = codec.encode(torch.randn(1, 1, 3200) * 0.1)
    assert (int8.decode(codes) - codec.decode(codes)).abs().max() < 0.05 * codec.decode(codes).abs().max() + 1e-4


def test_a_new_decoder_part_learns_a_saved_codecs_tokens(tmp_path, corpus_dir):
    """init_from + train_decoder_only with another decoder kind: encoder and quantizer taken as they
    are, the token fingerprint kept (the decoder never enters it); without train_decoder_only, refused."""
    seanet = _train(tmp_path / "base", corpus_dir)
    toy = _train(tmp_path / "toy", corpus_dir, "--model.codec.decoder", json.dumps(TOY),
                 "--model.init_from", str(seanet), "--model.train_decoder_only", "true")
    base, tuned = Codec.from_pretrained(seanet), Codec.from_pretrained(toy)
    assert tuned.token_fingerprint() == base.token_fingerprint() and tuned.fingerprint() != base.fingerprint()
    wav = torch.randn(1, 1, 3200) * 0.1
    assert torch.equal(tuned.encode(wav), base.encode(wav))
    with pytest.raises(ValueError, match="differs from this recipe's in decoder"):
        CodecModule({**base.config.to_dict(), "decoder": TOY}, init_from=str(seanet))


# The flat config.json of a version-1 folder: the iSTFT codec shipped until commit 295b688 wrote this one.
VERSION_1_CONFIG = {
    "format": "rvqlm-codec", "format_version": 1, "causal": True, "channels": 1, "codebook_size": 1024,
    "commitment_weight": 1.0, "compress": 2, "dead_code_threshold": 0.02, "decoder": "istft",
    "decoder_channels": 32, "decoder_dim": 384, "decoder_layers": 8, "dilations": [1, 3, 9], "ema_decay": 0.99,
    "encoder": "seanet", "encoder_channels": 8, "encoder_dim": 256, "encoder_full_rate_residuals": False,
    "encoder_hop": 80, "encoder_layers": 6, "istft_hop": 160, "istft_n_fft": 640, "istft_phase": "angle",
    "kernel_size": 7, "kmeans_init": True, "kmeans_iters": 10, "last_kernel_size": 7, "latent_dim": 64,
    "n_codebooks": 8, "quantizer_dropout": 0.5, "residual_kernel_size": 3, "sample_rate": 16000,
    "strides": [4, 4, 5, 4]}


def test_a_version_1_folder_reads_nested_with_the_same_fingerprints(tmp_path):
    """A flat config.json converts to the defaults; the settings hashed are version 1's, so both
    fingerprints are those of the same codec built in memory; saved again it is a version-2 folder
    that loads to the same codec."""
    torch.manual_seed(0)
    built = Codec(CodecConfig())
    folder = built.save_pretrained(tmp_path / "v1")
    (folder / "config.json").write_text(json.dumps(VERSION_1_CONFIG))
    weights = load_file(folder / "model.safetensors")  # the weights record the config they were saved with
    save_file(weights, folder / "model.safetensors", metadata={CONFIG_METADATA: json.dumps(VERSION_1_CONFIG)})
    codec = Codec.from_pretrained(folder)
    assert codec.config == CodecConfig()  # the defaults are the version-1 iSTFT codec's
    shaping = {k: v for k, v in VERSION_1_CONFIG.items() if k not in (
        "format", "format_version", "encoder", "encoder_dim", "encoder_layers", "encoder_hop", "istft_phase")}
    assert codec.config.shaping_settings() == flat_settings(codec.config) == shaping
    assert (codec.fingerprint(), codec.token_fingerprint()) == (built.fingerprint(), built.token_fingerprint())
    again = Codec.from_pretrained(codec.save_pretrained(tmp_path / "v2", decoder_dtype="float16"))
    saved = json.loads((tmp_path / "v2" / "config.json").read_text())
    assert saved["format_version"] == 2 and saved["decoder"]["kind"] == "istft" and "istft_hop" not in saved
    assert again.token_fingerprint() == codec.token_fingerprint()


def test_version_1_settings_convert_or_are_refused_by_name():
    seanet = CodecConfig.from_flat({"encoder_channels": 2, "decoder_channels": 3, "dilations": [1]})
    assert (seanet.decoder.kind, seanet.decoder.channels, seanet.encoder.dilations) == ("seanet", 3, (1,))
    assert flat_settings(seanet)["decoder_channels"] == 3 and "decoder" not in flat_settings(seanet)
    toy = CodecConfig(decoder=FrameDecoderConfig())  # no version-1 form: the nested settings are hashed
    assert flat_settings(toy) is None and toy.shaping_settings()["decoder"] == {"kind": "frame_mlp", "width": 16}
    assert toy.token_settings() == CodecConfig().token_settings()  # the decoder never shapes the tokens
    for flat, message in [({"encoder": "stft"}, "the STFT encoder\\) was removed; git commit 69f8875"),
                          ({"istft_phase": "angle_vector"}, "angle_vector phase head\\) was removed"),
                          ({"n_codebook": 3}, "unknown version-1 codec settings \\['n_codebook'\\]")]:
        with pytest.raises(ValueError, match=message):
            nested_from_flat(flat, "config.json")
    with pytest.raises(ValueError, match="frame decoder width must be >= 1"):
        CodecConfig(decoder=FrameDecoderConfig(width=0))
    with pytest.raises(ValueError, match="already registered"):
        register_part("decoder", "frame_mlp", FrameDecoderConfig)(nn.Identity)
