"""MUDDFormer (arXiv 2502.12170; `mudd=True`): per-token dense mixes of earlier block outputs, one each for the next
block's query, key, value and residual inputs; `mudd_prepost=True` adds PrePostDANorm (§2.5, eq. 10, as the authors'
code computes it: `mudd_prenorm` and `mudd_postnorm`), their normalization for deep-narrow models."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Component, Relative, Stream, fp32

OPTIONS = dict(
    mudd=False,          # a block's q, k, v, residual inputs per-token mixes of earlier block outputs
    mudd_prepost=False,  # PrePostDANorm (needs mudd): sources normed, every way X + mix, the residual way's normed
)


def check(config):
    if config.mudd_prepost and not config.mudd:
        raise ValueError("mudd_prepost is MUDDFormer's PrePostDANorm: set mudd too, e.g. mudd=True mudd_prepost=True")


def attach(model):
    """After block i, the mixes that feed block i + 1 (after the last block: the final norm): model.mudd[i]."""
    model.mudd = nn.ModuleList([MUDDConnection(model.config, i) for i in range(model.config.n_layer)])


def reset_parameters(model):
    for connection in model.mudd:
        connection.reset_parameters()


def stream(model, x):
    return MUDDStream(model, x)


def flops(c, T):
    """After block i: W1, W2 and, for each way, a multiply-add per source (PrePostDANorm's norms and its residual
    adds are elementwise: no FLOPs counted)."""
    total = 0
    for i in range(c.n_layer):
        ways, sources, hidden = mudd_shape(c, i)
        total += 2 * c.n_embd * hidden + 2 * hidden * ways * sources + 2 * ways * sources * c.n_embd
    return total


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
            x_q, x_k, x_v = block.ln_1(x_q), connection.ln_k(x_k), connection.ln_v(x_v)
            y = self.attention(block.attn, x_q, x_k, x_v, rope, kv_stack, cache)
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

    def attention(self, attn, x_q, x_k, x_v, rope, kv_stack, cache):
        """model.Attention with its own query, key and value inputs (B, T, d), three where
        Attention.qkv projects one: the query through q_proj, keys and values through kv_proj's two
        halves. Returns the attention's output (B, T, d)."""
        q = attn.q_proj(x_q).unflatten(-1, (attn.n_head, attn.head_dim))  # (B, T, H, d_h)
        heads, (w_k, w_v) = (attn.n_kv_head, attn.head_dim), attn.kv_proj.weight.chunk(2)
        k = F.linear(x_k, w_k).unflatten(-1, heads)  # (B, T, H_kv, d_h)
        v = F.linear(x_v, w_v).unflatten(-1, heads)
        for hook in self.hooks:
            hook('kv', attn.layer, torch.stack((k, v), dim=2))
        if kv_stack is not None:  # LIMe routes these keys and values as the baseline's
            k, v = attn.routed_kv(x_q, k, v, kv_stack)
        return attn.out(attn.attend(q, k, v, rope, cache))


def family(config):
    """Its name in analyses: MUDD, or MUDD-PrePostDANorm."""
    return "MUDD-PrePostDANorm" if config.mudd_prepost else "MUDD"


RELATIVE = Relative(
    family=family, options=OPTIONS, stream=stream, flops=flops, check=check, attach=attach,
    reset_parameters=reset_parameters, rewires_stream=True,
    components={"mudd": Component({"mudd": True}, mode="mudd_prepost", word="prepost")})
