"""MUDDFormer with PrePostDANorm as its authors' JAX code computes it: tests/fixtures/authors/muddformer_prepost.pt.

    python experiments/authors/muddformer_prepost.py CHECKOUT [--commit=SHA]

Needs a Python with jax 0.4.30, flax 0.8.5, einops, pyyaml and torch (e.g. a venv of its own:
`pip install "jax[cpu]==0.4.30" flax==0.8.5 einops pyyaml torch`; the authors' MaxText is from mid 2024).
CHECKOUT: a local checkout of Caiyun-AI/MUDDFormer; the fixture in the repository was made from commit
fc067b274a5f14894b2ee299fdcb3c581a092896 (main, 2025-02-19), `jax/MaxText`: the Transformer of
`layers/models.py` (class Decoder: the dense connections, `mudd_prenorm`, `mudd_postnorm`) with the decoder
block of `layers/llama2.py` (LlamaDecoderLayer: its q, k, v norms, W1 and W2 of the dense connection).

Their settings are their MUDDLlama2Medium's (`jax/MaxText/exp.py`): dense_conn, dynamic_dense_type 'qkvm',
ddw_gen_pattern 'q,k,v,m', mudd_prenorm and mudd_postnorm, W1's width 1x (4x for the last block) rounded past a
multiple of 64, the last block's one way (dynamic_dense_fix_last_layer), scan_layers off; with MaxText's
dot-product attention (training mode, causal), GQA (4 query heads, 2 KV heads), untied embeddings, float32
throughout: their rotary embedding's cast of the rotated queries and keys to bfloat16 (RotaryEmbedding's
fprop_dtype) is made float32 here. Set otherwise, because our arm leaves it out on purpose or cannot express it
(docs/deviations.md): `dynamic_mlp_dim` off (their MLP widths over depth: every MLP has the baseline's width) and
W1's activation the exact GELU (theirs, `dynamic_dense_act_cls = 'gelu'`, is flax's `nn.gelu`, the tanh
approximation; their PyTorch model and ours use the exact one). Their
block 0 has separate query, key and value norms of the embedding (ours one, ln_1): the fixture gives the three the
same gain, ours, and our ln_1's gradient is the sum of theirs.

Parameter map (their flax path under params/decoder -> ours): token_embedder/embedding (params/) ->
transformer.wte; logits_dense/kernel -> lm_head (transposed); decoder_norm -> transformer.ln_f; mudd_prenorm ->
mudd.0.ln_embedding; mudd_prenorm_{i} -> mudd.{i}.ln_source; mudd_postnorm_{i} -> mudd.{i}.ln_post; in
layers_{i}: pre_self_attention_layer_norm_q -> h.{i}.ln_1, _k, _v -> mudd.{i-1}.ln_k, ln_v (block 0: ln_1);
self_attention/query, key, value, out kernels -> q_proj, kv_proj's halves, o_proj (reshaped, transposed);
post_self_attention_layer_norm -> ln_2; mlp/wi_0, wi_1, wo -> gate_proj, up_proj, down_proj (transposed);
pre_dense_proj1_norm -> mudd.{i}.ln_w1; dynamic_dense_conn1 -> mudd.{i}.w1; dynamic_dense_conn2 (hidden, ways,
sources) -> mudd.{i}.w2 (hidden, ways * sources); dense_proj2.bias -> mudd.{i}.bias.
Stubbed so that their modules import: `aqt` (quantization, off: quant=None). Their config comes from
`configs/base.yml` with the settings above, not through their pyconfig (which wants a full training setup).
"""
import os
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture  # noqa: E402  (experiments/authors/fixture.py; puts the repository on sys.path)

REPO = "Caiyun-AI/MUDDFormer"


def stub_aqt():
    """aqt (AQT quantization) is imported by their quantizations.py; with quant=None nothing of it runs."""
    import enum

    class Unused:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("stub: quantization is off here")

    names = {"aqt": {}, "aqt.jax": {}, "aqt.jax.v2": {},
             "aqt.jax.v2.config": dict(DotGeneral=Unused, LocalAqt=Unused, config_v3=Unused),
             "aqt.jax.v2.flax": {},
             "aqt.jax.v2.flax.aqt_flax": dict(QuantMode=enum.Enum("QuantMode", "TRAIN SERVE CONVERT"),
                                              FreezerMode=enum.Enum("FreezerMode", "NONE CALIBRATION_AND_VALUE"),
                                              AqtDotGeneral=Unused, AqtEinsum=Unused)}
    for name, attrs in names.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules.setdefault(name, module)
    sys.modules["aqt.jax.v2"].config = sys.modules["aqt.jax.v2.config"]
    sys.modules["aqt.jax.v2.flax"].aqt_flax = sys.modules["aqt.jax.v2.flax.aqt_flax"]


