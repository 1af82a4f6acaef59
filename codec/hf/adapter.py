"""Hugging Face codecs behind rvqlm's codec interface: EnCodec, DAC and Mimi folders, through `transformers`.

    codec = load_hf_codec("models/mimi")     # a folder save_pretrained wrote: config.json + model.safetensors
    codes = codec.encode(wav)                  # wav [B, C, S] at codec.sample_rate -> LongTensor [B, n_q, T]
    wav = codec.decode(codes[:, :k])           # codes [B, k, T], 1 <= k <= N_c -> [B, C, T * hop]

`HFCodec` wraps the library's own model (`EncodecModel`, `DacModel`, `MimiModel`; the optional extra
`pip install -e '.[hf]'`) as an `AudioCodec` (codec.core.interface), the interface of rvqlm's own
`codec.core.model.Codec`: encode / decode of the first k codebooks, fingerprints. One module per family
(codec/hf/encodec.py, codec/hf/dac.py, codec/hf/mimi.py) says how its model is called.

Fingerprints: `token_fingerprint()` is a sha256 (`codec.core.model.weights_hash`) of the family, the config
fields that decide the codes (the family's TOKEN_KEYS) and the tensors of the encoder and quantizer;
`fingerprint()` of the whole config and every tensor. Token folders, `.rvq` files and LMs record the
token fingerprint as for rvqlm's own codec, so an LM of Mimi tokens refuses EnCodec.

Tokenizing: the receptive field of these encoders is not known exactly (Mimi's has a transformer), so
`rvqlm tokenize` encodes every file whole, alone in its call (`frame_span` is None, so `tokenizes_whole_files`):
the codes are the model's `encode` of the file, bit for bit; a file must fit in memory. No streaming
(`stream_refusal` says why; `--stream` is refused in one line).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import nn

from codec.core.interface import AudioCodec
from codec.core.model import check_wav, weights_hash

#: config.json `model_type` -> the module of its adapter.
FAMILIES = {"encodec": "codec.hf.encodec", "dac": "codec.hf.dac", "mimi": "codec.hf.mimi"}
#: Config keys that are bookkeeping, not the model (left out of `fingerprint()`).
BOOKKEEPING = ("transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path", "return_dict",
               "output_hidden_states", "output_attentions", "use_cache", "_attn_implementation_autoset")


def hf_model_type(path: str | Path) -> str | None:
    """The `model_type` of a Hugging Face model folder's config.json, or None for any other folder (rvqlm's
    own LM folders name theirs "rvqlm.…": not Hugging Face ones)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("model_type") if isinstance(config, dict) else None
    return value if isinstance(value, str) and not value.startswith("rvqlm") else None


def import_transformers():
    """The transformers module, or one line saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise RuntimeError("reading a Hugging Face codec folder needs transformers: pip install -e '.[hf]' "
                           "(or pip install 'transformers>=5.25,<6')") from None
    return transformers


def load_hf_codec(path: str | Path, map_location: str | torch.device = "cpu") -> "HFCodec":
    """The adapter of a Hugging Face EnCodec, DAC or Mimi folder; ValueError naming the supported model types."""
    import importlib

    model_type = hf_model_type(path)
    if model_type not in FAMILIES:
        raise ValueError(f"{path}: a Hugging Face model of type {model_type!r} is not a codec rvqlm can use; "
                         f"supported model types: {', '.join(FAMILIES)}")
    if not (Path(path) / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path}: no model.safetensors next to config.json (a folder as save_pretrained "
                                "writes it, e.g. from `huggingface-cli download kyutai/mimi --local-dir DIR`)")
    adapter = importlib.import_module(FAMILIES[model_type]).ADAPTER
    transformers = import_transformers()
    check_weights_file(Path(path) / "model.safetensors")
    model_class = getattr(transformers, adapter.model_class)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar in a command's output
    transformers.utils.logging.set_verbosity_error()  # nor its load report: what it says is refused below
    try:
        model, info = model_class.from_pretrained(str(path), local_files_only=True, dtype=torch.float32,
                                                  output_loading_info=True)
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: transformers could not load this {model_type} folder: {first}") from None
    finally:
        transformers.utils.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    check_loading_info(path, info)
    return adapter(model, source=str(path)).to(map_location).eval()


def check_weights_file(file: Path) -> None:
    """ValueError in one line for a model.safetensors whose header cannot be read (cut short, not safetensors)."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            f.keys()
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError) for a broken file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{file} is not a readable safetensors file ({first}); the download may have been cut "
                         "short: fetch the folder again") from None


