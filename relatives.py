"""
LIMe's cross-layer relatives, plugged into model.py's GPT: each rewires the residual stream.

- Hyper-Connections (Zhu et al. 2024, the LIMe paper's other baseline; `hc=n`, `hc_dynamic`): n streams.
- mHC (DeepSeek, arXiv 2512.24880): `mhc='dynamic'` is the paper's (eqs. 7-9, per-token maps);
  `mhc='static'` is HC's coefficients constrained the same way (the form our earlier results used).
- DenseFormer (arXiv 2402.02622; `denseformer=True`): a learned weighted average of earlier block outputs.
- Attention Residuals (Kimi, arXiv 2603.15031; `attnres='full'|'block'|'block-<m>'`): a softmax mix over depth.
- MUDDFormer (arXiv 2502.12170; `mudd=True`): per-token dense mixes of earlier block outputs, one each for the
  next block's query, key, value and residual inputs; `mudd_prepost=True` adds PrePostDANorm (§2.5, eq. 10: the
  authors' `mudd_prenorm` and `mudd_postnorm`), their normalization for deep-narrow models.
- MoDA (mixture-of-depths attention, arXiv 2603.15619; `moda=True`): the one relative that changes attention
  instead of the stream: each head also attends to every earlier sub-layer's key and value at its position.
- CompleteP (arXiv 2505.01618; `depth_scaling='completep'`, `depth_base`) is no relative but a depth scaling: each
  attention and MLP output times depth_base / n_layer, AdamW's eps too (section "Depth scaling (CompleteP)").

model.py knows none of them: this file extends it. RelativesConfig is GPTConfig plus the relatives' options (all
off: GPTConfig's model); RelativesGPT is model.GPT with a relative's weights added after the baseline's (attach:
none drawn from the RNG; then reset_parameters: random weights, drawn after the baseline's and LIMe's, so one
seed gives every variant the baseline's weights), its blocks run on the relative's residual stream (run_blocks,
through stream(model, x)), and the mixing's FLOPs added (flops). build_model(config) is model.GPT when no
relative is on. A Stream runs each block through its sub-layers' own modules (block.attn, block.mlp), so
LIMe's routing, RoPE and the KV cache work as in the baseline; most streams only say where a sub-layer's
input comes from and where its output goes:
    stream.read() -> the next sub-layer's input (B, T, d); stream.write(y): that sub-layer's output;
    stream.output() -> what the final norm sees.
Sub-layers come in order: layer 0's attention, layer 0's MLP, layer 1's attention, ...
The mixing runs in float32 even under bf16 autocast (the streams are kept in float32, as the
baseline's residual sum is): rounding the stream to bf16 at every sub-layer would lose what
the sub-layers add.
"""

import math
from functools import partial

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import GPT, GPTConfig, zero_linear

ATTNRES = "full, block, block-<m>"
MHC = "'' (off), 'dynamic' (the paper's), 'static'"


@dataclass
class RelativesConfig(GPTConfig):
    """model.GPTConfig and the relatives' options; all off: GPTConfig's model."""
    hc: int = 0                # Hyper-Connections expansion rate (0 = off; the paper uses 4)
    hc_dynamic: bool = False   # HC's per-token offsets (needs hc)
    mhc: str = ""              # mHC (needs hc): MHC below; 'dynamic' the paper's, 'static' HC's weights constrained
    denseformer: bool = False  # DenseFormer: a learned weighted average of all earlier block outputs
    attnres: str = ""          # Attention Residuals: '' (off) or ATTNRES below: a softmax mix of earlier outputs
    moda: bool = False         # MoDA: attention also reads every earlier sub-layer's key and value at the same position
    mudd: bool = False         # MUDDFormer: a block's q, k, v, residual inputs per-token mixes of earlier block outputs
    mudd_prepost: bool = False # MUDDFormer's PrePostDANorm (needs mudd): sources normed, residual way X + norm(mix)
    # depth scaling (section "Depth scaling (CompleteP)" below): DEPTH_SCALINGS; 'standard' is GPTConfig's model
    depth_scaling: str = "standard"
    depth_base: int = None     # CompleteP's base depth L_base: the depth its learning rate was tuned at

    def __post_init__(self):
        super().__post_init__()
        check(self)


