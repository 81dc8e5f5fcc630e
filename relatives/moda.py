"""MoDA (mixture-of-depths attention, arXiv 2603.15619; `moda=True`): the one relative that changes attention instead
of the stream: each head also attends to every earlier sub-layer's key and value at its position."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import zero_linear

from .base import Component, Relative, Stream

OPTIONS = dict(
    moda=False,  # attention also reads every earlier sub-layer's key and value at the same position
)


def attach(model):
    """Every MLP but the last writes a depth key and value (no attention reads the last one's): block.mlp.moda_kv."""
    c = model.config
    for block in model.transformer.h[:-1]:
        block.mlp.moda_kv = zero_linear(c.n_embd, 2 * c.n_kv_head * (c.n_embd // c.n_head))


def reset_parameters(model):
    """The MLPs' key/value projections: the baseline's k/v init, N(0, 0.02)."""
    for block in model.transformer.h[:-1]:
        nn.init.normal_(block.mlp.moda_kv.weight, std=0.02)


def stream(model, x):
    return MoDAStream(x)


def flops(c, T):
    """Layer l's queries read 2l depth keys and values; L - 1 MLPs project their input to k, v."""
    d, L, H, H_kv = c.n_embd, c.n_layer, c.n_head, c.n_kv_head
    hd = d // H
    return sum(2 * 2 * H * hd * 2 * layer for layer in range(L)) + (L - 1) * 2 * d * 2 * H_kv * hd


class MoDAStream(Stream):
    """The baseline's residual sum, in the model's dtype, with MoDA's attention: every attention sub-layer
    also reads the depth keys and values that the sub-layers before it wrote at each position."""

    def __init__(self, x):
        self.x, self.depth = x, DepthKV()

    def block(self, block, rope, kv_stack, cache):
        attn = block.attn
        q, k, v = (t.transpose(1, 2) for t in attn.qkv(block.ln_1(self.x)))  # (B, heads, T, d_h)
        self.x = self.x + attn.out(self.depth.attend(attn, q, k, v, rope, cache))
        x = block.ln_2(self.x)
        self.depth.write_mlp(block.mlp, x)  # this MLP's input, projected, is its depth key and value
        self.x = self.x + block.mlp(x)

    def output(self):
        return self.x


class DepthKV:
    """MoDA's depth stream of one forward pass (arXiv 2603.15619, §2.2 and Table 3 row 4, its default): the
    keys and values, before RoPE, that every sub-layer so far wrote at each position. An attention layer
    writes its own sequence k, v (W_K, W_V reused); an MLP writes its input projected by its own moda_kv.
    Only the tokens of this pass: a position's depth keys are its own, so the KV cache needs nothing more."""

    def __init__(self):
        self.k, self.v = [], []  # (B, H_kv, T, d_h) each, sub-layer order

    def write(self, k, v):  # (B, H_kv, T, d_h): kept contiguous, so that every later reader's product saves
        self.k.append(k.contiguous())  # this same tensor for backward (memory O(L) in depth, not a stacked
        self.v.append(v.contiguous())  # copy of all earlier sub-layers per layer)

    def write_mlp(self, mlp, x):  # x: the MLP's input (B, T, d)
        if hasattr(mlp, "moda_kv"):  # not the last MLP (no attention reads that one)
            B, T, _ = x.shape
            H_kv, d_h = self.k[-1].shape[1], self.k[-1].shape[3]
            k, v = mlp.moda_kv(x).view(B, T, 2, H_kv, d_h).permute(2, 0, 3, 1, 4).unbind(0)
            self.write(k, v)

    def attend(self, attn, q, k, v, rope, cache):
        """One softmax per head over [causal sequence logits, depth logits at the query's own position]
        (Alg. 1), both scaled by 1/sqrt(d_h). q (B, H, T, d_h), k, v (B, H_kv, T, d_h), before RoPE.
        Depth logits are q . k_d before RoPE: a query and a key at the same position, rotated alike, have
        the same dot product (relative distance 0). Returns (B, T, H * d_h) for o_proj."""
        B, H, T, d_h = q.shape
        H_kv, scale = k.size(1), 1 / math.sqrt(d_h)
        G = H // H_kv  # GQA: query head h reads KV head h // G (eq. (2)'s phi)
        S = len(self.k)  # the earlier sub-layers: 2 * layer
        if S:  # each position's G queries against its own S depth keys, per sub-layer: products summed over
            # d_h: the same as B * H_kv * T tiny matmuls (G x d_h) @ (d_h x 1), which eager runs far slower
            qt = q.view(B, H_kv, G, T, d_h).transpose(2, 3).contiguous()  # (B, H_kv, T, G, d_h)
            depth_logits = torch.stack([(qt * kd.unsqueeze(-2)).sum(-1) for kd in self.k], dim=-1)  # (B, H_kv, T, G, S)
            depth_logits = depth_logits * scale
        depth_values = self.v[:]
        self.write(k, v)  # this layer's own, for the later layers
        pos = cache.pos if cache is not None else 0
        qr = rope(q.transpose(1, 2), pos).transpose(1, 2).view(B, H_kv, G, T, d_h)
        k = rope(k.transpose(1, 2), pos).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(attn.layer, k, v)
        logits = qr @ k.unsqueeze(2).transpose(-1, -2) * scale  # (B, H_kv, G, T, pos+T)
        causal = torch.ones(T, pos + T, dtype=torch.bool, device=q.device).tril(pos)
        logits = logits.masked_fill(~causal, float("-inf"))
        if S:
            logits = torch.cat([logits, depth_logits.transpose(2, 3).to(logits.dtype)], dim=-1)
        att = F.dropout(logits.softmax(dim=-1), attn.dropout, attn.training)
        y = att[..., :pos + T].to(v.dtype) @ v.unsqueeze(2)  # (B, H_kv, G, T, d_h)
        if S:  # plus the depth values: each position's weights times its own values, per sub-layer
            att = att[..., pos + T:].transpose(2, 3).to(v.dtype)  # (B, H_kv, T, G, S)
            y_depth = sum(att[..., i, None] * vd.unsqueeze(-2) for i, vd in enumerate(depth_values))
            y = y + y_depth.transpose(2, 3)  # y_depth: (B, H_kv, T, G, d_h)
        return y.reshape(B, H, T, d_h).transpose(1, 2).reshape(B, T, H * d_h)


RELATIVE = Relative(
    family=lambda config: "MoDA", options=OPTIONS, stream=stream, flops=flops, attach=attach,
    reset_parameters=reset_parameters, components={"moda": Component({"moda": True})},
    alone="another way to read earlier layers (their keys and values, by attention)")
