"""mHC as its authors' code computes it: the fixture tests/fixtures/authors/mhc.pt.

    python experiments/authors/mhc.py CHECKOUT [--commit=SHA]

CHECKOUT: a local checkout of deepseek-ai/TileKernels; the fixture in the repository was made from commit
36d9e45d38e204ebb87e6f6e833821eee0482fe5 (2026-04-23). Their mHC kernels are TileLang (GPU only); the kernels'
tests check them against a PyTorch reference, `tile_kernels/torch/mhc.py` (loaded here by its path, without the
package, whose __init__ imports tilelang). The driver composes the reference functions around every sub-layer
as their training path `tile_kernels/modeling/mhc/functional.py`'s `mhc_pre` composes the kernels
(`mhc_pre_norm_fn` -> `mhc_pre_split_mixes` -> `sinkhorn_normalize` -> `mhc_pre_apply_mix`, then the sub-layer,
then `mhc_post`), with `expand_to_mhc` on the embedding; the sub-layers are nanoLIMe's baseline attention and
MLP (each with its pre-norm), the model's embedding, final norm and LM head the baseline's.

Their settings where ours can express them: mhc_mult 4 (`hc=4`), RMSNorm of the n*d stream vector without a gain
(norm_weight None), eps 1e-6. Set otherwise (docs/deviations.md): `sinkhorn_repeat` 20 (their default 10; ours
is the paper's t_max = 20), `post_mult_value` 2 (the paper's 2 sigmoid, eq. 8; their default 1), `pre_eps` and
`sinkhorn_eps` 0 (their 1e-6 guards, which our arm does not add). Their reference rounds the sub-layer input and
the new streams to bfloat16 (`.bfloat16()` in mhc_pre_apply_mix_ref, mhc_post_ref): the driver makes that the
identity while it runs, float32 throughout. The final hidden state is the sum of the streams, our arm's (HC's);
their `mhc_head` (a learned per-token sigmoid mix of the streams before the LM head) is not in our arm and is not
run.

Parameter map, per sub-layer (theirs -> ours, in transformer.h.{l}.hc_attn / hc_mlp): fn (n(n+2), n d) rows
[pre n, post n, res n^2] -> phi_pre, phi_post, phi_res weights; scale [3] -> scale_pre, scale_post, scale_res;
base [n(n+2)] -> b_pre, b_post, b_res. Their res matrix is [source stream m, new stream n] (new stream n =
sum_m comb[m, n] stream m), ours [new, source]: their res rows of fn and their b_res are ours transposed.
"""
import contextlib
import importlib.util
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture  # noqa: E402  (experiments/authors/fixture.py; puts the repository on sys.path)
from model import GPT, GPTConfig  # noqa: E402

REPO = "deepseek-ai/TileKernels"
SINKHORN_REPEAT, POST_MULT = 20, 2.0