OPTIONS = ('hc', 'hc_dynamic', 'mhc', 'denseformer', 'attnres', 'moda', 'mudd', 'mudd_prepost')


def enabled(config):
    """Whether any relative's option is on (then the model is a RelativesGPT), or a depth scaling."""
    return any(getattr(config, name, False) for name in OPTIONS) or depth_scaled(config)


def build_model(config):
    """The model of `config`: model.GPT when no relative is on, else RelativesGPT."""
    if depth_scaled(config):
        return CompletePGPT(config)
    return RelativesGPT(config) if enabled(config) else GPT(config)


class RelativesGPT(GPT):
    """model.GPT with a cross-layer relative rewiring its residual stream (or, for MoDA, its attention)."""

    def __init__(self, config):
        super().__init__(config)  # the baseline's weights and LIMe's routers, drawn as in model.GPT
        attach(self)              # the relative's weights: fixed init, no RNG draw
        reset_parameters(self)    # the relative's random weights, drawn last

    def run_blocks(self, x, kv_stack=None, cache=None):
        s = stream(self, x)  # a relative's residual stream for this pass, or None: the plain residual sum
        return super().run_blocks(x, kv_stack, cache) if s is None else s.run(self.transformer.h, self.rope,
                                                                               kv_stack, cache)

    def flops_per_token(self, seq_len=None):
        return super().flops_per_token(seq_len) + flops(self.config, seq_len or self.config.block_size)


def check(config):
    """ValueError for a combination that does not make sense; LIMe combines with every stream."""
    if config.hc < 0:
        raise ValueError(f"hc={config.hc} must be 0 (off) or an expansion rate >= 1")
    if config.mhc not in ("", "dynamic", "static"):
        raise ValueError(f"unknown mhc '{config.mhc}'; choose one of: {MHC}")
    if config.mhc and not config.hc:
        raise ValueError("mhc constrains Hyper-Connections: set hc too, e.g. hc=4")
    if config.hc_dynamic and not config.hc:
        raise ValueError("hc_dynamic makes Hyper-Connections dynamic: set hc too, e.g. hc=4")
    if config.hc_dynamic and config.mhc == "dynamic":
        raise ValueError("mhc='dynamic' is dynamic already (the paper's maps); hc_dynamic is for hc and mhc='static'")
    if config.mudd_prepost and not config.mudd:
        raise ValueError("mudd_prepost is MUDDFormer's PrePostDANorm: set mudd too, e.g. mudd=True mudd_prepost=True")
    if config.attnres:
        attnres_block_sublayers(config.attnres, config.n_layer)  # raises on an unknown mode
    if sum(map(bool, (config.hc, config.denseformer, config.attnres, config.mudd))) > 1:
        raise ValueError("hc, denseformer, attnres and mudd each rewire the residual stream; use one of them")
    if config.moda and (config.lime or config.hc or config.denseformer or config.attnres or config.mudd):
        raise ValueError("moda is another way to read earlier layers (their keys and values, by attention); "
                         "use it alone, without lime, hc, denseformer, attnres or mudd")
    check_depth_scaling(config)


