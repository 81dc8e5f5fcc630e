"""MUDDFormer as its authors' PyTorch model computes it: the fixture tests/fixtures/authors/muddformer.pt.

    python experiments/authors/muddformer.py CHECKOUT [--commit=SHA]

CHECKOUT: a local checkout of Caiyun-AI/MUDDFormer; the fixture in the repository was made from commit
fc067b274a5f14894b2ee299fdcb3c581a092896 (main, 2025-02-19), `pytorch/muddformer/modeling_muddformer.py`
(class MUDDFormer, which needs transformers and einops). It has no PrePostDANorm (their JAX code has it:
experiments/authors/muddformer_prepost.py), so this is `mudd=True` alone.

Their settings are their released config's (`pytorch/muddformer/config.json`): dense_type 'qkvr', dynamic dense,
separate query/key/value norms (sepln), W1's width rounded past a multiple of 64 (round64) and 4x for the last
block (expand_last), untied embeddings; training mode (no KV or layer cache). Set otherwise, because our arm
leaves them out on purpose (docs/deviations.md): `use_qk_norm` off, and their FeedForward's width rule off
(its defaults `scale_with_layer`, the 0.5x-1.5x widths over depth, and `round128`, patched to False here):
every MLP has the baseline's width. One precision choice of theirs is undone: their rotary table
(`precompute_freqs_cis`) is rounded to bfloat16; the driver gives their model the same table in float32
(nanoLIMe's RoPE's cos and sin). Their attention is MHA only (no key/value head repeat), so n_kv_head = n_head.

Parameter map (theirs -> ours): tok_embeddings -> transformer.wte; output -> lm_head; norm -> transformer.ln_f;
layers.{i}.attention.wq -> transformer.h.{i}.attn.q_proj; wk, wv -> kv_proj's two halves (keys first); wo ->
o_proj; feed_forward.w1, w3, w2 -> mlp.gate_proj, up_proj, down_proj; ffn_norm -> ln_2; layers.0.attention_norm
-> h.0.ln_1; layers.{i}.attention_norms.0, 1, 2 -> h.{i}.ln_1, mudd.{i-1}.ln_k, mudd.{i-1}.ln_v;
dense_bs.{i} -> mudd.{i}.bias; dynamic_dense.{i}.w1, w2 (nn.Linear, out x in) -> mudd.{i}.w1, w2 transposed.
Nothing of theirs is stubbed; einops must be importable.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture  # noqa: E402  (experiments/authors/fixture.py; puts the repository on sys.path)

REPO = "Caiyun-AI/MUDDFormer"


def parameter_map(c):
    """[(our name, [their names], split ours into theirs, join theirs into ours)] for every parameter."""
    same = (lambda w: [w], lambda ws: ws[0])
    transposed = (lambda w: [w.T], lambda ws: ws[0].T)
    halves = (lambda w: list(w.chunk(2)), lambda ws: torch.cat(ws))
    rows = [("transformer.wte.weight", ["tok_embeddings.weight"], *same),
            ("lm_head.weight", ["output.weight"], *same),
            ("transformer.ln_f.weight", ["norm.weight"], *same)]
    for i in range(c.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"layers.{i}."
        rows += [(ours + "attn.q_proj.weight", [theirs + "attention.wq.weight"], *same),
                 (ours + "attn.kv_proj.weight", [theirs + "attention.wk.weight", theirs + "attention.wv.weight"],
                  *halves),
                 (ours + "attn.o_proj.weight", [theirs + "attention.wo.weight"], *same),
                 (ours + "mlp.gate_proj.weight", [theirs + "feed_forward.w1.weight"], *same),
                 (ours + "mlp.up_proj.weight", [theirs + "feed_forward.w3.weight"], *same),
                 (ours + "mlp.down_proj.weight", [theirs + "feed_forward.w2.weight"], *same),
                 (ours + "ln_2.weight", [theirs + "ffn_norm.weight"], *same),
                 (f"mudd.{i}.bias", [f"dense_bs.{i}"], *same),
                 (f"mudd.{i}.w1", [f"dynamic_dense.{i}.w1.weight"], *transposed),
                 (f"mudd.{i}.w2", [f"dynamic_dense.{i}.w2.weight"], *transposed)]
        if i == 0:
            rows.append((ours + "ln_1.weight", [theirs + "attention_norm.weight"], *same))
        else:
            rows += [(ours + "ln_1.weight", [theirs + "attention_norms.0.weight"], *same),
                     (f"mudd.{i - 1}.ln_k.weight", [theirs + "attention_norms.1.weight"], *same),
                     (f"mudd.{i - 1}.ln_v.weight", [theirs + "attention_norms.2.weight"], *same)]
    return rows


def main():
    args = fixture.arguments(__doc__, REPO)
    sys.path.insert(0, os.path.join(args.checkout, "pytorch", "muddformer"))
    import modeling_muddformer as mudd
    from configuration_muddformer import MUDDFormerConfig

    options = dict(mudd=True, tie_embeddings=False)
    ours = fixture.our_model(**options)
    fixture.randomize(ours)
    weights = dict(ours.named_parameters())
    c = ours.config

    mudd.FeedForward.__init__.__defaults__ = (False, False)  # round128, scale_with_layer: the baseline's widths
    config = MUDDFormerConfig(block_size=c.block_size, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                              dim=c.n_embd, intermediate_size=c.mlp_hidden, n_local_heads=c.n_kv_head,
                              norm_eps=c.norm_eps, is_training=True, use_qk_norm=False, tie_word_embeddings=False,
                              use_layer_cache=False, stack_hidden=False, dense=True, dynamic_dense=True, sepln=True,
                              dense_type="qkvr", expand_last=True, round64=True)
    theirs = mudd.MUDDFormer(config).float()
    theirs.setup_caches(fixture.BATCH, fixture.SEQ, dtype=torch.float32)
    half = c.n_embd // c.n_head // 2  # their rotary table (T, d_h / 2, [cos, sin]) in float32: ours
    theirs.freqs_cis = torch.stack([ours.rope.cos[:, 0, :half], ours.rope.sin[:, 0, :half]], dim=-1)

    rows = parameter_map(c)
    their_params = dict(theirs.named_parameters())
    assert {n for r in rows for n in r[1]} == set(their_params), set(their_params) ^ {n for r in rows for n in r[1]}
    assert {r[0] for r in rows} == set(weights)
    with torch.no_grad():
        for ours_name, their_names, split, _ in rows:
            for n, w in zip(their_names, split(weights[ours_name])):
                their_params[n].copy_(w)

    idx, targets = fixture.batch(c.vocab_size)
    logits = theirs(idx, return_tensor=True)
    fixture.objective(logits, targets).backward()
    grads = {ours_name: join([their_params[n].grad for n in their_names]) for ours_name, their_names, _, join in rows}
    notes = ("their pytorch/muddformer MUDDFormer, released config; use_qk_norm off and every MLP the baseline's "
             "width (their scale_with_layer, round128 off); their bf16 rotary table given in float32")
    saved = fixture.save("muddformer", args, options, idx, targets, weights, logits, grads, notes)
    fixture.check_against_ours(fixture.our_model(**options), saved)


if __name__ == "__main__":
    main()
