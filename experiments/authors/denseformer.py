"""DenseFormer as its authors' code computes it: the fixture tests/fixtures/authors/denseformer.pt.

    python experiments/authors/denseformer.py CHECKOUT [--commit=SHA]

CHECKOUT: a local checkout of epfml/DenseFormer; the fixture in the repository was made from commit
c99a623bdb5f6611bf0d37e964c67ecbf15c3c19 (2024-03-26). Their released package, `denseformer.DWAModules`, is the
depth weighted average (DWA) meant to be dropped into any transformer (their README's three steps:
`init_accumulators(x)` on the embedding, `x = dwa_modules(x, block_idx=i)` after block i). It runs here around
nanoLIMe's baseline blocks (model.GPT: the embedding, the blocks, the final norm and the LM head are the
baseline's, which DenseFormer does not change), with dilation 1 and period 1: a DWA after every block over the
embedding and every block output so far, the form `denseformer=True` has. Their experiment model
(experiments/models/denseformer.py) computes the same sum (`self.weights`, `torch.tensordot`) around GPT-2
blocks (LayerNorm, GELU, learned positions), which nanoLIMe's Llama blocks are not.

Parameter map: their `alphas.{i}.weight` (1, i + 2) -> our `dwa.{i}.weight` (i + 2); every other weight is the
baseline's, under the same name on both sides. Nothing of theirs is stubbed.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture  # noqa: E402  (experiments/authors/fixture.py; puts the repository on sys.path)
from model import GPT, GPTConfig  # noqa: E402

REPO = "epfml/DenseFormer"


class TheirDenseFormer(torch.nn.Module):
    """Their DWAModules around the baseline's blocks, as their README wires it."""

    def __init__(self, base, dwa_modules):
        super().__init__()
        self.base, self.dwa_modules = base, dwa_modules

    def forward(self, idx):
        x = self.base.transformer.wte(idx)
        self.dwa_modules.init_accumulators(x)  # step 2
        for i, block in enumerate(self.base.transformer.h):
            x = block(x, self.base.rope)
            x = self.dwa_modules(x, block_idx=i)  # step 3
        return self.base.lm_head(self.base.transformer.ln_f(x))


def main():
    args = fixture.arguments(__doc__, REPO)
    sys.path.insert(0, args.checkout)
    from denseformer import DWAModules

    options = dict(denseformer=True)
    ours = fixture.our_model(**options)
    fixture.randomize(ours)
    weights = dict(ours.named_parameters())

    base = GPT(GPTConfig(**fixture.SHAPE)).float()
    dwa = DWAModules(ours.config.n_layer, dilation=1, period=1)
    theirs = TheirDenseFormer(base, dwa)
    to_ours = {f"dwa_modules.alphas.{i}.weight": f"dwa.{i}.weight" for i in range(ours.config.n_layer)}
    to_ours.update({f"base.{n}": n for n, _ in base.named_parameters()})
    their_params = dict(theirs.named_parameters())
    assert set(to_ours) == set(their_params) and set(to_ours.values()) == set(weights)
    with torch.no_grad():
        for theirs_name, ours_name in to_ours.items():
            their_params[theirs_name].copy_(weights[ours_name].view_as(their_params[theirs_name]))

    idx, targets = fixture.batch(ours.config.vocab_size)
    logits = theirs(idx)
    fixture.objective(logits, targets).backward()
    grads = {to_ours[n]: p.grad.view_as(weights[to_ours[n]]) for n, p in their_params.items()}
    notes = ("their denseformer.DWAModules (dilation 1, period 1) around nanoLIMe's baseline blocks, "
             "as their README wires it")
    saved = fixture.save("denseformer", args, options, idx, targets, weights, logits, grads, notes)
    fixture.check_against_ours(fixture.our_model(**options), saved)


if __name__ == "__main__":
    main()
