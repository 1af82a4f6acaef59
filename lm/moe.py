"""Mixture-of-experts feed-forward sublayer (LMConfig.n_experts > 0): E experts, each the configured
FFN kind (lm.layers: SwiGLU or FeedForward of width ffn_dim), and a router choosing k per position.

    x [B, S, d] -> logits r = x W_r [B, S, E] -> the top-k experts e_1..e_k of each position
    gates g_i = softmax over the k chosen logits (they sum to 1)
    y = sum_i g_i FFN_{e_i}(x)                                 [B, S, d]

Every position reaches its k experts (no capacity limit, no dropped tokens); an expert runs once
on the rows routed to it. An expert chosen by no position still runs on zero rows, so each
expert's weights are in every step's graph (DDP without find_unused_parameters).

Load balancing (Switch Transformer, Fedus et al. 2021): over the N positions of a forward,
f_e = the share of the N k routing choices that went to expert e, P_e = the mean over positions
of softmax(r)_e (all E logits), and aux = E * sum_e f_e P_e, which is 1 when routing is uniform
and E when one expert takes everything. Each MoE layer keeps its last forward's value in
`aux_loss`; `moe_aux_loss(model)` averages them, and training adds LMConfig.moe_aux_weight times it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lm.config import LMConfig


class MoEFeedForward(nn.Module):
    """Top-k routed experts. x [B, S, d] -> [B, S, d]; `aux_loss` holds the last forward's balance loss."""

    def __init__(self, cfg: LMConfig, make_expert):
        super().__init__()
        self.top_k = cfg.moe_top_k
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(make_expert(cfg) for _ in range(cfg.n_experts))
        self.aux_loss: Tensor | None = None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [N, d] -> (router logits [N, E], chosen experts [N, k] long, gates [N, k])."""
        logits = self.router(x)
        top, chosen = logits.topk(self.top_k, dim=-1)
        return logits, chosen, torch.softmax(top, dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits, chosen, gates = self.route(flat)
        self.aux_loss = balance_loss(logits, chosen)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)  # empty for an unchosen expert: still in the graph
            y = expert(flat[rows]) * gates[rows, slot, None].to(flat.dtype)
            out = out.index_add(0, rows, y)
        return out.view_as(x)


def balance_loss(logits: Tensor, chosen: Tensor) -> Tensor:
    """Switch Transformer's load-balancing loss E * sum_e f_e P_e (module docstring).
    logits [N, E] router logits, chosen [N, k] expert ids -> a scalar (1 when uniform)."""
    n_experts = logits.shape[-1]
    share = F.one_hot(chosen, n_experts).float().sum(dim=(0, 1)) / chosen.numel()  # f_e, no gradient
    mean_prob = torch.softmax(logits.float(), dim=-1).mean(dim=0)  # P_e
    return n_experts * (share * mean_prob).sum()


def moe_aux_loss(model: nn.Module) -> Tensor | None:
    """The mean of the MoE layers' last balance losses (None when the model has no MoE layer)."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, MoEFeedForward) and m.aux_loss is not None]
    return torch.stack(losses).mean() if losses else None
