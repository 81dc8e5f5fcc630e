"""Hyper-Connections (Zhu et al. 2024, the LIMe paper's other baseline; `hc=n`, `hc_dynamic`): n residual streams,
and mHC (DeepSeek, arXiv 2512.24880): `mhc='dynamic'` is the paper's (eqs. 7-9, per-token maps); `mhc='static'` is
HC's coefficients constrained the same way (the form our earlier results used)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import zero_linear

from .base import Component, Relative, Stream, fp32

MHC = "'' (off), 'dynamic' (the paper's), 'static'"
OPTIONS = dict(
    hc=0,             # Hyper-Connections expansion rate (0 = off; the paper uses 4)
    hc_dynamic=False,  # HC's per-token offsets (needs hc)
    mhc="",           # mHC (needs hc): MHC above; 'dynamic' the paper's, 'static' HC's weights constrained
)


def check(config):
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


def family(config):
    """Its name in analyses: HC, HC-dynamic, mHC-dynamic, mHC-static, mHC-static-hc_dynamic."""
    if config.mhc:
        return f"mHC-{config.mhc}" + ("-hc_dynamic" if config.hc_dynamic else "")
    return "HC" + ("-dynamic" if config.hc_dynamic else "")


def attach(model):
    """A connection around each sub-layer: block.hc_attn and block.hc_mlp."""
    c = model.config
    for layer, block in enumerate(model.transformer.h):
        connection = DynamicMHC if c.mhc == "dynamic" else HyperConnection
        block.hc_attn, block.hc_mlp = connection(c, 2 * layer), connection(c, 2 * layer + 1)


def stream(model, x):
    return HyperStreams(model, x)


def flops(c, T):
    d, L, n = c.n_embd, c.n_layer, c.hc
    if c.mhc == "dynamic":  # per sub-layer: phi (n d x (2n + n^2)), the pre and res mixes, the post add
        return 2 * L * (2 * n * d * (2 * n + n * n) + 2 * n * d + 2 * n * n * d + 2 * n * d)
    # per sub-layer: width mix (n x n+1), depth add, dynamic projections
    return 2 * L * (2 * n * (n + 1) * d + 2 * n * d + (2 * n * d * (n + 2) if c.hc_dynamic else 0))


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


RELATIVE = Relative(
    family=family, options=OPTIONS, stream=stream, flops=flops, check=check, attach=attach,
    rewires_stream=True, components={  # hc, hc8, hc:dynamic; mhc, mhc:static, mhc+hc8 (8 streams)
        "hc": Component({"hc": 4}, mode="hc_dynamic", word="dynamic", number="hc"),
        "mhc": Component({"hc": 4, "mhc": "dynamic"}, mode="mhc")})
