"""
nanoLIMe model: a Llama-style GPT with an optional LIMe router.

LIMe (Layer-Integrated Memory, arXiv 2502.09245): every attention layer keeps its
own queries, but builds its keys and values as a learned mixture of the keys and
values of all layers so far, read from a stacked KV buffer (eq. 2). Everything
LIMe-specific lives in the block marked "LIMe" below; with lime=False the model is
a plain pre-norm Llama (RMSNorm, RoPE, SwiGLU, GQA, tied embeddings, no biases).
Hyper-Connections (Zhu et al. 2024), the paper's other baseline, is the last block.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

ROUTERS = "full, average, dynamic, last-<j>, first-<j>"
GPU_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16, for MFU


@dataclass
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 65
    n_layer: int = 6
    n_head: int = 6
    n_kv_head: int = None      # None: n_head (MHA); fewer: grouped-query attention
    n_embd: int = 384
    mlp_hidden: int = None     # None: the Llama rule, 8/3 * n_embd rounded up to a multiple of 64
    dropout: float = 0.0
    tie_embeddings: bool = True
    lime: bool = False         # the paper's method
    router: str = "full"       # LIMe router variant (paper App. D): ROUTERS
    hc: int = 0                # Hyper-Connections expansion rate (0 = off; the paper uses 4)
    hc_dynamic: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.mlp_hidden is None:
            self.mlp_hidden = 64 * math.ceil(8 * self.n_embd / 3 / 64)
        if min(self.n_layer, self.n_head, self.n_kv_head, self.n_embd, self.block_size, self.vocab_size) < 1:
            raise ValueError("n_layer, n_head, n_kv_head, n_embd, block_size and vocab_size must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head}")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(f"head size n_embd/n_head={self.n_embd // self.n_head} must be even for RoPE")
        if self.hc < 0:
            raise ValueError(f"hc={self.hc} must be 0 (off) or an expansion rate >= 1")
        router_layers(self.router, 0)  # raises on an unknown variant


def router_layers(router, layer):
    """The layers whose keys and values layer `layer` may read, for each router variant."""
    name, _, j = router.partition("-")
    if name in ("full", "average", "dynamic") and not j:
        return list(range(layer + 1))
    if name in ("last", "first") and j.isdigit() and int(j) >= 1:
        j = int(j)
        if name == "last":  # the most recent min(l+1, j) layers, this one included
            return list(range(max(0, layer + 1 - j), layer + 1))
        return list(range(min(layer, j))) + [layer]  # the first min(l, j) layers plus this one
    raise ValueError(f"unknown router '{router}'; choose one of: {ROUTERS}")


class RoPE(nn.Module):
    """Rotary position embedding (theta 10000), half-split convention."""

    def __init__(self, config):
        super().__init__()
        head_dim = config.n_embd // config.n_head
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(config.block_size).float(), inv_freq)
        self.register_buffer("cos", angles.cos().repeat(1, 2), persistent=False)
        self.register_buffer("sin", angles.sin().repeat(1, 2), persistent=False)

    def forward(self, x, pos):  # x: (B, heads, T, head_dim), tokens at positions pos..pos+T-1
        T = x.size(2)
        cos, sin = self.cos[pos:pos + T].to(x.dtype), self.sin[pos:pos + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


# ----------------------------------------------------------------------------- LIMe
# The only change LIMe makes to the baseline: Attention calls lime_route() on this
# layer's k, v instead of using them directly (eq. 2). Source order everywhere:
# source s = j * n_kv_head + h is KV head h of layer j.

class KVBuffer:
    """The stacked KV buffer, one per forward pass.

    Row s holds [k | v] of source s for all N = B*T tokens: (L * H_kv, 2 * N * d_h), the
    authors' layout (App. E). Each layer writes its rows once and routes over the first
    (l+1) * H_kv rows, so nothing is concatenated per layer: activations kept for backward
    grow as O(L), not O(L^2) as in the authors' eager code."""

    def __init__(self, n_layer, keep_sources=False):
        self.n_layer = n_layer
        self.data = None      # allocated at the first write: its dtype follows autocast
        self.grad = None      # gradient w.r.t. data, accumulated top layer first in backward
        self.order = None     # zero-size tensor chaining the layers' Route ops (see Route.backward)
        self.sources = [] if keep_sources else None  # per-layer k, v as autograd sees them (dynamic router)


