"""The ground floor that `codec` and `lm` share: atomic writes, model folders (safetensors +
config.json), weight storage dtypes, the token-shard format, RNG state and resumable batch streams.
It imports neither of them, nor the `rvqlm` application."""
