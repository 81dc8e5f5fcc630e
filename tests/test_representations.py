"""Tests for study/representations.py: the Renyi entropy, the router map and the linear probe against values
worked out by hand, and the Recorder against the model's own computation (study/analyze.py end to end:
test_analyze.py)."""
import contextlib
import math
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from study import representations  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from relatives import RelativesConfig, build_model  # noqa: E402
from conftest import Terminal  # noqa: E402


# ----------------------------------------------------------------------------- entropy

@pytest.mark.parametrize('t,d', [(5, 8), (8, 8), (3, 40)])
def test_entropy_orthogonal_rows(t, d):
    g = torch.Generator().manual_seed(t * d)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    Z = 2.5 * Q[:t]  # t orthonormal rows, equal norms
    assert representations.renyi_entropy(Z) == pytest.approx(math.log(t), abs=1e-9)
    assert representations.renyi_entropy(Z, order=2.0) == pytest.approx(math.log(t), abs=1e-9)


def test_entropy_rank_one():
    u, v = torch.randn(50, 1), torch.randn(1, 16)
    assert representations.renyi_entropy(u @ v) == pytest.approx(0.0, abs=1e-8)
    assert representations.renyi_entropy(np.ones((7, 3))) == pytest.approx(0.0, abs=1e-8)


def test_entropy_is_renyi_of_spectrum():
    # orthogonal rows with squared norms p: the spectrum of K is p itself
    p = np.array([0.5, 0.25, 0.125, 0.125])
    Z = np.diag(np.sqrt(p)) @ np.linalg.qr(np.random.default_rng(0).normal(size=(6, 6)))[0][:4]
    for order in (0.5, 0.99, 2.0):
        want = math.log((p ** order).sum()) / (1 - order)
        assert representations.renyi_entropy(Z, order) == pytest.approx(want, abs=1e-9)
    assert representations.renyi_entropy(Z, 0.99) != pytest.approx(math.log(4), abs=1e-3)


@pytest.mark.parametrize('t,d', [(30, 10), (10, 30)])
def test_entropy_matches_direct_gram(t, d):
    Z = np.random.default_rng(1).normal(size=(t, d)) * np.linspace(0.1, 3, d)
    lam = np.clip(np.linalg.eigvalsh(Z @ Z.T), 0, None)  # the t x t Gram matrix, literally
    p = lam / lam.sum()
    p = p[p > 0]
    want = math.log((p ** 0.99).sum()) / 0.01
    assert representations.renyi_entropy(torch.tensor(Z, dtype=torch.float32)) == pytest.approx(want, rel=1e-4)


# ----------------------------------------------------------------------------- router map

def tiny(lime=True, router='full', n_layer=4, **kw):
    cfg = dict(block_size=64, vocab_size=30, n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=32,
               lime=lime, router=router)
    cfg.update(kw)
    torch.manual_seed(0)
    return build_model(RelativesConfig(**cfg)), cfg


def test_router_map_rows_sum_to_one():
    model, _ = tiny()
    M = representations.router_map(model)
    assert M.shape == (4, 4)
    np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-12)
    assert np.all(M[np.triu_indices(4, 1)] == 0)
    np.testing.assert_array_equal(M[0], [1, 0, 0, 0])
    assert np.all(M >= 0)
    assert representations.router_map(tiny(lime=False)[0]) is None


def test_router_map_known_values():
    model, _ = tiny()
    n_kv = 2
    with torch.no_grad():
        w = model.transformer.h[2].attn.router.weight  # (H_kv, 3 * H_kv), source s = j*H_kv + h'
        w.zero_()
        w[:, 0:n_kv] = -1.0        # layer 0: |.| = 1
        w[:, n_kv:2 * n_kv] = 3.0  # layer 1
        w[0, 2 * n_kv] = 4.0       # layer 2: mean |.| over 4 entries = 1
    M = representations.router_map(model)
    np.testing.assert_allclose(M[2, :3], [1 / 5, 3 / 5, 1 / 5], atol=1e-12)


def test_router_map_reads_the_routers_matrix():
    # the map is built from attn.router.matrix() (the full router, whatever the variant stores)
    model, _ = tiny()
    known = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0, 0.0, 4.0]])
    model.transformer.h[2].attn.router.matrix = lambda: known
    M = representations.router_map(model)
    np.testing.assert_allclose(M[2, :3], [0, 2 / 3, 1 / 3], atol=1e-12)