class Config:
    """Their config's values as attributes (what their pyconfig hands the model); a missing key raises."""

    def __init__(self, values):
        self.__dict__.update(values)


def their_config(checkout, c, jnp, jax):
    import functools
    import yaml
    with open(os.path.join(checkout, "jax", "MaxText", "configs", "base.yml")) as f:
        values = yaml.safe_load(f)
    L = c.n_layer
    values.update(  # MUDDLlama2Medium (exp.py), at our shape
        dense_conn=True, dynamic_dense_type="qkvm", dynamic_dense_fix_last_layer=True,
        dynamic_dense_hidden_expand=[1] * (L - 1) + [4], dynamic_dense_hidden_round=True, scan_layers=False,
        ddw_gen_pattern="q,k,v,m", ddw_gen_chunk_size=None, mudd_prenorm=True, mudd_postnorm=True,
        normalization_layer_epsilon=c.norm_eps, vocab_size=c.vocab_size, mlp_activations=["silu", "linear"],
        logits_via_embedding=False, decoder_block="llama2", attention="dot_product", rope_max_timescale=10000,
        rope_min_timescale=1, mgate=False, enable_dropout=False, dropout_rate=0.0,
        # set otherwise: the baseline's MLP widths, the exact GELU (their 'gelu' is flax's tanh approximation)
        dynamic_mlp_dim=False, dynamic_dense_act_cls=functools.partial(jax.nn.gelu, approximate=False),
        # what pyconfig would derive, at our shape, in float32
        emb_dim=c.n_embd, num_query_heads=c.n_head, num_kv_heads=c.n_kv_head, head_dim=c.n_embd // c.n_head,
        mlp_dim=c.mlp_hidden, num_decoder_layers=L, max_target_length=c.block_size,
        max_prefill_predict_length=c.block_size, dtype=jnp.float32, weight_dtype=jnp.float32,
        record_internal_nn_metrics=0, set_mask_by_eos=False, query_chunk_size=None,
        using_pipeline_parallelism=False, remat_policy="full", fused_qkv=False, fused_mlp=False,
        use_untrainable_positional_embedding=False, trainable_position_size=-1, use_iota_embed=False,
        quantize_kvcache=False)
    return Config(values)


def parameter_map(c):
    """[(our name, [their paths], split ours into theirs, join theirs into ours)]: paths under params/."""
    d, H, H_kv, hd = c.n_embd, c.n_head, c.n_kv_head, c.n_embd // c.n_head
    same = (lambda w: [w], lambda ws: ws[0])
    transposed = (lambda w: [w.T], lambda ws: ws[0].T)
    rows = [("transformer.wte.weight", ["token_embedder/embedding"], *same),
            ("lm_head.weight", ["decoder/logits_dense/kernel"], *transposed),
            ("transformer.ln_f.weight", ["decoder/decoder_norm/scale"], *same),
            ("mudd.0.ln_embedding.weight", ["decoder/mudd_prenorm/scale"], *same)]
    for i in range(c.n_layer):
        ours, theirs, last = f"transformer.h.{i}.", f"decoder/layers_{i}/", i == c.n_layer - 1
        ways = 1 if last else 4
        norm = theirs + "pre_self_attention_layer_norm_{}/scale"
        rows += [
            (ours + "attn.q_proj.weight", [theirs + "self_attention/query/kernel"],
             lambda w: [w.T.reshape(d, H, hd)], lambda ws: ws[0].reshape(d, H * hd).T),
            (ours + "attn.kv_proj.weight",
             [theirs + "self_attention/key/kernel", theirs + "self_attention/value/kernel"],
             lambda w: [h.T.reshape(d, H_kv, hd) for h in w.chunk(2)],
             lambda ws: torch.cat([h.reshape(d, H_kv * hd).T for h in ws])),
            (ours + "attn.o_proj.weight", [theirs + "self_attention/out/kernel"],
             lambda w: [w.T.reshape(H, hd, d)], lambda ws: ws[0].reshape(H * hd, d).T),
            (ours + "mlp.gate_proj.weight", [theirs + "mlp/wi_0/kernel"], *transposed),
            (ours + "mlp.up_proj.weight", [theirs + "mlp/wi_1/kernel"], *transposed),
            (ours + "mlp.down_proj.weight", [theirs + "mlp/wo/kernel"], *transposed),
            (ours + "ln_2.weight", [theirs + "post_self_attention_layer_norm/scale"], *same),
            (f"mudd.{i}.w1", [theirs + "dynamic_dense_conn1/kernel"], *same),
            (f"mudd.{i}.w2", [theirs + "dynamic_dense_conn2/kernel"],
             lambda w, ways=ways: [w.reshape(w.size(0), ways, -1)], lambda ws: ws[0].flatten(1)),
            (f"mudd.{i}.bias", [theirs + "dense_proj2.bias"], *same),
            (f"mudd.{i}.ln_w1.weight", [theirs + "pre_dense_proj1_norm/scale"], *same),
            (f"mudd.{i}.ln_source.weight", [f"decoder/mudd_prenorm_{i}/scale"], *same),
            (f"mudd.{i}.ln_post.weight", [f"decoder/mudd_postnorm_{i}/scale"], *same)]
        if i == 0:  # their block 0: three norms of the embedding, one gain here (ours), gradients summed
            rows.append((ours + "ln_1.weight", [norm.format(x) for x in "qkv"],
                         lambda w: [w, w, w], lambda ws: ws[0] + ws[1] + ws[2]))
        else:
            rows += [(ours + "ln_1.weight", [norm.format("q")], *same),
                     (f"mudd.{i - 1}.ln_k.weight", [norm.format("k")], *same),
                     (f"mudd.{i - 1}.ln_v.weight", [norm.format("v")], *same)]
    return rows


def flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) or hasattr(v, "items"):
            out.update(flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def unflatten(flat):
    tree = {}
    for path, v in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


def main():
    args = fixture.arguments(__doc__, REPO)
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_default_matmul_precision", "highest")
    stub_aqt()
    sys.path.insert(0, os.path.join(args.checkout, "jax", "MaxText"))
    import functools
    from layers import attentions, embeddings, models
    # their rotary embedding casts the rotated queries and keys to bfloat16 (cast_as_fprop_dtype, fprop_dtype's
    # default): kept in float32 here, as everything else
    attentions.RotaryEmbedding = functools.partial(embeddings.RotaryEmbedding, fprop_dtype=jnp.float32)

    options = dict(mudd=True, mudd_prepost=True, tie_embeddings=False, n_kv_head=2)
    ours = fixture.our_model(**options)
    fixture.randomize(ours)
    weights = dict(ours.named_parameters())
    c = ours.config

    cfg = their_config(args.checkout, c, jnp, jax)
    model = models.Transformer(config=cfg, mesh=None, quant=None)
    idx, targets = fixture.batch(c.vocab_size)
    tokens = jnp.asarray(idx.numpy())
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    from flax.core import meta
    init = flatten(meta.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, positions,
                                                                enable_dropout=False))["params"]))
    rows = parameter_map(c)
    assert {p for r in rows for p in r[1]} == set(init), sorted({p for r in rows for p in r[1]} ^ set(init))
    assert {r[0] for r in rows} == set(weights)
    flat = {}
    for ours_name, paths, split, _ in rows:
        for path, w in zip(paths, split(weights[ours_name].detach())):
            assert tuple(w.shape) == tuple(init[path].shape), (path, w.shape, init[path].shape)
            flat[path] = jnp.asarray(w.numpy())

    def loss_fn(params):
        logits = model.apply({"params": params}, tokens, positions, enable_dropout=False)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, jnp.asarray(targets.numpy())[..., None], axis=-1).mean(), logits

    (_, logits), grad_tree = jax.value_and_grad(loss_fn, has_aux=True)(unflatten(flat))
    their_grads = {p: torch.from_numpy(np.asarray(g).copy()) for p, g in flatten(grad_tree).items()}
    grads = {ours_name: join([their_grads[p] for p in paths]) for ours_name, paths, _, join in rows}
    logits = torch.from_numpy(np.asarray(logits).copy())
    notes = ("their jax/MaxText Transformer (models.py Decoder, llama2.py LlamaDecoderLayer), MUDDLlama2Medium's "
             "dense settings with mudd_prenorm and mudd_postnorm; dynamic_mlp_dim off, W1's GELU exact; block 0's "
             "q, k, v norms given one gain")
    saved = fixture.save("muddformer_prepost", args, options, idx, targets, weights, logits, grads, notes)
    fixture.check_against_ours(fixture.our_model(**options), saved)


if __name__ == "__main__":
    main()
