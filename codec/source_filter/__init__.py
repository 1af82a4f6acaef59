"""The source-filter codec: F0 / envelope / aperiodicity analysis, WORLD-style synthesis, and its training."""