def their_reference(checkout):
    path = os.path.join(checkout, "tile_kernels", "torch", "mhc.py")
    spec = importlib.util.spec_from_file_location("their_mhc_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def float32_bfloat16():
    """Tensor.bfloat16() as the identity: their reference's casts of its outputs, undone."""
    cast = torch.Tensor.bfloat16
    torch.Tensor.bfloat16 = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.bfloat16 = cast


class TheirMHC(nn.Module):
    """nanoLIMe's baseline sub-layers on n streams, each wrapped in their reference mHC (functional.mhc_pre's order)."""

    def __init__(self, config, n, ref):
        super().__init__()
        self.base, self.n, self.ref = GPT(config), n, ref
        self.fn = nn.ParameterList([nn.Parameter(torch.zeros(n * (n + 2), n * config.n_embd))
                                    for _ in range(2 * config.n_layer)])
        self.scale = nn.ParameterList([nn.Parameter(torch.zeros(3)) for _ in range(2 * config.n_layer)])
        self.mix_base = nn.ParameterList([nn.Parameter(torch.zeros(n * (n + 2))) for _ in range(2 * config.n_layer)])

    def connect(self, s, residual, sublayer):
        ref, eps = self.ref, self.base.config.norm_eps
        mixes = ref.mhc_pre_norm_fn_ref(residual, self.fn[s], None, eps)
        pre, post, comb = ref.mhc_pre_split_mixes_ref(mixes, self.scale[s], self.mix_base[s], self.n, POST_MULT, 0.0)
        comb = ref.sinkhorn_normalize_ref(comb, repeat=SINKHORN_REPEAT, eps=0.0)
        y = sublayer(ref.mhc_pre_apply_mix_ref(residual, pre))
        return ref.mhc_post_ref(y, residual, post, comb)

    def forward(self, idx):
        base = self.base
        residual = self.ref.expand_to_mhc_ref(base.transformer.wte(idx), self.n)  # (B, T, n, d)
        for layer, block in enumerate(base.transformer.h):
            residual = self.connect(2 * layer, residual, lambda h: block.attn(block.ln_1(h), base.rope))
            residual = self.connect(2 * layer + 1, residual, lambda h: block.mlp(block.ln_2(h)))
        return base.lm_head(base.transformer.ln_f(residual.sum(-2)))


def main():
    args = fixture.arguments(__doc__, REPO)
    ref = their_reference(args.checkout)

    n = 4
    options = dict(hc=n, mhc="dynamic")
    ours = fixture.our_model(**options)
    fixture.randomize(ours)
    with torch.no_grad():  # streams that differ, so that the maps between them matter: every stream its own post
        g = torch.Generator().manual_seed(3)  # weight, off-diagonal residual logits, gates well above 0.01
        for name, p in sorted(ours.named_parameters()):
            if name.endswith(("b_post", "b_res")):
                p.add_(torch.randn(p.shape, generator=g))
            elif ".scale_" in name:
                p.copy_(0.3 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(("o_proj.weight", "down_proj.weight")):  # sub-layer outputs as large as the
                p.mul_(20)  # embedding: streams that differ by O(1), gradients of the maps far from rounding
    weights = dict(ours.named_parameters())
    c = ours.config

    theirs = TheirMHC(GPTConfig(**fixture.SHAPE), n, ref).float()
    their_params = dict(theirs.named_parameters())
    shared = {f"base.{k}": k for k in weights if not (".hc_attn." in k or ".hc_mlp." in k)}
    connections = [f"transformer.h.{layer}.hc_{part}." for layer in range(c.n_layer) for part in ("attn", "mlp")]
    assert set(their_params) == set(shared) | {f"{k}.{s}" for k in ("fn", "scale", "mix_base")
                                               for s in range(len(connections))}
    assert set(shared.values()) | {p + q for p in connections for q in (
        "phi_pre.weight", "phi_post.weight", "phi_res.weight", "b_pre", "b_post", "b_res",
        "scale_pre", "scale_post", "scale_res")} == set(weights)

    def transposed_res(w):  # (n * n, ...) rows [i, j] <-> [j, i]
        return w.reshape(n, n, *w.shape[1:]).transpose(0, 1).reshape(w.shape)

    with torch.no_grad():
        for theirs_name, ours_name in shared.items():
            their_params[theirs_name].copy_(weights[ours_name])
        for s, p in enumerate(connections):
            w = {k: weights[p + k] for k in ("phi_pre.weight", "phi_post.weight", "phi_res.weight", "b_pre", "b_post",
                                             "b_res", "scale_pre", "scale_post", "scale_res")}
            theirs.fn[s].copy_(torch.cat([w["phi_pre.weight"], w["phi_post.weight"],
                                          transposed_res(w["phi_res.weight"])]))
            theirs.scale[s].copy_(torch.stack([w["scale_pre"], w["scale_post"], w["scale_res"]]))
            theirs.mix_base[s].copy_(torch.cat([w["b_pre"], w["b_post"], w["b_res"].T.flatten()]))

    idx, targets = fixture.batch(c.vocab_size)
    with float32_bfloat16():
        logits = theirs(idx)
        fixture.objective(logits, targets).backward()
    grads = {ours_name: their_params[theirs_name].grad for theirs_name, ours_name in shared.items()}
    for s, p in enumerate(connections):
        fn, scale, mix_base = theirs.fn[s].grad, theirs.scale[s].grad, theirs.mix_base[s].grad
        grads.update({p + "phi_pre.weight": fn[:n], p + "phi_post.weight": fn[n:2 * n],
                      p + "phi_res.weight": transposed_res(fn[2 * n:]), p + "b_pre": mix_base[:n],
                      p + "b_post": mix_base[n:2 * n], p + "b_res": mix_base[2 * n:].view(n, n).T,
                      p + "scale_pre": scale[0], p + "scale_post": scale[1], p + "scale_res": scale[2]})
    notes = ("their tile_kernels/torch/mhc.py reference in functional.mhc_pre's order around nanoLIMe's baseline "
             "sub-layers; sinkhorn_repeat 20, post_mult_value 2, pre_eps and sinkhorn_eps 0, their bf16 casts undone; "
             "the final state the streams' sum (their mhc_head not run)")
    saved = fixture.save("mhc", args, options, idx, targets, weights, logits, grads, notes)
    fixture.check_against_ours(fixture.our_model(**options), saved)


if __name__ == "__main__":
    main()
