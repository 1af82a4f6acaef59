"""rvqlm: the application on top of `codec` and `lm`: the `rvqlm` command, the built-in corpus, the
demo and its listening report, and the quality measures the benchmarks use.

Nothing in `rvqlm_core`, `codec` or `lm` imports it.
"""

__version__ = "0.1.0"
