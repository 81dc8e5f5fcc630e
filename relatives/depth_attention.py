"""Depth-Attention (Zeng et al., arXiv 2606.05014; `depth_attention=True`): before a layer attends over the sequence,
its query scores the keys of earlier layers at the same position and mixes their values into the value that
self-attention then reads (and the KV cache stores). No parameters: the layer's own q, k, v projections.

As the authors' code computes it (hyq718/Depth-Attention, commit 3bdad70,
src/llamafactory/model/modeling/modeling_llama_depth_attention.py, cross_layer_mode 'depth_softmax', its SDPA path),
at layer l, per position and KV head, with s the stride and S_l = {j < l : j % s == 0} its source layers:
    q~ = the mean of the G query heads that read this KV head          (GQA: the scoring runs at the KV heads)
    w  = softmax over j in S_l and l itself of  q~ . k_j / sqrt(d_h)    (float32)
    v~_l = sum_{j in S_l} w_j v~_j + w_l v_l
and the layer attends with its own keys k_l and the mixed values v~_l; v~_l is what later layers read as layer l's
value (the mixing recurses). Layer 0, with no source, keeps v_0. The scores are taken before RoPE: a query and a
key at the same position are rotated alike, so their dot product is the rotated pair's.
"""
import math

import torch

from .base import Component, Relative, Stream

OPTIONS = dict(
    depth_attention=False,     # each layer's query also scores same-position keys of earlier layers, mixes their values
    depth_attention_stride=0,  # the source layers 0, s, 2s, ...; 0: n_layer // 2, as the authors' configs (code: 1)
)


def check(config):
    if config.depth_attention_stride < 0:
        raise ValueError(f"depth_attention_stride={config.depth_attention_stride} must be >= 1, or 0 for n_layer // 2")
    if config.depth_attention_stride and not config.depth_attention:
        raise ValueError("depth_attention_stride picks Depth-Attention's source layers: set depth_attention too")


def stride(config):
    """The layers every stride-th of which are sources: the option, or n_layer // 2 (at least 1)."""
    return config.depth_attention_stride or max(1, config.n_layer // 2)


def sources(config, layer):
    """The earlier layers whose keys and mixed values layer `layer` reads: 0, s, 2s, ... below it."""
    return [j for j in range(layer) if j % stride(config) == 0]


def stream(model, x):
    return DepthAttentionStream(x, stride(model.config))


def flops(c, T):
    """Per layer with sources, per position and KV head: a score and a multiply-add per source and itself
    (the query's mean over its group is elementwise: not counted)."""
    H_kv, d_h = c.n_kv_head, c.n_embd // c.n_head
    return sum(2 * 2 * H_kv * d_h * (len(sources(c, layer)) + 1) for layer in range(c.n_layer) if sources(c, layer))


class DepthAttentionStream(Stream):
    """The baseline's residual sum, in the model's dtype, with Depth-Attention's values: the keys and mixed values
    of the source layers so far, this pass's tokens only (a position's sources are its own, so the KV cache,
    which holds the mixed values, needs nothing more)."""

    def __init__(self, x, stride):
        self.x, self.stride = x, stride
        self.keys, self.values = [], []  # (B, T, H_kv, d_h) each, the source layers in order

    def block(self, block, rope, kv_stack, cache):
        attn = block.attn
        q, k, v = attn.qkv(block.ln_1(self.x))  # (B, T, H, d_h), (B, T, H_kv, d_h) x 2
        if self.keys:
            v = self.mix(q, k, v)
        if attn.layer % self.stride == 0:  # a source for the layers above
            self.keys.append(k)
            self.values.append(v)
        self.x = self.x + attn.out(attn.attend(q, k, v, rope, cache))
        self.x = self.x + block.mlp(block.ln_2(self.x))

    def mix(self, q, k, v):
        """v~ = softmax over the sources and this layer of q~ . k / sqrt(d_h), times their values. q (B, T, H, d_h),
        k, v (B, T, H_kv, d_h). Returns v~ (B, T, H_kv, d_h)."""
        B, T, H_kv, d_h = k.shape
        q = q.view(B, T, H_kv, -1, d_h).mean(3)  # (B, T, H_kv, d_h): each KV head's group of queries
        keys, values = self.keys + [k], self.values + [v]
        scores = torch.stack([(q * key).sum(-1) for key in keys], dim=-1) / math.sqrt(d_h)  # (B, T, H_kv, N + 1)
        weights = scores.float().softmax(dim=-1).to(v.dtype)
        return sum(weights[..., j, None] * value for j, value in enumerate(values))

    def output(self):
        return self.x


RELATIVE = Relative(
    family=lambda config: "Depth-Attention", options=OPTIONS, stream=stream, flops=flops,
    check=check, components={"depthattn": Component({"depth_attention": True})},
    alone="another way to read earlier layers (their keys and values, by attention)")
