"""
What analyze.py measures of a model's representations: the router map (paper Sec. 5.4), the matrix-based
Renyi entropy and the linear probe's accuracy, token separability (Sec. 5.2), and the Recorder that captures,
per layer, the values, the routed values and the residual stream of a forward pass. Functions of a model and
of arrays; analyze.py runs them over trained runs and writes what they find.
"""

import math
import re

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from model import route_reference

# ----------------------------------------------------------------------------- measures


def renyi_entropy(Z, order=0.99):
    """Matrix-based Renyi entropy of the rows of Z (t x d).

    K = Z Z^T, p_i = lambda_i(K) / tr(K), S = log(sum_i p_i^order) / (1 - order) (the paper's S_alpha, Sec. 5.2).
    The nonzero eigenvalues of Z Z^T and Z^T Z coincide, so the smaller Gram
    matrix is decomposed (float64). t orthogonal rows of equal norm give log t;
    a rank-one Z gives 0.
    """
    Z = torch.as_tensor(np.asarray(Z) if not torch.is_tensor(Z) else Z).detach().to('cpu', torch.float64)
    Z = Z.reshape(Z.shape[0], -1)
    K = Z @ Z.T if Z.shape[0] <= Z.shape[1] else Z.T @ Z
    lam = torch.linalg.eigvalsh(K).clamp_min(0)
    tr = lam.sum()
    if tr <= 0:
        return 0.0
    p = lam / tr
    p = p[p > 0]
    if abs(1 - order) < 1e-12:  # the Shannon limit
        return float(-(p * p.log()).sum())
    return float(torch.log((p ** order).sum()) / (1 - order))


def router_map(model):
    """L x L array M (rows: layer l, columns: source layer j <= l; zeros above the
    diagonal): M[l, j] = mean over target and source heads of |R^l[h, j*H_kv + h']|,
    each row normalised to sum 1. Row 0 is [1, 0, ...] (layer 0 reads only its
    own keys and values). None for a model without routers.
    For the dynamic router this is its static part."""
    if not model.config.lime:
        return None
    blocks = model.transformer.h
    L = len(blocks)
    M = np.zeros((L, L))
    M[0, 0] = 1.0
    for layer in range(1, L):
        R = blocks[layer].attn.router.matrix().detach().abs().double().cpu()  # (H_kv, (layer+1)*H_kv)
        n_kv = R.shape[0]
        per_source = R.view(n_kv, layer + 1, n_kv).mean(dim=(0, 2)).numpy()
        total = per_source.sum()
        M[layer, :layer + 1] = per_source / total if total > 0 else 1.0 / (layer + 1)
    return M


