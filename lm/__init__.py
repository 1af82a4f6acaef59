"""The multi-codebook transformer language model of rvqlm.

It models N_c parallel streams of integer codes (0..|V|-1) and knows nothing about audio:

    from lm import MultiCodebookLM, LMConfig
    model = MultiCodebookLM(LMConfig(n_codebooks=8, codebook_size=1024))
    nll = model.log_likelihood(codes)          # codes [B, N_c, T] -> [B] nats

A second family, MaskedLM (LMConfig.family = "masked"), predicts masked codes from both sides and
generates by iterative parallel decoding; load_lm loads a saved LM of either family.
"""

from lm.config import LMConfig
from lm.families import load_lm
from lm.kv_cache import KVCache
from lm.masked_model import MaskedLM
from lm.model import LMLoss, MultiCodebookLM
from lm.patterns import CodebookPattern, DelayPattern, ParallelPattern, get_pattern

__all__ = ["LMConfig", "MultiCodebookLM", "LMLoss", "KVCache", "CodebookPattern", "DelayPattern",
           "ParallelPattern", "get_pattern", "MaskedLM", "load_lm"]