def check_loading_info(path: str | Path, info: dict[str, Any]) -> None:
    """ValueError in one line when the weights file lacks tensors the model needs (transformers would start
    them at random, and the codes would be random) or holds tensors it does not have (another model's)."""
    for key, what in (("missing_keys", "is missing weights the model needs"),
                      ("unexpected_keys", "holds weights the model does not have"),
                      ("mismatched_keys", "holds weights of other shapes than the model's")):
        names = sorted(str(k if isinstance(k, str) else k[0]) for k in info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ValueError(f"{path} {what} ({shown}): not the folder save_pretrained wrote; fetch it again")


class HFCodec(AudioCodec):
    """A transformers codec model behind rvqlm's codec interface (module docstring). Subclasses, one a
    family, set `family`, `model_class`, TOKEN_KEYS, DECODER_PREFIXES and implement `_encode`, `_decode`."""

    family = ""
    model_class = ""
    #: config fields that decide the codes (with the encoder and quantizer tensors)
    TOKEN_KEYS: tuple[str, ...] = ()
    #: state-dict prefixes of the parts that only turn codes into audio (left out of the token fingerprint)
    DECODER_PREFIXES: tuple[str, ...] = ("decoder.",)

    def __init__(self, model: nn.Module, source: str = "<model>"):
        super().__init__()
        self.model, self.source = model.eval(), source
        self.check_config(model.config)

    def train(self, mode: bool = True) -> "HFCodec":
        """Only eval mode: these models apply quantizer dropout in train mode (DAC), so codes would be random."""
        if mode:
            raise ValueError(f"the Hugging Face {self.family} codec is used for inference only in rvqlm "
                             "(train it with its own library)")
        return super().train(False)

    # ------------------------------------------------------------------ the family's part

    def check_config(self, config) -> None:
        """ValueError for a configuration of the family this adapter cannot turn into plain codes."""

    @abstractmethod
    def _encode(self, wav: torch.Tensor, n_q: int) -> torch.Tensor:
        """wav [B, C, S] on the device -> codes [B, n_q, T] (the model's own encode)."""

    @abstractmethod
    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, k, T] -> audio [B, C, S'] as the model's decode gives it (S' about T * hop)."""

    # ------------------------------------------------------------------ the interface

    @property
    def config(self):
        """The transformers config (`config_dict()` is its `to_dict()`)."""
        return self.model.config

    @property
    def sample_rate(self) -> int:
        return int(self.model.config.sampling_rate)

    @property
    def channels(self) -> int:
        return int(getattr(self.model.config, "audio_channels", 1))

    @property
    def hop_length(self) -> int:
        return int(self.model.config.hop_length)

    @property
    def frame_rate(self) -> float:
        """Frames per second: sample_rate / hop_length (12.5 for Mimi; an int where it is whole)."""
        rate = self.sample_rate / self.hop_length
        return int(rate) if rate == int(rate) else rate

    @property
    @abstractmethod
    def n_codebooks(self) -> int:
        """Codebooks the model's quantizer holds (each family's config names them its own way)."""

    @property
    def codebook_size(self) -> int:
        return int(self.model.config.codebook_size)

    @property
    def causal(self) -> bool:
        """The model's own convolutions are causal (EnCodec 24 kHz, Mimi); rvqlm streams none of them all the
        same (`stream_refusal`)."""
        return bool(getattr(self.model.config, "use_causal_conv", False))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def frame_span(self) -> None:
        """Not known exactly (Mimi's encoder has a transformer): `rvqlm tokenize` encodes files whole."""
        return None

    def check_n_q(self, n_q: int | None) -> int:
        n_q = self.n_codebooks if n_q is None else n_q
        if isinstance(n_q, bool) or not isinstance(n_q, int) or not 1 <= n_q <= self.n_codebooks:
            raise ValueError(f"n_q must be in 1..{self.n_codebooks} for this {self.family} codec, got {n_q!r}")
        return n_q

    @torch.inference_mode()
    def encode(self, wav: torch.Tensor, n_q: int | None = None) -> torch.Tensor:
        """wav [B, C, S] float at `sample_rate` -> LongTensor [B, n_q (default N_c), frames_for(S)]."""
        check_wav(wav, self.channels)
        n_q = self.check_n_q(n_q)
        codes = self._encode(wav.to(self.device, torch.float32), n_q).long()
        expected = (wav.shape[0], n_q, self.frames_for(wav.shape[-1]))
        if tuple(codes.shape) != expected:
            raise RuntimeError(f"the {self.family} model encoded {wav.shape[-1]} samples into codes "
                               f"{tuple(codes.shape)}, expected {expected}")
        return codes

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, k, T], 1 <= k <= N_c, values in 0..|V|-1 -> wav [B, C, T * hop] float (the model's
        decode, cut or zero-padded at the end to exactly T * hop samples)."""
        if not isinstance(codes, torch.Tensor) or codes.dim() != 3:
            shape = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise ValueError(f"decode expects codes shaped [B, k, T], got {shape}")
        if codes.shape[0] == 0 or codes.shape[-1] == 0:
            raise ValueError(f"decode got an empty code tensor of shape {tuple(codes.shape)}")
        if not 1 <= codes.shape[1] <= self.n_codebooks:
            raise ValueError(f"decode takes 1..{self.n_codebooks} codebooks, got {codes.shape[1]}")
        if codes.min() < 0 or codes.max() >= self.codebook_size:
            raise ValueError(f"codes must lie in 0..{self.codebook_size - 1}")
        audio = self._decode(codes.to(self.device).long())
        want = codes.shape[-1] * self.hop_length
        if audio.shape[-1] >= want:
            return audio[..., :want]
        return nn.functional.pad(audio, (0, want - audio.shape[-1]))

    def streaming_encoder(self, n_q: int | None = None):
        raise ValueError(self.stream_refusal)

    def streaming_decoder(self, exact: bool = False):
        raise ValueError(self.stream_refusal)

    @property
    def stream_refusal(self) -> str:
        return (f"the Hugging Face {self.family} codec {self.source} cannot stream in rvqlm (only rvqlm's own causal "
                "codecs stream chunk by chunk); run without --stream")

    # ------------------------------------------------------------------ fingerprints

    def config_dict(self) -> dict[str, Any]:
        """The transformers config's `to_dict()`."""
        return self.model.config.to_dict()

    def token_settings(self) -> dict[str, Any]:
        config = self.model.config
        return {"family": self.family, **{k: _plain(getattr(config, k, None)) for k in self.TOKEN_KEYS}}

    def _state(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def fingerprint(self) -> str:
        """sha256 hex of the whole config (bookkeeping keys left out) and every tensor: this exact model."""
        config = {k: v for k, v in self.model.config.to_dict().items() if k not in BOOKKEEPING}
        return weights_hash({"family": self.family, "config": json.loads(json.dumps(config, default=str))},
                            self._state())

    def token_fingerprint(self) -> str:
        """sha256 hex of what makes and means the codes: the family, its TOKEN_KEYS settings, the
        encoder's and quantizer's tensors (every tensor but the DECODER_PREFIXES ones)."""
        state = {k: v for k, v in self._state().items() if not k.startswith(self.DECODER_PREFIXES)}
        return weights_hash(self.token_settings(), state)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.family}: {self.sample_rate} Hz, {self.channels} channel(s), {self.frame_rate} frames/s, "
                f"{self.n_codebooks} x {self.codebook_size} codes, {self.source})")


def _plain(value: Any) -> Any:
    """A config value as JSON would hold it (tuples as lists)."""
    return json.loads(json.dumps(value, default=str))
