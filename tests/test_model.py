"""Model tests: LIMe's fast routing against the plain eq. (2), exact cached decoding,
paper Table 8 parameter and FLOP counts, optimizer groups, activation memory, and LIMe with
the relatives' residual streams. (The relatives themselves: tests/test_relatives.py; torch.compile:
tests/test_compile.py.)"""
import math

import pytest
import torch
import torch.nn.functional as F

import model as M
import relatives
from conftest import (GROUPINGS, V, VARIANTS, build, loss_and_grads, plain_routed, saved_bytes, scramble,
                      step_logits, tiny)
from model import GPT, GPTConfig, KVCache
from nanolime.optim import configure_optimizers
from relatives import build_model

@pytest.mark.parametrize("router", VARIANTS)
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_fast_path_matches_the_plain_reference(router, n_kv_head, monkeypatch):
    """KVStack's two-phase sum against eq. (2) as written: logits and every gradient (routers,
    dynamic offsets, every layer's projections), for every group size case."""
    for n_layer, group in GROUPINGS:
        model = build(lime=True, router=router, n_kv_head=n_kv_head, n_layer=n_layer)
        if group is not None:
            model.route_group_size = group
        x, y = torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 16))
        fast_logits, fast_grads = loss_and_grads(model, x, y)
        with monkeypatch.context() as patch:
            patch.setattr(M.KVStack, "routed", plain_routed)
            ref_logits, ref_grads = loss_and_grads(model, x, y)
        torch.testing.assert_close(fast_logits, ref_logits, atol=1e-5, rtol=1e-5)
        assert fast_grads.keys() == ref_grads.keys()
        assert any("router" in n for n in ref_grads) == (router != "average")
        for name in ref_grads:  # routers, projections of every layer, everything
            torch.testing.assert_close(fast_grads[name], ref_grads[name], atol=1e-6, rtol=1e-4,
                                       msg=f"{name} (L={n_layer}, group={group})")


@pytest.mark.parametrize("router", ["full", "dynamic", "first-2"])
def test_one_phase_is_the_default_two_phase_sum(router):
    """route_group_size=n_layer (eq. (2) read left to right, one phase) and the default groups of about
    sqrt(L) layers (two phases) are one function: the same logits and every gradient, from one seed."""
    results = []
    for group in (None, 9):
        model = build(lime=True, router=router, n_layer=9, n_kv_head=2, route_group_size=group)
        assert model.route_group_size == (3 if group is None else 9)
        results.append(loss_and_grads(model, torch.arange(32).view(2, 16) % V, torch.arange(1, 33).view(2, 16) % V))
    (logits, grads), (ref_logits, ref_grads) = results
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-6, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="route_group_size=0"):
        GPTConfig(lime=True, route_group_size=0)


def test_rope_is_the_half_split_rotation():
    """RoPE(x) = x cos + [-x2, x1] sin (x1, x2 the halves of a head), at positions pos..pos+T-1."""
    config = GPTConfig(n_embd=32, n_head=2, block_size=16)
    rope, x = M.RoPE(config), torch.randn(2, 5, 3, 16)  # (B, T, heads, head_dim)
    for pos in (0, 4):
        angles = torch.arange(pos, pos + 5).float()[:, None] * 10000.0 ** (-torch.arange(0, 16, 2).float() / 16)
        cos, sin = angles.cos().repeat(1, 2)[:, None], angles.sin().repeat(1, 2)[:, None]  # (T, 1, head_dim)
        x1, x2 = x.chunk(2, dim=-1)
        torch.testing.assert_close(rope(x, pos), x * cos + torch.cat((-x2, x1), dim=-1) * sin)


def test_two_phase_groups_default_to_about_sqrt_depth():
    assert [build(lime=True, n_layer=L).route_group_size for L in (1, 4, 16, 32, 64)] == [1, 2, 4, 6, 8]
    assert build(lime=True, n_layer=16).route_group_size == 4


def test_route_gradcheck_against_the_reference():
    """route() in float64, over single layers and over groups of layers (a wider source group than
    output): equal to route_reference, and its gradients (router, every source) pass gradcheck."""
    torch.manual_seed(0)
    B, T, d = 2, 3, 4
    for H_out, H_src, n in [(2, 2, 3), (4, 6, 2)]:
        sources = [torch.randn(H_src, 2, B, T, d, dtype=torch.float64, requires_grad=True) for _ in range(n)]
        weight = torch.randn(H_out, n * H_src, dtype=torch.float64, requires_grad=True)
        torch.testing.assert_close(M.route(weight, sources), M.route_reference(weight, torch.cat(sources)))
        assert torch.autograd.gradcheck(lambda w, *src: M.route(w, list(src)), (weight, *sources))