class Route(torch.autograd.Function):
    """eq. (2): [k~ | v~] = R @ buffer[:S], the same R for K and V. Batched (bmm) over the
    2*B (k|v, sequence) blocks of each row: BLAS runs an H_kv-row matmul on one core, and
    this way k~, v~ come out in attention's (B, H_kv, T, d_h) layout."""

    @staticmethod
    def forward(ctx, kv, router, order, buffer):  # kv: (B, T, 2, H_kv, d_h); router: (H_kv, S)
        B, T, _, n_kv, d = kv.shape
        S = router.size(1)
        if buffer.data is None:
            buffer.data = kv.new_empty(buffer.n_layer * n_kv, 2 * B * T * d)
        buffer.data[S - n_kv:S].view(n_kv, 2, B, T, d).copy_(kv.permute(3, 2, 0, 1, 4))
        # Later layers write only rows >= S, which this layer never reads, so we save an
        # alias of the buffer with its own version counter: one storage for all layers.
        sources = buffer.data.data[:S]
        ctx.save_for_backward(router, sources)
        ctx.buffer, ctx.shape, ctx.has_order = buffer, kv.shape, order is not None
        blocks = sources.view(S, 2 * B, T * d).transpose(0, 1)          # (2B, S, T*d)
        routed = torch.bmm(router.to(sources.dtype).expand(2 * B, n_kv, S), blocks)
        return routed.view(2, B, n_kv, T, d), kv.new_empty(0)

    @staticmethod
    def backward(ctx, grad_out, _):
        router, sources = ctx.saved_tensors
        buffer, (B, T, _, n_kv, d) = ctx.buffer, ctx.shape
        S = router.size(1)
        g = grad_out.reshape(2 * B, n_kv, T * d)
        blocks = sources.view(S, 2 * B, T * d).transpose(0, 1)          # (2B, S, T*d)
        grad_router = None
        if ctx.needs_input_grad[1]:
            grad_router = torch.bmm(g, blocks.transpose(1, 2)).sum(0).to(router.dtype)
        # Each layer's Route takes the previous one's zero-size `order` output, so autograd
        # runs these backwards from the top layer down: when layer l gets here every later
        # layer has already added its share to the rows of layer l. Accumulate in place.
        first = buffer.grad is None  # the top layer: lower layers use a prefix of its rows
        if first:
            buffer.grad = torch.empty_like(sources)  # baddbmm_ with beta=0 overwrites it
        grad_blocks = buffer.grad[:S].view(S, 2 * B, T * d).transpose(0, 1)
        grad_blocks.baddbmm_(router.t().to(g.dtype).expand(2 * B, S, n_kv), g, beta=0 if first else 1)
        grad_kv = buffer.grad[S - n_kv:S].view(n_kv, 2, B, T, d).permute(2, 3, 1, 0, 4)
        if S == n_kv:  # layer 0 is the last to run: release the buffer's gradient
            buffer.grad = None
        return grad_kv, grad_router, grad_out.new_zeros(0) if ctx.has_order else None, None


@torch.compiler.disable  # the in-place buffer is outside what dynamo traces; graphs break around it
def lime_route(kv, router, delta, buffer):
    """Routed keys and values (B, H_kv, T, d_h) of one layer; delta: per-token router offsets or None."""
    routed, buffer.order = Route.apply(kv, router, buffer.order, buffer)  # routed: (2, B, H_kv, T, d_h)
    k, v = routed[0], routed[1]
    if buffer.sources is not None:
        buffer.sources.append(kv)
    if delta is not None:  # dynamic router: per-token R(x_t) = R + delta(x_t), plain autograd
        sources = torch.stack(buffer.sources, dim=3).flatten(3, 4)  # (B, T, 2, S, d_h)
        extra = torch.einsum("bths,btcsd->cbhtd", delta.to(sources.dtype), sources)
        k, v = k + extra[0], v + extra[1]
    return k, v


class Router(nn.Module):
    """R^l of eq. (2): H_kv x (l+1)*H_kv weights over the KV buffer's sources."""

    def __init__(self, config, layer):
        super().__init__()
        n_kv, self.layer = config.n_kv_head, layer
        self.layers = router_layers(config.router, layer)
        n_src = len(self.layers) * n_kv
        if config.router == "average":  # fixed: head h averages head h over layers 0..l
            self.register_buffer("weight", torch.eye(n_kv).repeat(1, layer + 1) / (layer + 1), persistent=False)
        else:  # authors' init: U(-b, b), b = sqrt(3 / #sources), identity on this layer's own heads
            bound = math.sqrt(3 / n_src)
            weight = torch.empty(n_kv, n_src).uniform_(-bound, bound)
            weight[:, -n_kv:] = torch.eye(n_kv)
            self.weight = nn.Parameter(weight)
        self.dynamic = None
        if config.router == "dynamic":  # zero init: starts as the static router
            self.dynamic = nn.Linear(config.n_embd, n_kv * n_src, bias=False)
            nn.init.zeros_(self.dynamic.weight)

    def matrix(self):
        """The full H_kv x (l+1)*H_kv router, zero on sources this variant leaves out."""
        n_kv = self.weight.size(0)
        if len(self.layers) == self.layer + 1:
            return self.weight
        full = self.weight.new_zeros(n_kv, self.layer + 1, n_kv)
        full[:, self.layers] = self.weight.view(n_kv, -1, n_kv)
        return full.flatten(1)

    def forward(self, x):  # -> (router, per-token offsets or None)
        if self.dynamic is None:
            return self.matrix(), None
        B, T, _ = x.shape
        return self.weight, self.dynamic(x).view(B, T, self.weight.size(0), -1)