def test_router_map_variants():
    M = representations.router_map(tiny(router='average')[0])
    for layer in range(4):
        np.testing.assert_allclose(M[layer, :layer + 1], 1 / (layer + 1), atol=1e-12)
    M = representations.router_map(tiny(router='last-2', n_layer=5)[0])
    np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-12)
    assert M[4, 0] == 0 and M[4, 1] == 0 and M[4, 2] == 0 and M[4, 3] > 0
    M = representations.router_map(tiny(router='first-1', n_layer=5)[0])
    assert M[4, 1] == 0 and M[4, 2] == 0 and M[4, 0] > 0 and M[4, 4] > 0


# ----------------------------------------------------------------------------- probe

def test_probe_accuracy():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 60)
    centers = rng.normal(size=(4, 16)) * 3
    X = centers[y] + rng.normal(size=(240, 16))
    m, s = representations.probe_accuracy(X, y, folds=5)
    assert m > 0.95 and 0 <= s < 0.1
    m_rand, _ = representations.probe_accuracy(rng.normal(size=(240, 16)), y, folds=5)
    assert m_rand < 0.45
    # string labels work too, and the result is deterministic
    words = np.array(['is', 'are', 'was', 'were'])[y]
    assert representations.probe_accuracy(X, words) == representations.probe_accuracy(X, words)



# ----------------------------------------------------------------------------- recording

def test_recorder_captures_w_v_and_block_outputs():
    model, cfg = tiny(n_layer=2)
    idx = torch.randint(0, 30, (2, 10))
    rec = representations.Recorder(model)
    with contextlib.redirect_stderr(Terminal()) as terminal:  # a progress bar on a terminal
        reps = rec.run(idx, batch_size=1)
    rec.close()
    assert 'recording:   0%|          | 0/2' in terminal.getvalue()  # drawn at its start; cleared at the end
    with torch.no_grad():
        x = model.transformer.wte(idx)
        h0 = model.transformer.h[0]
        kv = h0.attn.kv_proj(h0.ln_1(x)).view(2, 10, 2, -1)
        want_v = kv[:, :, 1].reshape(20, -1)
        want_h = h0(x, model.rope, [])
    torch.testing.assert_close(reps['values'][0], want_v)
    torch.testing.assert_close(reps['hidden'][0], want_h.reshape(20, -1))
    assert len(reps['values']) == 2 and reps['values'][1].shape == (20, 2 * 8)
    assert not model.transformer.h[0]._forward_hooks  # hooks removed


@pytest.mark.parametrize('router', ['full', 'last-2', 'average'])
def test_routed_values_are_what_attention_reads(router):
    # the model's own router output (H_kv, 2, B, T, d_h) = [k~; v~]: its v~ half, position by position
    model, _ = tiny(router=router)
    seen = {}
    for layer, block in enumerate(model.transformer.h[1:], 1):
        block.attn.router.register_forward_hook(lambda m, inp, out, layer=layer: seen.__setitem__(layer, out[:, 1]))
    idx = torch.randint(0, 30, (2, 10))
    rec = representations.Recorder(model)
    reps = rec.run(idx)
    rec.close()
    assert len(reps['routed_values']) == 4
    torch.testing.assert_close(reps['routed_values'][0], reps['values'][0])  # layer 0 reads its own values
    for layer, v in seen.items():  # (H_kv, B, T, d_h) -> (B * T, H_kv * d_h)
        torch.testing.assert_close(reps['routed_values'][layer], v.permute(1, 2, 0, 3).reshape(20, -1),
                                   atol=1e-5, rtol=1e-5)
    assert not torch.allclose(reps['routed_values'][3], reps['values'][3])



@pytest.mark.parametrize('kw', [dict(hc=2), dict(router='dynamic'), dict(router='first-1'),
                                dict(lime=False, n_kv_head=1)])
def test_recorder_and_router_map_on_variants(kw):
    model, cfg = tiny(n_layer=3, **kw)
    rec = representations.Recorder(model)
    reps = rec.run(torch.randint(0, 30, (2, 12)), keep=torch.tensor([3, 11]))
    rec.close()
    d_v = cfg['n_kv_head'] * 8 if 'n_kv_head' in kw else 2 * 8
    assert [tuple(z.shape) for z in reps['hidden']] == [(2, 32)] * 3
    assert [tuple(z.shape) for z in reps['values']] == [(2, d_v)] * 3
    M = representations.router_map(model)
    if cfg['lime']:
        np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-12)
    assert ('routed_values' in reps) == (cfg['lime'] and cfg['router'] != 'dynamic')