def test_route_under_bf16_autocast_matches_float32():
    """route() under bf16 autocast (the GPU default), a partial sum included: bf16 output close to the
    float32 sum, and the router's gradient a float32 tensor close to the float32 one."""
    torch.manual_seed(0)
    H, B, T, d = 4, 2, 8, 16
    sources = [torch.randn(n, 2, B, T, d) for n in (H, 2 * H)]
    partial = torch.randn(H, 2, B, T, d)
    weight = torch.randn(H, 3 * H, requires_grad=True)
    want = M.route_reference(weight, torch.cat(sources)) + partial
    want_grad, = torch.autograd.grad(want.square().sum(), weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = M.route(weight, sources, partial)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=0.1, rtol=0.02)
    out.float().square().sum().backward()
    assert weight.grad.dtype == torch.float32
    torch.testing.assert_close(weight.grad, want_grad, atol=0, rtol=0.02)


@pytest.mark.parametrize("router", ["full", "dynamic", "first-2"])
def test_identity_router_init_is_the_baseline(router):
    """router_init='identity': at init LIMe computes exactly the baseline function; the paper's
    init does not."""
    base = build(n_kv_head=2)
    x = torch.randint(0, V, (3, 16))
    for init, same in (("identity", True), ("paper", False)):
        lime = GPT(tiny(n_kv_head=2, lime=True, router=router, router_init=init))
        lime.load_state_dict(base.state_dict(), strict=False)
        diff = (lime(x, x)[0] - base(x, x)[0]).abs().max()
        assert diff < 1e-6 if same else diff > 1e-3, (init, diff)
    with pytest.raises(ValueError, match="router_init"):
        tiny(lime=True, router_init="zeros")


