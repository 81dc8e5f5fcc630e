"""CompleteP (arXiv 2505.01618; `depth_scaling='completep'`, `depth_base`): no relative but a parametrization, a depth
scaling: each attention and MLP output times depth_base / n_layer, AdamW's eps too. relatives/__init__.py makes its
model class, CompletePGPT, from the CompleteP mixin below and RelativesGPT."""
import math
from functools import partial

import torch

OPTIONS = dict(
    depth_scaling="standard",  # DEPTH_SCALINGS below; 'standard' is GPTConfig's model
    depth_base=None,           # CompleteP's base depth L_base: the depth its learning rate was tuned at
)

# CompleteP (Dey et al., arXiv 2505.01618) is depth-muP with alpha = 1: a learning rate tuned at the base depth L_base
# stays optimal at depth L. Its rules for AdamW at fixed width (width multiplier m_N = 1), with m_L = L / L_base, each
# a row of the paper's Table 1 as the authors' reference code implements it (EleutherAI/nanoGPT-mup, branch
# completep, commit 6f8bc3b, model.py, whose lines are cited):
#   residual branch multiplier  m_L^-alpha = L_base / L on every attention and MLP output  (Block, l. 113-118)
#   AdamW epsilon               eps m_N^-1 m_L^-alpha = eps L_base / L, in every group      (l. 335)
#   hidden weights' lr          eta m_N^-1 m_L^(alpha-1) = eta: unchanged at alpha = 1       (l. 331, 350)
#   norm gains' lr              eta m_L^(alpha-1) = eta: unchanged                           (l. 345)
#   biases' lr                  eta m_L^(alpha-1): the model has no biases                   (l. 355)
#   weight decay                lambda m_N: nothing in depth                                 (l. 349)
#   hidden init variance        sigma^2 m_N^-1: nothing in depth, no 1/sqrt(2L) term         (l. 168-174)
#                               so o_proj and down_proj keep the base depth's std 0.02 / sqrt(2 L_base), where the
#                               standard model draws 0.02 / sqrt(2 L)
#   embedding, LM head, final norm: nothing in depth                                        (l. 338-342, 358-361)
# LIMe's routers and AttnRes's queries live inside the branches: whichever row they fall under, their lr factor is 1
# at alpha = 1; their eps is scaled as every group's. At L = L_base every factor is exactly 1: the standard model.
# The multiplier is elementwise: no matmul FLOPs (flops_per_token unchanged).
DEPTH_SCALINGS = ("standard", "completep")
COMPLETEP_ALPHA = 1.0  # depth-muP's alpha: CompleteP's


def depth_scaled(config):
    """Whether the config asks for a depth scaling other than the standard model's."""
    return getattr(config, "depth_scaling", "standard") != "standard"


def check(config, unsupported=()):
    """ValueError for a depth scaling that is unknown, lacks its base depth, or meets a relative it does not support
    (unsupported: the switches of the relatives turned on that it does not support)."""
    if config.depth_scaling not in DEPTH_SCALINGS:
        raise ValueError(f"unknown depth_scaling '{config.depth_scaling}'; choose one of: {', '.join(DEPTH_SCALINGS)}")
    if not depth_scaled(config):
        if config.depth_base is not None:
            raise ValueError("depth_base is CompleteP's base depth: set depth_scaling='completep' too "
                             "(or leave depth_base unset)")
        return
    if config.depth_base is None or config.depth_base < 1:
        raise ValueError(f"depth_scaling='completep' needs depth_base >= 1, the n_layer its learning rate was tuned "
                         f"at (got {config.depth_base})")
    if unsupported:
        raise ValueError(f"depth_scaling='completep' supports the baseline, lime and attnres, not {unsupported[0]} "
                         "(docs/deviations.md, Depth scaling)")


def depth_multiplier(config):
    """m_L = L / L_base."""
    return config.n_layer / config.depth_base


def scale_output(multiplier, module, args, output):
    """Forward hook: a sub-layer's output times the residual branch multiplier."""
    return output * multiplier


class CompleteP:
    """CompleteP's rules above, mixed into a model class (relatives.CompletePGPT: CompleteP, RelativesGPT), on the
    baseline, LIMe or Attention Residuals. The multiplier is a forward hook on each block's attention and MLP, so
    whatever stream the outputs join (the plain residual sum, AttnRes's sources) receives them scaled."""

    def __init__(self, config):
        super().__init__(config)  # the standard model's weights (and a relative's), drawn as always
        m = depth_multiplier(config)
        with torch.no_grad():  # hidden init variance independent of depth: N(0, 0.02^2 / (2 L)) * L / L_base
            for block in self.transformer.h:
                block.attn.o_proj.weight.mul_(math.sqrt(m))
                block.mlp.down_proj.weight.mul_(math.sqrt(m))
        multiplier = m ** -COMPLETEP_ALPHA  # the residual branch multiplier, L_base / L
        for block in self.transformer.h:
            block.attn.register_forward_hook(partial(scale_output, multiplier))
            block.mlp.register_forward_hook(partial(scale_output, multiplier))

    def configure_optimizers(self, weight_decay, learning_rate, router_lr, betas, device_type, eps=1e-8):
        """model.GPT's groups, AdamW's epsilon times m_L^-alpha in every group (the lr and the weight decay of every
        group stay: their factors are 1 at alpha = 1 and fixed width)."""
        eps = eps * depth_multiplier(self.config) ** -COMPLETEP_ALPHA
        return super().configure_optimizers(weight_decay, learning_rate, router_lr, betas, device_type, eps=eps)
