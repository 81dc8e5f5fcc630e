"""MoDA as its authors' code computes it: the fixture tests/fixtures/authors/moda.pt.

    python experiments/authors/moda.py CHECKOUT [--commit=SHA]

CHECKOUT: a local checkout of hustvl/MoDA; the fixture in the repository was made from commit
36a225f4aefa016da7c3e53517d617de07e384d6 (2026-04-21). The authors have released no language model (their README
lists the LLM recipe as to do), so their code here is the attention itself: their reference of the MoDA
operator, `naive_mixture_of_depth_causal_ref` in `libs/moda_triton/tests/ops/test_moda.py` (causal; one softmax
per query over the sequence keys up to its position and the depth keys at its position; the Triton kernel
`parallel_moda` is tested against it), called the way their vision model's `MoDAAttention`
(`vision_tasks/deit/models.py`) calls the kernel: the G query heads of a KV head folded into the sequence
(q reshaped (B, N, G, H_kv, D) -> (B, N * G, H_kv, D), so query head j reads KV head j mod H_kv), depth keys and
values laid out as its `_build_depth_cache` stacks them ([token 0's depths, token 1's depths, ...]).

The language model around it is nanoLIMe's (model.GPT's modules; the relative's choices, docs/deviations.md):
each attention layer writes its own k, v to the depth stream and each MLP but the last its input ln_2(x)
projected by `moda_kv` (the paper's Table 3 row 4; their vision model has row 3's attention-only writers);
RoPE on the queries and the sequence keys as in the baseline, and each depth key rotated at its own position,
the query's (the operator takes keys as given; our arm's pre-RoPE depth logits claim to equal this).

Parameter map: every weight under our name, except the query projection and the output projection, whose heads
are relabelled: their head j = g * H_kv + h is our head h * G + g (our query head p reads KV head p // G), so
their q_proj rows and o_proj columns are ours permuted. Stubbed so that their test file imports: `fla.utils`
(device, check_shared_mem) and `fla.ops.moda` (parallel_moda, the Triton kernel), neither used by the reference.
"""
import importlib.util
import os
import sys
import types

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture  # noqa: E402  (experiments/authors/fixture.py; puts the repository on sys.path)
from model import GPT, GPTConfig, zero_linear  # noqa: E402

REPO = "hustvl/MoDA"


