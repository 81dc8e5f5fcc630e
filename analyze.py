"""
Representation-collapse and training-curve analysis of trained runs
(paper Sec. 5.2, 5.4, Figs. 1, 2, 4a, 5, 7, 9).

$ python analyze.py out-lime out-base [--save_dir=DIR] [--device=cpu] [--num_tokens=4096]
                    [--probe_words=is,are,was,were] [--max_per_word=400] [--data_dir=data]

For every out_dir with a ckpt.pt ('model_args', 'model', 'config' incl. 'dataset'),
on the dataset's val.bin (data/<dataset>/, read with meta.pkl):
  * router map (LIMe only): for layer l >= 1, |R^l| averaged over heads for every
    source layer j <= l, normalised per layer (rows sum to 1; layer 0 reads only
    itself) -> router_map.csv / router_map.png
  * matrix-based Renyi entropy (alpha 0.99, float64 eigenvalues, K = Z Z^T,
    p = lambda / tr K) per layer of
      - values: the output of the layer's W_V (the v half of attn.kv_proj),
      - hidden: the residual stream after each block (HC streams summed),
      - routed_values (LIMe, static routers): the values attention actually
        reads, sum_s R^l[h, s] v_s,
    on num_tokens validation tokens (no centering; the paper's definition).
  * token separability: a 4-way linear probe (multinomial logistic regression,
    5-fold stratified cross-validation, mean +- std over folds) per layer on the
    representations at occurrences of is / are / was / were (class-balanced).
    Char-level data: the representation at the word's LAST character (whole
    words only); BPE: the single token ' is', ' are', ... Arithmetic data:
    the numbers 1, 2, 3, 4 by default (paper Fig. 8).
  -> analysis.json (per run)
From every out_dir's log.jsonl (one JSON object per logged iteration: iter,
tokens, flops, loss, val_loss, ...): loss vs training FLOPs and vs tokens for all
runs, and final val loss vs depth (n_layer) per model family.
Combined outputs: entropy.{csv,png}, separability.{csv,png}, curves.csv,
loss_vs_flops.png, loss_vs_tokens.png, depth_sweep.{csv,png}, summary.json.

Outputs go to --save_dir if given (per-run files prefixed with the run name),
else per-run files into each out_dir and combined files into the first out_dir.
Without matplotlib only CSV/JSON are written.
"""

import argparse
import csv
import json
import math
import os
import pickle
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------- pure functions


