"""The multi-codebook transformer language model of rvqlm.

It models N_c parallel streams of integer codes (0..|V|-1) and knows nothing about audio:

    from lm import MultiCodebookLM, LMConfig, generate, SamplingOptions
    model = MultiCodebookLM(LMConfig(n_codebooks=8, codebook_size=1024))
    nll = model.log_likelihood(codes)          # codes [B, N_c, T] -> [B] nats
    more = generate(model, codes, 50, sampling=SamplingOptions(top_k=250, seed=1))

Every LM is a family (lm.families) on one trunk (lm.trunk): "ar", MultiCodebookLM, and "masked",
MaskedLM (LMConfig.family = "masked"), which predicts masked codes from both sides and generates by
iterative parallel decoding; load_lm loads a saved LM of any family, `generate` continues it.
"""

from lm.conditioning import Condition
from lm.config import LMConfig
from lm.families import Family, register_family
from lm.generate import generate
from lm.kv_cache import KVCache
from lm.masked_model import MaskedLM
from lm.model import LMLoss, MultiCodebookLM
from lm.patterns import CodebookPattern, DelayPattern, ParallelPattern, get_pattern
from lm.sampling import SamplingOptions
from lm.trunk import build_lm, load_lm, read_lm_config

__all__ = ["LMConfig", "MultiCodebookLM", "LMLoss", "KVCache", "CodebookPattern", "DelayPattern",
           "ParallelPattern", "get_pattern", "MaskedLM", "load_lm", "build_lm", "read_lm_config", "Family",
           "register_family", "generate", "SamplingOptions", "Condition"]
