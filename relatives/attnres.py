"""Attention Residuals (Kimi, arXiv 2603.15031; `attnres='full'|'block'|'block-<m>'`): a softmax mix over depth."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Component, Relative, Stream, fp32

ATTNRES = "full, block, block-<m>"
OPTIONS = dict(
    attnres="",  # '' (off) or ATTNRES above: a softmax mix of earlier outputs
)


def check(config):
    if config.attnres:
        attnres_block_sublayers(config.attnres, config.n_layer)  # raises on an unknown mode


def attach(model):
    model.attn_res = AttnRes(model.config)


def stream(model, x):
    c = model.config
    return DepthStream(model.attn_res(), attnres_block_sublayers(c.attnres, c.n_layer), x, c.norm_eps)


def flops(c, T):
    """Each of the 2L + 1 reads: a logit and a multiply-add per source; the sources of read i are the embedding,
    i // m completed blocks and a partial sum."""
    m = attnres_block_sublayers(c.attnres, c.n_layer)
    return sum(4 * c.n_embd * (1 + i // m + (i % m > 0)) for i in range(2 * c.n_layer + 1))


# Each sub-layer's input is a softmax-weighted mix of all earlier sub-layer outputs instead of their
# running sum. The sources are v_0, the token embedding, and v_i, the output of sub-layer i (attention and
# MLP are a sub-layer each: two per layer). Sub-layer l reads
#     h_l = sum_{i<l} a_{i->l} v_i,   a_{i->l} = softmax_i(w_l . RMSNorm(v_i)),
# one learned pseudo-query w_l per sub-layer (zero at init: the uniform mean, not the baseline's sum),
# one head, no projections. Block AttnRes sums the outputs inside blocks of m sub-layers, as the
# baseline does, and mixes only the completed block sums b_0 = v_0, b_1, ... plus the current block's
# partial sum: memory O(L/m) sources instead of O(L). Full AttnRes is m = 1, each output its own block.
# The final blend (the paper's output aggregating all block representations, §3.2) is one more read.

def attnres_block_sublayers(attnres, n_layer):
    """Sub-layers per block: 1 for 'full', m for 'block-<m>', and for 'block' the paper's 8 blocks of the
    2 * n_layer sub-layers (m rounded up: at most 8 blocks)."""
    name, _, m = attnres.partition("-")
    if attnres == "full":
        return 1
    if attnres == "block":
        return math.ceil(2 * n_layer / 8)
    if name == "block" and m.isdigit() and int(m) >= 1:
        return int(m)
    raise ValueError(f"unknown attnres '{attnres}'; choose one of: {ATTNRES}")


class AttnRes(nn.Module):
    """The pseudo-queries w_l and the gains g_l of the key RMSNorms of the reads with more than one source:
    sub-layers 1..2L-1 and the final blend (4d parameters per layer). Sub-layer 0 reads the embedding."""

    def __init__(self, config):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(2 * config.n_layer, config.n_embd))      # w_l (0: the uniform mean)
        self.key_weight = nn.Parameter(torch.ones(2 * config.n_layer, config.n_embd))  # g_l of RMSNorm_l

    def forward(self):
        """Every read's query for keys normalized without a gain, w_l . RMSNorm(v) = (w_l * g_l) . (v / rms(v)):
        (2L + 1, d), read 0's zero (one source: any query gives it weight 1)."""
        q = self.query * self.key_weight
        return torch.cat([q.new_zeros(1, q.size(1)), q])


class DepthStream(Stream):
    """The sources of one forward pass, and AttnRes read from them in two phases.

    The pseudo-queries do not depend on the input, so when a block starts, phase 1 mixes the completed
    blocks for all of its m sub-layers at once (one matmul per completed block for the logits). At each
    sub-layer, phase 2 adds the one source phase 1 could not see, the block's partial sum p, to the same
    softmax: with h' phase 1's mix, s the logsumexp of its logits and z the logit of p,
        h = sigmoid(s - z) * h' + sigmoid(z - s) * p = h' + sigmoid(z - s) * (p - h')."""

    def __init__(self, queries, m, embedding, eps):  # m: sub-layers per block
        self.queries, self.m, self.eps = queries, m, eps  # queries: every read's, in order (AttnRes)
        embedding = embedding.float()
        self.blocks = [embedding]           # the completed blocks' sums b_0, b_1, ..., (B, T, d) each
        with fp32(embedding):
            self.keys = [self.norm(embedding)]  # RMSNorm(b_j) without the gain, once per block
        self.partial = None                 # the current block's sum so far
        self.sub = 0                        # outputs so far: the next read is this sub-layer's input

    def norm(self, v):
        return F.rms_norm(v, (v.size(-1),), eps=self.eps)

    def read(self):
        """h_l for sub-layer l = self.sub (after the last one: the final blend)."""
        sub, i = self.sub, self.sub % self.m  # sub-layer `sub` is the i-th of its block
        with fp32(self.blocks[0]):
            if i == 0:  # phase 1, at a block's start: softmax over the completed blocks, for its m sub-layers
                q = self.queries[sub:sub + self.m]                  # (m, d)
                logits = torch.stack([k @ q.T for k in self.keys])  # (blocks, B, T, m)
                self.lse = logits.logsumexp(0)                      # (B, T, m)
                weights = logits.softmax(0)
                self.mixed = sum(a.unsqueeze(-1) * v.unsqueeze(-2)
                                 for a, v in zip(weights, self.blocks))  # (B, T, m, d)
            h = self.mixed[..., i, :]
            if i > 0:  # phase 2: the partial sum joins the softmax
                z = self.norm(self.partial) @ self.queries[sub]  # (B, T)
                h = h + torch.sigmoid(z - self.lse[..., i]).unsqueeze(-1) * (self.partial - h)
        return h

    def write(self, y):
        """Sub-layer i's output: added to its block's sum; a completed block becomes a source."""
        y = y.float()
        self.partial = y if self.partial is None else self.partial + y
        self.sub += 1
        if self.sub % self.m == 0:
            self.blocks.append(self.partial)
            with fp32(y):
                self.keys.append(self.norm(self.partial))
            self.partial = None

    def output(self):
        return self.read()  # the final blend: one more read, with its own query, over every source


RELATIVE = Relative(
    family=lambda config: f"AttnRes-{config.attnres}", options=OPTIONS, stream=stream, flops=flops,
    check=check, attach=attach, rewires_stream=True, with_completep=True,
    components={"attnres": Component({"attnres": "full"}, mode="attnres")})  # attnres:block, ...