def test_identity_routers_give_the_baseline():
    base = build(n_kv_head=2)
    lime = GPT(tiny(n_kv_head=2, lime=True))
    result = lime.load_state_dict(base.state_dict(), strict=False)  # shared names load as is
    assert not result.unexpected_keys and all("router" in k for k in result.missing_keys)
    with torch.no_grad():
        for block in lime.transformer.h[1:]:
            w = block.attn.router.weight
            w.zero_()
            w[:, -2:] = torch.eye(2)
    x = torch.randint(0, V, (3, 16))
    torch.testing.assert_close(lime(x, x)[0], base(x, x)[0], atol=1e-6, rtol=0)
    assert (lime(x, x)[0] - base(x, x)[0]).abs().max() < 1e-6
    # and a random router really changes the function (the comparison above can fail)
    with torch.no_grad():
        lime.transformer.h[2].attn.router.weight.normal_()
    assert (lime(x, x)[0] - base(x, x)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("kw", [dict(lime=True), dict(lime=True, router="dynamic"), dict(lime=True, router_init="identity"),
                                dict(lime=True, router="first-2", tie_embeddings=False), dict(hc=2, hc_dynamic=True, mhc="static"),
                                dict(hc=2, mhc="dynamic", lime=True), dict(attnres="block"), dict(denseformer=True, lime=True),
                                dict(mudd=True), dict(mudd=True, lime=True), dict(mudd=True, mudd_prepost=True),
                                dict(moda=True)],
                         ids=str)
def test_one_seed_gives_every_variant_the_baseline_weights(kw):
    """Runs paired by seed start from the same weights: every parameter the baseline has, a variant built
    after the same manual_seed has too, equal (routers draw last), so a paired difference is the method's
    and not another init's; and the variant's own random init still differs from seed to seed."""
    torch.manual_seed(3)
    base = build_model(tiny(tie_embeddings=kw.get("tie_embeddings", True)))
    torch.manual_seed(3)
    variant = build_model(tiny(**kw))
    mine = dict(variant.named_parameters())
    for name, p in base.named_parameters():
        assert torch.equal(p, mine[name]), name
    if kw.get("lime") and kw.get("router_init") != "identity":
        torch.manual_seed(4)
        other = build_model(tiny(**kw)).transformer.h[2].attn.router.weight
        assert not torch.equal(other, variant.transformer.h[2].attn.router.weight)


def test_the_model_is_built_on_the_default_device():
    """bench.py builds models under `with torch.device('cuda')`: every weight must land there, the zero-init
    linears made without the RNG included. The meta device stands in for a GPU here."""
    with torch.device("meta"):
        model = build_model(tiny(lime=True, router="dynamic", hc=2, hc_dynamic=True))
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize("kw", [dict(), dict(lime=True), dict(lime=True, router="dynamic", n_kv_head=2),
                                dict(hc=4, hc_dynamic=True), dict(lime=True, hc=2),
                                dict(hc=2, mhc="dynamic"), dict(attnres="block-3", lime=True),
                                dict(denseformer=True, lime=True), dict(mudd=True), dict(mudd=True, mudd_prepost=True)])
def test_causality(kw):
    model = scramble(build(**kw))
    for module in model.modules():  # make HC and mHC non-trivial too
        if isinstance(module, relatives.hyper_connections.HyperConnection) and module.dynamic:
            torch.nn.init.normal_(module.dynamic_alpha.weight, std=0.5)
        elif isinstance(module, relatives.hyper_connections.DynamicMHC):
            torch.nn.init.normal_(module.phi_res.weight, std=0.5)
    x = torch.randint(0, V, (2, 16))
    x2 = x.clone()
    x2[:, 9] = (x2[:, 9] + 1) % V
    a, b = model(x, x)[0], model(x2, x2)[0]
    assert torch.equal(a[:, :9], b[:, :9])
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


def test_router_shapes_count_and_init():
    L, n_kv = 6, 2
    model = build(lime=True, n_layer=L, n_kv_head=n_kv)
    routers = {n: p for n, p in model.named_parameters() if "router" in n}
    assert len(routers) == L - 1  # layer 0 has none
    assert sum(p.numel() for p in routers.values()) == sum(n_kv * (l + 1) * n_kv for l in range(1, L))
    for l in range(1, L):
        w = model.transformer.h[l].attn.router.weight
        assert w.shape == (n_kv, (l + 1) * n_kv)
        assert torch.equal(w[:, l * n_kv:], torch.eye(n_kv))  # identity on its own heads
        rest, bound = w[:, :l * n_kv], math.sqrt(3 / ((l + 1) * n_kv))
        assert rest.abs().max() <= bound and rest.abs().max() > bound / 10
    base = build(n_layer=L, n_kv_head=n_kv)
    assert model.get_num_params() - base.get_num_params() == sum(p.numel() for p in routers.values())


def test_router_variants_select_the_right_sources():
    n_kv = 2
    for router in ["average", "last-2", "first-1", "first-2"]:
        model = build(lime=True, router=router, n_layer=5, n_kv_head=n_kv)
        for l in range(1, 5):
            R = model.transformer.h[l].attn.router.matrix().view(n_kv, l + 1, n_kv)
            used = [j for j in range(l + 1) if R[:, j].abs().sum() > 0]
            if router == "average":
                torch.testing.assert_close(R, torch.eye(n_kv)[:, None, :].expand_as(R) / (l + 1))
                expected = list(range(l + 1))
            elif router.startswith("last"):
                expected = list(range(max(0, l + 1 - 2), l + 1))
            else:
                j = int(router[-1])
                expected = list(range(min(l, j))) + [l]
            assert used == expected, (router, l, used)
    with pytest.raises(ValueError, match="unknown router"):
        GPTConfig(lime=True, router="middle-3")
    with pytest.raises(ValueError, match="unknown router"):
        GPTConfig(lime=True, router="last-0")


def test_gradients_reach_every_router_and_earlier_kv():
    model = build(lime=True, n_kv_head=2, n_layer=5)
    x = torch.randint(0, V, (2, 16))
    _, grads = loss_and_grads(model, x, x)
    for l in range(1, 5):
        assert grads[f"transformer.h.{l}.attn.router.weight"].abs().sum() > 0
    # Through the stacked KV alone: the last layer's routed values, with every block before it
    # cut off from the residual stream, still depend on layer 0's kv projection.
    routed = []
    for block in model.transformer.h[:4]:
        block.register_forward_hook(lambda m, i, o: o.detach())
    model.transformer.h[4].attn.register_forward_hook(lambda m, i, o: routed.append(o))
    model(x, x)
    g = torch.autograd.grad(routed[0].sum(), model.transformer.h[0].attn.kv_proj.weight)[0]
    assert g.abs().sum() > 0


CACHE_CASES = [dict(), dict(n_kv_head=2), *[dict(lime=True, router=r) for r in VARIANTS],
               dict(lime=True, n_kv_head=2), dict(lime=True, router="dynamic", n_kv_head=2),
               dict(hc=4), dict(hc=4, hc_dynamic=True), dict(lime=True, hc=2, n_kv_head=2),
               dict(denseformer=True), dict(denseformer=True, lime=True)]


@pytest.mark.parametrize("kw", CACHE_CASES)
def test_cached_decoding_is_exact(kw):
    model = scramble(build(seed=1, **kw)).eval()
    prompt = torch.randint(0, V, (2, 4))
    idx, cached = step_logits(model, prompt, 12)
    for t in range(12):  # every step's logits equal full recomputation
        full, _ = model(idx[:, :4 + t], idx[:, :4 + t])
        torch.testing.assert_close(cached[t], full[:, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.generate(prompt, 12, top_k=1), idx, atol=0, rtol=0)
    torch.testing.assert_close(model.generate(prompt, 12, top_k=1, use_cache=False), idx, atol=0, rtol=0)


@pytest.mark.parametrize("kw", [dict(), dict(lime=True, n_kv_head=2)])
def test_generation_past_block_size_slides_like_uncached(kw):
    model = build(seed=2, **kw).eval()
    prompt = torch.randint(0, V, (1, 5))
    a = model.generate(prompt, 30, top_k=1)  # block_size is 16: 19 steps slide the window
    b = model.generate(prompt, 30, top_k=1, use_cache=False)
    assert a.shape == (1, 35) and torch.equal(a, b)
    torch.manual_seed(0)
    s1 = model.generate(prompt, 30, temperature=0.8, top_k=10)
    torch.manual_seed(0)
    s2 = model.generate(prompt, 30, temperature=0.8, top_k=10, use_cache=False)
    assert torch.equal(s1, s2)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.randint(0, V, (1, 17)))


# Paper Table 3/8: vocab 50257, d 2048, MLP 8192, 16 layers, 32 heads, T 2048.
def paper_1b(n_kv_head, **kw):
    with torch.device("meta"):
        return GPT(GPTConfig(block_size=2048, vocab_size=50257, n_layer=16, n_head=32, n_kv_head=n_kv_head,
                             n_embd=2048, mlp_hidden=8192, **kw))


def test_table8_parameter_counts_and_flops():
    llama_gqa, lime_gqa = paper_1b(8), paper_1b(8, lime=True)
    llama_mha, lime_mha = paper_1b(32), paper_1b(32, lime=True)
    assert llama_gqa.get_num_params() == 1_076_072_448
    assert round(lime_gqa.get_num_params() / 1e9, 5) == 1.07608
    assert round(llama_mha.get_num_params() / 1e9, 5) == 1.17674
    assert round(lime_mha.get_num_params() / 1e9, 5) == 1.17687
    mha = lime_mha.flops_per_token(2048) / llama_mha.flops_per_token(2048) - 1
    gqa = lime_gqa.flops_per_token(2048) / llama_gqa.flops_per_token(2048) - 1
    assert round(100 * mha, 2) == 1.35 and round(100 * gqa, 2) == 0.09
    # the router term alone: 2 * H_kv * (l+1) * H_kv * 2 * d_h per layer l >= 1
    assert lime_mha.flops_per_token(2048) - llama_mha.flops_per_token(2048) == \
        sum(2 * 32 * (l + 1) * 32 * 2 * 64 for l in range(1, 16))


def test_flops_count_matches_a_matmul_trace():
    """flops_per_token against FLOPs counted by torch's own FlopCounterMode on a real forward."""
    from torch.utils.flop_counter import FlopCounterMode
    # torch counts addmm, not its in-place form, which route() uses for its running sums: 2*m*k*n as addmm
    addmm_ = {torch.ops.aten.addmm_: lambda self_shape, a_shape, b_shape, **_: 2 * a_shape[0] * a_shape[1] * b_shape[1]}
    for kw in [dict(), dict(lime=True, n_kv_head=2), dict(lime=True)]:
        model = build(**kw)
        x = torch.randint(0, V, (2, 16))
        with FlopCounterMode(display=False, custom_mapping=addmm_) as counter:
            model(x, x)
        counted = counter.get_total_flops() / x.numel()
        # FlopCounterMode counts CPU attention (over the full T x T matrix) in some torch releases and not in
        # others: where it does not, add our full T x T term
        c = model.config
        q, k = torch.zeros(1, c.n_head, 4, 2), torch.zeros(1, c.n_kv_head, 4, 2)
        with FlopCounterMode(display=False) as probe:  # attention as the model calls it (GQA: another kernel)
            F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=c.n_kv_head != c.n_head)
        if not probe.get_total_flops():
            counted += c.n_layer * 2 * 2 * 16 * c.n_embd
        assert counted == model.flops_per_token(16)