def their_reference(checkout):
    """naive_mixture_of_depth_causal_ref from their test file, its GPU-only imports stubbed (unused by it)."""
    def unused(*args, **kwargs):
        raise RuntimeError("stub: the Triton kernel is not run here")
    stubs = {"fla": {}, "fla.utils": dict(device="cpu", check_shared_mem=unused), "fla.ops": {},
             "fla.ops.moda": dict(parallel_moda=unused)}
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules.setdefault(name, module)
    path = os.path.join(checkout, "libs", "moda_triton", "tests", "ops", "test_moda.py")
    spec = importlib.util.spec_from_file_location("their_test_moda", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.naive_mixture_of_depth_causal_ref


class TheirMoDA(nn.Module):
    """nanoLIMe's baseline modules, each attention computed by their MoDA reference in MoDAAttention's layout."""

    def __init__(self, config, reference):
        super().__init__()
        self.base, self.reference = GPT(config), reference
        hd = config.n_embd // config.n_head
        self.moda_kv = nn.ModuleList([zero_linear(config.n_embd, 2 * config.n_kv_head * hd)
                                      for _ in range(config.n_layer - 1)])

    def forward(self, idx):
        c, base = self.base.config, self.base
        H, H_kv, D = c.n_head, c.n_kv_head, c.n_embd // c.n_head
        G = H // H_kv
        x = base.transformer.wte(idx)
        B, T, _ = x.shape
        depth = []  # every earlier sub-layer's (k, v), (B, T, H_kv, D), before RoPE
        for layer, block in enumerate(base.transformer.h):
            attn, a = block.attn, block.ln_1(x)
            q = base.rope(attn.q_proj(a).view(B, T, H, D), 0)
            k, v = attn.kv_proj(a).view(B, T, 2, H_kv, D).unbind(2)
            q = q.reshape(B, T, G, H_kv, D).reshape(B, T * G, H_kv, D)  # MoDAAttention's folding
            kd = vd = None
            if depth:  # _build_depth_cache's layout; each depth key rotated at its position
                kd = torch.stack([base.rope(kk, 0) for kk, _ in depth], dim=2).reshape(B, T * len(depth), H_kv, D)
                vd = torch.stack([vv for _, vv in depth], dim=2).reshape(B, T * len(depth), H_kv, D)
            o, _ = self.reference(q, base.rope(k, 0), v, kd=kd, vd=vd, scale=D ** -0.5, moda_group_num=G)
            x = x + attn.o_proj(o.reshape(B, T, H * D))
            depth.append((k, v))
            m = block.ln_2(x)
            if layer < c.n_layer - 1:  # the MLP's depth key and value (no attention reads the last one's)
                depth.append(self.moda_kv[layer](m).view(B, T, 2, H_kv, D).unbind(2))
            x = x + block.mlp(m)
        return base.lm_head(base.transformer.ln_f(x))


def main():
    args = fixture.arguments(__doc__, REPO)
    reference = their_reference(args.checkout)

    options = dict(moda=True, n_kv_head=2)
    ours = fixture.our_model(**options)
    fixture.randomize(ours)
    weights = dict(ours.named_parameters())
    c = ours.config
    H, H_kv, D, d = c.n_head, c.n_kv_head, c.n_embd // c.n_head, c.n_embd
    G = H // H_kv
    ours_of_theirs = torch.tensor([(j % H_kv) * G + j // H_kv for j in range(H)])  # their head j: our head
    theirs_of_ours = ours_of_theirs.argsort()

    theirs = TheirMoDA(GPTConfig(**{**fixture.SHAPE, "n_kv_head": H_kv}), reference).float()
    their_params = dict(theirs.named_parameters())
    to_ours = {n: n[len("base."):] for n in their_params if n.startswith("base.")}
    to_ours.update({f"moda_kv.{i}.weight": f"transformer.h.{i}.mlp.moda_kv.weight" for i in range(c.n_layer - 1)})
    assert set(to_ours) == set(their_params) and set(to_ours.values()) == set(weights)

    def to_theirs(name, w):  # our tensor -> theirs: the heads of q_proj (rows) and o_proj (columns) relabelled
        if name.endswith("q_proj.weight"):
            return w.view(H, D, d)[ours_of_theirs].reshape(H * D, d)
        if name.endswith("o_proj.weight"):
            return w.view(d, H, D)[:, ours_of_theirs].reshape(d, H * D)
        return w

    def from_theirs(name, w):
        if name.endswith("q_proj.weight"):
            return w.view(H, D, d)[theirs_of_ours].reshape(H * D, d)
        if name.endswith("o_proj.weight"):
            return w.view(d, H, D)[:, theirs_of_ours].reshape(d, H * D)
        return w

    with torch.no_grad():
        for n, p in their_params.items():
            p.copy_(to_theirs(to_ours[n], weights[to_ours[n]]))

    idx, targets = fixture.batch(c.vocab_size)
    logits = theirs(idx)
    fixture.objective(logits, targets).backward()
    grads = {to_ours[n]: from_theirs(to_ours[n], p.grad) for n, p in their_params.items()}
    notes = ("their naive_mixture_of_depth_causal_ref (libs/moda_triton/tests/ops/test_moda.py) in MoDAAttention's "
             "layout, inside nanoLIMe's baseline; depth writers: attention k, v and each MLP's moda_kv (row 4)")
    saved = fixture.save("moda", args, options, idx, targets, weights, logits, grads, notes)
    fixture.check_against_ours(fixture.our_model(**options), saved)


if __name__ == "__main__":
    main()
