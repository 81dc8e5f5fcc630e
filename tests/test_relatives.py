"""LIMe's 2026 relatives against independent references: Attention Residuals (Full and Block) against
a naive AttnRes written from the equation in this file (a Python loop over sources, softmax over depth,
block sums recomputed from scratch), in outputs and every gradient; mHC's Sinkhorn matrices doubly
stochastic and of Sinkhorn's form, the dynamic form's as eq. (9) (rows last); mHC without its constraint is HC;
Hyper-Connections (static and dynamic) written out per stream; MUDDFormer (and its PrePostDANorm as its authors'
code has it) against its equations; MoDA against its joint softmax written per position; Depth-Attention against
its authors' expression written out; init, counts, cached decoding, optimizer groups (every relative's weights decayed or not, as
docs/deviations.md says). (torch.compile: tests/test_compile.py.)"""
import contextlib
import math
import types

import pytest
import torch
import torch.nn.functional as F

from conftest import OPTIMIZERS
import model as M
from nanolime.optim import configure_optimizers
import relatives as R
from conftest import V, build, error_of, loss_and_grads, saved_bytes, step_logits, tiny
from nanolime.variants import VARIANT_COMPONENTS

def assert_matches(model, reference, grad_atol=lambda ref: 1e-6):
    """The model against reference(model, x, y) -> (logits, loss), a naive form written from the paper's
    equations: logits, and the gradient of every parameter."""
    x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
    logits, grads = loss_and_grads(model, x, y)
    model.zero_grad()
    ref_logits, ref_loss = reference(model, x, y)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys() == {n for n, _ in model.named_parameters()}
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, atol=grad_atol(ref), rtol=1e-4, msg=name)



def scramble(model):
    """AttnRes queries and key gains, HC/mHC coefficients off their init, so that tests see them act."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("attn_res."):  # logits w . RMSNorm(v) of order 1
                p.add_(torch.randn_like(p) * (0.3 if name.endswith("query") else 0.2))
            elif ".hc_" in name:
                p.add_(torch.randn_like(p) * (0.5 if "static" in name else 0.3))
    return model


def naive_attnres(model, idx, targets, m, branch=1.0):
    """The model's function with AttnRes as written: sources v_0 = the embedding, then the sums of blocks
    of m sub-layer outputs (m = 1: every output, Full AttnRes) and the current block's partial sum;
    sub-layer l reads h_l = sum_i softmax_i(w_l . RMSNorm_l(v_i)) v_i, its key norm with its own gain.
    `branch`: CompleteP's multiplier on every sub-layer output (the modules' own forward, without hooks).
    Returns logits, loss and the number of sources of every read."""
    d, eps = model.config.n_embd, model.config.norm_eps
    emb, outputs, counts = model.transformer.wte(idx), [], []

    def read():
        l = len(outputs)
        done = l - l % m  # outputs in completed blocks
        sources = [emb] + [sum(outputs[j:j + m]) for j in range(0, done, m)]
        if done < l:
            sources.append(sum(outputs[done:]))
        counts.append(len(sources))
        if l == 0:  # one source: weight 1, whatever the query
            return emb
        w, g = model.attn_res.query[l - 1], model.attn_res.key_weight[l - 1]
        logits = [(w * F.rms_norm(v, (d,), g, eps)).sum(-1) for v in sources]
        alpha = torch.stack(logits).softmax(dim=0)  # over depth
        return sum(alpha[i].unsqueeze(-1) * v for i, v in enumerate(sources))

    kv_stack = M.KVStack([b.attn.router for b in model.transformer.h], model.route_group_size) \
        if model.config.lime else None  # LIMe's stacked KV, as model.py passes it
    for block in model.transformer.h:
        outputs.append(branch * block.attn.forward(block.ln_1(read()), model.rope, kv_stack))
        outputs.append(branch * block.mlp.forward(block.ln_2(read())))
    logits = model.lm_head(model.transformer.ln_f(read()))
    return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1)), counts


# (layers, attnres, sub-layers per block): Full; Block with one sub-layer per block (= Full); the default
# 8 blocks (1 and 2 sub-layers each at 3 and 8 layers); blocks that do not divide the 2L sub-layers; one
# block of exactly 2L; a block longer than the model (everything a partial sum)
CASES = [(4, "full", 1), (4, "block-1", 1), (3, "block", 1), (8, "block", 2), (4, "block-3", 3),
         (5, "block-4", 4), (3, "block-5", 5), (4, "block-8", 8), (3, "block-16", 16)]


@pytest.mark.parametrize("n_layer, attnres, m", CASES, ids=lambda c: str(c))
def test_attnres_matches_the_equation(n_layer, attnres, m):
    """The model's two-phase AttnRes against the naive one: logits and every gradient (pseudo-queries,
    key gains, the final blend's, every projection, the embedding)."""
    model = scramble(build(n_layer=n_layer, attnres=attnres))
    assert R.attnres.attnres_block_sublayers(attnres, n_layer) == m
    assert_matches(model, lambda model, x, y: naive_attnres(model, x, y, m)[:2])


def test_attnres_at_init_reads_the_uniform_mean():
    """Zero pseudo-queries: every sub-layer reads the plain mean of the embedding and all earlier
    outputs (Full), not the baseline's sum."""
    model = build(n_layer=3, attnres="full")
    seen = {"in": [], "out": []}
    model.transformer.wte.register_forward_hook(lambda mod, args, out: seen["out"].append(out))
    for block in model.transformer.h:
        for norm, sub in ((block.ln_1, block.attn), (block.ln_2, block.mlp)):
            norm.register_forward_pre_hook(lambda mod, args: seen["in"].append(args[0]))
            sub.register_forward_hook(lambda mod, args, out: seen["out"].append(out))
    model.transformer.ln_f.register_forward_pre_hook(lambda mod, args: seen["in"].append(args[0]))
    model(torch.randint(0, V, (2, 16)))
    assert len(seen["in"]) == len(seen["out"]) == 7
    for l, h in enumerate(seen["in"]):
        sources = torch.stack(seen["out"][:l + 1])
        torch.testing.assert_close(h, sources.mean(0), atol=1e-6, rtol=1e-5)
        if l > 0:
            assert (h - sources.sum(0)).abs().max() > 1e-3


def test_attnres_counts():
    """Parameters: a pseudo-query and a key gain per read with more than one source (sub-layers 1..2L-1
    and the final blend): 4d per layer. FLOPs: a logit and a multiply-add per source of every read, the
    sources counted by the naive reference."""
    L, d = 4, 32
    base = build(n_layer=L)
    for attnres, m in (("full", 1), ("block-3", 3), ("block", 1)):
        model = build(n_layer=L, attnres=attnres)
        assert model.get_num_params() - base.get_num_params() == 4 * d * L
        x = torch.randint(0, V, (1, 16))
        _, _, counts = naive_attnres(model, x, x, m)
        assert len(counts) == 2 * L + 1 and counts[:4] == ([1, 2, 3, 4] if m == 1 else [1, 2, 2, 2])
        assert model.flops_per_token(16) - base.flops_per_token(16) == sum(4 * d * c for c in counts)


@pytest.mark.parametrize("kw", [dict(attnres="full"), dict(attnres="block-3", n_kv_head=2),
                                dict(attnres="block", lime=True, n_kv_head=2), dict(hc=4, mhc="static"),
                                dict(hc=2, mhc="static", hc_dynamic=True, lime=True), dict(hc=4, mhc="dynamic"),
                                dict(hc=2, mhc="dynamic", lime=True, n_kv_head=2), dict(moda=True),
                                dict(moda=True, n_kv_head=2),
                                dict(lime=True, attnres="block-3", depth_scaling="completep", depth_base=2)], ids=str)
