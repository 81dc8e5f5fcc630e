"""
LIMe's cross-layer relatives, plugged into model.py's GPT: each rewires the residual stream (or, for MoDA and
Depth-Attention, what attention reads). One file per relative, each against its paper (docs/deviations.md):

- hyper_connections.py: Hyper-Connections (Zhu et al. 2024, the LIMe paper's other baseline; `hc=n`, `hc_dynamic`)
  and mHC (DeepSeek, arXiv 2512.24880; `mhc='dynamic'`, the paper's, or `'static'`).
- denseformer.py: DenseFormer (arXiv 2402.02622; `denseformer=True`).
- attnres.py: Attention Residuals (Kimi, arXiv 2603.15031; `attnres='full'|'block'|'block-<m>'`).
- moda.py: MoDA (mixture-of-depths attention, arXiv 2603.15619; `moda=True`).
- muddformer.py: MUDDFormer (arXiv 2502.12170; `mudd=True`, and `mudd_prepost=True` for its PrePostDANorm).
- depth_attention.py: Depth-Attention (arXiv 2606.05014; `depth_attention=True`, `depth_attention_stride`).
- completep.py: CompleteP (arXiv 2505.01618; `depth_scaling='completep'`, `depth_base`), no relative but a depth
  scaling: each attention and MLP output times depth_base / n_layer, AdamW's eps too.

model.py knows none of them: this package extends it. This file is the plumbing they share and their registry.
RelativesConfig is GPTConfig plus every relative's options (all off: GPTConfig's model); RelativesGPT is model.GPT with
the relatives' weights added after the baseline's (attach: none drawn from the RNG; then reset_parameters: random
weights, drawn after the baseline's and LIMe's, so one seed gives every variant the baseline's weights), its blocks
run on the relative's stream (run_blocks, through stream(model, x)), and the mixing's FLOPs added (flops).
build_model(config) is model.GPT when no relative is on. What each relative's file declares: relatives/base.py.
The mixing runs in float32 even under bf16 autocast (the streams are kept in float32, as the baseline's residual
sum is): rounding the stream to bf16 at every sub-layer would lose what the sub-layers add.
"""
from dataclasses import dataclass

from model import GPT, GPTConfig

from . import completep
from .completep import DEPTH_SCALINGS, CompleteP  # noqa: F401 (DEPTH_SCALINGS: train.py's)

# The registry: one line per relative, in the order of their options, weights and random draws (their
# checkpoint keys and the RNG order follow it). Each file declares everything about its relative in RELATIVE
# (relatives/base.py says what that holds): a new relative is a file and a line here.
from .base import Relative
from .hyper_connections import RELATIVE as HYPER_CONNECTIONS
from .denseformer import RELATIVE as DENSEFORMER
from .attnres import RELATIVE as ATTENTION_RESIDUALS
from .moda import RELATIVE as MODA
from .muddformer import RELATIVE as MUDDFORMER
from .depth_attention import RELATIVE as DEPTH_ATTENTION
RELATIVES = tuple(r for r in globals().values() if isinstance(r, Relative))  # the lines above, in order

OPTIONS = {name: default for r in RELATIVES for name, default in r.options.items()}  # all off


def switch(relative):
    """A relative's switch: its first option (the others refine it)."""
    return next(iter(relative.options))


def on(relative, config):
    """Whether `config` turns `relative` on."""
    return bool(getattr(config, switch(relative), False))


def with_options(cls):
    """cls as a dataclass with every relative's options, in registry order, then CompleteP's, as its fields."""
    annotations = dict(cls.__dict__.get("__annotations__", {}))
    for options in [relative.options for relative in RELATIVES] + [completep.OPTIONS]:
        for name, default in options.items():
            annotations[name] = int if default is None else type(default)  # depth_base: None or an int
            setattr(cls, name, default)
    cls.__annotations__ = annotations
    return dataclass(cls)


@with_options
class RelativesConfig(GPTConfig):
    """model.GPTConfig and the relatives' options (each relative file's OPTIONS) and CompleteP's; all off: GPTConfig's
    model."""

    def __post_init__(self):
        super().__post_init__()
        check(self)


def enabled(config):
    """Whether any relative's option is on (then the model is a RelativesGPT), or a depth scaling."""
    return any(getattr(config, name, False) for name in OPTIONS) or completep.depth_scaled(config)


def build_model(config):
    """The model of `config`: model.GPT when no relative is on, else RelativesGPT (CompletePGPT when depth-scaled)."""
    if completep.depth_scaled(config):
        return CompletePGPT(config)
    return RelativesGPT(config) if enabled(config) else GPT(config)


class RelativesGPT(GPT):
    """model.GPT with a cross-layer relative rewiring its residual stream (or, for MoDA and Depth-Attention,
    its attention)."""

    def __init__(self, config):
        super().__init__(config)  # the baseline's weights and LIMe's routers, drawn as in model.GPT
        attach(self)              # the relative's weights: fixed init, no RNG draw
        reset_parameters(self)    # the relative's random weights, drawn last
        self.stream_hooks = []    # probes of the stream (relatives/base.py's Stream)

    def run_blocks(self, x, kv_stack=None, cache=None):
        s = stream(self, x)  # a relative's residual stream for this pass, or None: the plain residual sum
        if s is None:
            return super().run_blocks(x, kv_stack, cache)
        s.hooks = self.stream_hooks
        return s.run(self.transformer.h, self.rope, kv_stack, cache)

    def flops_per_token(self, seq_len=None):
        return super().flops_per_token(seq_len) + flops(self.config, seq_len or self.config.block_size)


class CompletePGPT(CompleteP, RelativesGPT):
    """The model of depth_scaling='completep': CompleteP's rules (relatives/completep.py) on RelativesGPT."""


def check(config):
    """ValueError for a combination that does not make sense; LIMe combines with every stream."""
    for relative in RELATIVES:
        relative.check(config)
        others = ["lime"] * bool(config.lime) + [switch(r) for r in RELATIVES
                                                 if r is not relative and on(r, config)]
        if relative.alone and on(relative, config) and others:
            raise ValueError(f"{switch(relative)} is {relative.alone}: use it alone, without "
                             f"{' or '.join(others)}")
    rewiring = [switch(r) for r in RELATIVES if r.rewires_stream]
    if sum(on(r, config) for r in RELATIVES if r.rewires_stream) > 1:
        raise ValueError(f"{', '.join(rewiring[:-1])} and {rewiring[-1]} each rewire the residual stream; "
                         "use one of them")
    completep.check(config, [switch(r) for r in RELATIVES if on(r, config) and not r.with_completep])


def attach(model):
    """Add the enabled relatives' weights to the model, under their checkpoint names. Nothing here draws
    from the RNG: with one seed every variant starts from the baseline's weights."""
    for relative in RELATIVES:
        if on(relative, model.config):
            relative.attach(model)


def reset_parameters(model):
    """Draw the relatives' random weights: called last in GPT.__init__, after the baseline's and the routers'."""
    for relative in RELATIVES:
        if on(relative, model.config):
            relative.reset_parameters(model)


def stream(model, x):
    """The residual stream of one forward pass from the embedding x (B, T, d); None: the plain sum."""
    for relative in RELATIVES:
        if on(relative, model.config):
            return relative.stream(model, x)
    return None


def flops(c, T):
    """Forward matmul FLOPs per token of the relatives' mixing (multiply-add = 2); elementwise work not counted."""
    return sum(relative.flops(c, T) for relative in RELATIVES if on(relative, c))