def attach(model):
    """Add the enabled relative's weights to the model, under their checkpoint names. Nothing here draws
    from the RNG: with one seed every variant starts from the baseline's weights."""
    c = model.config
    if c.hc:
        for layer, block in enumerate(model.transformer.h):
            connection = DynamicMHC if c.mhc == "dynamic" else HyperConnection
            block.hc_attn, block.hc_mlp = connection(c, 2 * layer), connection(c, 2 * layer + 1)
    if c.denseformer:  # after block i, a weighted average of the embedding and blocks 0..i's outputs
        model.dwa = nn.ModuleList([DepthWeightedAverage(i + 2) for i in range(c.n_layer)])
    if c.attnres:
        model.attn_res = AttnRes(c)
    if c.mudd:  # after block i, the mixes that feed block i + 1 (after the last block: the final norm)
        model.mudd = nn.ModuleList([MUDDConnection(c, i) for i in range(c.n_layer)])
    if c.moda:  # every MLP but the last writes a depth key and value (no attention reads the last one's)
        for block in model.transformer.h[:-1]:
            block.mlp.moda_kv = zero_linear(c.n_embd, 2 * c.n_kv_head * (c.n_embd // c.n_head))


def reset_parameters(model):
    """Draw the relatives' random weights: called last in GPT.__init__, after the baseline's and the routers'."""
    for module in model.modules():
        if isinstance(module, MUDDConnection):
            module.reset_parameters()
    if model.config.moda:  # the MLPs' key/value projections: the baseline's k/v init, N(0, 0.02)
        for block in model.transformer.h[:-1]:
            nn.init.normal_(block.mlp.moda_kv.weight, std=0.02)


def stream(model, x):
    """The residual stream of one forward pass from the embedding x (B, T, d); None: the plain sum."""
    c = model.config
    if c.hc:
        return HyperStreams(model, x)
    if c.denseformer:
        return DenseStream(model, x)
    if c.attnres:
        return DepthStream(model.attn_res(), attnres_block_sublayers(c.attnres, c.n_layer), x, c.norm_eps)
    if c.mudd:
        return MUDDStream(model, x)
    if c.moda:
        return MoDAStream(x)
    return None


def flops(c, T):
    """Forward matmul FLOPs per token of the mixing (multiply-add = 2); elementwise work not counted."""
    d, L, n = c.n_embd, c.n_layer, c.hc
    total = 0
    if n and c.mhc == "dynamic":  # per sub-layer: phi (n d x (2n + n^2)), the pre and res mixes, the post add
        total += 2 * L * (2 * n * d * (2 * n + n * n) + 2 * n * d + 2 * n * n * d + 2 * n * d)
    elif n:  # per sub-layer: width mix (n x n+1), depth add, dynamic projections
        total += 2 * L * (2 * n * (n + 1) * d + 2 * n * d + (2 * n * d * (n + 2) if c.hc_dynamic else 0))
    if c.denseformer:  # after block i, a weighted sum of i + 2 tensors of width d
        total += sum(2 * (i + 2) * d for i in range(L))
    if c.attnres:  # each of the 2L + 1 reads: a logit and a multiply-add per source; the sources of read i
        m = attnres_block_sublayers(c.attnres, L)  # are the embedding, i // m completed blocks and a partial sum
        total += sum(4 * d * (1 + i // m + (i % m > 0)) for i in range(2 * L + 1))
    if c.mudd:  # after block i: W1, W2 and, for each way, a multiply-add per source (PrePostDANorm's norms and
        # its residual add are elementwise: no FLOPs counted)
        for i in range(L):
            ways, sources, hidden = mudd_shape(c, i)
            total += 2 * d * hidden + 2 * hidden * ways * sources + 2 * ways * sources * d
    if c.moda:  # layer l's queries read 2l depth keys and values; L - 1 MLPs project their input to k, v
        H, hd, H_kv = c.n_head, d // c.n_head, c.n_kv_head
        total += sum(2 * 2 * H * hd * 2 * layer for layer in range(L)) + (L - 1) * 2 * d * 2 * H_kv * hd
    return total


def fp32(x):
    """Autocast off: the mixing runs in the streams' float32."""
    return torch.autocast(x.device.type, enabled=False)


class Stream:
    """A relative's residual stream for one forward pass; run() is what GPT.forward calls."""

    def run(self, blocks, rope, kv_stack=None, cache=None):
        for block in blocks:
            self.block(block, rope, kv_stack, cache)
        return self.output()

    def block(self, block, rope, kv_stack, cache):
        """One transformer block on the stream: each sub-layer reads its input and writes its output."""
        self.write(block.attn(block.ln_1(self.read()), rope, kv_stack, cache))
        self.write(block.mlp(block.ln_2(self.read())))


# ----------------------------------------------------------------------------- Hyper-Connections, mHC
class HyperStreams(Stream):
    """n residual streams H (B, T, n, d), float32. Around each sub-layer F a connection gives the maps
    pre (n), res (n x n) and post (n), per token or not:  h = pre H,  H <- res H + post^T F(h)."""

    def __init__(self, model, x):
        self.connections = [c for block in model.transformer.h for c in (block.hc_attn, block.hc_mlp)]
        self.H = x.float().unsqueeze(2).repeat(1, 1, model.config.hc, 1)  # n copies of the embedding
        self.sub = 0  # the next sub-layer

    def read(self):
        with fp32(self.H):
            pre, res, self.post = self.connections[self.sub](self.H)
            h = (pre.unsqueeze(-2) @ self.H).squeeze(-2)  # (B, T, d)
            self.H = res @ self.H                          # (B, T, n, d), carried
        return h

    def write(self, y):
        with fp32(self.H):
            self.H = self.H + self.post.unsqueeze(-1) * y.float().unsqueeze(-2)
        self.sub += 1

    def output(self):
        return self.H.sum(2)  # the streams summed before the final norm


class HyperConnection(nn.Module):
    """Hyper-Connections (Zhu et al. 2024) around one sub-layer, rate n, and static mHC.

    Width connection: [h, H'] = alpha^T H mixes the n streams into the sub-layer input h (column 0:
    the pre map) and n carried streams (columns 1..n: the residual map); depth connection:
    H_new = H' + beta * sublayer(h). Static init (column 0 one-hot at index % n, then identity;
    beta = 1) keeps all streams equal, so at step 0 the model computes the baseline function.
    Dynamic HC adds tanh(norm(H) W) * s to alpha and beta, with W = 0 at init and s = 0.01.

    mhc='static' keeps these coefficients and constrains them as mHC does: the pre map through a
    sigmoid, beta through 2 * sigmoid (beta starts at 0: post map 1), the residual map made doubly
    stochastic (sinkhorn). Not the paper's mHC, whose maps are computed per token (DynamicMHC)."""

    def __init__(self, config, index):
        super().__init__()
        n, d = config.hc, config.n_embd
        alpha = torch.zeros(n, n + 1)
        alpha[index % n, 0] = 1.0
        alpha[:, 1:] = torch.eye(n)
        self.static_alpha = nn.Parameter(alpha)
        self.mhc = config.mhc == "static"
        self.static_beta = nn.Parameter(torch.zeros(n) if self.mhc else torch.ones(n))
        self.dynamic = config.hc_dynamic
        if self.dynamic:
            self.norm = nn.RMSNorm(d, eps=config.norm_eps)
            self.dynamic_alpha = zero_linear(d, n + 1)
            self.dynamic_beta = zero_linear(d, 1)
            self.alpha_scale = nn.Parameter(torch.tensor(0.01))
            self.beta_scale = nn.Parameter(torch.tensor(0.01))

    def coefficients(self, H):  # H: (B, T, n, d) -> alpha (n, n+1), beta (n), or per token (B, T, ...)
        alpha, beta = self.static_alpha, self.static_beta
        if self.dynamic:
            Hn = self.norm(H)
            alpha = alpha + self.alpha_scale * torch.tanh(self.dynamic_alpha(Hn))      # (B, T, n, n+1)
            beta = beta + self.beta_scale * torch.tanh(self.dynamic_beta(Hn)).squeeze(-1)  # (B, T, n)
        if self.mhc:  # H_pre = sigmoid, H_res = Sinkhorn-Knopp, H_post = 2 * sigmoid
            alpha = torch.cat([alpha[..., :1].sigmoid(), sinkhorn(alpha[..., 1:])], dim=-1)
            beta = 2 * beta.sigmoid()
        return alpha, beta

    def forward(self, H):
        """pre (..., n), res (..., n, n) with res[i, j] the weight of stream j in carried stream i, post (..., n)."""
        alpha, beta = self.coefficients(H)
        return alpha[..., 0], alpha[..., 1:].transpose(-1, -2), beta


class DynamicMHC(nn.Module):
    """mHC (arXiv 2512.24880, eqs. 7-9) around one sub-layer, per token, for streams x (n x d):
        x' = RMSNorm(vec x)                         (over the n*d numbers, no gain: phi absorbs one)
        H~pre = a_pre (x' phi_pre) + b_pre,  H~post = a_post (x' phi_post) + b_post   (1 x n)
        H~res = a_res mat(x' phi_res) + b_res                                          (n x n)
        H_pre = sigmoid(H~pre), H_post = 2 sigmoid(H~post), H_res = Sinkhorn-Knopp(H~res)
    and the layer x <- H_res x + H_post^T F(H_pre x). Sinkhorn-Knopp as eq. (9): M = exp(H~res), then 20 times
    M <- T_r(T_c(M)), columns normalized, then rows: the rows of H_res (the weights that make one new stream)
    sum to 1 exactly, the columns as far as 20 steps converge. Gating scalars a start at 0.01 (the paper's);
    phi starts at 0 and b at: b_pre = +-log 9 (H_pre 0.9 on stream index % n, 0.1 on the others: the
    streams' symmetry broken as HC's one-hot does), b_post = 0 (H_post = 1), b_res = 4 I (H_res near the
    identity). At init all n streams are copies of the baseline's residual stream."""

    def __init__(self, config, index):
        super().__init__()
        n, d = config.hc, config.n_embd
        self.n, self.eps = n, config.norm_eps
        self.phi_pre, self.phi_post = zero_linear(n * d, n), zero_linear(n * d, n)
        self.phi_res = zero_linear(n * d, n * n)
        b_pre = torch.full((n,), -math.log(9))
        b_pre[index % n] = math.log(9)
        self.b_pre, self.b_post = nn.Parameter(b_pre), nn.Parameter(torch.zeros(n))
        self.b_res = nn.Parameter(4 * torch.eye(n))
        self.scale_pre, self.scale_post, self.scale_res = (nn.Parameter(torch.tensor(0.01)) for _ in range(3))

    def forward(self, H):  # H: (B, T, n, d) -> pre (B, T, n), res (B, T, n, n), post (B, T, n)
        x = F.rms_norm(H.flatten(-2), (H.size(-2) * H.size(-1),), eps=self.eps)  # eq. (7): x'
        pre = torch.sigmoid(self.scale_pre * self.phi_pre(x) + self.b_pre)
        post = 2 * torch.sigmoid(self.scale_post * self.phi_post(x) + self.b_post)
        logits = self.scale_res * self.phi_res(x).unflatten(-1, (self.n, self.n)) + self.b_res  # res[i, j] from [i, j]
        res = sinkhorn(logits.mT).mT  # eq. (9), T_r(T_c(.)): sinkhorn() ends on columns, so on the transpose's
        return pre, res, post         # columns: res's rows, each new stream's weights, sum to 1 exactly


SINKHORN_ITERS = 20  # mHC's t_max


def sinkhorn(logits, iters=SINKHORN_ITERS):
    """Sinkhorn-Knopp: exp(logits), its rows and then its columns normalized to sum 1, `iters` times: a doubly
    stochastic matrix (non-negative, rows and columns summing to 1; the columns exactly). logits: (..., n, n).
    Static mHC takes this of HC's alpha and transposes it (its rows exact, as mHC's eq. (9) has them); dynamic
    mHC's eq. (9), T_r(T_c(.)), rows last, is sinkhorn(logits.mT).mT."""
    M = (logits - logits.amax(dim=(-2, -1), keepdim=True)).exp()  # the shift cancels; it keeps exp finite
    for _ in range(iters):
        M = M / M.sum(dim=-1, keepdim=True)
        M = M / M.sum(dim=-2, keepdim=True)
    return M


# ----------------------------------------------------------------------------- DenseFormer
class DepthWeightedAverage(nn.Module):
    """DenseFormer (arXiv 2402.02622): after block i, the input to the next block is a learned
    weighted sum of the embedding and the outputs of blocks 0..i. Weights start one-hot on
    block i's own output, so at init the model computes exactly the baseline function."""

    def __init__(self, n_inputs):
        super().__init__()
        weight = torch.zeros(n_inputs)
        weight[-1] = 1.0
        self.weight = nn.Parameter(weight)

    def forward(self, outputs):  # outputs: the embedding and blocks 0..i's outputs, each (B, T, d)
        return sum(w * x for w, x in zip(self.weight.unbind(), outputs))


class DenseStream(Stream):
    """The baseline's sum inside a block; after each block the DenseFormer average."""

    def __init__(self, model, x):
        self.dwa, self.x, self.sub = model.dwa, x.float(), 0
        self.outputs = [self.x]  # the embedding and every block's output

    def read(self):
        return self.x

    def write(self, y):
        self.x = self.x + y.float()
        self.sub += 1
        if self.sub % 2 == 0:  # a block's end
            self.outputs.append(self.x)
            with fp32(self.x):
                self.x = self.dwa[self.sub // 2 - 1](self.outputs)

    def output(self):
        return self.x


# ----------------------------------------------------------------------------- Attention Residuals
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


# ----------------------------------------------------------------------------- MUDDFormer
# After block i, per token, MUDD's dense connection (arXiv 2502.12170) mixes the embedding X_0 and the
# outputs X_1..X_{i+1} of blocks 0..i, with weights generated from block i's output:
#     A_i = GELU(RMSNorm(X_{i+1}) W1) W2 + a_i          (ways x (i + 2); RMSNorm without a gain)
#     X^c = sum_j A_i[c, j] X_j                         c = query, key, value, residual
# Block i + 1 then computes  h = X^r + attn(q from ln_1(X^q), k from ln_k(X^k), v from ln_v(X^v)),
# out = h + mlp(ln_2(h)). After the last block one way only: the input to the final norm. W2 = 0 and a_i
# one-hot on X_{i+1} at init: every X^c is the block's output, so the model computes the baseline function.
# PrePostDANorm (mudd_prepost; §2.5, eq. 10, for deep-narrow models; here as the authors' JAX code has it,
# mudd_prenorm and mudd_postnorm in jax/MaxText/layers/models.py and llama2.py): every source through its own
# RMSNorm (with a gain) before it is mixed, W1's input norm with a gain, and every way the block's output plus
# its mix, X^c = X_{i+1} + sum_j A_i[c, j] RMSNorm_j(X_j), except the residual way (after the last block: the
# one way), whose mix goes through a post norm, X^r = X_{i+1} + RMSNorm_post(sum_j A_i[r, j] RMSNorm_j(X_j)),
# its gain 0.001 at init; a_i = 0 at init. So at init every input of block i + 1 is block i's output: the
# baseline function.
MUDD_WAYS = 4  # query, key, value, residual


def mudd_shape(config, i):
    """(ways, sources, W1's width) of the connection after block i. The authors' width: ways x sources (x 4 for
    the last block's one way), rounded up past a multiple of 64, (n // 64 + 1) * 64."""
    last = i == config.n_layer - 1
    ways, sources = (1 if last else MUDD_WAYS), i + 2
    return ways, sources, (ways * sources * (4 if last else 1) // 64 + 1) * 64


class MUDDConnection(nn.Module):
    """The weights of the dense connection after block i: W1 (d x hidden), W2 (hidden x ways * sources), the
    static a_i (ways x sources), and the RMSNorms of the next block's key and value inputs (its query input
    goes through that block's ln_1, as before). With PrePostDANorm (mudd_prepost) also: ln_source, the norm of
    this source X_{i+1} (after block 0 also ln_embedding, X_0's), ln_w1, W1's input norm (a gain: the authors'),
    and ln_post, the residual way's norm (gain 0.001 at init); a_i = 0 at init."""

    def __init__(self, config, i):
        super().__init__()
        self.ways, self.sources, hidden = mudd_shape(config, i)
        d, self.eps, self.prepost = config.n_embd, config.norm_eps, config.mudd_prepost
        self.w1 = nn.Parameter(torch.empty(d, hidden))  # drawn by reset_parameters, after the baseline's weights
        self.w2 = nn.Parameter(torch.zeros(hidden, self.ways * self.sources))
        bias = torch.zeros(self.ways, self.sources)
        if not self.prepost:
            bias[:, -1] = 1.0  # a_i one-hot on block i's own output (PrePostDANorm: 0, the authors')
        self.bias = nn.Parameter(bias)
        if self.ways > 1:
            self.ln_k, self.ln_v = nn.RMSNorm(d, eps=config.norm_eps), nn.RMSNorm(d, eps=config.norm_eps)
        if self.prepost:  # no RNG draw: gains 1, the post norm's 0.001
            if i == 0:
                self.ln_embedding = nn.RMSNorm(d, eps=config.norm_eps)
            self.ln_source, self.ln_w1 = nn.RMSNorm(d, eps=config.norm_eps), nn.RMSNorm(d, eps=config.norm_eps)
            self.ln_post = nn.RMSNorm(d, eps=config.norm_eps)
            with torch.no_grad():
                self.ln_post.weight.fill_(0.001)

    @torch.no_grad()
    def reset_parameters(self):
        """W1 ~ N(0, 1/d), the authors' (variance scaling, fan in). W1 must be random: with W2 = 0 a zero W1
        would get no gradient, nor would W2 (GELU(0) = 0)."""
        self.w1.normal_(0.0, self.w1.size(0) ** -0.5)

    def forward(self, x):  # x: block i's output X_{i+1} (B, T, d) -> A_i (ways, B, T, sources)
        x = self.ln_w1(x) if self.prepost else F.rms_norm(x, (x.size(-1),), eps=self.eps)
        a = F.gelu(x @ self.w1) @ self.w2  # (B, T, ways * sources)
        return a.unflatten(-1, (self.ways, self.sources)).permute(2, 0, 1, 3) + self.bias[:, None, None, :]


class MUDDStream(Stream):
    """The embedding and every block's output so far (as mixed: normed with PrePostDANorm), and the four inputs
    of the next block."""

    def __init__(self, model, x):
        self.connections = model.mudd
        self.prepost = model.config.mudd_prepost
        x = x.float()
        with fp32(x):  # the sources X_0, X_1, ...: the embedding and the blocks' outputs (PrePostDANorm: normed)
            self.sources = [self.connections[0].ln_embedding(x) if self.prepost else x]
        self.inputs = (x,) * 4   # the next block's X^q, X^k, X^v, X^r (block 0: the embedding)

    def block(self, block, rope, kv_stack, cache):
        x_q, x_k, x_v, x_r = self.inputs
        i = len(self.sources) - 1  # this block's index
        if i == 0:  # block 0: one input, the baseline's attention
            y = block.attn(block.ln_1(x_q), rope, kv_stack, cache)
        else:  # its key and value inputs through their own norms
            connection = self.connections[i - 1]
            y = mudd_attention(block.attn, block.ln_1(x_q), connection.ln_k(x_k), connection.ln_v(x_v),
                               rope, kv_stack, cache)
        h = x_r + y.float()
        out = h + block.mlp(block.ln_2(h)).float()
        connection = self.connections[i]
        with fp32(out):  # the block's output joins the sources; the mixes make the next block's inputs
            self.sources.append(connection.ln_source(out) if self.prepost else out)
            A = connection(out)  # (ways, B, T, sources)
            mixed = list(sum(A[..., j, None] * X for j, X in enumerate(self.sources)).unbind(0))  # ways x (B, T, d)
            if self.prepost:  # eq. (10) as the authors' code has it: every way is the block's output plus its
                # mix, the residual way's (the last) through the post norm
                mixed = [out + m for m in mixed[:-1]] + [out + connection.ln_post(mixed[-1])]
        self.inputs = tuple(mixed)

    def output(self):
        return self.inputs[-1]  # after the last block, the final mix


def mudd_attention(attn, x_q, x_k, x_v, rope, kv_stack, cache):
    """model.Attention with its own query, key and value inputs (B, T, d): keys and values through kv_proj's two
    halves. Returns the attention's output (B, T, d)."""
    B, T, _ = x_q.shape
    q = attn.q_proj(x_q).view(B, T, attn.n_head, attn.head_dim)
    w_k, w_v = attn.kv_proj.weight.chunk(2)
    kv = torch.stack((F.linear(x_k, w_k), F.linear(x_v, w_v)), dim=2)  # (B, T, 2, H_kv * d_h)
    kv = kv.view(B, T, 2, attn.n_kv_head, attn.head_dim)
    if kv_stack is None:
        k, v = kv.unbind(2)  # (B, T, H_kv, d_h) each
    else:  # LIMe routes these keys and values as the baseline's
        k, v = attn.lime(x_q, kv, kv_stack)
    return attn.resid_dropout(attn.o_proj(attn.attend(q, k, v, rope, cache)))


# ----------------------------------------------------------------------------- MoDA
class MoDAStream(Stream):
    """The baseline's residual sum, in the model's dtype, with MoDA's attention: every attention sub-layer
    also reads the depth keys and values that the sub-layers before it wrote at each position."""

    def __init__(self, x):
        self.x, self.depth = x, DepthKV()

    def block(self, block, rope, kv_stack, cache):
        attn, x = block.attn, block.ln_1(self.x)
        B, T, _ = x.shape
        q = attn.q_proj(x).view(B, T, attn.n_head, attn.head_dim).transpose(1, 2)  # (B, H, T, d_h)
        k, v = attn.kv_proj(x).view(B, T, 2, attn.n_kv_head, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        self.x = self.x + attn.resid_dropout(attn.o_proj(self.depth.attend(attn, q, k, v, rope, cache)))
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


# ----------------------------------------------------------------------------- Depth scaling (CompleteP)
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


def check_depth_scaling(config):
    """ValueError for a depth scaling that is unknown, lacks its base depth, or meets a relative it does not support."""
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
    refused = [k for k in ("hc", "denseformer", "mudd", "moda") if getattr(config, k)]
    if refused:
        raise ValueError(f"depth_scaling='completep' supports the baseline, lime and attnres, not {refused[0]} "
                         "(docs/deviations.md, Depth scaling)")


def depth_multiplier(config):
    """m_L = L / L_base."""
    return config.n_layer / config.depth_base


def scale_output(multiplier, module, args, output):
    """Forward hook: a sub-layer's output times the residual branch multiplier."""
    return output * multiplier


class CompletePGPT(RelativesGPT):
    """The model of depth_scaling='completep': CompleteP's rules above, on the baseline, LIMe or Attention Residuals.
    The multiplier is a forward hook on each block's attention and MLP, so whatever stream the outputs join (the
    plain residual sum, AttnRes's sources) receives them scaled."""

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

    def configure_optimizers(self, weight_decay, learning_rate, router_lr, betas, device_type, eps=1e-8,
                             optimizer="adamw", **kwargs):
        """model.GPT's groups, AdamW's epsilon times m_L^-alpha in every group (the lr and the weight decay of every
        group stay: their factors are 1 at alpha = 1 and fixed width)."""
        if optimizer != "adamw":
            raise ValueError(f"depth_scaling='completep' has AdamW's rules (CompleteP's Table 1), none for "
                             f"optimizer='{optimizer}': use optimizer='adamw'")
        eps = eps * depth_multiplier(self.config) ** -COMPLETEP_ALPHA
        return super().configure_optimizers(weight_decay, learning_rate, router_lr, betas, device_type, eps=eps,
                                            optimizer=optimizer, **kwargs)
