"""What every relative's file builds on: the Stream it runs blocks on, float32 mixing, and Relative,
what each file declares about its relative. The registry (relatives/__init__.py), train.py's
options, the variant names (nanolime/variants.py), study/analyze.py and nanolime/fsdp.py read that.

A relative's file (relatives/<name>.py) declares, as RELATIVE = Relative(...):
    family(config)    its name in analyses (study/analyze.py), as its options refine it
    options           its RelativesConfig fields and train.py options, name -> default (off); the
                      first is its switch: the relative is on when that option is set (the others
                      refine it, and check refuses them alone)
    components        its components of a variant name (nanolime/variants.py), name -> Component
    stream(model, x)  its Stream for one forward pass from the embedding x (B, T, d)
    flops(config, T)  forward matmul FLOPs per token of what it adds (multiply-add = 2;
                      elementwise work not counted)
and where it differs from the default (nothing to check or add, False, ''):
    check(config)     ValueError for a bad value or combination of its options (for every config)
    attach(model)     its weights added under their checkpoint names, at a fixed init: no RNG draw
    reset_parameters(model)  its random weights, drawn after the baseline's and LIMe's (called
                      last in GPT.__init__), so that one seed gives every variant the baseline's
    rewires_stream    whether it rewires the residual stream (one such relative at a time)
    alone             why it runs alone, without LIMe or another relative ('': it combines)
    with_completep    whether CompleteP's depth scaling (relatives/completep.py) supports it
    fsdp              whether train.py --fsdp=True shards it (nanolime/fsdp.py)
The files import each other relatively (from .base import ...), never through the package's
__init__: the remote-code export ships them flat, beside model.py (integrations/hf.py), where that
still holds.
"""
from collections import namedtuple

import torch


def nothing(*args):
    """attach, reset_parameters or check of a relative that has nothing to add there."""


Relative = namedtuple("Relative", "family options components stream flops check attach "
                      "reset_parameters rewires_stream alone with_completep fsdp",
                      defaults=(nothing, nothing, nothing, False, '', False, False))

# A component of a variant name: `options`, what the bare name sets ({'attnres': 'full'}); `mode`,
# the option that ':<text>' after the name sets to that text (attnres:block), or, given `word`, the
# bool option that ':<word>' switches on (hc:dynamic); `number`, the option that a number after the
# name sets (hc8), after every component's options. Of a relative's components (hc, mhc), the one
# whose options include another's comes last.
Component = namedtuple("Component", "options mode word number", defaults=(None, None, None))


def fp32(x):
    """Autocast off: the mixing runs in the streams' float32."""
    return torch.autocast(x.device.type, enabled=False)


class Stream:
    """A relative's residual stream for one forward pass; run() is what GPT.forward calls. Most
    streams only say where a sub-layer's input comes from and where its output goes (each block's
    sub-layers run through their own modules, block.attn and block.mlp, so LIMe's routing, RoPE and
    the KV cache work as in the baseline):
        read() -> the next sub-layer's input (B, T, d); write(y): that sub-layer's output;
        output() -> what the final norm sees.
    Sub-layers come in order: layer 0's attention, layer 0's MLP, layer 1's attention, ... A stream
    that changes the block itself (MUDDFormer, MoDA, Depth-Attention) overrides block().
    Probes watch a stream through its hooks (RelativesGPT.stream_hooks; study/representations.py),
    each called as hook(kind, layer, x): 'hidden', what the stream outputs after the layer's block
    (B, T, d); 'kv', the layer's keys and values (B, T, 2, H_kv, d_h) where the stream projects them
    without kv_proj (MUDDFormer)."""
    hooks = ()

    def run(self, blocks, rope, kv_stack=None, cache=None):
        for layer, block in enumerate(blocks):
            self.block(block, rope, kv_stack, cache)
            for hook in self.hooks:
                hook('hidden', layer, self.output())
        return self.output()

    def block(self, block, rope, kv_stack, cache):
        """One block on the stream: each sub-layer reads its input and writes its output."""
        self.write(block.attn(block.ln_1(self.read()), rope, kv_stack, cache))
        self.write(block.mlp(block.ln_2(self.read())))
