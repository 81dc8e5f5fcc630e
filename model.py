"""
nanoLIMe model: a Llama-style GPT with an optional LIMe router.

With lime=False this is a plain pre-norm Llama: RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query
attention, tied embeddings, no biases. LIMe (Layer-Integrated Memory, arXiv 2502.09245) changes one thing: every
attention layer keeps its own queries but builds its keys and values as a learned mixture of the keys and values of
all layers so far, read from the stacked KV (eq. 2). Everything LIMe-specific is in the section marked "LIMe" below,
in the order a reader follows it: the Router, eq. (2) as written (route_reference), then the same sum as the model
computes it (KVStack, route, and RouteSum, a speed-up, last), and the one marked call in Attention.forward.

This file imports nothing of the project. The cross-layer relatives LIMe is compared with (Hyper-Connections,
mHC, DenseFormer, Attention Residuals, MUDDFormer, MoDA) extend it from outside, in relatives/.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

ROUTERS = "full, average, dynamic, last-<j>, first-<j> (j >= 1)"


@dataclass
class GPTConfig:
    block_size: int = 256      # context length in tokens
    vocab_size: int = 65
    n_layer: int = 6
    n_head: int = 6
    n_kv_head: int = None      # None: n_head (MHA); fewer: grouped-query attention
    n_embd: int = 384
    mlp_hidden: int = None     # None: the Llama rule, 8/3 * n_embd rounded up to a multiple of 64
    dropout: float = 0.0
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6     # RMSNorm's eps: the authors' (transformers' LlamaConfig default)
    lime: bool = False         # the paper's method
    router: str = "full"       # LIMe router variant: ROUTERS (full: eq. 2; the others: paper App. D and v1)
    router_init: str = "paper"  # 'paper': own-head identity plus U(-b, b) elsewhere; 'identity': zero elsewhere
    route_group_size: int = None  # LIMe's sum by groups of layers (KVStack): None ~sqrt(n_layer); n_layer: one phase

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.mlp_hidden is None:
            self.mlp_hidden = 64 * math.ceil(8 * self.n_embd / 3 / 64)
        for key in ('n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden', 'block_size', 'vocab_size'):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        if self.route_group_size is not None and self.route_group_size < 1:
            raise ValueError(f"route_group_size={self.route_group_size} must be >= 1 (or None: about sqrt(n_layer))")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head}")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(f"head size n_embd/n_head={self.n_embd // self.n_head} must be even for RoPE")
        router_layers(self.router, 0)  # raises on an unknown variant
        if self.router_init not in ("paper", "identity"):
            raise ValueError(f"unknown router_init '{self.router_init}'; choose 'paper' or 'identity'")


class RoPE(nn.Module):
    """Rotary position embedding (RoFormer), rotate-half form: RoPE(x) = x cos + rotate_half(x) sin, with
    rotate_half([x1, x2]) = [-x2, x1] for a head's halves x1, x2 (the Llama / transformers layout)."""

    def __init__(self, config):
        super().__init__()
        head_dim = config.n_embd // config.n_head
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(config.block_size).float(), inv_freq)  # (block_size, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (block_size, 1, head_dim): one angle per half
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x, pos):  # x: (B, T, heads, head_dim), tokens at positions pos..pos+T-1
        T = x.size(1)
        cos, sin = self.cos[pos:pos + T].to(x.dtype), self.sin[pos:pos + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


# ----------------------------------------------------------------------------- LIMe
# The one change LIMe makes to the baseline (Attention.forward): a layer's keys and values are a learned mixture of
# every layer's so far (eq. 2), read from the stacked KV, instead of its own. Source s = j * n_kv_head + h is KV
# head h of layer j; each layer appends its (H_kv, 2, B, T, d_h) [k; v] to the KVStack GPT.forward passes down.

def router_layers(router, layer):
    """The layers whose keys and values layer `layer` may read, for each router variant."""
    name, _, j = router.partition("-")
    if name in ("full", "average", "dynamic") and not j:
        return list(range(layer + 1))
    if name in ("last", "first") and j.isdigit() and int(j) >= 1:
        j = int(j)
        if name == "last":  # the most recent min(layer+1, j) layers, this one included
            return list(range(max(0, layer + 1 - j), layer + 1))
        return list(range(min(layer, j))) + [layer]  # the first min(layer, j) layers plus this one
    raise ValueError(f"unknown router '{router}'; choose one of: {ROUTERS}")


def zero_linear(d_in, d_out):
    """A bias-free nn.Linear that starts at zero, made without drawing from the RNG (skip_init), so that the
    weights drawn after it are the same as in a model without it: one seed, the baseline's weights."""
    # the default device of the moment (a `with torch.device(...)` block included, which older releases'
    # torch.get_default_device() does not see): where a factory function puts a tensor
    linear = nn.utils.skip_init(nn.Linear, d_in, d_out, bias=False, device=torch.empty(0).device)
    nn.init.zeros_(linear.weight)
    return linear


class Router(nn.Module):
    """R^l of eq. (2): H_kv x (l+1)*H_kv weights over the sources of layers 0..l."""

    def __init__(self, config, layer):
        super().__init__()
        self.n_kv, self.layer = config.n_kv_head, layer
        self.layers = router_layers(config.router, layer)  # the layers this variant reads
        n_src = len(self.layers) * self.n_kv
        if config.router == "average":  # fixed: head h averages head h over layers 0..l
            self.register_buffer("weight", torch.eye(self.n_kv).repeat(1, layer + 1) / (layer + 1), persistent=False)
        else:  # drawn by reset_parameters, after the baseline's weights (GPT.__init__)
            self.weight = nn.Parameter(torch.empty(self.n_kv, n_src))
        self.router_init = config.router_init
        self.dynamic = None
        if config.router == "dynamic":  # per-token offsets, zero at init: starts as the static router
            self.dynamic = zero_linear(config.n_embd, self.n_kv * n_src)

    @torch.no_grad()
    def reset_parameters(self):
        """Identity on this layer's own heads; elsewhere the authors' U(-b, b), b = sqrt(3 / #sources), or
        zero ('identity' init: exactly the baseline function at init)."""
        if isinstance(self.weight, nn.Parameter):  # not the fixed 'average' router
            bound = math.sqrt(3 / self.weight.size(1)) if self.router_init == "paper" else 0.0
            self.weight.uniform_(-bound, bound)
            self.weight[:, -self.n_kv:] = torch.eye(self.n_kv)

    def matrix(self):
        """The full H_kv x (l+1)*H_kv static router, zero on sources this variant leaves out."""
        if len(self.layers) == self.layer + 1:
            return self.weight
        full = self.weight.new_zeros(self.n_kv, self.layer + 1, self.n_kv)
        full[:, self.layers] = self.weight.view(self.n_kv, -1, self.n_kv)
        return full.flatten(1)

    def forward(self, x, kv_stack):  # x: this layer's input (B, T, d); kv_stack: every layer's [k; v] so far
        kv = kv_stack.read(self)
        if self.dynamic is not None:  # R(x_t) = R + delta(x_t): a broadcast product (einsum saves permuted copies)
            delta = self.dynamic(x).view(*x.shape[:2], self.n_kv, -1)  # (B, T, H, S)
            for w, source in zip(delta.split(self.n_kv, dim=-1), self.layers):  # a source layer's columns
                w = w.permute(2, 3, 0, 1)[:, :, None, ..., None]  # (H, H_src, 1, B, T, 1)
                src = kv_stack.sources[source]  # (H_src, 2, B, T, d_h)
                kv = kv + (w.to(src.dtype) * src).sum(1)  # (H, 2, B, T, d_h)
        return kv


def route_reference(router, sources):
    """eq. (2) as written: k~_h = sum_s R[h, s] k_s, and the same R for v. router: (H_kv, S), or per token
    (B, T, H_kv, S); sources: (S, 2, B, T, d_h), the stacked KV; returns (H_kv, 2, B, T, d_h). Readable, but each
    layer would keep its own copy of the stack for backward (O(L^2) memory); KVStack computes it in O(L)."""
    if router.dim() == 2:
        return torch.einsum("hs,scbtd->hcbtd", router, sources)
    return torch.einsum("bths,scbtd->hcbtd", router, sources)


class KVStack:
    """The stacked KV of one forward pass, and eq. (2) read from it. With one group of all n_layer layers
    (route_group_size=n_layer) this is eq. (2) read left to right: each layer appends its [k; v], then sums
    R[:, s] kv_s over every source so far (read(), route()). The default, groups of m ~ sqrt(L) layers, splits the
    same sum exactly by where a source lives (the static routers are linear and known before the pass): phase 1,
    when a group starts, routes the completed groups' sources for all m layers of the new group at once (their
    router rows stacked); phase 2, each layer adds its own group's. A source is read once per later group."""

    def __init__(self, routers, group_size):
        self.routers, self.group_size = routers, group_size  # routers: every layer's Router (None at layer 0)
        self.sources, self.partial, self.own = [], None, {}  # each layer's [k; v]; phase 1's sums; phase 2's weights

    def append(self, kv):
        layer, m = len(self.sources), self.group_size
        self.sources.append(kv)
        if layer % m:  # not a group's start
            return
        routers = [r for r in self.routers[layer:layer + m] if r is not None]  # layer 0 has none
        first = min([layer] + [s // m * m for r in routers for s in r.layers if s < layer])  # phase 1 reads from
        cut = (layer - first) * kv.size(0)  # the completed layers' columns from there on: phase 1's
        parts = [(r.matrix()[:, first * kv.size(0):] if first else r.matrix()).split(  # one op, backward one cat
            [cut, (r.layer + 1 - layer) * kv.size(0)], dim=1) for r in routers]
        self.own = {r.layer: own for r, (_, own) in zip(routers, parts)}  # phase 2: its own group's columns
        self.partial = None if not cut else route(  # phase 1: the group's rows over the completed layers, at once
            torch.cat([done for done, _ in parts]), self.sources[first:layer]).split(kv.size(0))

    def read(self, router):
        """k~, v~ of the router's layer: phase 2 (its own group) plus its rows of phase 1."""
        first = router.layer - router.layer % self.group_size  # the first layer of its group
        partial = None if self.partial is None else self.partial[router.layer - first]
        return route(self.own[router.layer], self.sources[first:router.layer + 1], partial)


def route_group_size(n_layer):
    """Layers per group of KVStack's two-phase sum: about sqrt(L) (dev/route_groups.py measures others)."""
    return max(1, round(math.sqrt(n_layer)))


def route(weight, sources, out=None):
    """eq. (2) for a static router: weight (H_out, S) over `sources`, a list of (H_src, 2, B, T, d_h), plus out, a
    partial sum (H_out, 2, B, T, d_h). Only the sources, which every reader saves, are saved: O(L) memory."""
    if torch.compiler.is_compiling():  # the compiler derives backward itself: RouteSum's, compiled for CUDA,
        # gave wrong gradients (docs/performance.md); a matmul per source keeps saving only the sources
        parts = [w.mm(src.flatten(1)) for w, src in zip(weight.split([s.size(0) for s in sources], 1), sources)]
        total = sum(parts[1:], parts[0]).view(-1, *sources[0].shape[1:])  # (H_out, 2, B, T, d_h)
        return total if out is None else total + out
    return RouteSum.apply(weight, out, *sources)


# ----------------------------------------------------------------------------- speed: route()'s sum by hand
def concat(sources, dtype=None):  # (S, 2*B*T*d_h), cast only where the dtype differs (.to() is an op too)
    x = torch.cat([src.view(src.size(0), -1) for src in sources])  # viewed first: not forward's cat
    return x if dtype in (None, x.dtype) else x.to(dtype)


class RouteSum(torch.autograd.Function):
    """W @ [S_1; S_2; ...] (+ out), backward by hand: the same function (tested against route_reference and by
    gradcheck) in one matmul each way instead of autograd's ~20 small ops per source. No concatenation is kept."""

    @staticmethod
    def forward(ctx, *inputs):  # one *args: dynamo cannot trace (weight, out, *sources) under no_grad
        weight, out, *sources = inputs
        ctx.save_for_backward(weight, *sources)
        total = weight.mm(torch.cat(sources).flatten(1)).view(-1, *sources[0].shape[1:])  # (H_out, 2, B, T, d_h)
        return total if out is None else total.add_(out)

    @staticmethod
    def backward(ctx, grad):  # grad: (H_out, 2, B, T, d_h); autograd casts each result to its input's dtype
        weight, *sources = ctx.saved_tensors
        shape, grad = grad.shape[1:], grad.reshape(grad.size(0), -1)
        grad_weight = grad.mm(concat(sources, grad.dtype).t())  # forward's cat, compiled, would be kept: O(L*m)
        grad_sources = weight.to(grad.dtype).t().mm(grad).view(-1, *shape).split([s.size(0) for s in sources])
        return (grad_weight, grad.view(-1, *shape) if ctx.needs_input_grad[1] else None, *grad_sources)


# ----------------------------------------------------------------------------- end of LIMe


class KVCache:
    """Per-layer keys and values as attention uses them, for incremental decoding. For LIMe these are the routed,
    RoPE'd k~, v~: they depend only on their own position, so caching them is exact, at the baseline's size."""

    def __init__(self, config):
        self.block_size, self.pos = config.block_size, 0
        self.k, self.v = [None] * config.n_layer, [None] * config.n_layer

    def update(self, layer, k, v):  # k, v: (B, H_kv, T, d_h) of the new tokens
        if self.k[layer] is None:
            shape = (k.size(0), k.size(1), self.block_size, k.size(3))
            self.k[layer], self.v[layer] = k.new_zeros(shape), v.new_zeros(shape)
        end = self.pos + k.size(2)
        self.k[layer][:, :, self.pos:end] = k
        self.v[layer][:, :, self.pos:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


class Attention(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.n_embd // config.n_head
        self.layer, self.dropout = layer, config.dropout
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(config.n_embd, 2 * self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.router = Router(config, layer) if config.lime and layer > 0 else None  # layer 0 reads its own k, v

    def forward(self, x, rope, kv_stack=None, cache=None):
        q, k, v = self.qkv(x)
        if kv_stack is not None:  # LIMe: this layer's pre-RoPE k, v routed with every earlier layer's (eq. 2)
            k, v = self.lime(x, k, v, kv_stack)
        return self.out(self.attend(q, k, v, rope, cache))

    def qkv(self, x):
        """This layer's queries and its own keys and values, before RoPE: (B, T, H, d_h), (B, T, H_kv, d_h) x 2."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k, v = self.kv_proj(x).view(B, T, 2, self.n_kv_head, self.head_dim).unbind(2)
        return q, k, v

    def out(self, y):  # y: (B, T, H * d_h), attention's output
        return self.resid_dropout(self.o_proj(y))

    def attend(self, q, k, v, rope, cache=None):
        """Causal attention of q (B, T, H, d_h) over k, v (B, T, H_kv, d_h), RoPE applied here; with a cache,
        over every cached key too. Returns (B, T, H * d_h) for o_proj."""
        B, T, _, _ = q.shape
        pos = cache.pos if cache is not None else 0
        q, k = rope(q, pos), rope(k, pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # views: y comes back (B, T, H, d_h), no copy
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        # queries at pos..pos+T-1 see every cached key up to their own position; one new token sees the whole
        # cache: no mask, which keeps the flash kernels available
        mask = torch.ones(T, pos + T, dtype=torch.bool, device=q.device).tril(pos) if pos > 0 and T > 1 else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=pos == 0,
                                           dropout_p=self.dropout if self.training else 0.0,
                                           enable_gqa=self.n_kv_head != self.n_head)
        return y.transpose(1, 2).reshape(B, T, -1)

    def lime(self, x, k, v, kv_stack):
        """LIMe's keys and values: k, v (B, T, H_kv, d_h) join the stacked KV, heads outermost, and the
        router mixes every layer's so far into this layer's (layer 0 keeps its own)."""
        kv = torch.stack((k.permute(2, 0, 1, 3), v.permute(2, 0, 1, 3)), dim=1)  # (H_kv, 2, B, T, d_h)
        kv_stack.append(kv)
        if self.router is not None:
            kv = self.router(x, kv_stack)
        return kv.permute(2, 3, 0, 1, 4).unbind(3)  # (B, T, H_kv, d_h) each


class MLP(nn.Module):
    """SwiGLU: W_down(SiLU(W_gate x) * W_up x)."""

    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class Block(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = Attention(config, layer)
        self.ln_2 = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, kv_stack=None, cache=None):
        x = x + self.attn(self.ln_1(x), rope, kv_stack, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, layer) for layer in range(config.n_layer)]),
            ln_f=nn.RMSNorm(config.n_embd, eps=config.norm_eps),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.rope = RoPE(config)
        self.route_group_size = config.route_group_size or route_group_size(config.n_layer)  # LIMe's sum (KVStack)
        # GPT-2 init; the projections back into the residual stream scaled by 1/sqrt(2L); routers below.
        nn.init.normal_(self.transformer.wte.weight, std=0.02)
        for block in self.transformer.h:
            attn, mlp = block.attn, block.mlp
            for linear in (attn.q_proj, attn.kv_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                residual = linear is attn.o_proj or linear is mlp.down_proj
                nn.init.normal_(linear.weight, std=0.02 / math.sqrt(2 * config.n_layer) if residual else 0.02)
        if not config.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        # LIMe's routers draw last: one seed gives LIMe the baseline's weights
        for router in (m for m in self.modules() if isinstance(m, Router)):
            router.reset_parameters()

    def get_num_params(self, non_embedding=False):
        """The parameter count (a tied weight counted once). non_embedding: less the token embedding and the
        output layer (one matrix when tied), the count that scaling laws and tokens per parameter use."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def forward(self, idx, targets=None, cache=None):
        B, T = idx.shape
        pos = cache.pos if cache is not None else 0
        if pos + T > self.config.block_size:
            raise ValueError(f"sequence of {pos + T} tokens exceeds block_size={self.config.block_size}")
        x = self.transformer.drop(self.transformer.wte(idx))  # (B, T, n_embd)
        kv_stack = KVStack([block.attn.router for block in self.transformer.h],  # LIMe: every layer's [k; v] so far
                           self.route_group_size) if self.config.lime else None
        x = self.run_blocks(x, kv_stack, cache)
        x = self.transformer.ln_f(x)
        if cache is not None:
            cache.pos += T
        if targets is None:  # inference: only the last position's logits
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def run_blocks(self, x, kv_stack=None, cache=None):
        """The residual stream through every block (relatives/ overrides this to rewire it)."""
        for block in self.transformer.h:
            x = block(x, self.rope, kv_stack, cache)
        return x

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, stop_token=None, top_p=1.0):
        """Sample max_new_tokens tokens after idx (B, T); top_k=1 is greedy. top_p < 1: nucleus sampling, among
        the fewest most likely tokens (of the top_k) whose probabilities sum to at least top_p. With the cache,
        the prompt is prefilled once and each step feeds one token. Past block_size the window slides, as in
        nanoGPT (the last block_size tokens recomputed each step), so use_cache never changes the result.
        stop_token: stop once every row has sampled it (the rows as long as they would be at that step)."""
        cache, prompt_len = None, idx.size(1)
        for _ in range(max_new_tokens):
            if use_cache and idx.size(1) <= self.config.block_size:
                feed = idx if cache is None else idx[:, -1:]  # the prompt once, then one token a step
                cache = KVCache(self.config) if cache is None else cache
                logits, _ = self(feed, cache=cache)
            else:
                logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            if top_p < 1.0:  # drop the tokens ranked after the nucleus is complete (the most likely one always stays)
                probs, order = F.softmax(logits, dim=-1).sort(dim=-1, descending=True)
                after = probs.cumsum(dim=-1) - probs >= top_p
                logits[torch.zeros_like(after).scatter(-1, order, after)] = -float("inf")
            if top_k == 1:  # greedy: argmax, deterministic even when the top logits tie
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            if stop_token is not None and (idx[:, prompt_len:] == stop_token).any(dim=1).all():
                break
        return idx

    def flops_per_token(self, seq_len=None):
        """Forward matmul FLOPs per token (multiply-add = 2), attention over the full T x T matrix, LM head and
        router included; training costs 3x this. Elementwise work is not counted. By this count LIMe adds 1.35 %
        (MHA) / 0.09 % (GQA) at the paper's 1B shape, T = 2048; the paper's Table 8, an fvcore trace, gives
        +1.22 % / +0.08 % (its parameter counts we reproduce exactly)."""
        c = self.config
        T, d, hd, L = seq_len or c.block_size, c.n_embd, c.n_embd // c.n_head, c.n_layer
        per_layer = (2 * d * c.n_head * hd * 2           # q and o projections
                     + 2 * d * 2 * c.n_kv_head * hd      # k and v projections
                     + 2 * 3 * d * c.mlp_hidden          # SwiGLU
                     + 2 * 2 * T * c.n_head * hd)        # q k^T and attention @ v
        flops = L * per_layer + 2 * d * c.vocab_size
        if c.lime:  # router of layer >= 1 mixes (layer+1)*H_kv sources into H_kv heads, for k and v
            for layer in range(1, L):
                S = (layer + 1) * c.n_kv_head
                flops += 2 * c.n_kv_head * S * 2 * hd
                if c.router == "dynamic":  # per-token router projection and its mixing
                    flops += 2 * d * c.n_kv_head * S + 2 * c.n_kv_head * S * 2 * hd
        return flops

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops, seq_len=None):
        """Model FLOPs utilisation: training FLOPs per second (3x forward) over peak_flops."""
        return 3 * self.flops_per_token(seq_len) * tokens_per_iter / dt / peak_flops

    def configure_optimizers(self, weight_decay, learning_rate, router_lr, betas, device_type, eps=1e-8,
                             optimizer="adamw", muon_lr=0.02, muon_momentum=0.95, named_lrs=None,
                             router_lr_scaling=""):
        """AdamW, three groups (paper App. A): every LIMe Router parameter at router_lr without decay; the other
        nn.Linear weights decayed; the rest (embedding, norms, other parameters) without decay. Each
        group keeps its 'peak_lr'. optimizer='muon': [Muon, AdamW], torch.optim.Muon on the attention and MLP
        matrices (at muon_lr, decayed; lr scaled by sqrt(max(1, rows/cols)), Keller Jordan's original rule), AdamW
        on everything else as above. named_lrs {parameter name: peak lr}: each in a group of its own, without decay.
        router_lr_scaling='fan_in' ('sqrt_fan_in'): a group per router instead, at router_lr * 2 H_kv / (the square
        root of) the sources it reads (not the paper's): router_lr is that of layer 1's router, which reads two
        layers."""
        if router_lr_scaling not in ("", "fan_in", "sqrt_fan_in"):
            raise ValueError(f"unknown router_lr_scaling '{router_lr_scaling}'; choose '' (off), 'fan_in' or "
                             "'sqrt_fan_in'")
        routers = {id(p) for m in self.modules() if isinstance(m, Router) for p in m.parameters()}
        linears = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear)}
        linears -= routers | {id(self.transformer.wte.weight)}  # the tied LM head is the embedding
        matrices = set()  # the blocks' projections: the Linear layers of Attention and MLP, routers aside
        if optimizer == "muon":
            matrices = {id(m.weight) for block in self.transformer.h for part in (block.attn, block.mlp)
                        for m in part.modules() if isinstance(m, nn.Linear)} - routers
        elif optimizer != "adamw":
            raise ValueError(f"unknown optimizer '{optimizer}'; choose 'adamw' or 'muon'")
        named_lrs = named_lrs or {}
        groups = {"muon": [], "decay": [], "no_decay": [], "router": [], **{n: [] for n in named_lrs}}
        for n, p in self.named_parameters():
            name = (n if n in named_lrs else "muon" if id(p) in matrices else "router" if id(p) in routers
                    else "decay" if id(p) in linears else "no_decay")
            groups[name].append(p)
        settings = dict(decay=(weight_decay, learning_rate), no_decay=(0.0, learning_rate), router=(0.0, router_lr),
                        **{n: (0.0, lr) for n, lr in named_lrs.items()})
        param_groups = [dict(name=name, params=groups[name], weight_decay=wd, lr=lr, peak_lr=lr)
                        for name, (wd, lr) in settings.items() if groups[name]]
        if router_lr_scaling and groups["router"]:  # under Adam a router's update moves k~ by about its lr times the
            # number of sources it sums (correlated ones) or its square root (independent ones)
            in_group = {id(p) for p in groups["router"]}
            param_groups = [g for g in param_groups if g["name"] != "router"] + [
                dict(name=f"router.{m.layer}", params=params, weight_decay=0.0, lr=lr, peak_lr=lr)
                for m in self.modules() if isinstance(m, Router)
                for params in [[p for p in m.parameters() if id(p) in in_group]] if params
                for lr in [router_lr * (2 / len(m.layers)) ** (0.5 if router_lr_scaling == "sqrt_fan_in" else 1)]]
        adamw = torch.optim.AdamW(param_groups, betas=betas, eps=eps, fused=device_type == "cuda")
        if optimizer == "adamw":
            return adamw
        muon = torch.optim.Muon([dict(name="muon", params=groups["muon"], lr=muon_lr, peak_lr=muon_lr)],
                                lr=muon_lr, weight_decay=weight_decay, momentum=muon_momentum)
        return [muon, adamw]
