"""
nanoLIMe model: a Llama-style GPT (RMSNorm, RoPE, SwiGLU, GQA, tied embeddings, no biases) with an
optional LIMe router (Layer-Integrated Memory, arXiv 2502.09245): each attention layer attends over
a learned mixture of the keys and values of all layers so far (eq. 2), all of it in the section
marked "LIMe". It imports nothing of the project; the relatives (relatives/) extend it from outside.
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
    router: str = "full"       # one of ROUTERS (full: eq. 2; the others: paper App. D and v1)
    router_init: str = "paper"  # 'paper': own-head identity, U(-b, b) elsewhere; 'identity': 0 elsewhere
    route_group_size: int = None  # KVStack's groups of layers: None ~sqrt(n_layer); n_layer: one phase

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.mlp_hidden is None:
            self.mlp_hidden = 64 * math.ceil(8 * self.n_embd / 3 / 64)
        for key in ('n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden', 'block_size',
                    'vocab_size', 'route_group_size'):
            value = getattr(self, key)
            if value is not None and value < 1:  # route_group_size may be None
                raise ValueError(f"{key}={value} must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head}")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(f"head size n_embd/n_head={self.n_embd // self.n_head} must be even for RoPE")
        router_layers(self.router, 0)  # raises on an unknown variant
        if self.router_init not in ("paper", "identity"):
            raise ValueError(f"unknown router_init '{self.router_init}': 'paper' or 'identity'")


class RoPE(nn.Module):
    """Rotary position embedding (RoFormer), rotate-half form: RoPE(x) = x cos + rotate_half(x) sin,
    rotate_half([x1, x2]) = [-x2, x1] for a head's halves x1, x2 (the Llama layout)."""

    def __init__(self, config):
        super().__init__()
        head_dim = config.n_embd // config.n_head
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(config.block_size).float(), inv_freq)  # (T, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (T, 1, head_dim): an angle per half
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x, pos):  # x: (B, T, heads, head_dim), tokens at positions pos..pos+T-1
        T = x.size(1)
        cos, sin = self.cos[pos:pos + T].to(x.dtype), self.sin[pos:pos + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


# ----------------------------------------------------------------------------- LIMe
# LIMe's one change (Attention.routed_kv): a layer's k, v are a learned mixture of every layer's so
# far (eq. 2), read from the stacked KV, in which source s = j * H_kv + h is KV head h of layer j.

def router_layers(router, layer):
    """The layers whose keys and values layer `layer` reads, for each router (paper App. D)."""
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
    """A bias-free nn.Linear at zero, made on the default device without drawing from the RNG
    (skip_init): the weights drawn after it are those of a model without it."""
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
            average = torch.eye(self.n_kv).repeat(1, layer + 1) / (layer + 1)
            self.register_buffer("weight", average, persistent=False)
        else:  # drawn by reset_parameters, after the baseline's weights (GPT.__init__)
            self.weight = nn.Parameter(torch.empty(self.n_kv, n_src))
        self.router_init = config.router_init
        # dynamic: per-token offsets, zero at init, so that it starts as the static router
        self.dynamic = zero_linear(config.n_embd, self.n_kv * n_src) if config.router == "dynamic" else None

    @torch.no_grad()
    def reset_parameters(self):
        """Identity on this layer's own heads; elsewhere the authors' U(-b, b), b = sqrt(3 / S), or
        zero ('identity' init: exactly the baseline function at init)."""
        if isinstance(self.weight, nn.Parameter):  # not the fixed 'average' router
            bound = math.sqrt(3 / self.weight.size(1)) if self.router_init == "paper" else 0.0
            self.weight.uniform_(-bound, bound)
            self.weight[:, -self.n_kv:] = torch.eye(self.n_kv)

    def matrix(self):
        """The full H_kv x (l+1)*H_kv static router, zero on the sources this variant leaves out."""
        if len(self.layers) == self.layer + 1:
            return self.weight
        full = self.weight.new_zeros(self.n_kv, self.layer + 1, self.n_kv)
        full[:, self.layers] = self.weight.view(self.n_kv, -1, self.n_kv)
        return full.flatten(1)


def route_reference(router, sources):
    """eq. (2) as written: k~_h = sum_s R[h, s] k_s, the same R for v. router (H_kv, S), or per
    token (B, T, H_kv, S), over sources (S, 2, B, T, d_h): (H_kv, 2, B, T, d_h). O(L^2) memory."""
    if router.dim() == 2:
        return torch.einsum("hs,scbtd->hcbtd", router, sources)
    return torch.einsum("bths,scbtd->hcbtd", router, sources)


def route(weight, sources, out=None):
    """eq. (2) for a static router, source by source: weight (H_out, S) over `sources`, a list of
    (H_src, 2, B, T, d_h), plus `out`, a partial sum (H_out, 2, B, T, d_h). Each matmul saves only
    its source, which every reader shares: O(L) memory."""
    weights = weight.split([src.size(0) for src in sources], dim=1)  # each source's columns
    total = None if out is None else out.flatten(1)  # (H_out, 2*B*T*d_h)
    for w, src in zip(weights, sources):
        total = w.mm(src.flatten(1)) if total is None else torch.addmm(total, w, src.flatten(1))
    return total.view(-1, *sources[0].shape[1:])


class KVStack:
    """The stacked KV of one forward pass (every layer's [k; v] so far) and eq. (2) read from it.
    As written, each layer reads every source: O(L^2) small matmuls. Split over groups of m ~ sqrt(L)
    layers, a source is read once per later group: phase 1, at a group's start, sums its routers'
    rows over the completed groups' sources at once; phase 2, at each layer, adds its own group's."""

    def __init__(self, routers, group_size):
        self.routers, self.group_size = routers, group_size  # every layer's Router (layer 0: None)
        self.sources = []  # each layer's [k; v], (H_kv, 2, B, T, d_h)
        self.partial, self.own = {}, {}  # the group's layers' phase-1 sums and phase-2 columns

    def append(self, kv):
        """Add a layer's [k; v] (H_kv, 2, B, T, d_h); at a group's start, run its phase 1."""
        layer, m, n = len(self.sources), self.group_size, kv.size(0)
        self.sources.append(kv)
        if layer % m:  # not a group's first layer
            return
        routers = [r for r in self.routers[layer:layer + m] if r is not None]
        parts = [r.matrix().split([layer * n, (r.layer + 1 - layer) * n], dim=1) for r in routers]
        self.own = {r.layer: own for r, (_, own) in zip(routers, parts)}  # phase 2's columns
        self.partial = {}
        if layer:  # phase 1: the group's routers over the completed layers, one sum
            stacked = torch.cat([done for done, _ in parts])  # (routers * H_kv, layer * H_kv)
            sums = route(stacked, self.sources[:layer]).split(n)
            self.partial = {r.layer: s for r, s in zip(routers, sums)}

    def routed(self, router, x):
        """k~, v~ of the router's layer (H_kv, 2, B, T, d_h): phase 2 over its own group's sources
        plus its phase-1 sum; a dynamic router adds its per-token part. x: the layer's input."""
        group = router.layer - router.layer % self.group_size  # the first layer of its group
        kv = route(self.own[router.layer], self.sources[group:], self.partial.get(router.layer))
        if router.dynamic is not None:  # R(x_t) = R + delta(x_t), one source layer at a time
            delta = router.dynamic(x).view(*x.shape[:2], router.n_kv, -1)  # (B, T, H, S)
            for w, j in zip(delta.split(router.n_kv, dim=-1), router.layers):
                src = self.sources[j]  # (H_src, 2, B, T, d_h)
                w = w.permute(2, 3, 0, 1)[:, :, None, ..., None]  # (H, H_src, 1, B, T, 1)
                kv = kv + (w.to(src.dtype) * src).sum(1)  # a broadcast product: einsum saves copies
        return kv


# ----------------------------------------------------------------------------- end of LIMe


class KVCache:
    """Per-layer keys and values as attention reads them, for incremental decoding. LIMe's routed,
    RoPE'd k~, v~ depend only on their position: caching them is exact, at the baseline's size."""

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
        # LIMe: layer 0 reads only its own k, v and has no router
        self.router = Router(config, layer) if config.lime and layer > 0 else None

    def forward(self, x, rope, kv_stack=None, cache=None):
        q, k, v = self.qkv(x)
        if kv_stack is not None:  # LIMe: k, v mixed with every earlier layer's (eq. 2)
            k, v = self.routed_kv(x, k, v, kv_stack)
        return self.out(self.attend(q, k, v, rope, cache))

    def qkv(self, x):
        """This layer's q (B, T, H, d_h) and its own k, v (B, T, H_kv, d_h) each, before RoPE."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k, v = self.kv_proj(x).view(B, T, 2, self.n_kv_head, self.head_dim).unbind(2)
        return q, k, v

    def routed_kv(self, x, k, v, kv_stack):
        """LIMe's k~, v~ (eq. 2): this layer's k, v join the stacked KV, heads outermost, and its
        router mixes every layer's so far (layer 0 keeps its own). x: the layer's input."""
        kv = torch.stack([t.permute(2, 0, 1, 3) for t in (k, v)], dim=1)  # (H_kv, 2, B, T, d_h)
        kv_stack.append(kv)
        if self.router is not None:
            kv = kv_stack.routed(self.router, x)
        return kv.permute(2, 3, 0, 1, 4).unbind(3)  # (B, T, H_kv, d_h) each

    def attend(self, q, k, v, rope, cache=None):
        """Causal attention of q (B, T, H, d_h) over k, v (B, T, H_kv, d_h), RoPE applied here;
        with a cache, over every cached key too. Returns (B, T, H * d_h)."""
        B, T, _, _ = q.shape
        pos = cache.pos if cache is not None else 0
        q, k = rope(q, pos), rope(k, pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, d_h): views
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        # queries at pos..pos+T-1 see every cached key up to their own position; one new token sees
        # the whole cache: no mask, which keeps the flash kernels available
        mask = torch.ones(T, pos + T, dtype=torch.bool, device=q.device).tril(pos) if pos > 0 and T > 1 else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=pos == 0,
                                           dropout_p=self.dropout if self.training else 0.0,
                                           enable_gqa=self.n_kv_head != self.n_head)
        return y.transpose(1, 2).reshape(B, T, -1)

    def out(self, y):  # y: (B, T, H * d_h), attention's output
        return self.resid_dropout(self.o_proj(y))


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
        # KVStack's groups: about sqrt(L) layers (dev/route_groups.py times others)
        self.route_group_size = config.route_group_size or max(1, round(math.sqrt(config.n_layer)))
        # GPT-2 init; the projections into the residual stream scaled by 1/sqrt(2L); routers below.
        nn.init.normal_(self.transformer.wte.weight, std=0.02)
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for block in self.transformer.h:
            attn, mlp = block.attn, block.mlp
            for linear in (attn.q_proj, attn.kv_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                           mlp.down_proj):
                residual = linear is attn.o_proj or linear is mlp.down_proj
                nn.init.normal_(linear.weight, std=residual_std if residual else 0.02)
        if not config.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        # LIMe's routers draw last: one seed gives LIMe the baseline's weights
        for router in (m for m in self.modules() if isinstance(m, Router)):
            router.reset_parameters()

    def get_num_params(self, non_embedding=False):
        """The parameter count; non_embedding: less the embedding and the output layer."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:  # a set: the tied head is the embedding
            n -= sum(p.numel() for p in {self.transformer.wte.weight, self.lm_head.weight})
        return n

    def forward(self, idx, targets=None, cache=None):
        B, T = idx.shape
        pos = cache.pos if cache is not None else 0
        if pos + T > self.config.block_size:
            raise ValueError(f"{pos + T} tokens exceed block_size={self.config.block_size}")
        x = self.transformer.drop(self.transformer.wte(idx))  # (B, T, n_embd)
        routers = [block.attn.router for block in self.transformer.h]
        kv_stack = KVStack(routers, self.route_group_size) if self.config.lime else None  # eq. (2)
        x = self.run_blocks(x, kv_stack, cache)
        x = self.transformer.ln_f(x)
        if cache is not None:
            cache.pos += T
        if targets is None:  # inference: only the last position's logits
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def run_blocks(self, x, kv_stack=None, cache=None):
        """The residual stream through every block (relatives/ overrides this to rewire it)."""
        for block in self.transformer.h:
            x = block(x, self.rope, kv_stack, cache)
        return x

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True,
                 stop_token=None, top_p=1.0):
        """Sample max_new_tokens tokens after idx (B, T); top_k=1 is greedy; top_p < 1: nucleus
        sampling. The cache changes nothing (past block_size the window slides, recomputed, as in
        nanoGPT). stop_token: stop once every row has sampled it."""
        cache, prompt_len = None, idx.size(1)
        for _ in range(max_new_tokens):
            if use_cache and idx.size(1) <= self.config.block_size:
                cache = cache or KVCache(self.config)  # the prompt once, then a token a step
                logits, _ = self(idx if cache.pos == 0 else idx[:, -1:], cache=cache)
            else:
                logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            if top_p < 1.0:  # drop the tokens ranked after the nucleus is full (never the first)
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
        """Forward matmul FLOPs per token (multiply-add = 2; the full T x T attention, LM head and
        routers included; elementwise work not, unlike the paper's Table 8: docs/deviations.md)."""
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

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops, seq_len=None):  # training: 3x forward
        return 3 * self.flops_per_token(seq_len) * tokens_per_iter / dt / peak_flops

    def configure_optimizers(self, weight_decay, learning_rate, router_lr, betas, device_type, eps=1e-8):
        """AdamW in the paper's three groups (App. A): the nn.Linear weights decayed; the rest
        (embedding, norms) not; LIMe's routers at router_lr, not decayed. Each group keeps its lr as
        'peak_lr', the top of the schedule. (Other optimizers: nanolime/optim.py.)"""
        routers = {id(p) for m in self.modules() if isinstance(m, Router) for p in m.parameters()}
        linears = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear)} - routers
        linears.discard(id(self.transformer.wte.weight))  # the tied LM head is the embedding
        groups = dict(decay=(weight_decay, learning_rate), no_decay=(0.0, learning_rate),
                      router=(0.0, router_lr))
        params = {name: [] for name in groups}
        for p in self.parameters():
            params["router" if id(p) in routers else "decay" if id(p) in linears else "no_decay"].append(p)
        return torch.optim.AdamW([dict(name=name, params=params[name], weight_decay=wd, lr=lr, peak_lr=lr)
                                  for name, (wd, lr) in groups.items() if params[name]],
                                 betas=betas, eps=eps, fused=device_type == "cuda")
