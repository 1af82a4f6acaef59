"""Starting an LM from a saved one (`init_from`): the same LM, or a conditioned LM from an
unconditioned one of the same decoder.

Same architecture (dropout may differ): every tensor is copied, strictly.

Conditioned from unconditioned (the recipe adds `condition`, everything else equal): the decoder's
tensors are copied, strictly by name and shape, and only the parts the unconditioned LM lacks start
fresh: the condition encoder, each block's cross-attention sublayer, and the end-of-audio id's row
in every embedding table and head. The ids move as lm.config describes (end = |V|, pad |V| + 1,
bos |V| + 2), so the old pad and bos rows are copied to their new places. The cross-attention
output projections start at zero, so the started model's code logits are exactly the old LM's
(its decoder ignores the conditions until training moves them; their gradient is not zero, since
the projection's input is not).
"""

from __future__ import annotations

import dataclasses

import torch
from einops import rearrange
from torch import Tensor, nn

from lm.int8 import refuse_training

FRESH_IN_CONDITIONED = ("condition_encoder.", ".cross_attn.", ".cross_norm.")


def architecture_differences(mine, theirs) -> list[str]:
    """The LMConfig fields (dropout left out) in which `theirs` differs from `mine`, as
    'field (theirs vs mine)' strings."""
    a = dataclasses.replace(mine, dropout=0.0).to_dict()
    b = dataclasses.replace(theirs, dropout=0.0).to_dict()
    return [f"{k} ({b.get(k)!r} vs {a.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def warm_start(model: nn.Module, start: nn.Module, source: str) -> list[str]:
    """Load the weights of LM `start` into LM `model` (see the module docstring); returns the names
    of the tensors that kept their fresh initialisation. ValueError naming `source` and every
    difference when the two cannot be paired, or `source` alone when it is an int8 (inference-only) LM."""
    refuse_training(start, f"init_from {source}:")
    differ = architecture_differences(model.config, start.config)
    if not differ:
        model.load_state_dict(start.state_dict())
        return []
    conditioned_from_plain = model.config.condition is not None and start.config.condition is None
    if differ != [d for d in differ if d.startswith("condition ")] or not conditioned_from_plain:
        raise ValueError(f"init_from {source}: its LM differs from this recipe's in " + ", ".join(differ)
                         + " (an LM starts from the same architecture, or a conditioned LM from an unconditioned "
                           "one that differs only in `condition`)")
    return decoder_into_conditioned(model, start, source)


@torch.no_grad()
def decoder_into_conditioned(model: nn.Module, start: nn.Module, source: str) -> list[str]:
    """Copy the unconditioned `start`'s decoder into the conditioned `model`; returns the fresh tensor names.
    A family without an end-of-audio id (masked) keeps its ids, embedding rows and heads as they are."""
    mine, theirs = model.state_dict(), start.state_dict()
    v = model.config.codebook_size
    problems = [f"unexpected tensor {k}" for k in theirs if k not in mine]
    fresh = [k for k in mine if k not in theirs]
    problems += [f"missing tensor {k}" for k in fresh if not any(part in k for part in FRESH_IN_CONDITIONED)]
    for name, tensor in theirs.items():
        if name not in mine:
            continue
        if model.config.end_id is None and mine[name].shape == tensor.shape:
            mine[name].copy_(tensor)
        elif name == "token_embedding.weight":
            _copy_rows(mine[name], tensor, model.config.n_codebooks,
                       [(slice(0, v), slice(0, v)), (v + 1, v), (v + 2, v + 1)])
        elif name == "head_weight":
            mine[name][:, :v].copy_(tensor)  # row v, the end-of-audio logit, stays fresh
        elif mine[name].shape != tensor.shape:
            problems.append(f"{name} has shape {tuple(tensor.shape)}, this LM needs {tuple(mine[name].shape)}")
        else:
            mine[name].copy_(tensor)
    if problems:
        raise ValueError(f"init_from {source}: cannot start this conditioned LM from it: " + "; ".join(problems[:8]))
    for block in model.blocks:
        nn.init.zeros_(block.cross_attn.out.weight)
        if block.cross_attn.out.bias is not None:
            nn.init.zeros_(block.cross_attn.out.bias)
    return fresh


def _copy_rows(dest: Tensor, src: Tensor, n_codebooks: int, rows: list[tuple]) -> None:
    """dest [N_c R', d] and src [N_c R, d] as N_c stacked tables: dest table rows <- src table rows, per pair."""
    d = rearrange(dest, "(c r) e -> c r e", c=n_codebooks)  # a view: writes land in dest
    s = rearrange(src, "(c r) e -> c r e", c=n_codebooks)
    for to, frm in rows:
        d[:, to] = s[:, frm]