# ----------------------------------------------------------------------------- end of LIMe


class KVCache:
    """Per-layer keys and values as attention uses them, for incremental decoding.

    For LIMe these are the routed, RoPE'd k~, v~: they depend only on their own
    position, so caching them is exact, at the same size as the baseline's cache.
    """

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
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.layer, self.dropout = layer, config.dropout
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(config.n_embd, 2 * self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.router = Router(config, layer) if config.lime and layer > 0 else None
        if config.lime and layer == 0:  # layer 0 has no router: it reads its own heads
            self.register_buffer("identity", torch.eye(config.n_kv_head), persistent=False)

    def forward(self, x, rope, kv_buffer=None, cache=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        kv = self.kv_proj(x).view(B, T, 2, self.n_kv_head, self.head_dim)
        if kv_buffer is None:  # baseline
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        else:  # LIMe: route pre-RoPE keys and values over all layers so far (eq. 2)
            router, delta = self.router(x) if self.router is not None else (self.identity, None)
            k, v = lime_route(kv, router, delta, kv_buffer)
        pos = cache.pos if cache is not None else 0
        q, k = rope(q, pos), rope(k, pos)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        mask = None
        if pos > 0:  # queries at pos..pos+T-1 see every cached key up to their own position
            mask = torch.ones(T, pos + T, dtype=torch.bool, device=x.device).tril(pos)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0,
                                           enable_gqa=self.n_kv_head != self.n_head)
        return self.resid_dropout(self.o_proj(y.transpose(1, 2).reshape(B, T, -1)))


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
        self.hc_attn = HyperConnection(config, 2 * layer) if config.hc else None
        self.hc_mlp = HyperConnection(config, 2 * layer + 1) if config.hc else None

    def forward(self, x, rope, kv_buffer=None, cache=None):
        if self.hc_attn is not None:  # x: (B, T, n, d), n residual streams
            x = self.hc_attn(x, lambda h: self.attn(self.ln_1(h), rope, kv_buffer, cache))
            return self.hc_mlp(x, lambda h: self.mlp(self.ln_2(h)))
        x = x + self.attn(self.ln_1(x), rope, kv_buffer, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, l) for l in range(config.n_layer)]),
            ln_f=nn.RMSNorm(config.n_embd, eps=config.norm_eps),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.rope = RoPE(config)
        # GPT-2 init; residual output projections scaled by 1/sqrt(2L). Routers and HC keep their own.
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))
            elif name.endswith(("proj.weight", "wte.weight", "lm_head.weight")):
                nn.init.normal_(p, std=0.02)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())  # a tied weight is counted once

    def forward(self, idx, targets=None, cache=None):
        B, T = idx.shape
        pos = cache.pos if cache is not None else 0
        if pos + T > self.config.block_size:
            raise ValueError(f"sequence of {pos + T} tokens exceeds block_size={self.config.block_size}")
        x = self.transformer.drop(self.transformer.wte(idx))
        if self.config.hc:  # the n residual streams start as copies of the embedding
            x = x.unsqueeze(2).repeat(1, 1, self.config.hc, 1)
        kv_buffer = KVBuffer(self.config.n_layer, self.config.router == "dynamic") if self.config.lime else None
        for block in self.transformer.h:
            x = block(x, self.rope, kv_buffer, cache)
        if kv_buffer is not None:  # the graph refers to the buffer: drop its references back, or it leaks
            kv_buffer.order = kv_buffer.sources = None
        if self.config.hc:
            x = x.sum(dim=2)
        x = self.transformer.ln_f(x)
        if cache is not None:
            cache.pos += T
        if targets is None:  # inference: only the last position's logits
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Sample max_new_tokens tokens after idx (B, T); top_k=1 is greedy.

        With the cache, the prompt is prefilled once and each step feeds one token. Once
        the sequence is longer than block_size the window slides, as in nanoGPT: the last
        block_size tokens are recomputed each step, so use_cache never changes the result.
        """
        cache = None
        for _ in range(max_new_tokens):
            if use_cache and idx.size(1) <= self.config.block_size:
                if cache is None:
                    cache = KVCache(self.config)
                    logits, _ = self(idx, cache=cache)
                else:
                    logits, _ = self(idx[:, -1:], cache=cache)
            else:
                logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    def flops_per_token(self, seq_len=None):
        """Forward matmul FLOPs per token (multiply-add = 2), attention over the full T x T matrix,
        LM head and router included; training costs 3x this. Reproduces paper Table 8's ratios."""
        c = self.config
        T, d, hd, L, n = seq_len or c.block_size, c.n_embd, c.n_embd // c.n_head, c.n_layer, c.hc
        per_layer = (2 * d * c.n_head * hd * 2           # q and o projections
                     + 2 * d * 2 * c.n_kv_head * hd      # k and v projections
                     + 2 * 3 * d * c.mlp_hidden          # SwiGLU
                     + 2 * 2 * T * c.n_head * hd)        # q k^T and attention @ v
        flops = L * per_layer + 2 * d * c.vocab_size
        if c.lime:  # router of layer l >= 1 mixes (l+1)*H_kv sources into H_kv heads, for k and v
            for l in range(1, L):
                S = (l + 1) * c.n_kv_head
                flops += 2 * c.n_kv_head * S * 2 * hd
                if c.router == "dynamic":  # per-token router projection and its mixing
                    flops += 2 * d * c.n_kv_head * S + 2 * c.n_kv_head * S * 2 * hd
        if n:  # per sub-layer: width mix (n x n+1), depth add, dynamic projections
            flops += 2 * L * (2 * n * (n + 1) * d + 2 * n * d + (2 * n * d * (n + 2) if c.hc_dynamic else 0))
        return flops

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops, seq_len=None):
        """Model FLOPs utilisation: training FLOPs per second (3x forward) over peak_flops."""
        return 3 * self.flops_per_token(seq_len) * tokens_per_iter / dt / peak_flops

    def configure_optimizers(self, weight_decay, learning_rate, router_lr, betas, device_type, eps=1e-8):
        """AdamW, three groups (paper App. A): decayed matrices; norms, embeddings and static HC
        weights without decay; routers at router_lr without decay. Each group keeps its 'peak_lr'."""
        groups = {"decay": [], "no_decay": [], "router": []}
        for name, p in self.named_parameters():
            if "router" in name:
                groups["router"].append(p)
            elif p.dim() < 2 or name.endswith(("wte.weight", "static_alpha")):
                groups["no_decay"].append(p)
            else:
                groups["decay"].append(p)
        settings = dict(decay=(weight_decay, learning_rate), no_decay=(0.0, learning_rate), router=(0.0, router_lr))
        param_groups = [dict(name=name, params=groups[name], weight_decay=wd, lr=lr, peak_lr=lr)
                        for name, (wd, lr) in settings.items() if groups[name]]
        return torch.optim.AdamW(param_groups, betas=betas, eps=eps, fused=device_type == "cuda")