@pytest.mark.parametrize('tied', [True, False])
def test_non_embedding_parameters_leave_out_the_embedding_and_the_output_layer(tied):
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=50, lime=True,
                          tie_embeddings=tied))
    embeddings = 50 * 16 * (1 if tied else 2)  # wte, and lm_head when it is a matrix of its own
    assert model.get_num_params() == sum(p.numel() for p in model.parameters())
    assert model.get_num_params(non_embedding=True) == model.get_num_params() - embeddings


def test_optimizer_groups_hold_every_parameter_once():
    for kw in [dict(lime=True, router="dynamic"), dict(hc=4, hc_dynamic=True), dict()]:
        model = build(**kw)
        opt = model.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu")
        ids = [id(p) for g in opt.param_groups for p in g["params"]]
        assert sorted(ids) == sorted(id(p) for p in model.parameters())
        names = {id(p): n for n, p in model.named_parameters()}
        for g in opt.param_groups:
            group_names = [names[id(p)] for p in g["params"]]
            if g["name"] == "router":
                assert g["lr"] == g["peak_lr"] == 1e-2 and g["weight_decay"] == 0
                assert all("router" in n for n in group_names)
            elif g["name"] == "decay":
                assert g["weight_decay"] == 0.1
                assert all("norm" not in n and "ln_" not in n and "wte" not in n and "static" not in n
                           and "router" not in n for n in group_names)
            else:
                assert g["weight_decay"] == 0 and "transformer.wte.weight" in group_names
        if kw.get("lime"):
            assert any(g["name"] == "router" for g in opt.param_groups)
    model = build(attnres="block")  # named_lrs: a parameter in a group of its own, at its own peak, no decay
    opt = configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu", named_lrs={"attn_res.query": 3e-3})
    named = [g for g in opt.param_groups if g["name"] == "attn_res.query"]
    assert len(named) == 1 and named[0]["params"] == [model.attn_res.query]
    assert named[0]["lr"] == named[0]["peak_lr"] == 3e-3 and named[0]["weight_decay"] == 0
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_activation_memory_is_linear_in_depth():
    """Bytes saved for backward, LIMe over the baseline: <= 1.15 and flat from 4 to 16 layers
    (a torch.cat of the sources per layer would grow O(L^2)). Compiled: tests/test_compile.py."""
    ratios = {}
    x = torch.randint(0, V, (4, 64))
    for L in (4, 16):
        kw = dict(block_size=64, n_layer=L, n_head=4, n_kv_head=4, n_embd=64)
        ratios[L] = saved_bytes(build(lime=True, **kw), x) / saved_bytes(build(**kw), x)
    assert ratios[4] <= 1.15 and ratios[16] <= 1.15, ratios
    assert ratios[16] - ratios[4] <= 0.05, ratios