def test_cached_decoding_is_exact(kw):
    """Each mixes per position across depth only (MoDA: its depth keys are the new token's own): the KV
    cache stays exact (as in test_model.py)."""
    model = scramble_mhc(scramble(build(seed=1, **kw))).eval()
    prompt = torch.randint(0, V, (2, 4))
    idx, cached = step_logits(model, prompt, 12)
    for t in range(12):
        full, _ = model(idx[:, :4 + t], idx[:, :4 + t])
        torch.testing.assert_close(cached[t], full[:, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.generate(prompt, 12, top_k=1, use_cache=False), idx, atol=0, rtol=0)


# ----------------------------------------------------------------------------- mHC
def test_sinkhorn_gives_the_doubly_stochastic_scaling_of_exp():
    """float64, batched, standard normal logits: after the 20 steps rows and columns sum to 1 to 1e-5,
    and the result is diag(r) exp(logits) diag(c) (Sinkhorn's form; a uniform 1/n would pass the sums
    but not this)."""
    torch.manual_seed(0)
    logits = torch.randn(5, 3, 4, 4, dtype=torch.float64)
    P = R.hyper_connections.sinkhorn(logits)
    assert P.min() > 0
    assert (P.sum(-1) - 1).abs().max() <= 1e-5 and (P.sum(-2) - 1).abs().max() <= 1e-12
    X = P.log() - logits  # log r_i + log c_j: double-centred, nothing is left
    X = X - X.mean(-1, keepdim=True) - X.mean(-2, keepdim=True) + X.mean((-2, -1), keepdim=True)
    assert X.abs().max() <= 1e-10
    torch.testing.assert_close(R.hyper_connections.sinkhorn(logits + 100.0), P)  # the shift before exp cancels


@pytest.mark.parametrize("dynamic", [False, True])
def test_every_mhc_residual_matrix_is_doubly_stochastic(dynamic, monkeypatch):
    """Every sub-layer's residual mix (per token when dynamic) after the model's Sinkhorn steps, on
    coefficients moved off their init: non-negative, rows and columns summing to 1 to 1e-5; the pre
    map in (0, 1), the post map in (0, 2). With one Sinkhorn step the rows are off: the check can fail."""
    model = scramble(build(hc=4, mhc="static", hc_dynamic=dynamic))
    seen = []
    for block in model.transformer.h:
        for hc in (block.hc_attn, block.hc_mlp):
            hc.register_forward_pre_hook(lambda mod, args: seen.append(mod.coefficients(args[0])))
    x = torch.randint(0, V, (2, 16))
    with torch.no_grad():
        model(x, x)
    assert len(seen) == 2 * model.config.n_layer
    for alpha, beta in seen:
        assert alpha.shape[-2:] == (4, 5) and (alpha.dim() == 4) == dynamic
        res = alpha[..., 1:]
        assert res.min() >= 0
        assert (res.sum(-1) - 1).abs().max() <= 1e-5 and (res.sum(-2) - 1).abs().max() <= 1e-5
        assert 0 < alpha[..., 0].min() and alpha[..., 0].max() < 1 and 0 < beta.min() and beta.max() < 2
    monkeypatch.setattr(R.hyper_connections.sinkhorn, "__defaults__", (1,))
    alpha, _ = model.transformer.h[1].hc_mlp.coefficients(torch.randn(2, 16, 4, 32))
    assert (alpha[..., 1:].sum(-1) - 1).abs().max() > 1e-3


@pytest.mark.parametrize("dynamic", [False, True])
def test_mhc_without_its_constraint_is_hc(dynamic):
    """mHC has HC's parameters; switched off, its constraint leaves exactly our HC."""
    mhc = scramble(build(seed=1, hc=4, mhc="static", hc_dynamic=dynamic, n_kv_head=2))
    hc = build(seed=2, hc=4, hc_dynamic=dynamic, n_kv_head=2)
    hc.load_state_dict(mhc.state_dict())  # strict: the same names and shapes
    x = torch.randint(0, V, (2, 16))
    assert (mhc(x, x)[0] - hc(x, x)[0]).abs().max() > 1e-3
    for module in mhc.modules():
        if isinstance(module, R.hyper_connections.HyperConnection):
            module.mhc = False
    assert torch.equal(mhc(x, x)[0], hc(x, x)[0])


def test_mhc_at_init_computes_the_baseline():
    """Post map 2 sigmoid(0) = 1 and doubly stochastic mixes keep the 4 streams copies of the baseline's
    residual stream: the baseline function, up to RMSNorm's eps (the sub-layers' norms see the streams
    weighted by the pre map, sigmoid(1) + 3 sigmoid(0); the final norm their sum)."""
    base = build(n_kv_head=2)
    mhc = build(seed=5, n_kv_head=2, hc=4, mhc="static")
    result = mhc.load_state_dict(base.state_dict(), strict=False)
    assert not result.unexpected_keys and all(".hc_" in k for k in result.missing_keys)
    x = torch.randint(0, V, (2, 16))
    assert (mhc(x, x)[0] - base(x, x)[0]).abs().max() > 1e-4  # eps matters at this scale
    pre = torch.tensor(1.0).sigmoid().item() + 1.5
    for module in base.modules():
        if isinstance(module, torch.nn.RMSNorm):
            module.eps = base.config.norm_eps / (16 if module is base.transformer.ln_f else pre ** 2)
    torch.testing.assert_close(mhc(x, x)[0], base(x, x)[0], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        mhc.transformer.h[1].hc_attn.static_beta[1] = 1.0  # stream 1 gets this attention output x 1.46
    assert (mhc(x, x)[0] - base(x, x)[0]).abs().max() > 1e-3


def test_mhc_counts():
    """mHC is HC's parameters and HC's matmuls (the Sinkhorn steps and sigmoids are elementwise)."""
    for dynamic in (False, True):
        hc, mhc = build(hc=4, hc_dynamic=dynamic), build(hc=4, hc_dynamic=dynamic, mhc="static")
        assert mhc.get_num_params() == hc.get_num_params()
        assert mhc.flops_per_token(16) == hc.flops_per_token(16)


# ----------------------------------------------------------------------------- both
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_mixing_weights_train_without_decay(optimizer):
    """AttnRes's queries and key gains, static mHC's coefficients: gradients, and AdamW without weight decay at
    learning_rate (with Muon too), as static HC's and DenseFormer's; MUDD's W1, W2, a_i and norms too. Muon takes
    none. (Which relatives' weights are decayed: test_every_relatives_weights_are_decayed_as_documented.)"""
    for kw in (dict(attnres="block-3"), dict(hc=4, mhc="static"), dict(mudd=True)):
        model = scramble_mudd(scramble(build(**kw)))
        x = torch.randint(0, V, (2, 16))
        _, grads = loss_and_grads(model, x, x)
        names = [n for n, _ in model.named_parameters() if n.startswith(("attn_res.", "mudd.")) or ".hc_" in n]
        assert len(names) == {"attnres": 2, "hc": 2 * 4 * 2, "mudd": 3 * 4 + 2 * 3}[next(iter(kw))]
        assert all(grads[n].abs().sum() > 0 for n in names)
        opt = configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu", optimizer=optimizer)
        adamw = opt if optimizer == "adamw" else opt[1]
        no_decay = next(g for g in adamw.param_groups if g["name"] == "no_decay")
        assert no_decay["weight_decay"] == 0 and no_decay["lr"] == 1e-3
        params = dict(model.named_parameters())
        assert all(any(p is params[n] for p in no_decay["params"]) for n in names)


# Every relative's own parameters (named without the layer index and the hc_attn / hc_mlp module; 'mlp.moda_kv'
# is in each MLP), decayed (True) or not (False) by AdamW in configure_optimizers: nn.Linear weights decayed, every
# other parameter not. docs/deviations.md ("Weight decay of the relatives' weights") says the same, row for row.
HC_STATIC = {"static_alpha": False, "static_beta": False}
HC_DYNAMIC = {**HC_STATIC, "norm.weight": False, "dynamic_alpha.weight": True, "dynamic_beta.weight": True,
              "alpha_scale": False, "beta_scale": False}
MUDD = {"mudd.w1": False, "mudd.w2": False, "mudd.bias": False, "mudd.ln_k.weight": False, "mudd.ln_v.weight": False}
WEIGHT_DECAY = [
    (dict(hc=4), HC_STATIC), (dict(hc=4, hc_dynamic=True), HC_DYNAMIC),
    (dict(hc=4, mhc="static"), HC_STATIC), (dict(hc=4, mhc="static", hc_dynamic=True), HC_DYNAMIC),
    (dict(hc=4, mhc="dynamic"), {**{f"phi_{m}.weight": True for m in ("pre", "post", "res")},
                                 **{f"{k}_{m}": False for k in ("b", "scale") for m in ("pre", "post", "res")}}),
    (dict(denseformer=True), {"dwa.weight": False}),
    (dict(attnres="block"), {"attn_res.query": False, "attn_res.key_weight": False}),
    (dict(mudd=True), MUDD),
    (dict(mudd=True, mudd_prepost=True), {**MUDD, **{f"mudd.{n}.weight": False
                                                     for n in ("ln_embedding", "ln_source", "ln_w1", "ln_post")}}),
    (dict(moda=True), {"mlp.moda_kv.weight": True}), (dict(depth_attention=True), {})]


@pytest.mark.parametrize("kw, table", WEIGHT_DECAY, ids=[str(kw) for kw, _ in WEIGHT_DECAY])
def test_every_relatives_weights_are_decayed_as_documented(kw, table):
    """Each parameter a relative adds to the baseline sits in AdamW's 'decay' or 'no_decay' group as WEIGHT_DECAY
    (and docs/deviations.md) says: every such parameter is in the table, and the table has no other."""
    base = {n for n, _ in build().named_parameters()}
    model = build(**kw)
    opt = model.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu")
    group = {id(p): g["name"] for g in opt.param_groups for p in g["params"]}
    seen = {}
    for name, p in model.named_parameters():
        if name not in base:
            key = ".".join(s for s in name.split(".") if not s.isdigit() and s not in ("transformer", "h", "hc_attn",
                                                                                      "hc_mlp"))
            assert group[id(p)] in ("decay", "no_decay"), name
            assert seen.setdefault(key, group[id(p)] == "decay") == (group[id(p)] == "decay"), name
    assert seen == table
    assert next(g for g in opt.param_groups if g["name"] == "decay")["weight_decay"] == 0.1


@pytest.mark.parametrize("bad, match", [
    (dict(mudd_prepost=True), "mudd_prepost is MUDDFormer's PrePostDANorm: set mudd too"),
    (dict(attnres="blocks"), "unknown attnres"),
    (dict(attnres="block-0"), "unknown attnres"),
    (dict(attnres="full", hc=4), "use one of them"),
    (dict(attnres="block", denseformer=True), "use one of them"),
    (dict(hc=4, denseformer=True), "use one of them"),
    (dict(mudd=True, hc=4), "hc, denseformer, attnres and mudd each rewire the residual stream; use one of them"),
    (dict(mudd=True, denseformer=True), "use one of them"),
    (dict(mudd=True, attnres="block"), "use one of them"),
    (dict(mhc="static"), "set hc too"),
    (dict(mhc="dynamic"), "set hc too"),
    (dict(hc_dynamic=True), "hc_dynamic makes Hyper-Connections dynamic: set hc too"),
    (dict(hc=4, mhc="yes"), "unknown mhc 'yes'"),
    (dict(hc=4, mhc=True), "unknown mhc"),  # the old flag: a checkpoint's is converted on loading
    (dict(hc=4, mhc="dynamic", hc_dynamic=True), "dynamic already"),
    (dict(hc=-1), "hc=-1 must be 0"),
    (dict(lime=True, router="last-0"), r"j >= 1"),
    (dict(moda=True, lime=True), "use it alone"),
    (dict(moda=True, hc=2), "use it alone"),
    (dict(moda=True, denseformer=True), "use it alone"),
    (dict(moda=True, attnres="full"), "use it alone"),
    (dict(moda=True, mudd=True), "use it alone"),
    (dict(depth_attention_stride=2), "depth_attention_stride picks Depth-Attention.s source layers: set depth_"),
    (dict(depth_attention=True, depth_attention_stride=-1), "must be >= 1, or 0 for n_layer // 2"),
    (dict(depth_attention=True, lime=True), "use it alone"),
    (dict(depth_attention=True, hc=2), "use it alone"),
    (dict(depth_attention=True, mudd=True), "use it alone"),
    (dict(depth_attention=True, moda=True), "use it alone"),
    (dict(depth_attention=True, depth_scaling="completep", depth_base=2), "not depth_attention"),
])
def test_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        tiny(**bad)


@pytest.mark.parametrize("stream", [dict(hc=2), dict(hc=2, hc_dynamic=True), dict(hc=2, mhc="static"),
                                    dict(hc=2, mhc="dynamic"), dict(denseformer=True), dict(attnres="block-3"),
                                    dict(mudd=True), dict(mudd=True, mudd_prepost=True)], ids=str)
def test_lime_combines_with_every_stream(stream):
    """LIMe with each relative's stream: a model, its routers and the relative's weights all get gradients."""
    model = scramble_mudd(scramble(build(lime=True, n_kv_head=2, **stream)))
    x = torch.randint(0, V, (2, 16))
    _, grads = loss_and_grads(model, x, x)
    assert grads.keys() == {n for n, _ in model.named_parameters()}
    assert any("router" in n for n in grads)
    assert any(n.startswith(("dwa.", "attn_res.", "mudd.")) or ".hc_" in n for n in grads)


# ----------------------------------------------------------------------------- mHC, the paper's (dynamic)
def naive_mhc(model, idx, targets):
    """The model's function with mHC as the paper writes it (eqs. 7-9), per token, for n streams x (n x d):
    x' = RMSNorm(vec x); H_pre = sigmoid(a_pre x' phi_pre + b_pre), H_post = 2 sigmoid(a_post x' phi_post +
    b_post), H_res = Sinkhorn-Knopp(a_res mat(x' phi_res) + b_res) as eq. (9) (sinkhorn_eq9); x <- H_res x +
    H_post^T F(H_pre x). The streams start as copies of the embedding and are summed before the final norm."""
    n, d, eps = model.config.hc, model.config.n_embd, model.config.norm_eps
    x = model.transformer.wte(idx).unsqueeze(2).repeat(1, 1, n, 1)  # (B, T, n, d)
    kv_stack = None  # with LIMe, its stacked KV (LIMe itself is checked against eq. (2) in test_model.py)
    if model.config.lime:
        kv_stack = M.KVStack([block.attn.router for block in model.transformer.h], model.route_group_size)
    for block in model.transformer.h:
        for conn, sublayer in ((block.hc_attn, lambda h: block.attn(block.ln_1(h), model.rope, kv_stack)),
                               (block.hc_mlp, lambda h: block.mlp(block.ln_2(h)))):
            v = x.reshape(*x.shape[:2], n * d)
            v = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)  # RMSNorm(vec x), no gain
            pre = torch.sigmoid(conn.scale_pre * (v @ conn.phi_pre.weight.T) + conn.b_pre)
            post = 2 * torch.sigmoid(conn.scale_post * (v @ conn.phi_post.weight.T) + conn.b_post)
            P = sinkhorn_eq9(conn.scale_res * (v @ conn.phi_res.weight.T).reshape(*x.shape[:2], n, n) + conn.b_res)
            h = torch.einsum("btj,btjd->btd", pre, x)
            x = torch.einsum("btij,btjd->btid", P, x) + post[..., None] * sublayer(h)[:, :, None, :]
    logits = model.lm_head(model.transformer.ln_f(x.sum(2)))
    return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


def sinkhorn_eq9(logits, t_max=20):
    """mHC's eq. (9), written out: M^(0) = exp(H~res), M^(t) = T_r(T_c(M^(t-1))), T_c dividing each column by its
    sum, T_r each row (rows last), t_max = 20 (Table 5); H_res = M^(t_max), H_res[i, j] the weight of stream j
    in the new stream i (x_{l+1} = H_res x_l): row i sums to 1 exactly."""
    M = torch.exp(logits)
    for _ in range(t_max):
        M = M / M.sum(dim=-2, keepdim=True)  # T_c: columns
        M = M / M.sum(dim=-1, keepdim=True)  # T_r: rows
    return M


def scramble_mhc(model, seed=0):
    """The paper's mHC off its init: phi random, gating scales and biases moved, so that every map acts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".hc_" in name:
                p.add_(torch.randn(p.shape, generator=g) * (0.5 if ".phi_" in name else 0.3))
    return model


@pytest.mark.parametrize("kw", [dict(hc=4), dict(hc=2, lime=True, n_kv_head=2), dict(hc=3, n_layer=2)], ids=str)
def test_dynamic_mhc_matches_the_equations(kw):
    """The model's mHC against naive_mhc: logits and every gradient (phi, b, the scales, every projection)."""
    model = scramble_mhc(build(mhc="dynamic", **kw))
    assert_matches(model, naive_mhc)


def test_dynamic_mhc_residual_matrix_is_eq_9():
    """H_res per token as eq. (9) (sinkhorn_eq9, rows normalized last) on logits far from the init (b_res with
    std 3, phi random): every row sums to 1 to 1e-6 in float64, and the matrix is eq. (9)'s to 1e-6; the
    columns only as far as 20 steps converge (here visibly not: the check that the rows are the exact side).
    Rows then columns (the form before the fix) leaves the rows off by more than 1e-6 here."""
    model = build(hc=4, mhc="dynamic").double()
    conn = model.transformer.h[1].hc_attn
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        conn.b_res.copy_(torch.randn(4, 4, generator=g, dtype=torch.float64) * 3)
        conn.phi_res.weight.copy_(torch.randn(conn.phi_res.weight.shape, generator=g, dtype=torch.float64))
        conn.scale_res.fill_(0.5)
    H = torch.randn(3, 7, 4, 32, generator=g, dtype=torch.float64)
    _, res, _ = conn(H)
    x = F.rms_norm(H.flatten(-2), (4 * 32,), eps=model.config.norm_eps)
    want = sinkhorn_eq9(conn.scale_res * (x @ conn.phi_res.weight.T).unflatten(-1, (4, 4)) + conn.b_res)
    assert (res.sum(-1) - 1).abs().max() <= 1e-6
    torch.testing.assert_close(res, want, atol=1e-6, rtol=0)
    assert (res.sum(-2) - 1).abs().max() > 1e-6  # the columns are the inexact side: the logits are far enough


def test_dynamic_mhc_init():
    """phi = 0, scales 0.01, H_pre = 0.9 on stream index % n and 0.1 elsewhere, H_post = 1, H_res the
    Sinkhorn matrix of exp(4 I); all streams copies of the baseline's: the baseline function up to RMSNorm's
    eps (sub-layers see 1.2x at n = 4, the final norm 4x)."""
    model = build(hc=4, mhc="dynamic", n_kv_head=2)
    conn = model.transformer.h[1].hc_mlp  # sub-layer 3
    pre, res, post = conn(torch.randn(2, 5, 4, 32))
    torch.testing.assert_close(pre, torch.tensor([0.1, 0.1, 0.1, 0.9]).expand(2, 5, 4))
    torch.testing.assert_close(post, torch.ones(2, 5, 4))
    e = math.exp(4)
    torch.testing.assert_close(res, (torch.eye(4) * (e - 1) + 1).div(e + 3).expand(2, 5, 4, 4))
    assert all(p.abs().max() == 0 for n, p in model.named_parameters() if ".phi_" in n)
    assert all(torch.equal(p, torch.tensor(0.01)) for n, p in model.named_parameters() if ".scale_" in n)
    base = build(n_kv_head=2)
    result = model.load_state_dict(base.state_dict(), strict=False)
    assert not result.unexpected_keys and all(".hc_" in k for k in result.missing_keys)
    x = torch.randint(0, V, (2, 16))
    assert (model(x, x)[0] - base(x, x)[0]).abs().max() > 1e-4  # eps matters at this scale
    for module in base.modules():
        if isinstance(module, torch.nn.RMSNorm):
            module.eps = base.config.norm_eps / (16 if module is base.transformer.ln_f else 1.2 ** 2)
    torch.testing.assert_close(model(x, x)[0], base(x, x)[0], atol=1e-5, rtol=1e-5)


def test_dynamic_mhc_counts():
    """Parameters per sub-layer: phi (n d x (2n + n^2)), b (2n + n^2), three scales. FLOPs per sub-layer:
    phi, the pre mix (n d), the residual mix (n^2 d) and the post add (n d), multiply-add = 2."""
    n, d, L = 4, 32, 4
    base, model = build(), build(hc=n, mhc="dynamic")
    assert model.get_num_params() - base.get_num_params() == 2 * L * (n * d * (2 * n + n * n) + 2 * n + n * n + 3)
    assert model.flops_per_token(16) - base.flops_per_token(16) == \
        2 * L * 2 * (n * d * (2 * n + n * n) + n * d + n * n * d + n * d)


# ----------------------------------------------------------------------------- mixing in float32 under autocast
@pytest.mark.parametrize("kw", [dict(hc=4, mhc="dynamic"), dict(hc=4, mhc="static"), dict(hc=4, hc_dynamic=True),
                                dict(attnres="block-3"), dict(attnres="full"), dict(denseformer=True), dict(mudd=True),
                                dict(mudd=True, mudd_prepost=True)],
                         ids=str)
def test_mixing_runs_in_float32_under_bf16_autocast(kw, monkeypatch):
    """A stream fed the same bf16 sub-layer outputs under bf16 autocast (CPU) and in float32 without it reads
    and outputs the same float32 numbers (to 1e-6): the streams stay float32 and the mix is float32. With
    autocast left on around the mix (fp32() a no-op) the streams round to bf16 and the check fails (by
    > 1e-3), except for DenseFormer, whose average is elementwise (autocast never rounded it)."""
    model = scramble_mudd(scramble_mhc(scramble(build(seed=2, **kw))))
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(2, 8, 32, generator=g)
    outputs = [(torch.randn(2, 8, 32, generator=g) * 0.3).bfloat16() for _ in range(2 * model.config.n_layer)]

    def sublayer(x, *args):  # records its input, returns the next given output
        reads.append(x.float())
        y = next(ys)
        return y if torch.is_autocast_enabled("cpu") else y.float()

    def run():
        nonlocal ys
        reads.clear()
        ys = iter(outputs)
        block = types.SimpleNamespace(ln_1=lambda x: x, ln_2=lambda x: x, attn=sublayer, mlp=sublayer)
        out = R.stream(model, emb).run([block] * model.config.n_layer, rope=None)
        return torch.stack(reads + [out.float()])

    reads, ys = [], None
    monkeypatch.setattr(R.muddformer.MUDDStream, "attention", lambda self, attn, x_q, *args: attn(x_q))  # MUDD: a sub-layer
    with torch.no_grad():
        want = run()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fixed = run()
            for module in (R.hyper_connections, R.denseformer, R.attnres, R.muddformer):  # each stream's fp32
                monkeypatch.setattr(module, "fp32", lambda t: contextlib.nullcontext())
            rounding = run()
    assert (fixed - want).abs().max() <= 1e-6
    if "denseformer" not in kw:
        assert (rounding - want).abs().max() > 1e-3


# ----------------------------------------------------------------------------- MUDDFormer
def scramble_mudd(model, seed=0):
    """MUDD off its init: W2, the static weights a_i and the key/value norms' gains moved, so every way acts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("mudd.") and not name.endswith(".w1"):
                p.add_(torch.randn(p.shape, generator=g) * (0.1 if name.endswith(".w2") else 0.3))
    return model


def naive_mudd(model, idx, targets):
    """The model's function with MUDD as the paper writes it, attention written out: X_0 the embedding, X_{i+1}
    block i's output; block i reads four inputs, h = X^r + attn(RMSNorm_q(X^q), RMSNorm_k(X^k), RMSNorm_v(X^v)),
    X_{i+1} = h + mlp(RMSNorm(h)); then per token A_i = GELU(RMSNorm(X_{i+1}) W1) W2 + a_i (RMSNorm without
    gain), rows (query, key, value, residual), and X^c = sum_j A_i[c, j] X_j; after the last block one row: the
    final norm's input. Block 0's three attention inputs are the embedding, through one norm.
    With mudd_prepost, PrePostDANorm (§2.5, eq. 10) as the authors' JAX code has it (mudd_prenorm, mudd_postnorm):
    every source through its own RMSNorm with a gain, Y_j = RMSNorm_j(X_j); A_i's RMSNorm with a gain; every way
    c of the next block's input is y + (post_norm(wsum_c) if c is the last way else wsum_c), y = X_{i+1} the
    block's output and wsum_c = sum_j A_i[c, j] Y_j (the residual way is the last; after the last block the only
    one). The norms written out here: x / sqrt(mean(x^2) + eps) * g."""
    c = model.config
    rms = lambda x, g: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * g
    prepost = c.mudd_prepost
    H, H_kv, d = c.n_head, c.n_kv_head, c.n_embd
    hs = d // H
    X = [model.transformer.wte(idx)]
    Y = [rms(X[0], model.mudd[0].ln_embedding.weight) if prepost else X[0]]  # the sources as mixed
    inputs = [X[0]] * 4
    B, T, _ = X[0].shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i, block in enumerate(model.transformer.h):
        attn, conn = block.attn, model.mudd[i]
        norms = (block.ln_1,) * 3 if i == 0 else (block.ln_1, model.mudd[i - 1].ln_k, model.mudd[i - 1].ln_v)
        xq, xk, xv = (norm(x) for norm, x in zip(norms, inputs[:3]))
        w_k, w_v = attn.kv_proj.weight[:H_kv * hs], attn.kv_proj.weight[H_kv * hs:]
        q = (xq @ attn.q_proj.weight.T).view(B, T, H, hs).transpose(1, 2)
        k = (xk @ w_k.T).view(B, T, H_kv, hs).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)
        v = (xv @ w_v.T).view(B, T, H_kv, hs).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)
        q, k = (model.rope(x.transpose(1, 2), 0).transpose(1, 2) for x in (q, k))  # RoPE takes (B, T, H, hs)
        att = (q @ k.transpose(-1, -2) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(-1)
        h = inputs[3] + (att @ v).transpose(1, 2).reshape(B, T, d) @ attn.o_proj.weight.T
        X.append(h + block.mlp(block.ln_2(h)))
        x = rms(X[-1], conn.ln_w1.weight if prepost else 1.0)
        Y.append(rms(X[-1], conn.ln_source.weight) if prepost else X[-1])
        ways = 4 if i < c.n_layer - 1 else 1
        A = (F.gelu(x @ conn.w1) @ conn.w2).view(B, T, ways, i + 2) + conn.bias  # (B, T, ways, i + 2)
        wsum = [sum(A[:, :, w, j, None] * Y[j] for j in range(i + 2)) for w in range(ways)]
        if prepost:  # the authors' mudd_postnorm: y + (post_norm(wsum_c) if c is the last way else wsum_c)
            y = X[-1]
            inputs = [y + (rms(wsum[c], conn.ln_post.weight) if c == ways - 1 else wsum[c]) for c in range(ways)]
        else:
            inputs = wsum
    logits = model.lm_head(model.transformer.ln_f(inputs[0]))
    return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_head=2), dict(n_layer=1), dict(n_layer=3, n_embd=64)], ids=str)
def test_mudd_matches_the_equations(kw):
    """The model's MUDD stream against naive_mudd: logits and every gradient (W1, W2, a_i, the key and value
    norms, every projection, the embedding)."""
    model = scramble_mudd(build(mudd=True, **kw))
    assert_matches(model, naive_mudd, grad_atol=lambda ref: 1e-4 * ref.abs().max().item())  # float32 rounding


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_head=2), dict(n_layer=1), dict(n_layer=3, n_embd=64)], ids=str)
def test_mudd_prepost_matches_eq_10(kw):
    """MUDD with PrePostDANorm (mudd_prepost) against naive_mudd's eq. (10): logits and every gradient (the
    source norms, W1's norm and the post norm included). Without the norms (mudd_prepost's code off) it fails."""
    model = scramble_mudd(build(mudd=True, mudd_prepost=True, **kw))
    assert_matches(model, naive_mudd, grad_atol=lambda ref: 1e-4 * ref.abs().max().item())


def test_mudd_prepost_init():
    """PrePostDANorm's init, the authors' (jax/MaxText/layers/llama2.py, models.py): a_i = 0, the post norm's gain
    0.001, the other norms' 1; W1 as plain MUDD's (one seed, the same draw). Its norms are parameters only: the
    parameter count grows by d per norm, the FLOP count not at all. Every way is the block's output plus its
    mix, and every mix is 0 at init: block 1's query input is block 0's output (not zero), and the model
    computes the baseline function (with the baseline's weights: one seed)."""
    L, d = 4, 32
    base, plain = build(seed=3), build(seed=3, mudd=True)
    model = build(seed=3, mudd=True, mudd_prepost=True)
    for i, (p, conn) in enumerate(zip(plain.mudd, model.mudd)):
        assert torch.equal(conn.w1, p.w1) and conn.bias.abs().max() == 0 and conn.w2.abs().max() == 0
        assert torch.equal(conn.ln_post.weight, torch.full((d,), 0.001))
        norms = [conn.ln_source, conn.ln_w1] + ([conn.ln_embedding] if i == 0 else [])
        assert all(torch.equal(n.weight, torch.ones(d)) for n in norms)
    assert model.get_num_params() - plain.get_num_params() == d * (3 * L + 1)
    assert model.flops_per_token(16) == plain.flops_per_token(16)
    x = torch.randint(0, V, (2, 16))
    seen = []  # block 1's query input: what its ln_1 reads
    hook = model.transformer.h[1].ln_1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    logits = model(x, x)[0]
    hook.remove()
    block0 = model.transformer.h[0]
    h = model.transformer.wte(x)
    h = h + block0.attn(block0.ln_1(h), model.rope)
    out0 = h + block0.mlp(block0.ln_2(h))  # block 0's output
    assert out0.abs().max() > 0.01  # not zero: the old form fed blocks 1.. zero queries
    torch.testing.assert_close(seen[0], out0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logits, base(x, x)[0], atol=1e-5, rtol=1e-5)
    _, grads = loss_and_grads(model, x, x)
    assert all(grads[f"mudd.{i}.{n}"].abs().sum() > 0 for i in range(L) for n in ("w2", "bias"))


def test_mudd_at_init_is_the_baseline():
    """W2 = 0 and a_i one-hot on the block's own output: with the baseline's weights (one seed) the logits
    are the baseline's, exactly; W1 is random (N(0, 1/d), drawn after the baseline's weights: other seeds,
    other W1) so that W2 gets a gradient; moving W2 changes the function."""
    base, model = build(seed=3, n_kv_head=2), build(seed=3, n_kv_head=2, mudd=True)
    mine = dict(model.named_parameters())
    assert all(torch.equal(p, mine[n]) for n, p in base.named_parameters())
    x = torch.randint(0, V, (2, 16))
    assert torch.equal(model(x, x)[0], base(x, x)[0])
    for i, conn in enumerate(model.mudd):
        ways = 4 if i < 3 else 1
        assert conn.w2.abs().max() == 0
        assert torch.equal(conn.bias, F.one_hot(torch.tensor([i + 1] * ways), i + 2).float())
        assert 0.7 < conn.w1.std().item() * math.sqrt(32) < 1.3
    assert not torch.equal(build(seed=4, mudd=True).mudd[1].w1, model.mudd[1].w1)
    _, grads = loss_and_grads(model, x, x)
    assert all(grads[f"mudd.{i}.w2"].abs().sum() > 0 for i in range(4))
    with torch.no_grad():
        model.mudd[1].w2.normal_(0, 0.1)
    assert (model(x, x)[0] - base(x, x)[0]).abs().max() > 1e-3


def test_mudd_counts():
    """W1's width is the authors' rule, (ways * sources * expand // 64 + 1) * 64, ways 4 and expand 1 except
    after the last block (1 and 4). Parameters: W1, W2, a_i, and two norms per connection but the last.
    FLOPs: W1 and W2 as the matmuls torch's FLOP counter sees in the forward pass (the model's against the
    baseline's), plus a multiply-add per source and way of the mixes."""
    from torch.utils.flop_counter import FlopCounterMode
    L, d, B, T = 16, 32, 2, 8
    base, model = build(n_kv_head=2, n_layer=L), build(n_kv_head=2, n_layer=L, mudd=True)
    widths, params, mixes = [], 0, 0
    for i in range(L):
        ways, expand = (4, 1) if i < L - 1 else (1, 4)
        widths.append((ways * (i + 2) * expand // 64 + 1) * 64)
        params += d * widths[-1] + widths[-1] * ways * (i + 2) + ways * (i + 2) + (2 * d if i < L - 1 else 0)
        mixes += 2 * ways * (i + 2) * d
    assert [conn.w1.size(1) for conn in model.mudd] == widths
    assert widths[13:] == [64, 128, 128]  # 4 x 15 = 60 -> 64; 4 x 16 = 64 -> 128 (past a multiple); 17 x 4 -> 128
    assert model.get_num_params() - base.get_num_params() == params
    x = torch.randint(0, V, (B, T))
    counted = []
    for m in (base, model):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            m(x, x)
        counted.append(counter.get_total_flops())
    matmuls = (counted[1] - counted[0]) / (B * T)
    assert matmuls == sum(2 * d * w + 2 * w * c.w2.size(1) for w, c in zip(widths, model.mudd))
    assert model.flops_per_token(T) - base.flops_per_token(T) == matmuls + mixes


def assert_cached_decoding_exact(model):
    """Decoding 12 tokens with the KV cache gives the full forward's logits at every step, and generate() with
    and without the cache the same tokens."""
    prompt = torch.randint(0, V, (2, 4))
    idx, cached = step_logits(model, prompt, 12)
    for t in range(12):
        full, _ = model(idx[:, :4 + t], idx[:, :4 + t])
        torch.testing.assert_close(cached[t], full[:, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.generate(prompt, 12, top_k=1, use_cache=False), idx, atol=0, rtol=0)
    torch.testing.assert_close(model.generate(prompt, 12, top_k=1), idx, atol=0, rtol=0)


@pytest.mark.parametrize("kw", [dict(mudd=True), dict(mudd=True, n_kv_head=2, lime=True),
                                dict(mudd=True, lime=True, router="dynamic"), dict(mudd=True, mudd_prepost=True),
                                dict(mudd=True, mudd_prepost=True, lime=True, n_kv_head=2)], ids=str)
def test_mudd_cached_decoding_is_exact(kw):
    """MUDD mixes per position across depth only: decoding with the KV cache gives the full forward's logits,
    and generate() with and without the cache the same tokens."""
    model = scramble_mudd(build(seed=1, **kw)).eval()
    assert_cached_decoding_exact(model)


# ----------------------------------------------------------------------------- MoDA
def naive_moda(model, idx, targets):
    """The model's function with MoDA as the paper writes it (eq. (2), Alg. 1, §2.2; Table 3 row 4), one
    query at a time: head h of layer l at position t takes one softmax over the logits
    RoPE_t(q_t) . RoPE_j(k_j) / sqrt(d_h) of its KV head phi(h) = h // G for every j <= t, and
    RoPE_t(q_t) . RoPE_t(k^i_t) / sqrt(d_h) for the depth keys k^i_t of every earlier sub-layer i at position t:
    attention i's own k, MLP i's input times its moda_kv; and sums the values with those weights."""
    c = model.config
    B, T = idx.shape
    H, H_kv, d_h = c.n_head, c.n_kv_head, c.n_embd // c.n_head
    G = H // H_kv
    rope = lambda x, t: model.rope(x.view(1, 1, 1, d_h), t).view(d_h)  # one vector at position t
    x = model.transformer.wte(idx)
    depth_k, depth_v = [], []  # every sub-layer's (B, T, H_kv, d_h) so far
    for block in model.transformer.h:
        h = block.ln_1(x)
        q = block.attn.q_proj(h).view(B, T, H, d_h)
        k, v = block.attn.kv_proj(h).view(B, T, 2, H_kv, d_h).unbind(2)
        y = torch.zeros(B, T, H, d_h)
        for b in range(B):
            for t in range(T):
                for head in range(H):
                    g = head // G
                    qt = rope(q[b, t, head], t)
                    logits = [qt @ rope(k[b, j, g], j) / math.sqrt(d_h) for j in range(t + 1)]
                    logits += [qt @ rope(kd[b, t, g], t) / math.sqrt(d_h) for kd in depth_k]
                    w = torch.softmax(torch.stack(logits), 0)
                    values = [v[b, j, g] for j in range(t + 1)] + [vd[b, t, g] for vd in depth_v]
                    y[b, t, head] = sum(wi * vi for wi, vi in zip(w, values))
        depth_k.append(k)
        depth_v.append(v)
        x = x + block.attn.o_proj(y.view(B, T, H * d_h))
        h = block.ln_2(x)
        if block is not model.transformer.h[-1]:  # the last MLP's depth key would be read by no one
            kd, vd = block.mlp.moda_kv(h).view(B, T, 2, H_kv, d_h).unbind(2)
            depth_k.append(kd)
            depth_v.append(vd)
        x = x + block.mlp.down_proj(F.silu(block.mlp.gate_proj(h)) * block.mlp.up_proj(h))
    logits = model.lm_head(model.transformer.ln_f(x))
    return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@pytest.mark.parametrize("kw", [dict(n_layer=3), dict(n_layer=3, n_kv_head=2), dict(n_layer=1, n_kv_head=1)], ids=str)
def test_moda_matches_the_equations(kw):
    """Logits, loss and every gradient equal the per-query joint softmax above (depth keys rotated at the
    query's own position there, not rotated at all in the model: the same logits)."""
    model = build(moda=True, **kw)
    x = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(0))
    logits, grads = loss_and_grads(model, x, x)
    model.zero_grad()
    ref_logits, ref_loss = naive_moda(model, x, x)
    ref_loss.backward()
    torch.testing.assert_close(logits, ref_logits.detach(), atol=1e-5, rtol=1e-5)
    assert grads.keys() == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
    # and the depth keys change the function: zeroing one MLP's projection moves the logits
    if kw["n_layer"] > 1:
        with torch.no_grad():
            model.transformer.h[0].mlp.moda_kv.weight.zero_()
        assert (model(x, x)[0] - logits).abs().max() > 1e-4


def test_moda_init_and_counts():
    """L - 1 MLPs get a key/value projection, d x 2 H_kv d_h, drawn N(0, 0.02) after the baseline's weights;
    FLOPs: every matmul of a MoDA forward, counted by torch's FlopCounterMode (its attention is plain matmuls,
    the sequence part over the full T x T as flops_per_token counts it), plus the depth reads' products (one
    multiply-add per d_h for each query, depth key and depth value it reads, counted here from the number of
    depth keys each layer found) equals flops_per_token."""
    from torch.utils.flop_counter import FlopCounterMode
    L, d, H_kv, d_h, T = 4, 32, 2, 8, 16
    base, moda = build(n_layer=L, n_kv_head=H_kv), build(n_layer=L, n_kv_head=H_kv, moda=True)
    assert moda.get_num_params() - base.get_num_params() == (L - 1) * d * 2 * H_kv * d_h
    assert not hasattr(moda.transformer.h[-1].mlp, "moda_kv")
    w = torch.cat([b.mlp.moda_kv.weight.flatten() for b in moda.transformer.h[:-1]])
    assert abs(w.std().item() - 0.02) < 0.002
    x = torch.randint(0, V, (2, T))
    depth_reads, attend = [], R.moda.DepthKV.attend
    def spy(self, attn, q, *args):  # records the depth keys each attention layer reads
        depth_reads.append(q.numel() * len(self.k))  # (queries x d_h) x depth keys
        return attend(self, attn, q, *args)
    with FlopCounterMode(display=False) as counter, pytest.MonkeyPatch.context() as mp:
        mp.setattr(R.moda.DepthKV, "attend", spy)
        moda(x, x)
    assert len(depth_reads) == L and depth_reads[0] == 0  # layer 0 has no earlier sub-layer
    assert counter.get_total_flops() + 2 * 2 * sum(depth_reads) == moda.flops_per_token(T) * 2 * T  # logits, values
    assert moda.flops_per_token(T) - base.flops_per_token(T) == R.flops(moda.config, T) > 0


def test_moda_activation_memory_is_linear_in_depth():
    """Bytes saved for backward, MoDA over the baseline, from 4 to 16 layers: each depth key and value is
    saved once, shared by its readers (a stack of the earlier sub-layers per layer would grow O(L^2): +0.95
    here); what grows is the softmax weights, S = 2l more scalars per query at layer l."""
    ratios = {}
    x = torch.randint(0, V, (4, 64))
    for L in (4, 16):
        kw = dict(block_size=64, n_layer=L, n_head=4, n_kv_head=4, n_embd=64)
        ratios[L] = saved_bytes(build(moda=True, **kw), x) / saved_bytes(build(**kw), x)
    assert ratios[16] - ratios[4] <= 0.15, ratios


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_moda_projections_are_mlp_matrices(optimizer):
    """The MLPs' key/value projections are projection matrices like kv_proj: decayed with AdamW, on Muon
    with optimizer='muon'."""
    model = build(moda=True, n_kv_head=2)
    opt = configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu", optimizer=optimizer)
    group = next(g for o in (opt if isinstance(opt, list) else [opt]) for g in o.param_groups
                 if g["name"] == ("decay" if optimizer == "adamw" else "muon"))
    kv = [b.mlp.moda_kv.weight for b in model.transformer.h[:-1]]
    assert all(any(p is w for p in group["params"]) for w in kv)


# ----------------------------------------------------------------------------- Hyper-Connections
@pytest.mark.parametrize("dynamic", [False, True])
def test_hc_at_init_computes_the_baseline(dynamic):
    base = build(n_kv_head=2)
    hc = build(seed=5, n_kv_head=2, hc=4, hc_dynamic=dynamic)
    result = hc.load_state_dict(base.state_dict(), strict=False)
    assert not result.unexpected_keys and all(".hc_" in k for k in result.missing_keys)
    x = torch.randint(0, V, (2, 16))
    # The final norm sees the sum of 4 equal streams, RMSNorm(4x) with eps = RMSNorm(x) with eps/16:
    # identical up to RMSNorm's eps, which the baseline's final norm can absorb exactly.
    assert (hc(x, x)[0] - base(x, x)[0]).abs().max() > 1e-4  # eps matters at this scale
    base.transformer.ln_f.eps = base.config.norm_eps / 4 ** 2
    torch.testing.assert_close(hc(x, x)[0], base(x, x)[0], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        hc.transformer.h[1].hc_attn.static_beta[1] = 0.0  # stream 1 skips this attention output
    assert (hc(x, x)[0] - base(x, x)[0]).abs().max() > 1e-3


def test_hc_gradients_reach_alpha_beta_and_dynamic_weights():
    model = build(hc=4, hc_dynamic=True)
    x = torch.randint(0, V, (2, 16))
    _, grads = loss_and_grads(model, x, x)
    for l in range(4):
        for part in ("hc_attn", "hc_mlp"):
            for p in ("static_alpha", "static_beta", "dynamic_alpha.weight", "dynamic_beta.weight"):
                assert grads[f"transformer.h.{l}.{part}.{p}"].abs().sum() > 0, (l, part, p)


@pytest.mark.parametrize("dynamic", [False, True])
def test_hc_parameter_count_formula(dynamic):
    n, d, L = 4, 32, 4
    extra_per_sublayer = n * (n + 1) + n + ((d + d * (n + 1) + d + 2) if dynamic else 0)
    assert build(hc=n, hc_dynamic=dynamic).get_num_params() - build().get_num_params() == 2 * L * extra_per_sublayer


def naive_hc(model, idx, targets):
    """The model's function with Hyper-Connections written out per stream, for n streams H_0..H_{n-1} (each
    (B, T, d)) and around each sub-layer F its alpha (n x (n+1)) and beta (n):
        dynamic: alpha = static_alpha + s_a tanh(RMSNorm(H_i) W_a) (row i from stream i),
                 beta_i = static_beta_i + s_b tanh(RMSNorm(H_i) . w_b)
        h = sum_i alpha[i, 0] H_i,  H'_j = sum_i alpha[i, 1 + j] H_i,  H_j <- H'_j + beta_j F(h)
    The streams start as copies of the embedding and are summed before the final norm."""
    n, eps = model.config.hc, model.config.norm_eps
    rms = lambda x, g: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    H = [model.transformer.wte(idx)] * n
    for block in model.transformer.h:
        for conn, sublayer in ((block.hc_attn, lambda h: block.attn(block.ln_1(h), model.rope)),
                               (block.hc_mlp, lambda h: block.mlp(block.ln_2(h)))):
            alpha = [[conn.static_alpha[i, c] for c in range(n + 1)] for i in range(n)]
            beta = [conn.static_beta[i] for i in range(n)]
            if conn.dynamic:
                for i in range(n):
                    Hn = rms(H[i], conn.norm.weight)
                    a = torch.tanh(Hn @ conn.dynamic_alpha.weight.T)  # (B, T, n + 1)
                    alpha[i] = [alpha[i][c] + conn.alpha_scale * a[..., c] for c in range(n + 1)]
                    beta[i] = beta[i] + conn.beta_scale * torch.tanh(Hn @ conn.dynamic_beta.weight.T)[..., 0]
            per_token = lambda w: w[..., None] if w.dim() else w  # a (B, T) coefficient against (B, T, d)
            h = sum(per_token(alpha[i][0]) * H[i] for i in range(n))
            y = sublayer(h)
            H = [sum(per_token(alpha[i][1 + j]) * H[i] for i in range(n)) + per_token(beta[j]) * y
                 for j in range(n)]
    logits = model.lm_head(model.transformer.ln_f(sum(H)))
    return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


@pytest.mark.parametrize("kw", [dict(hc=4), dict(hc=4, hc_dynamic=True), dict(hc=2, hc_dynamic=True, n_kv_head=2),
                                dict(hc=3, n_layer=2)], ids=str)
def test_hc_matches_the_equations(kw):
    """Static and dynamic HC against naive_hc: logits and the gradient of every parameter (alpha, beta, the
    dynamic weights, scales and norm, every projection), off their init."""
    model = scramble(build(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "dynamic_" in name or name.endswith("_scale"):  # W = 0 and s = 0.01 at init: make them act
                p.add_(torch.randn_like(p) * 0.1)
    # float32 rounding: 1e-4 of a tensor's scale, and at least 1e-6 (a scale's gradient, one sum over every token
    # that nearly cancels, can be 1e-5 of the largest gradient, about 1)
    assert_matches(model, naive_hc, grad_atol=lambda ref: 1e-4 * max(ref.abs().max().item(), 1e-2))


# ----------------------------------------------------------------------------- DenseFormer
def test_denseformer_at_init_is_the_baseline():
    base = build(n_kv_head=2)
    dense = build(seed=3, n_kv_head=2, denseformer=True)
    result = dense.load_state_dict(base.state_dict(), strict=False)
    assert not result.unexpected_keys and result.missing_keys == [f"dwa.{i}.weight" for i in range(4)]
    x = torch.randint(0, V, (2, 16))
    assert torch.equal(dense(x, x)[0], base(x, x)[0])  # one-hot weights: exactly the baseline
    with torch.no_grad():
        dense.dwa[1].weight[0] = 0.5  # block 2 also sees the embedding
    assert (dense(x, x)[0] - base(x, x)[0]).abs().max() > 1e-4


def test_denseformer_weights_learn():
    for kw, names in [(dict(denseformer=True, lime=True), ["dwa.0.weight", "dwa.3.weight"])]:
        model = build(**kw)
        x = torch.randint(0, V, (2, 16))
        _, grads = loss_and_grads(model, x, x)
        for name in names:
            assert grads[name].abs().sum() > 0, name
        opt = model.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu")
        params = dict(model.named_parameters())
        no_decay = next(g for g in opt.param_groups if g["name"] == "no_decay")
        assert all(any(p is params[n] for p in no_decay["params"]) for n in names)


def test_denseformer_counts():
    L, d, n_kv = 4, 32, 2
    base = build(n_kv_head=n_kv)
    dense = build(n_kv_head=n_kv, denseformer=True)
    assert dense.get_num_params() - base.get_num_params() == sum(i + 2 for i in range(L))
    assert dense.flops_per_token(16) - base.flops_per_token(16) == sum(2 * (i + 2) * d for i in range(L))


@pytest.mark.parametrize("bad, match", [
    (dict(denseformer=True, hc=4), "use one of them"),
])
def test_cross_layer_variants_that_do_not_compose_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        tiny(**bad)


# ----------------------------------------------------------------------------- Depth-Attention
def naive_depth_attention(model, idx, targets):
    """The model's function with Depth-Attention as the authors' code computes it (hyq718/Depth-Attention 3bdad70,
    modeling_llama_depth_attention.py, 'depth_softmax', SDPA path), attention written out: at layer l, for each KV
    head, the mean of its group's queries scores the key of each source layer j in {j < l : j % s == 0} and of l
    itself, at the same position, after RoPE (as theirs); softmax over those; the value is the weighted sum of
    the sources' mixed values and its own. The layer then attends causally with its own keys and that value,
    which is also what later layers read as its value. Loops over KV heads and sources, plain softmaxes."""
    c = model.config
    H, H_kv, d = c.n_head, c.n_kv_head, c.n_embd
    hs, G = d // H, H // H_kv
    s = c.depth_attention_stride or max(1, c.n_layer // 2)
    x = model.transformer.wte(idx)
    B, T, _ = x.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    keys, values = {}, {}  # source layer -> its key (after RoPE) and mixed value, (B, T, H_kv, hs)
    for layer, block in enumerate(model.transformer.h):
        attn, h = block.attn, block.ln_1(x)
        q = model.rope((h @ attn.q_proj.weight.T).view(B, T, H, hs), 0)  # RoPE takes (B, T, heads, hs)
        k = model.rope((h @ attn.kv_proj.weight[:H_kv * hs].T).view(B, T, H_kv, hs), 0)
        v = (h @ attn.kv_proj.weight[H_kv * hs:].T).view(B, T, H_kv, hs)
        sources = [j for j in range(layer) if j % s == 0]
        if sources:
            mixed = []
            for g in range(H_kv):
                q_g = q[:, :, g * G:(g + 1) * G].mean(2)  # (B, T, hs)
                ks = [keys[j][:, :, g] for j in sources] + [k[:, :, g]]
                vs = [values[j][:, :, g] for j in sources] + [v[:, :, g]]
                w = torch.stack([(q_g * key).sum(-1) / math.sqrt(hs) for key in ks], dim=-1).softmax(-1)
                mixed.append(sum(w[..., n, None] * value for n, value in enumerate(vs)))
            v = torch.stack(mixed, dim=2)
        if layer % s == 0:
            keys[layer], values[layer] = k, v
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        kh, vh = kh.repeat_interleave(G, dim=1), vh.repeat_interleave(G, dim=1)  # query head h reads KV head h // G
        att = (qh @ kh.transpose(-1, -2) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + (att @ vh).transpose(1, 2).reshape(B, T, d) @ attn.o_proj.weight.T
        x = x + block.mlp(block.ln_2(x))
    logits = model.lm_head(model.transformer.ln_f(x))
    return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


DEPTH_ATTENTION = [dict(), dict(n_kv_head=2), dict(n_kv_head=1, n_layer=5, depth_attention_stride=2),
                   dict(n_layer=3, depth_attention_stride=1), dict(n_layer=1)]


@pytest.mark.parametrize("kw", DEPTH_ATTENTION, ids=str)
def test_depth_attention_matches_the_authors_formula(kw):
    """Depth-Attention against naive_depth_attention: logits and the gradient of every parameter (MHA, GQA, MQA;
    the default stride n_layer // 2, strides 1 and 2; one layer: the baseline)."""
    model = build(depth_attention=True, **kw)
    assert_matches(model, naive_depth_attention, grad_atol=lambda ref: 1e-4 * ref.abs().max().item())


def test_depth_attention_has_no_weights_and_counts():
    """No parameter of its own (one seed: the baseline's weights, the same checkpoint keys), yet not the baseline
    function: the mix acts from the first step. The mix is elementwise (no matmul beyond the baseline's, as torch's
    FLOP counter sees it); its count: a score and a multiply-add per source and the layer itself, per KV head."""
    from torch.utils.flop_counter import FlopCounterMode
    L, B, T = 5, 2, 8
    base, model = build(seed=3, n_layer=L, n_kv_head=2), build(seed=3, n_layer=L, n_kv_head=2, depth_attention=True)
    sa, sb = base.state_dict(), model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    x = torch.randint(0, V, (B, T))
    assert (model(x, x)[0] - base(x, x)[0]).abs().max() > 1e-4
    counted = []
    for m in (base, model):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            m(x, x)
        counted.append(counter.get_total_flops())
    assert counted[0] == counted[1]
    # stride 5 // 2 = 2: layers 1, 2 read layer 0; layers 3, 4 read layers 0 and 2
    assert model.flops_per_token(T) - base.flops_per_token(T) == 2 * 2 * 2 * (32 // 4) * (2 + 2 + 3 + 3)


def test_depth_attention_is_causal():
    """A change at position t leaves every logit before t as it was (the depth mix is per position)."""
    model = build(seed=1, depth_attention=True, n_kv_head=2).eval()
    x = torch.randint(0, V, (2, 16))
    y = x.clone()
    y[:, 9] = (y[:, 9] + 1) % V
    with torch.no_grad():
        a, b = model(x, x)[0], model(y, y)[0]
    assert torch.equal(a[:, :9], b[:, :9]) and (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_head=2, depth_attention_stride=1)], ids=str)
def test_depth_attention_cached_decoding_is_exact(kw):
    """The cache holds the mixed values, and a new token's depth sources are its own: decoding with the KV cache
    gives the full forward's logits, and generate() with and without the cache the same tokens."""
    model = build(seed=1, depth_attention=True, **kw).eval()
    assert_cached_decoding_exact(model)


# ----------------------------------------------------------------------------- Depth scaling (CompleteP)
# CompleteP (arXiv 2505.01618; relatives/completep.py): at fixed width, with m_L = L / L_base,
# every attention and MLP output times 1 / m_L, AdamW's eps times 1 / m_L, the residual projections drawn with the
# base depth's std; at L = L_base, the standard model exactly.
COMPLETEP_SUPPORTED = [dict(), dict(lime=True), dict(lime=True, router="dynamic"), dict(lime=True, router="first-2"),
                       dict(attnres="block-3"), dict(attnres="full", lime=True)]


def completep(**kw):
    return dict(depth_scaling="completep", **kw)


def adamw_groups(model, **kw):
    opt = configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.99), "cpu", **kw)
    names = {id(p): n for n, p in model.named_parameters()}
    return [(g["name"], [names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for g in opt.param_groups]


@pytest.mark.parametrize("kw", COMPLETEP_SUPPORTED, ids=str)
def test_completep_at_its_base_depth_is_the_standard_model(kw):
    """n_layer == depth_base: the same weights, logits, gradients and optimizer groups (eps included), bit for bit."""
    base, scaled = build(**kw), build(**completep(depth_base=4, **kw))
    assert type(scaled).__name__ == "CompletePGPT"
    sa, sb = base.state_dict(), scaled.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
    (la, ga), (lb, gb) = loss_and_grads(base, x, y), loss_and_grads(scaled, x, y)
    assert torch.equal(la, lb) and ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)
    assert adamw_groups(base) == adamw_groups(scaled)
    assert base.flops_per_token(16) == scaled.flops_per_token(16)


def naive_completep(model, idx, targets, branch):
    """The rule as written, on the modules' own forward (no hooks): x = x + branch * attn(ln_1(x)),
    x = x + branch * mlp(ln_2(x)); LIMe's keys and values routed through the stacked KV as in model.py."""
    x = model.transformer.wte(idx)
    kv_stack = M.KVStack([b.attn.router for b in model.transformer.h], model.route_group_size) \
        if model.config.lime else None
    for block in model.transformer.h:
        x = x + branch * block.attn.forward(block.ln_1(x), model.rope, kv_stack)
        x = x + branch * block.mlp.forward(block.ln_2(x))
    logits = model.lm_head(model.transformer.ln_f(x))
    return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


@pytest.mark.parametrize("kw", COMPLETEP_SUPPORTED, ids=str)
def test_completep_scales_every_sub_layer_output_by_base_over_depth(kw):
    """n_layer = 2 x depth_base: every attention and MLP output times 1/2, against the rule written by hand (AttnRes:
    its naive form with every source scaled), logits and every gradient; the standard model is not that function."""
    model = scramble(build(**completep(depth_base=2, **kw)))
    if kw.get("attnres"):
        m = R.attnres.attnres_block_sublayers(kw["attnres"], 4)
        reference = lambda model, x, y: naive_attnres(model, x, y, m, branch=0.5)[:2]  # noqa: E731
    else:
        reference = lambda model, x, y: naive_completep(model, x, y, branch=0.5)  # noqa: E731
    assert_matches(model, reference)
    x = torch.randint(0, V, (2, 16))
    unscaled = naive_attnres(model, x, x, m)[0] if kw.get("attnres") else naive_completep(model, x, x, 1.0)[0]
    assert (model(x, x)[0] - unscaled).abs().max() > 1e-3  # 100x the tolerance above


def test_completep_draws_the_residual_projections_with_the_base_depths_std():
    """Hidden init variance independent of depth: o_proj and down_proj N(0, 0.02^2 / (2 L_base)), the standard
    model's draw at the same seed rescaled (no other RNG draw); every other weight the standard model's."""
    L, base = 8, 2
    standard, scaled = build(n_layer=L, lime=True).state_dict(), build(**completep(n_layer=L, depth_base=base,
                                                                                 lime=True)).state_dict()
    for k, w in standard.items():
        factor = (0.02 / math.sqrt(2 * base)) / (0.02 / math.sqrt(2 * L)) if k.endswith(("o_proj.weight",
                                                                                         "down_proj.weight")) else 1.0
        torch.testing.assert_close(scaled[k], w * factor, atol=0, rtol=1e-6, msg=k)
    assert abs(scaled["transformer.h.0.mlp.down_proj.weight"].std().item() / (0.02 / math.sqrt(2 * base)) - 1) < 0.05


@pytest.mark.parametrize("kw", [dict(lime=True), dict(attnres="block")], ids=str)
def test_completep_adamw_eps_is_scaled_and_nothing_else(kw):
    """AdamW's eps times depth_base / n_layer in every group (the router and AttnRes's own group included); every
    group's parameters, lr, peak lr and weight decay as the standard model's (depth factors 1 at alpha = 1)."""
    named = dict(named_lrs={"attn_res.query": 3e-3}) if kw.get("attnres") else {}
    standard = adamw_groups(build(n_layer=8, **kw), **named)
    scaled = adamw_groups(build(**completep(n_layer=8, depth_base=2, **kw)), **named)
    assert [(n, p) for n, p, _ in standard] == [(n, p) for n, p, _ in scaled]
    assert len(scaled) == 3
    for (_, _, a), (_, _, b) in zip(standard, scaled):
        assert b.pop("eps") == a.pop("eps") * 2 / 8 == 2.5e-9
        assert a == b
    with pytest.raises(ValueError, match="has AdamW's rules"):
        configure_optimizers(build(**completep(depth_base=2)), 0.1, 1e-3, 1e-2, (0.9, 0.99), "cpu", optimizer="muon")


@pytest.mark.parametrize("bad, match", [
    (dict(depth_scaling="complete-p"), "unknown depth_scaling 'complete-p'; choose one of: standard, completep"),
    (dict(depth_scaling="completep"), "depth_scaling='completep' needs depth_base >= 1"),
    (dict(depth_scaling="completep", depth_base=0), "needs depth_base >= 1"),
    (dict(depth_base=2), "depth_base is CompleteP's base depth: set depth_scaling='completep' too"),
    (completep(depth_base=2, hc=2), "supports the baseline, lime and attnres, not hc"),
    (completep(depth_base=2, hc=2, mhc="dynamic", lime=True), "not hc"),
    (completep(depth_base=2, denseformer=True), "not denseformer"),
    (completep(depth_base=2, mudd=True), "not mudd"),
    (completep(depth_base=2, moda=True), "not moda"),
])
def test_completep_config_validation(bad, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        tiny(**bad)


def test_completep_travels_with_its_config():
    """What a checkpoint and the remote-code export keep (the config as a dict, through JSON) rebuilds the same
    model; it is no plain Llama (transformers' LlamaForCausalLM would lose the multiplier), and the authors' layout
    names it as what it cannot hold."""
    import dataclasses
    import json
    from integrations import hf
    model = scramble(build(**completep(depth_base=2, lime=True)))
    cfg = json.loads(json.dumps(dataclasses.asdict(model.config)))
    again = R.build_model(R.RelativesConfig(**cfg))
    again.load_state_dict(model.state_dict())
    x = torch.randint(0, V, (2, 16))
    assert torch.equal(model(x, x)[0], again(x, x)[0])
    assert not hf.is_llama(cfg) and not hf.is_llama({**cfg, "lime": False})
    assert hf.variants(cfg)[0] == "depth_scaling"


def test_every_relative_option_is_a_train_option():
    """train.py's globals are its options (nanoGPT's config; --help lists them): every relative's option, and
    CompleteP's, is one of them, with the registry's default, in the registry's order after LIMe's."""
    from conftest import script_here
    code, out, _ = script_here("train.py", "--help")
    listed = [line.split(" = ")[0].strip() for line in out.splitlines() if line.startswith("  ") and " = " in line]
    options = {**R.OPTIONS, **R.completep.OPTIONS}
    assert code == 0 and len(R.OPTIONS) > len(R.RELATIVES)  # every relative's switch at least
    start = listed.index("router_init") + 1
    assert listed[start:start + len(options)] == list(options)
    for name, default in options.items():
        assert f"  {name:<{len(max(listed, key=len))}} = {default!r}" in out, name


@pytest.mark.parametrize("component", [c for c in VARIANT_COMPONENTS if c not in ("baseline", "lime")])
def test_fsdp_refuses_every_relative_by_its_name(component, data_dir, tmp_path, run_here, monkeypatch):
    """train.py --fsdp=True (one rank, as torchrun sets it) with each relative's variant: refused before any work,
    the relative named. train.py names the variant from every option the grammar takes, so a new relative's
    option cannot be left out of what FSDP checks. Every relative of the registry has a variant here."""
    assert {R.switch(r) for r in R.RELATIVES} <= {k for c in VARIANT_COMPONENTS.values() for k in c.options}
    torchrun = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for k, v in torchrun.items():
        monkeypatch.setenv(k, v)
    options = [f"--{k}={v}" for k, v in VARIANT_COMPONENTS[component].options.items()]
    error = error_of(run_here, "train.py", "--device=cpu", "--lime=False", "--n_layer=2", "--n_embd=32",
                     f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'out'}", "--fsdp=True", *options)
    assert f"shards the baseline and LIMe only, not {component}" in error
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- a new relative: a file and a line
TOY = '''"""Toy: each block's output times a learned gain (a relative made by the registry's test)."""
import torch
import torch.nn as nn

from .base import Component, Relative, Stream

OPTIONS = dict(toy=False)  # each block's output times a learned gain


def attach(model):
    model.toy_gain = nn.Parameter(torch.ones(model.config.n_layer))


class ToyStream(Stream):
    def __init__(self, model, x):
        self.gain, self.x, self.sub = model.toy_gain, x, 0

    def read(self):
        return self.x

    def write(self, y):
        self.x, self.sub = self.x + self.gain[self.sub // 2] * y, self.sub + 1

    def output(self):
        return self.x


RELATIVE = Relative(family=lambda config: "Toy", options=OPTIONS, stream=ToyStream,
                    flops=lambda config, T: 0, attach=attach, components={"toy": Component({"toy": True})})
'''


@pytest.mark.slow
def test_a_new_relative_is_a_file_and_a_registry_line(data_dir, tmp_path):
    """In a copy of the repository, relatives/toy.py and one line in the registry make a relative that train.py
    trains (its option, its weight in the checkpoint, its variant name in the log), sweep.py and bench.py run by
    its variant name, study.analyze names (its family) and records through its stream, and train.py --fsdp=True
    refuses by name."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from conftest import REPO, TINY_RUN, child_env
    repo = tmp_path / "repo"
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True).stdout.split()
    for name in tracked:
        if not name.startswith(("tests/", "experiments/", "dev/")):
            os.makedirs(repo / os.path.dirname(name), exist_ok=True)
            shutil.copy(os.path.join(REPO, name), repo / name)
    (repo / "relatives" / "toy.py").write_text(TOY)
    registry = (repo / "relatives" / "__init__.py").read_text()
    line = "from .depth_attention import RELATIVE as DEPTH_ATTENTION\n"
    (repo / "relatives" / "__init__.py").write_text(registry.replace(line, line + "from .toy import RELATIVE as TOY\n"))

    def run(*args, **env):
        return subprocess.run([sys.executable, *args], cwd=repo, env=child_env(**env), capture_output=True,
                              text=True, timeout=600)

    small = [*TINY_RUN, f"--data_dir={data_dir}", "--max_iters=2", "--eval_interval=2", "--lime=False"]
    p = run("sweep.py", "--depths=2", "--variants=toy", "--seeds=0", f"--out_dir={tmp_path}", "--plot=False", *small)
    out = tmp_path / "toy-L2-s0"  # the sweep's run: train.py's, with toy=True
    assert p.returncode == 0 and "toy" in (tmp_path / "sweep.csv").read_text(), p.stderr
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["toy"] is True and (ckpt["model"]["toy_gain"] != 1).all()  # trained
    p = run("bench.py", "--variants=baseline,toy", "--n_layer=2", "--n_embd=32", "--block_size=16",
            "--batch_size=2", "--warmup=1", "--iters=1", "--device=cpu", "--count_ops=False")
    assert p.returncode == 0 and " toy " in p.stdout, p.stderr
    p = run("-m", "study.analyze", str(out), f"--data_dir={data_dir}", "--num_tokens=64", "--max_per_word=10")
    analysis = json.loads((out / "analysis.json").read_text())
    assert p.returncode == 0 and analysis["family"] == "Toy" and len(analysis["entropy"]["hidden"]) == 2, p.stderr
    p = run("train.py", *small, f"--out_dir={tmp_path / 'fsdp'}", "--toy=True", "--fsdp=True", RANK=0, LOCAL_RANK=0,
            WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500)
    assert p.returncode == 1 and "shards the baseline and LIMe only, not toy:" in p.stderr, p.stderr
