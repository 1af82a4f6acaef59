"""Settings dataclasses built strictly from JSON or YAML dicts (model configs, training groups)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def settings_from_dict(cls: type[T], data: Any, source: str) -> T:
    """The dataclass `cls` built from a dict of its fields, refusing anything else with one
    ValueError that names `source`: a misspelt key must never silently become a default."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object of {cls.__name__} settings, got {type(data).__name__}")
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{source}: unknown {cls.__name__} settings {unknown}; known: {known}")
    try:
        return cls(**data)
    except TypeError as e:  # a wrong type that the checks in __post_init__ trip over
        raise ValueError(f"{source}: invalid {cls.__name__} ({e})") from None