def test_bf16_autocast_forward_backward():
    model = build(lime=True, n_kv_head=2)
    x = torch.randint(0, V, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(x, x)
    loss.backward()
    g = model.transformer.h[3].attn.router.weight.grad
    assert g.dtype == torch.float32 and torch.isfinite(g).all() and g.abs().sum() > 0


def test_rms_norm_reads_and_returns_float32_under_bf16_autocast():
    """The residual stream stays float32 under bf16 autocast: every RMSNorm reads and returns float32 (the
    matmuls after it cast to bf16). So autocast's handling of rms_norm on bf16 inputs, which differs between
    torch releases on CUDA (tests/test_cuda.py checks the GPU's), does not reach this model."""
    model, dtypes = build(lime=True, n_kv_head=2), []
    for m in model.modules():
        if isinstance(m, torch.nn.RMSNorm):
            m.register_forward_hook(lambda m, args, out: dtypes.append((args[0].dtype, out.dtype)))
    x = torch.randint(0, V, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, x)
    assert dtypes == [(torch.float32, torch.float32)] * (2 * model.config.n_layer + 1)


@pytest.mark.parametrize("bad, match", [
    (dict(n_embd=30, n_head=4), "divisible by n_head"),
    (dict(n_head=4, n_kv_head=3), "divisible by n_kv_head"),
    (dict(n_embd=12, n_head=4), "even for RoPE"),
    (dict(n_layer=0), ">= 1"),
    (dict(hc=-1), "hc="),
])
def test_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        tiny(**bad)


@pytest.mark.parametrize("router", ["full", "dynamic"])
def test_no_kv_source_outlives_its_step(router, monkeypatch):
    """The memory of every layer's [k; v] (the stacked KV) and routed output is freed by
    backward, even while the loss and logits live: nothing but the autograd graph holds it,
    so two steps' stacks never coexist."""
    from torch.multiprocessing.reductions import StorageWeakRef
    refs, routed = [], M.KVStack.routed

    def track(kv_stack, router, x):
        out = routed(kv_stack, router, x)
        refs.extend(StorageWeakRef(t.untyped_storage()) for t in (*kv_stack.sources, out))
        return out

    monkeypatch.setattr(M.KVStack, "routed", track)
    model = build(lime=True, router=router)
    x = torch.randint(0, V, (2, 16))
    logits, loss = model(x, x)
    assert len(refs) > 4 and not all(r.expired() for r in refs)  # saved for backward
    loss.backward()
    assert all(r.expired() for r in refs)  # freed by refcounting, no gc needed
    assert logits.requires_grad and loss.item() > 0


def test_decoding_one_token_passes_no_mask(monkeypatch):
    """A single new token attends to the whole cache: no mask, so flash kernels stay usable."""
    masks, sdpa = [], M.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        masks.append((q.size(2), k.size(2), attn_mask is None, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(M.F, "scaled_dot_product_attention", spy)
    model = build(lime=True)
    cache = KVCache(model.config)
    model(torch.randint(0, V, (1, 5)), cache=cache)
    model(torch.randint(0, V, (1, 1)), cache=cache)
    model(torch.randint(0, V, (1, 2)), cache=cache)
    L = model.config.n_layer
    assert masks[:L] == [(5, 5, True, True)] * L               # prefill: causal
    assert masks[L:2 * L] == [(1, 6, True, False)] * L         # one token: no mask at all
    assert masks[2 * L:] == [(2, 8, False, False)] * L         # several tokens after a cache: a mask


def test_greedy_decoding_is_deterministic_on_ties():
    model = build(lime=True).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()  # every logit 0: a tie everywhere
    prompt = torch.randint(0, V, (2, 3))
    for seed in range(3):
        torch.manual_seed(seed)
        assert model.generate(prompt, 4, top_k=1)[:, 3:].eq(0).all()  # argmax picks the first


def test_generate_stops_once_every_row_has_the_stop_token(monkeypatch):
    model = build(seed=3).eval()
    script = torch.tensor([[5, 1, 2, 3, 4, 6], [1, 2, 5, 3, 4, 6]])  # 5 comes at step 0 in row 0, step 2 in row 1

    def scripted(idx, targets=None, cache=None):  # logits whose argmax is the script's next token
        return F.one_hot(script[:, idx.size(1) - 4], V).float()[:, None], None
    monkeypatch.setattr(model, "forward", scripted)
    prompt = torch.zeros(2, 4, dtype=torch.long)
    assert torch.equal(model.generate(prompt, 6, top_k=1, use_cache=False, stop_token=5)[:, 4:], script[:, :3])
    assert torch.equal(model.generate(prompt, 6, top_k=1, use_cache=False, stop_token=6)[:, 4:], script)
    assert torch.equal(model.generate(prompt, 6, top_k=1, use_cache=False, stop_token=7)[:, 4:], script)


def test_top_p_samples_only_the_nucleus(monkeypatch):
    model = build(seed=3).eval()
    probs = torch.zeros(V)
    probs[[3, 7, 1, 5]] = torch.tensor([0.5, 0.3, 0.15, 0.05])  # by rank: 3, 7, 1, 5; the rest impossible

    def fixed(idx, targets=None, cache=None):
        return probs.log().expand(idx.size(0), 1, V), None
    monkeypatch.setattr(model, "forward", fixed)
    prompt = torch.zeros(4000, 1, dtype=torch.long)
    for top_p, nucleus in ((0.7, {3, 7}), (0.9, {3, 7, 1}), (0.4, {3})):  # the fewest tokens reaching top_p
        torch.manual_seed(0)
        assert set(model.generate(prompt, 1, top_p=top_p, use_cache=False)[:, 1].tolist()) == nucleus
    torch.manual_seed(0)
    unchanged = model.generate(prompt, 1, use_cache=False)
    assert set(unchanged[:, 1].tolist()) == {3, 7, 1, 5}
    torch.manual_seed(0)
    assert torch.equal(model.generate(prompt, 1, top_p=1.0, use_cache=False), unchanged)  # 1.0: plain sampling