def _folds(y, folds, seed):
    """Stratified fold index for every sample."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=np.int64)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        fold[idx] = np.arange(len(idx)) % folds
    return fold


def _fit_logreg(X, y, n_classes, l2, max_iter):
    W = torch.zeros(X.shape[1], n_classes, dtype=X.dtype, requires_grad=True)
    b = torch.zeros(n_classes, dtype=X.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=max_iter, history_size=20,
                            line_search_fn='strong_wolfe', tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(X @ W + b, y) + l2 * (W * W).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return W.detach(), b.detach()


def probe_accuracy(X, y, folds=5, seed=0, l2=1e-3, max_iter=100):
    """k-fold cross-validated accuracy of a linear classifier on (X, y).

    Multinomial logistic regression with an L2 penalty l2*||W||^2, fit by L-BFGS
    in float64 on features standardised with the training fold's statistics;
    stratified folds. Returns (mean accuracy, std over folds)."""
    X = torch.as_tensor(np.asarray(X, dtype=np.float64))
    y_np = np.asarray(y)
    classes, y_idx = np.unique(y_np, return_inverse=True)
    y_t = torch.as_tensor(y_idx, dtype=torch.long)
    fold = _folds(y_idx, folds, seed)
    accs = []
    with torch.enable_grad():
        for k in range(folds):
            tr, te = torch.as_tensor(fold != k), torch.as_tensor(fold == k)
            if te.sum() == 0:
                continue
            mu, sd = X[tr].mean(0), X[tr].std(0).clamp_min(1e-8)
            W, b = _fit_logreg((X[tr] - mu) / sd, y_t[tr], len(classes), l2, max_iter)
            pred = (((X[te] - mu) / sd) @ W + b).argmax(1)
            accs.append(float((pred == y_t[te]).double().mean()))
    return float(np.mean(accs)), float(np.std(accs))


# ----------------------------------------------------------------------------- recording


class Recorder:
    """Forward hooks capturing, per layer, the values (W_V's output: the v half of attn.kv_proj),
    the routed values (what a static LIMe router makes attention read) and the block outputs: the
    residual stream after each block. A relative's stream (relatives/) runs the blocks itself and
    reports both to its hooks (relatives/base.py's Stream): what it outputs after each block (HC,
    mHC: the streams' sum; DenseFormer: the average; AttnRes: the mix of every output so far), and
    the values of MUDDFormer's attention, projected from its own value input."""

    def __init__(self, model):
        self.model, self.keep = model, None
        self.handles = []
        for layer, block in enumerate(model.transformer.h):
            self.handles.append(block.attn.kv_proj.register_forward_hook(self._hook('kv', layer)))
            self.handles.append(block.register_forward_hook(self._hook('hidden', layer)))
        self.stream_hooks = getattr(model, 'stream_hooks', [])  # relatives.RelativesGPT's
        self.stream_hooks.append(self._stream_hook)

    def _stream_hook(self, kind, layer, x):
        self._hook(kind, layer)(None, None, x)

    def _hook(self, kind, layer):
        def fn(module, inp, out):
            if kind == 'kv':  # kv_proj's (B, T, 2 * H_kv * d_h), or a stream's (B, T, 2, H_kv, d_h)
                n_kv = self.model.config.n_kv_head
                out = out.view(*out.shape[:2], 2, n_kv, -1)
            out = out.detach()
            if self.keep is not None:  # one position per sequence
                out = out[torch.arange(out.size(0), device=out.device), self.keep]
            else:
                out = out.flatten(0, 1)
            self.store[kind].setdefault(layer, []).append(out.float().cpu())
        return fn

    def run(self, windows, keep=None, batch_size=16):
        """windows: LongTensor (n, T); keep: LongTensor (n,) positions, or None for all.
        Returns {kind: per-layer (N, features)} for kind in values, routed_values (static
        LIMe routers only), hidden."""
        self.store = {'kv': {}, 'hidden': {}}
        device = next(self.model.parameters()).device
        with torch.no_grad():
            for i in tqdm(range(0, len(windows), batch_size), desc='recording', unit='batch', leave=False,
                          disable=None):  # None: on a terminal only
                self.keep = None if keep is None else keep[i:i + batch_size].to(device)
                self.model(windows[i:i + batch_size].to(device))  # hooks see every position
        self.keep = None
        L = len(self.model.transformer.h)
        kv = [torch.cat(self.store['kv'][layer]) for layer in range(L)]  # (N, 2, H_kv, d_h)
        reps = {'values': [x[:, 1].flatten(1) for x in kv]}
        rv = routed_values(self.model, kv)
        if rv is not None:
            reps['routed_values'] = rv
        reps['hidden'] = [torch.cat(self.store['hidden'][layer]) for layer in range(L)]
        return reps

    def close(self):
        for h in self.handles:
            h.remove()
        self.stream_hooks.remove(self._stream_hook)


def routed_values(model, kv):
    """The values attention reads under a static LIMe router: v~_l[h] = sum_s R^l[h, s] v_s
    (eq. 2, model.route_reference). kv: per layer the recorded [k; v] (N, 2, H_kv, d_h).
    Per layer (N, H_kv * d_h); None for the baseline or a dynamic (per-token) router."""
    if not model.config.lime or model.config.router == 'dynamic':
        return None
    out = [kv[0][:, 1].flatten(1)]  # layer 0 reads its own values
    for layer in range(1, len(kv)):
        R = model.transformer.h[layer].attn.router.matrix().detach().double().cpu()
        # the stacked KV (S, 2, B, T, d_h), each recorded position a sequence of length 1
        sources = torch.cat(kv[:layer + 1], dim=2).permute(2, 1, 0, 3).unsqueeze(3).double()
        out.append(route_reference(R, sources)[:, 1, :, 0].transpose(0, 1).flatten(1).float())
    return out


def entropy_windows(val, T, num_tokens):
    n = max(1, math.ceil(num_tokens / T))
    starts = np.linspace(0, max(0, len(val) - T - 1), n).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(val[s:s + T], dtype=np.int64) for s in starts]))


def find_word_positions(val, meta, encode, decode, words, limit_tokens=2_000_000):
    """{word: array of token positions} of whole-word occurrences in val (first limit_tokens).
    Char-level: position of the word's last character. BPE: the token ' word'."""
    ids = np.asarray(val[:limit_tokens])
    out = {}
    if meta.get('kind') == 'bpe':
        for w in words:
            tok = encode(' ' + w)
            if len(tok) != 1:
                tok = encode(w)
            out[w] = np.flatnonzero(ids == tok[0]) if len(tok) == 1 else np.array([], dtype=np.int64)
        return out
    text = decode(ids.tolist())
    assert len(text) == len(ids), 'char-level data: one character per token'
    for w in words:
        pat = re.compile(r'(?<![A-Za-z0-9])' + re.escape(w) + r'(?![A-Za-z0-9])')
        out[w] = np.array([m.end() - 1 for m in pat.finditer(text)], dtype=np.int64)
    return out


def separability(recorder, val, positions, T, max_per_word, folds=5, seed=0, max_iter=100):
    words = list(positions)
    counts = {w: len(p) for w, p in positions.items()}
    n_per = min(min(counts.values()), max_per_word) if counts else 0
    if n_per < 2 * folds:
        return {'skipped': f'too few occurrences {counts}', 'counts': counts}
    rng = np.random.default_rng(seed)
    sel, labels = [], []
    for c, w in enumerate(words):
        p = positions[w]
        p = p[p >= 1]  # at least one token of context
        sel.append(np.sort(rng.choice(p, size=min(n_per, len(p)), replace=False)))
        labels.append(np.full(len(sel[-1]), c))
    pos, y = np.concatenate(sel), np.concatenate(labels)
    starts = np.maximum(0, pos - T + 1)
    windows = torch.from_numpy(np.stack([np.asarray(val[s:s + T], dtype=np.int64) for s in starts]))
    keep = torch.from_numpy(pos - starts)
    reps = recorder.run(windows, keep)
    res = {'words': words, 'n_per_word': int(n_per), 'counts': counts, 'folds': folds,
           'context': int(T), 'position': 'char-level: last character of the word; bpe: the word token'}
    for kind, per_layer in reps.items():
        res[kind] = [probe_accuracy(Z.numpy(), y, folds=folds, seed=seed, max_iter=max_iter)
                     for Z in tqdm(per_layer, desc=f'probing {kind}', unit='layer', leave=False, disable=None)]
    return res