# ----------------------------------------------------------------------------- Hyper-Connections
class HyperConnection(nn.Module):
    """Hyper-Connections (Zhu et al. 2024) around one sub-layer, rate n.

    Width connection: [h, H'] = alpha^T H mixes the n streams into the sub-layer input h
    and n carried streams; depth connection: H_new = H' + beta * sublayer(h). Static init
    (column 0 one-hot at index % n, then identity; beta = 1) keeps all streams equal, so
    at step 0 the model computes the baseline function. Dynamic HC adds
    tanh(norm(H) W) * s to alpha and beta, with W = 0 at init and s = 0.01.
    """

    def __init__(self, config, index):
        super().__init__()
        n, d = config.hc, config.n_embd
        alpha = torch.zeros(n, n + 1)
        alpha[index % n, 0] = 1.0
        alpha[:, 1:] = torch.eye(n)
        self.static_alpha = nn.Parameter(alpha)
        self.static_beta = nn.Parameter(torch.ones(n))
        self.dynamic = config.hc_dynamic
        if self.dynamic:
            self.norm = nn.RMSNorm(d, eps=config.norm_eps)
            self.dynamic_alpha = nn.Linear(d, n + 1, bias=False)
            self.dynamic_beta = nn.Linear(d, 1, bias=False)
            nn.init.zeros_(self.dynamic_alpha.weight)
            nn.init.zeros_(self.dynamic_beta.weight)
            self.alpha_scale = nn.Parameter(torch.tensor(0.01))
            self.beta_scale = nn.Parameter(torch.tensor(0.01))

    def forward(self, H, sublayer):  # H: (B, T, n, d)
        alpha, beta = self.static_alpha, self.static_beta
        if self.dynamic:
            Hn = self.norm(H)
            alpha = alpha + self.alpha_scale * torch.tanh(self.dynamic_alpha(Hn))      # (B, T, n, n+1)
            beta = beta + self.beta_scale * torch.tanh(self.dynamic_beta(Hn)).squeeze(-1)  # (B, T, n)
        mixed = alpha.transpose(-1, -2) @ H  # (B, T, n+1, d)
        y = sublayer(mixed[..., 0, :])
        return mixed[..., 1:, :] + beta.unsqueeze(-1) * y.unsqueeze(-2)
