"""A saved model: a folder holding `config.json` (a header naming the format, and the model's
settings) and `model.safetensors` (every tensor), written atomically and read without unpickling.

The codec and the LM each describe their folders with a `FolderFormat` and call `save_folder` /
`read_folder` / `load_state`; the checks and error messages live here once.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

from rvqlm_core.atomic import refuse_foreign_folder, usual_permissions
from rvqlm_core.weight_dtype import INT8_SCALE_SUFFIX, dequantize_rows, loads_as, quantize_rows, storage_dtype

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_METADATA = "rvqlm_config"  # the weights file's copy of config.json, to catch mixed saves


@dataclass(frozen=True)
class FolderFormat:
    """How one kind of model is named in its `config.json`: `{type_key: type_name, "format_version":
    version, ...}`. `what` names the kind in messages; `extra_files` are other files a save may
    write (a folder holding anything else is never replaced)."""

    what: str
    type_key: str
    type_name: str
    version: int
    extra_files: tuple[str, ...] = ()

    def header(self) -> dict[str, Any]:
        return {self.type_key: self.type_name, "format_version": self.version}


def cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """A detached, contiguous CPU copy of `module.state_dict()`."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}


def stored_state(state: dict[str, torch.Tensor], dtype: "str | torch.dtype | None", option: str = "dtype",
                 which: Callable[[str], bool] = lambda name: True) -> dict[str, torch.Tensor]:
    """`state` with the floating-point tensors that `which` selects cast to the storage dtype."""
    to = storage_dtype(dtype, option)
    return {k: v.to(to) if v.is_floating_point() and which(k) else v for k, v in state.items()}


def save_folder(path: str | os.PathLike, fmt: FolderFormat, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                metadata: dict[str, str] | None = None,
                extra: dict[str, Callable[[Path], None]] | None = None) -> Path:
    """Write `config.json` ({**fmt.header(), **config}) and `model.safetensors` (`tensors`, with the
    config and `metadata` in its header), plus each `extra` file by its writer, as one folder.

    Atomic: everything goes to a temporary sibling folder that is then renamed into place, so
    `path` never holds a half-written model. An existing `path` is replaced only if it holds
    nothing but this format's files (a model card is never deleted)."""
    dest = Path(path)
    refuse_foreign_folder(dest, (CONFIG_FILE, WEIGHTS_FILE, *fmt.extra_files), f"a saved {fmt.what}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        header = {**fmt.header(), **config}
        (tmp / CONFIG_FILE).write_text(json.dumps(header, indent=2, sort_keys=True) + "\n")
        meta = {CONFIG_METADATA: json.dumps(header, sort_keys=True), **(metadata or {})}
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata=meta)
        for name, write in (extra or {}).items():
            write(tmp / name)
        usual_permissions(tmp)
        _replace_folder(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _replace_folder(new: Path, dest: Path) -> None:
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_folder(path: str | os.PathLike, fmt: FolderFormat,
                map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read a folder written by `save_folder`: (config.json without its header, tensors).

    Raises FileNotFoundError (no folder, a file missing) or ValueError (not JSON, another format or
    version, an unreadable weights file, config and weights from different saves), naming the file."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"no {fmt.what} folder at {folder}")
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for p in (config_path, weights_path):
        if not p.is_file():
            raise FileNotFoundError(f"{folder} is not a saved {fmt.what}: {p.name} is missing "
                                    f"(a saved {fmt.what} holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        header = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_path}: not valid JSON ({e})") from None
    if not isinstance(header, dict) or header.get(fmt.type_key) != fmt.type_name:
        found = header.get(fmt.type_key) if isinstance(header, dict) else None
        raise ValueError(f"{config_path} does not describe an rvqlm {fmt.what} "
                         f"({fmt.type_key} {found!r}, expected {fmt.type_name!r})")
    if header.get("format_version") != fmt.version:
        raise ValueError(f"{config_path}: {fmt.what} format version {header.get('format_version')!r} is not "
                         f"supported (this rvqlm reads version {fmt.version})")
    try:
        with safe_open(str(weights_path), framework="pt") as f:
            saved = (f.metadata() or {}).get(CONFIG_METADATA)
        tensors = load_file(str(weights_path), device=str(map_location))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{weights_path}: not a readable safetensors file ({e})") from None
    if saved is not None and json.loads(saved) != header:
        raise ValueError(f"{config_path} and {WEIGHTS_FILE} come from different saves; save the {fmt.what} again")
    config = {k: v for k, v in header.items() if k not in fmt.header()}
    return config, tensors


def load_state(model: nn.Module, found: dict[str, torch.Tensor], source: str | os.PathLike,
               may_cast: Callable[[str], bool] = lambda name: True) -> None:
    """Load `found` into `model` strictly, after checking names, shapes and dtypes against the
    model's own (one ValueError listing every problem). Tensors that `may_cast` allows load from
    half precision into float32."""
    expected = model.state_dict()
    problems = []
    for label, names in (("missing", set(expected) - set(found)), ("unexpected", set(found) - set(expected))):
        if names:
            names = sorted(names)
            problems.append(f"{label} tensors {names[:5]}{' ...' if len(names) > 5 else ''}")
    for name in sorted(set(expected) & set(found)):
        want, got = expected[name], found[name]
        if want.shape != got.shape:
            problems.append(f"{name} has shape {tuple(got.shape)}, the config needs {tuple(want.shape)}")
        elif want.dtype != got.dtype and not (may_cast(name) and loads_as(got.dtype, want.dtype)):
            problems.append(f"{name} has dtype {got.dtype}, expected {want.dtype}")
    if problems:
        raise ValueError(f"{source} does not match its {CONFIG_FILE}: " + "; ".join(problems[:8]))
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in found.items()}, strict=True)



def quantized_state(state: dict[str, torch.Tensor], which: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """`state` with each floating-point tensor of two or more dimensions that `which` selects stored as
    int8 rows (`name`) and their float32 scales (`name` + INT8_SCALE_SUFFIX); the rest as they are."""
    out = {}
    for name, value in state.items():
        if value.is_floating_point() and value.dim() >= 2 and which(name):
            out[name], out[name + INT8_SCALE_SUFFIX] = quantize_rows(value)
        else:
            out[name] = value
    return out


def dequantized_state(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, tuple]]:
    """The inverse of `quantized_state`: (float state with every int8 pair dequantized to float32,
    {name: (q, scale)} of those pairs, for a model that computes with them directly)."""
    scales = {k[:-len(INT8_SCALE_SUFFIX)]: v for k, v in tensors.items() if k.endswith(INT8_SCALE_SUFFIX)}
    state, pairs = {}, {}
    for name, value in tensors.items():
        if name.endswith(INT8_SCALE_SUFFIX):
            continue
        if name in scales:
            if value.dtype != torch.int8 or tuple(scales[name].shape) != tuple(value.shape[:-1]):
                raise ValueError(f"{name}: an int8 weight needs int8 values and one scale per row; got {value.dtype} "
                                 f"{tuple(value.shape)} with scales {tuple(scales[name].shape)}")
            pairs[name] = (value, scales[name].float())
            state[name] = dequantize_rows(*pairs[name])
        else:
            state[name] = value
    return state, pairs
