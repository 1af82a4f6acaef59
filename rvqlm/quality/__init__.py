"""Quality measures of decoded and generated speech (metrics.py) and reference-codec round trips."""
