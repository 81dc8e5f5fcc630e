"""What every relative's file builds on: the Stream it runs blocks on, float32 mixing, and the few things each file
exports (Relative), which the registry in relatives/__init__.py calls for the relatives a config turns on.

A relative's file (relatives/<name>.py) exports, as RELATIVE = Relative(...):
    options            its RelativesConfig fields, name -> default (off); the first is its switch: the relative
                       is on when that option is set (the others refine it, and check refuses them alone)
    check(config)      ValueError for a bad value or combination of its options (called for every config)
    attach(model)      its weights added under their checkpoint names, at a fixed init: nothing drawn from the RNG
    reset_parameters(model)  its random weights, drawn after the baseline's and LIMe's (called last in
                       GPT.__init__), so that one seed gives every variant the baseline's weights
    stream(model, x)   its Stream for one forward pass from the embedding x (B, T, d)
    flops(config, T)   forward matmul FLOPs per token of what it adds (multiply-add = 2; elementwise work not counted)
    rewires_stream     whether it rewires the residual stream (at most one such relative at a time)
    with_completep     whether CompleteP's depth scaling (relatives/completep.py) supports it
The files import each other relatively (from .base import ...), never through the package's __init__: the
remote-code export ships them flat, beside model.py (integrations/hf.py), where that still holds.
"""
from collections import namedtuple

import torch

Relative = namedtuple("Relative", "options check attach reset_parameters stream flops rewires_stream with_completep")


def nothing(*args):
    """attach, reset_parameters or check of a relative that has nothing to add there."""


def fp32(x):
    """Autocast off: the mixing runs in the streams' float32."""
    return torch.autocast(x.device.type, enabled=False)


class Stream:
    """A relative's residual stream for one forward pass; run() is what GPT.forward calls. Most streams only say
    where a sub-layer's input comes from and where its output goes (each block's sub-layers run through their own
    modules, block.attn and block.mlp, so LIMe's routing, RoPE and the KV cache work as in the baseline):
        read() -> the next sub-layer's input (B, T, d); write(y): that sub-layer's output;
        output() -> what the final norm sees.
    Sub-layers come in order: layer 0's attention, layer 0's MLP, layer 1's attention, ... A stream that changes
    the block itself (MUDDFormer, MoDA, Depth-Attention) overrides block()."""

    def run(self, blocks, rope, kv_stack=None, cache=None):
        for block in blocks:
            self.block(block, rope, kv_stack, cache)
        return self.output()

    def block(self, block, rope, kv_stack, cache):
        """One transformer block on the stream: each sub-layer reads its input and writes its output."""
        self.write(block.attn(block.ln_1(self.read()), rope, kv_stack, cache))
        self.write(block.mlp(block.ln_2(self.read())))
