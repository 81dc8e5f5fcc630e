"""Depth-Attention as its authors' code computes it: the fixture tests/fixtures/authors/depth_attention.pt.

    python experiments/authors/depth_attention.py CHECKOUT [--commit=SHA]

CHECKOUT: a local checkout of hyq718/Depth-Attention; the fixture in the repository was made for commit
3bdad7082c7e63884c030b83d9d3ada3f63dad6d, `src/llamafactory/model/modeling/modeling_llama_depth_attention.py`. From
that file the script takes, by name and without importing the module (whose imports want transformers 4.46 and
flash-attn), the two functions the depth mix runs on: `_depth_attention_split_mix` (the softmax over the source
layers and the layer itself, and the mixed value; what its SDPA path calls through `_get_compiled_depth_mix()`
with LLAMA_DEPTH_COMPILE_MIX unset) and `repeat_kv`. The fetch tool had no snapshot of the repository, so the
fixture was made from a CHECKOUT holding just those two functions, copied from the stored text of that file at that
commit; with a full checkout the script runs unchanged.

Around them the driver wires one forward pass as `LlamaSdpaAttention.forward` (cross_layer_mode 'depth_softmax')
and `LlamaModel.forward` of that file do: query and key after RoPE; layer 0 plain causal attention, storing its
(key, value); layer l > 0, with its source layers' stored (key, mixed value) stacked, the query mean-pooled over the
G heads of each KV head (`query_states.view(B, H_kv, G, T, d).mean(2)`), `mixed_v = _depth_attention_split_mix(
q_depth, cross_k, cross_v, self_k, self_v, sqrt(d))`, stored as (self_k, mixed_v) for later layers, and causal SDPA
with repeat_kv(self_k) and repeat_kv(mixed_v); the source layers those with index % depth_attention_stride == 0.
The sub-layers, norms, RoPE, embedding and head are nanoLIMe's baseline modules (their decoder layer is the same
pre-norm Llama block).

Their settings where ours can express them: GQA (4 query heads, 2 KV heads), depth_attention_stride 2 at 4 layers,
so that the fixture checks which layers are sources (layer 3 reads layers 0 and 2, not 1) as well as the recursion
(layer 2's stored value is its mixed one); their loader's default stride is 1, every earlier layer. Set otherwise
(docs/deviations.md): `use_qk_norm` off (their default and released configs have per-head q and k RMSNorms; our
baseline has none, so their q_norm, k_norm are the identity).
Parameter map: every weight under our name (their q_proj, k_proj, v_proj are our q_proj and kv_proj's halves).
"""
import ast
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture  # noqa: E402  (experiments/authors/fixture.py; puts the repository on sys.path)
from model import GPT, GPTConfig  # noqa: E402

REPO = "hyq718/Depth-Attention"
FILE = os.path.join("src", "llamafactory", "model", "modeling", "modeling_llama_depth_attention.py")
STRIDE, N_LAYER = 2, 4  # layer 2 a source (its value mixed from layer 0's); layer 3 reads 0 and 2, not 1


def their_functions(checkout, names=("_depth_attention_split_mix", "repeat_kv")):
    """The named top-level functions of their modeling file, compiled on their own (the module is not imported)."""
    with open(os.path.join(checkout, FILE)) as f:
        tree = ast.parse(f.read())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert sorted(n.name for n in found) == sorted(names), [n.name for n in found]
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=found, type_ignores=[]), FILE, "exec"), namespace)
    return [namespace[name] for name in names]


class TheirDepthAttention(nn.Module):
    """nanoLIMe's baseline modules, each attention wired as their SDPA path's depth_softmax mode."""

    def __init__(self, config, split_mix, repeat_kv):
        super().__init__()
        self.base, self.split_mix, self.repeat_kv = GPT(config), split_mix, repeat_kv

    def attention(self, attn, x, stored):
        B, T, _ = x.shape
        H, H_kv, d = attn.n_head, attn.n_kv_head, attn.head_dim
        G, rope = H // H_kv, self.base.rope
        q = rope(attn.q_proj(x).view(B, T, H, d), 0).transpose(1, 2)                # (B, H, T, d)
        k, v = attn.kv_proj(x).view(B, T, 2, H_kv, d).unbind(2)
        k, v = rope(k, 0).transpose(1, 2), v.transpose(1, 2)                        # (B, H_kv, T, d)
        sources = [kv for j, kv in enumerate(stored) if j % STRIDE == 0]
        if sources:  # depth_softmax at the KV heads
            q_depth = q.view(B, H_kv, G, T, d).mean(dim=2) if G > 1 else q
            cross_k = torch.stack([kk for kk, _ in sources], dim=0)
            cross_v = torch.stack([vv for _, vv in sources], dim=0)
            v = self.split_mix(q_depth, cross_k, cross_v, k, v, d ** 0.5)
        stored.append((k, v))  # layer_kv_for_reuse: the key and the (mixed) value
        y = F.scaled_dot_product_attention(q, self.repeat_kv(k, G), self.repeat_kv(v, G), is_causal=True)
        return attn.o_proj(y.transpose(1, 2).reshape(B, T, H * d))

    def forward(self, idx):
        base, stored = self.base, []
        x = base.transformer.wte(idx)
        for block in base.transformer.h:
            x = x + self.attention(block.attn, block.ln_1(x), stored)
            x = x + block.mlp(block.ln_2(x))
        return base.lm_head(base.transformer.ln_f(x))


def main():
    args = fixture.arguments(__doc__, REPO)
    split_mix, repeat_kv = their_functions(args.checkout)

    options = dict(depth_attention=True, depth_attention_stride=STRIDE, n_kv_head=2, n_layer=N_LAYER)
    ours = fixture.our_model(**options)
    fixture.randomize(ours)
    weights = dict(ours.named_parameters())

    theirs = TheirDepthAttention(GPTConfig(**{**fixture.SHAPE, "n_kv_head": 2, "n_layer": N_LAYER}), split_mix,
                                 repeat_kv).float()
    their_params = dict(theirs.named_parameters())
    to_ours = {n: n[len("base."):] for n in their_params}
    assert set(to_ours.values()) == set(weights)
    with torch.no_grad():
        for n, p in their_params.items():
            p.copy_(weights[to_ours[n]])

    idx, targets = fixture.batch(ours.config.vocab_size)
    logits = theirs(idx)
    fixture.objective(logits, targets).backward()
    grads = {to_ours[n]: p.grad for n, p in their_params.items()}
    notes = ("their _depth_attention_split_mix and repeat_kv (modeling_llama_depth_attention.py) wired as their SDPA "
             "path's depth_softmax mode around nanoLIMe's baseline modules; stride 2 at 4 layers, GQA, use_qk_norm "
             "off; the checkout held those two functions, copied from the search index's text (no snapshot could be "
             "fetched)")
    saved = fixture.save("depth_attention", args, options, idx, targets, weights, logits, grads, notes)
    fixture.check_against_ours(fixture.our_model(**options), saved)


if __name__ == "__main__":
    main()
