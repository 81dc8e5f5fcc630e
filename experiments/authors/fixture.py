"""Shared by the scripts in experiments/authors/: each builds a relative as its authors' code computes it and as
nanoLIMe does, with the same weights, and writes what the authors' code computed to
tests/fixtures/authors/<relative>.pt, which tests/test_authors.py checks our arm against without the authors' code.

A fixture holds numbers only: the authors' repository and commit, our model's options, the batch (idx, targets),
every weight under OUR parameter name, and the authors' logits, loss and gradients (mapped to our names). The
objective of the backward pass is the mean cross-entropy of the logits against `targets`, the same on both sides.
A new fixture matches .gitignore's `*.pt`: add it with `git add -f` (a tracked one is seen as usual).
"""
import argparse
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
FIXTURES = os.path.join(REPO, "tests", "fixtures", "authors")

from relatives import RelativesConfig, build_model  # noqa: E402  (our public interface)

# the fixtures' shape: small enough that a fixture stays well under 200 KB
SHAPE = dict(block_size=8, vocab_size=32, n_layer=3, n_head=4, n_embd=16, mlp_hidden=32, norm_eps=1e-6)
BATCH, SEQ = 2, 8


def arguments(doc, repo):
    """The command line: the authors' checkout and its commit (read with git when the checkout has its history).
    repo: the authors' repository, owner/name on GitHub."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("checkout", help="a local checkout of the authors' repository")
    p.add_argument("--commit", help="the checkout's commit, when it is no git work tree (e.g. a `git archive`)")
    p.add_argument("--out", help="where to write the fixture (default: tests/fixtures/authors/<relative>.pt)")
    args = p.parse_args()
    if args.commit is None:
        try:
            args.commit = subprocess.run(["git", "-C", args.checkout, "rev-parse", "HEAD"], check=True,
                                         capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            p.error(f"{args.checkout} is no git work tree: give its commit with --commit=<sha>")
    args.repo = repo
    return args


def our_model(**options):
    """nanoLIMe's arm, float32, through relatives.build_model, at SHAPE with the relative's options."""
    torch.manual_seed(0)
    return build_model(RelativesConfig(**{**SHAPE, **options})).float()


@torch.no_grad()
def randomize(model, seed=1):
    """Every weight moved off its init, so that no path is zero or one-hot by construction (MUDD's W2, the one-hot
    averages, norm gains of 1): each parameter plus noise of half its spread (0.1 where it has none)."""
    g = torch.Generator().manual_seed(seed)
    for _, p in sorted(model.named_parameters()):
        spread = p.std().item() if p.numel() > 1 else 0.0
        p.add_(torch.randn(p.shape, generator=g) * (0.5 * spread if spread > 0 else 0.1))


def batch(vocab_size, seed=2):
    """A fixed batch: tokens and next-token targets (B, T)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab_size, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def objective(logits, targets):
    """The loss both sides differentiate: mean cross-entropy, as model.GPT.forward computes it."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


FLOOR = 1e-3  # a gradient tensor's scale is at least FLOOR times the largest gradient (tests/test_authors.py)


def relative_error(ours, theirs, floor=1e-30):
    """max |ours - theirs| / max |theirs|: the error relative to the tensor's scale (at least `floor`)."""
    return ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(floor)).item()


def check_against_ours(model, fixture):
    """Run our arm on the fixture's weights and batch; print and return the largest relative errors."""
    params = dict(model.named_parameters())
    assert set(params) == set(fixture["weights"]), set(params) ^ set(fixture["weights"])
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(fixture["weights"][name])
    model.zero_grad()
    logits, _ = model(fixture["idx"], fixture["targets"])
    objective(logits, fixture["targets"]).backward()
    err_logits = relative_error(logits.detach(), fixture["logits"])
    floor = FLOOR * max(g.abs().max() for g in fixture["grads"].values())
    err_grads = max(relative_error(params[n].grad, g, floor) for n, g in fixture["grads"].items())
    print(f"ours against theirs: logits {err_logits:.2e}, gradients {err_grads:.2e} (max relative error)")
    return err_logits, err_grads


def save(name, args, options, idx, targets, weights, logits, grads, notes):
    """Write tests/fixtures/authors/<name>.pt (or args.out): numbers, our model's options (SHAPE and the relative's:
    what RelativesConfig takes), the source and notes."""
    fixture = dict(repo=args.repo, commit=args.commit, options={**SHAPE, **options}, idx=idx, targets=targets,
                   weights={n: w.detach().clone().contiguous() for n, w in weights.items()},
                   logits=logits.detach().clone().contiguous(),
                   grads={n: g.detach().clone().contiguous() for n, g in grads.items()},
                   notes=notes)
    path = args.out or os.path.join(FIXTURES, f"{name}.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(fixture, path)
    print(f"wrote {path} ({os.path.getsize(path) / 1024:.0f} KB)")
    return fixture