def renyi_entropy(Z, alpha=0.99):
    """Matrix-based Renyi entropy of the rows of Z (t x d).

    K = Z Z^T, p_i = lambda_i(K) / tr(K), S = log(sum_i p_i^alpha) / (1 - alpha).
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
    if abs(1 - alpha) < 1e-12:  # the Shannon limit
        return float(-(p * p.log()).sum())
    return float(torch.log((p ** alpha).sum()) / (1 - alpha))


def _router_matrix(attn):
    """The effective full H_kv x (l+1)*H_kv router of one attention module, or None."""
    for owner in (attn, getattr(attn, 'router', None)):
        if owner is None:
            continue
        for name in ('router_matrix', 'matrix'):
            fn = getattr(owner, name, None)
            if callable(fn):
                return fn().detach()
    r = getattr(attn, 'router', None)
    if torch.is_tensor(r):
        return r.detach()
    w = getattr(r, 'weight', None)
    if torch.is_tensor(w):
        return w.detach()
    for name, p in attn.named_parameters():
        if 'router' in name and p.dim() == 2:
            return p.detach()
    return None


def router_map(model):
    """L x L array M (rows: layer l, columns: source layer j <= l; zeros above the
    diagonal): M[l, j] = mean over target and source heads of |R^l[h, j*H_kv + h']|,
    each row normalised to sum 1. Row 0 is [1, 0, ...] (layer 0 reads only its
    own keys and values). None for a model without routers.
    For the dynamic router this is its static part."""
    blocks = model.transformer.h
    L = len(blocks)
    M = np.zeros((L, L))
    M[0, 0] = 1.0
    found = False
    for l in range(1, L):
        R = _router_matrix(blocks[l].attn)
        if R is None:
            continue
        found = True
        R = R.abs().double().cpu()
        n_kv = R.shape[0]
        if R.shape[1] != (l + 1) * n_kv:
            raise ValueError(f'layer {l}: router of shape {tuple(R.shape)}, expected ({n_kv}, {(l + 1) * n_kv})')
        per_layer = R.view(n_kv, l + 1, n_kv).mean(dim=(0, 2)).numpy()
        s = per_layer.sum()
        M[l, :l + 1] = per_layer / s if s > 0 else 1.0 / (l + 1)
    return M if found else None


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


# ----------------------------------------------------------------------------- loading


def load_meta(dataset, data_dir=None):
    path = os.path.join(data_dir or os.path.join(HERE, 'data'), dataset)
    with open(os.path.join(path, 'meta.pkl'), 'rb') as f:
        meta = pickle.load(f)
    return path, meta


def get_codec(meta):
    try:
        from prepare import load_codec
        return load_codec(meta)
    except ImportError:  # pragma: no cover - prepare.py missing
        if 'stoi' in meta:
            stoi, itos = meta['stoi'], meta['itos']
            return (lambda s: [stoi[c] for c in s]), (lambda ids: ''.join(itos[int(i)] for i in ids))
        raise


def load_run(out_dir, device='cpu'):
    """(model or None, ckpt dict or None)."""
    path = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.exists(path):
        return None, None
    from model import GPT, GPTConfig
    ckpt = torch.load(path, map_location=device, weights_only=False)
    model = GPT(GPTConfig(**ckpt['model_args']))
    sd = {k[len('_orig_mod.'):] if k.startswith('_orig_mod.') else k: v for k, v in ckpt['model'].items()}
    model.load_state_dict(sd)
    model.to(device).eval()
    return model, ckpt


def read_log(out_dir):
    rows = []
    path = os.path.join(out_dir, 'log.jsonl')
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def family(model_args):
    if not model_args:
        return 'unknown'
    if model_args.get('lime'):
        r = model_args.get('router', 'full')
        return 'LIMe' if r in (None, 'full') else f'LIMe-{r}'
    if model_args.get('hc'):
        return 'HC-dynamic' if model_args.get('hc_dynamic') else 'HC'
    return 'LLaMA'


# ----------------------------------------------------------------------------- representations


class Recorder:
    """Forward hooks capturing, per layer, W_V outputs ('values') and block outputs ('hidden')."""

    def __init__(self, model):
        self.model, self.handles, self.keep = model, [], None
        self.store = {'values': {}, 'hidden': {}}
        for l, block in enumerate(model.transformer.h):
            attn = block.attn
            if hasattr(attn, 'v_proj'):
                self.handles.append(attn.v_proj.register_forward_hook(self._hook('values', l, None)))
            elif hasattr(attn, 'kv_proj'):  # fused [k | v]: (B, T, 2 * H_kv * d_h)
                self.handles.append(attn.kv_proj.register_forward_hook(self._hook('values', l, 'kv')))
            self.handles.append(block.register_forward_hook(self._hook('hidden', l, 'block')))

    def _hook(self, kind, layer, how):
        def fn(module, inp, out):
            if isinstance(out, (tuple, list)):
                out = out[0]
            if how == 'kv':
                out = out.view(*out.shape[:2], 2, -1)[:, :, 1]
            elif how == 'block' and out.dim() == 4:  # hyper-connections: (B, T, n, d) streams, summed
                out = out.sum(2)
            out = out.detach()
            if self.keep is not None:  # one position per sequence
                out = out[torch.arange(out.size(0), device=out.device), self.keep]
            else:
                out = out.reshape(-1, out.size(-1))
            self.store[kind].setdefault(layer, []).append(out.float().cpu())
        return fn

    def run(self, windows, keep=None, batch_size=16):
        """windows: LongTensor (n, T); keep: LongTensor (n,) positions, or None for all."""
        self.store = {'values': {}, 'hidden': {}}
        device = next(self.model.parameters()).device
        with torch.no_grad():
            for i in range(0, len(windows), batch_size):
                self.keep = None if keep is None else keep[i:i + batch_size].to(device)
                idx = windows[i:i + batch_size].to(device)
                self.model(idx)  # hooks see every position; only the logits are cut
        self.keep = None
        L = len(self.model.transformer.h)
        return {k: [torch.cat(v[l]) for l in range(L)] for k, v in self.store.items() if v}

    def close(self):
        for h in self.handles:
            h.remove()


def routed_values(model, values):
    """Values as attention reads them for static LIMe routers: v~_l[h] = sum_s R^l[h, s] v_s.
    values: list over layers of (N, H_kv * d_h). None for non-LIMe or dynamic routers."""
    cfg = model.config
    if not getattr(cfg, 'lime', False) or getattr(cfg, 'router', 'full') == 'dynamic':
        return None
    n_kv = cfg.n_kv_head
    vs = [v.view(v.size(0), n_kv, -1).double() for v in values]
    out = [values[0]]
    for l in range(1, len(vs)):
        R = _router_matrix(model.transformer.h[l].attn)
        if R is None:
            return None
        src = torch.cat(vs[:l + 1], dim=1)  # (N, (l+1)*H_kv, d_h), source order j*H_kv + h
        out.append(torch.einsum('hs,nsd->nhd', R.double().cpu(), src).reshape(src.size(0), -1).float())
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
        res[kind] = [probe_accuracy(Z.numpy(), y, folds=folds, seed=seed, max_iter=max_iter) for Z in per_layer]
    rv = routed_values(recorder.model, reps['values']) if 'values' in reps else None
    if rv is not None:
        res['routed_values'] = [probe_accuracy(Z.numpy(), y, folds=folds, seed=seed, max_iter=max_iter)
                                for Z in rv]
    return res


# ----------------------------------------------------------------------------- plotting / writing


def get_plt():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def write_csv(path, header, rows):
    with open(path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def plot_router_map(plt, M, title, path):
    L = M.shape[0]
    fig, ax = plt.subplots(figsize=(1 + 0.5 * L, 0.8 + 0.45 * L))
    masked = np.ma.masked_where(np.triu(np.ones_like(M), 1) > 0, M)
    im = ax.imshow(masked, cmap='viridis', vmin=0, vmax=1, origin='upper')
    if L <= 16:
        for l in range(L):
            for j in range(l + 1):
                ax.text(j, l, f'{M[l, j]:.2f}', ha='center', va='center', fontsize=7,
                        color='white' if M[l, j] < 0.6 else 'black')
    ax.set_xlabel('source layer j (buffered keys/values)')
    ax.set_ylabel('layer l')
    ax.set_xticks(range(L))
    ax.set_yticks(range(L))
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_per_layer(plt, results, key, ylabel, path, with_std=False):
    kinds = [k for k in ('values', 'routed_values', 'hidden') if any(k in (r.get(key) or {}) for r in results)]
    if not kinds:
        return
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 3.6), squeeze=False,
                             sharey=with_std)
    for ax, kind in zip(axes[0], kinds):
        for i, r in enumerate(results):  # one colour per run in every panel
            vals = (r.get(key) or {}).get(kind)
            if not vals:
                continue
            if with_std:
                m, s = np.array([v[0] for v in vals]), np.array([v[1] for v in vals])
                ax.errorbar(range(len(m)), m, yerr=s, marker='o', ms=3, capsize=2, label=r['run'], color=f'C{i % 10}')
            else:
                ax.plot(range(len(vals)), vals, marker='o', ms=3, label=r['run'], color=f'C{i % 10}')
        ax.set_title(kind.replace('_', ' '))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel('layer')
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_curves(plt, logs, xkey, xlabel, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    any_line = False
    for i, (name, rows) in enumerate(logs.items()):
        # x > 0 only: the x axis is logarithmic and the iter-0 evaluation sits at 0 FLOPs / tokens
        pts = [(r[xkey], r['loss']) for r in rows if (r.get(xkey) or 0) > 0 and r.get('loss') is not None]
        vpts = [(r[xkey], r['val_loss']) for r in rows if (r.get(xkey) or 0) > 0 and r.get('val_loss') is not None]
        color = f'C{i % 10}'
        if pts:
            line, = ax.plot(*zip(*pts), alpha=0.4, lw=1, color=color)
            any_line = True
        if vpts:
            ax.plot(*zip(*vpts), marker='o', ms=3, color=color, label=f'{name} (val)')
            any_line = True
        elif pts:
            line.set_label(f'{name} (train)')
    if not any_line:
        plt.close(fig)
        return
    ax.set_xlabel(xlabel)
    ax.set_ylabel('loss (thin: train, markers: val)')
    ax.set_xscale('log')
    ax.grid(alpha=0.3, which='both')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def final_val_loss(rows, ckpt):
    vals = [r['val_loss'] for r in rows if r.get('val_loss') is not None]
    if vals:
        return vals[-1]
    if ckpt and ckpt.get('best_val_loss') is not None:
        return float(ckpt['best_val_loss'])
    return None


# ----------------------------------------------------------------------------- main


def analyze_run(out_dir, model, ckpt, args):
    cfg = ckpt.get('config') or {}
    dataset = args.dataset or cfg.get('dataset')
    res = {'run': None, 'out_dir': out_dir, 'dataset': dataset, 'model_args': ckpt['model_args'],
           'family': family(ckpt['model_args'])}
    M = router_map(model)
    res['router_map'] = None if M is None else M.tolist()
    if not dataset:
        res['skipped'] = 'no dataset in ckpt config (pass --dataset)'
        return res
    try:
        data_path, meta = load_meta(dataset, args.data_dir or cfg.get('data_dir') or None)
    except FileNotFoundError as e:
        res['skipped'] = f'{e.filename} not found (python prepare.py {dataset}, or --data_dir)'
        print(f'{out_dir}: {res["skipped"]}; router map only')
        return res
    val = np.memmap(os.path.join(data_path, 'val.bin'), dtype=np.uint16, mode='r')
    T = min(model.config.block_size, args.context or model.config.block_size, len(val) - 1)
    rec = Recorder(model)
    try:
        reps = rec.run(entropy_windows(val, T, args.num_tokens), batch_size=args.batch_size)
        ent = {k: [renyi_entropy(Z[:args.num_tokens], args.alpha) for Z in v] for k, v in reps.items()}
        rv = routed_values(model, reps['values']) if 'values' in reps else None
        if rv is not None:
            ent['routed_values'] = [renyi_entropy(Z[:args.num_tokens], args.alpha) for Z in rv]
        res['entropy'] = ent
        res['entropy_tokens'] = int(min(args.num_tokens, len(reps['hidden'][0])))
        res['alpha'] = args.alpha
        words = args.probe_words
        if not words:
            words = '1,2,3,4' if dataset.startswith('arithmetic') else 'is,are,was,were'
        words = [w for w in words.split(',') if w]
        encode, decode = get_codec(meta)
        positions = find_word_positions(val, meta, encode, decode, words)
        res['separability'] = separability(rec, val, positions, min(T, args.probe_context or T),
                                           args.max_per_word, folds=args.folds, seed=args.seed,
                                           max_iter=args.probe_iters)
    finally:
        rec.close()
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('out_dirs', nargs='+')
    p.add_argument('--save_dir', default='')
    p.add_argument('--device', default='cpu')
    p.add_argument('--num_tokens', type=int, default=4096, help='validation tokens for the entropy')
    p.add_argument('--alpha', type=float, default=0.99)
    p.add_argument('--probe_words', default='', help="default: is,are,was,were (arithmetic: 1,2,3,4)")
    p.add_argument('--max_per_word', type=int, default=400)
    p.add_argument('--folds', type=int, default=5)
    p.add_argument('--probe_iters', type=int, default=100, help='L-BFGS iterations per probe fit')
    p.add_argument('--context', type=int, default=0, help='window length (default block_size)')
    p.add_argument('--probe_context', type=int, default=128, help='context before each probed word')
    p.add_argument('--batch_size', type=int, default=16)
    p.add_argument('--data_dir', default=None,
                   help="root holding <dataset>/ (default: the checkpoint config's data_dir, else ./data)")
    p.add_argument('--dataset', default=None, help='override the dataset of the checkpoints')
    p.add_argument('--no_model', action='store_true', help='only the loss curves / depth sweep')
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    plt = get_plt()
    if plt is None:
        print('matplotlib not found: writing CSV/JSON only (pip install matplotlib for pictures)')
    names = [os.path.basename(os.path.normpath(d)) for d in args.out_dirs]
    if len(set(names)) < len(names):
        names = [os.path.normpath(d).strip(os.sep).replace(os.sep, '_') for d in args.out_dirs]
    combined_dir = args.save_dir or args.out_dirs[0]
    os.makedirs(combined_dir, exist_ok=True)

    def run_path(i, fname):
        if args.save_dir:
            return os.path.join(args.save_dir, f'{names[i]}_{fname}')
        return os.path.join(args.out_dirs[i], fname)

    results, logs, sweep = [], {}, []
    for i, out_dir in enumerate(args.out_dirs):
        rows = read_log(out_dir)
        if rows:
            logs[names[i]] = rows
        model, ckpt = (None, None) if args.no_model else load_run(out_dir, args.device)
        if ckpt is None and not args.no_model:
            print(f'{out_dir}: no ckpt.pt, curves only')
        if ckpt is None and os.path.exists(os.path.join(out_dir, 'ckpt.pt')):
            ckpt = torch.load(os.path.join(out_dir, 'ckpt.pt'), map_location='cpu', weights_only=False)
        margs = (ckpt or {}).get('model_args') or {}
        sweep.append([names[i], family(margs), margs.get('n_layer'), final_val_loss(rows, ckpt),
                      rows[-1].get('flops') if rows else None])
        if model is None:
            continue
        res = analyze_run(out_dir, model, ckpt, args)
        res['run'] = names[i]
        results.append(res)
        with open(run_path(i, 'analysis.json'), 'w') as f:
            json.dump(res, f, indent=1)
        if res['router_map'] is not None:
            M = np.array(res['router_map'])
            write_csv(run_path(i, 'router_map.csv'), ['layer'] + [f'src{j}' for j in range(len(M))],
                      [[l] + [f'{x:.6f}' for x in M[l]] for l in range(len(M))])
            if plt is not None:
                plot_router_map(plt, M, f'{names[i]}: normalised mean |router| weight', run_path(i, 'router_map.png'))
        msg = [f'{names[i]} ({res["family"]}, {res["model_args"].get("n_layer")} layers)']
        for kind, v in (res.get('entropy') or {}).items():
            msg.append(f'  entropy {kind:13s}: ' + ' '.join(f'{x:.2f}' for x in v))
        sep = res.get('separability') or {}
        for kind in ('values', 'routed_values', 'hidden'):
            if kind in sep:
                msg.append(f'  probe   {kind:13s}: ' + ' '.join(f'{m:.3f}' for m, _ in sep[kind]))
        if 'skipped' in sep:
            msg.append(f'  probe skipped: {sep["skipped"]}')
        print('\n'.join(msg))

    # combined outputs
    if results:
        rows = []
        for r in results:
            for kind, v in (r.get('entropy') or {}).items():
                rows += [[r['run'], r['family'], kind, l, f'{x:.6f}'] for l, x in enumerate(v)]
        write_csv(os.path.join(combined_dir, 'entropy.csv'), ['run', 'family', 'kind', 'layer', 'entropy'], rows)
        rows = []
        for r in results:
            sep = r.get('separability') or {}
            for kind in ('values', 'routed_values', 'hidden'):
                rows += [[r['run'], r['family'], kind, l, f'{m:.6f}', f'{s:.6f}', sep.get('n_per_word')]
                         for l, (m, s) in enumerate(sep.get(kind) or [])]
        write_csv(os.path.join(combined_dir, 'separability.csv'),
                  ['run', 'family', 'kind', 'layer', 'accuracy', 'std', 'n_per_word'], rows)
        if plt is not None:
            plot_per_layer(plt, results, 'entropy', f'Renyi entropy (alpha={args.alpha})',
                           os.path.join(combined_dir, 'entropy.png'))
            plot_per_layer(plt, results, 'separability', f'{args.folds}-fold probe accuracy',
                           os.path.join(combined_dir, 'separability.png'), with_std=True)
    if logs:
        keys = ['iter', 'tokens', 'flops', 'loss', 'val_loss', 'lr']
        write_csv(os.path.join(combined_dir, 'curves.csv'), ['run'] + keys,
                  [[n] + [r.get(k) for k in keys] for n, rs in logs.items() for r in rs])
        if plt is not None:
            plot_curves(plt, logs, 'flops', 'training FLOPs', os.path.join(combined_dir, 'loss_vs_flops.png'))
            plot_curves(plt, logs, 'tokens', 'training tokens', os.path.join(combined_dir, 'loss_vs_tokens.png'))
    write_csv(os.path.join(combined_dir, 'depth_sweep.csv'),
              ['run', 'family', 'n_layer', 'final_val_loss', 'flops'], sweep)
    pts = [s for s in sweep if s[2] is not None and s[3] is not None]
    if plt is not None and len(pts) >= 2:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for i, fam in enumerate(sorted({s[1] for s in pts})):
            xs = sorted((s[2], s[3]) for s in pts if s[1] == fam)
            depths = sorted({x for x, _ in xs})  # several runs (seeds) per depth: line through the means
            means = [sum(y for x, y in xs if x == d) / sum(1 for x, _ in xs if x == d) for d in depths]
            ax.plot(depths, means, marker='o', color=f'C{i % 10}', label=f'{fam} (mean)')
            if len(xs) > len(depths):
                ax.scatter(*zip(*xs), s=14, alpha=0.5, color=f'C{i % 10}')
        ax.set_xlabel('n_layer')
        ax.set_ylabel('final val loss')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(combined_dir, 'depth_sweep.png'), dpi=120)
        plt.close(fig)
    with open(os.path.join(combined_dir, 'summary.json'), 'w') as f:
        json.dump({'runs': names, 'results': results,
                   'depth_sweep': [dict(zip(['run', 'family', 'n_layer', 'final_val_loss', 'flops'], s))
                                   for s in sweep]}, f, indent=1)
    print(f'wrote analysis to {combined_dir}' + ('' if plt is not None else ' (CSV/JSON only)'))
    return results


if __name__ == '__main__':
    main()
