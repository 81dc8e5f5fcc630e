"""
Representation-collapse and training-curve analysis of trained runs
(paper Sec. 5.2, 5.4, Figs. 1, 2, 4a, 5, 7, 9).

$ python analyze.py out-lime out-base [--save_dir=DIR] [--device=cpu] [--num_tokens=4096]
                    [--probe_words=is,are,was,were] [--max_per_word=400] [--data_dir=data]
$ python analyze.py out-results/sc-* --no_model=True --save_dir=DIR   # curves and depth sweep only

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

import csv
import difflib
import json
import math
import os
import re
import sys

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from common import UserError, configure, resolve_device
from checkpoint import CKPT_NAME, load_checkpoint, load_model, read_log, writable_dir
from data import data_info, load_codec, prepare_hint
import numpy as np
import torch
import torch.nn.functional as F
from model import route_reference
import relatives

# config: the bare words are the out_dirs, the rest --key=value (or a config file)
save_dir = ''          # '' = per-run files into each out_dir, combined files into the first
device = 'cpu'
num_tokens = 4096      # validation tokens for the entropy
alpha = 0.99           # Renyi entropy order
probe_words = ''       # '' = is,are,was,were (arithmetic: 1,2,3,4)
max_per_word = 400     # occurrences per word for the probe
folds = 5
probe_iters = 100      # L-BFGS iterations per probe fit
context = 0            # window length for the entropy; 0 = block_size
probe_context = 128    # tokens of context before each probed word
batch_size = 16
data_dir = ''          # root holding <dataset>/; '' = the checkpoint config's data_dir, else data/
dataset = ''           # '' = each checkpoint's own dataset
no_model = False       # only the loss curves and the depth sweep
seed = 0

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
    for l in range(1, L):
        R = blocks[l].attn.router.matrix().detach().abs().double().cpu()  # (H_kv, (l+1)*H_kv)
        n_kv = R.shape[0]
        per_layer = R.view(n_kv, l + 1, n_kv).mean(dim=(0, 2)).numpy()
        s = per_layer.sum()
        M[l, :l + 1] = per_layer / s if s > 0 else 1.0 / (l + 1)
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


# ----------------------------------------------------------------------------- runs


def family(model_args):
    """What a run is: 'LLaMA' (the baseline), 'LIMe', 'LIMe-first-2', 'mHC-dynamic', 'LIMe+DenseFormer', ..."""
    if not model_args:
        return 'unknown'
    a, parts = model_args, []
    if a.get('lime'):
        r = a.get('router', 'full')
        parts.append('LIMe' if r in (None, 'full') else f'LIMe-{r}')
    mhc = {True: 'static', False: ''}.get(a.get('mhc'), a.get('mhc'))  # mhc was a flag for the static form
    if a.get('hc') and mhc:
        parts.append(f'mHC-{mhc}' + ('-hc_dynamic' if a.get('hc_dynamic') else ''))
    elif a.get('hc'):
        parts.append('HC' + ('-dynamic' if a.get('hc_dynamic') else ''))
    if a.get('denseformer'):
        parts.append('DenseFormer')
    if a.get('attnres'):
        parts.append(f"AttnRes-{a['attnres']}")
    if a.get('mudd'):
        parts.append('MUDD')
    if a.get('moda'):
        parts.append('MoDA')
    return '+'.join(parts) or 'LLaMA'


# ----------------------------------------------------------------------------- representations


class Recorder:
    """Forward hooks capturing, per layer, the values (W_V's output: the v half of attn.kv_proj),
    the routed values (what a static LIMe router makes attention read) and the block outputs: the
    residual stream after each block, for a relative (relatives.py) what its stream outputs there
    (HC, mHC: the streams' sum; DenseFormer: the average; AttnRes: the mix of every output so far)."""

    def __init__(self, model):
        self.model, self.keep = model, None
        self.handles = []
        for layer, block in enumerate(model.transformer.h):
            self.handles.append(block.attn.kv_proj.register_forward_hook(self._hook('kv', layer)))
            self.handles.append(block.register_forward_hook(self._hook('hidden', layer)))
        self.handles.append(_StreamHook(self))  # a relative's stream runs the blocks itself: its own recording

    def record_stream(self, stream):
        """A relative's stream (relatives.stream) that records, after each block, what the stream outputs
        there, and for MUDDFormer the values its attention computes from its own value input."""
        step, blocks = stream.block, list(self.model.transformer.h)

        def block_step(block, *args):
            layer = blocks.index(block)
            if self.model.config.mudd and layer > 0:  # kv_proj's halves on the normed key and value inputs
                connection, (_, x_k, x_v, _) = self.model.mudd[layer - 1], stream.inputs
                w_k, w_v = block.attn.kv_proj.weight.chunk(2)
                kv = torch.cat([connection.ln_k(x_k) @ w_k.T, connection.ln_v(x_v) @ w_v.T], dim=-1)
                self._hook('kv', layer)(block.attn, None, kv)
            step(block, *args)
            self._hook('hidden', layer)(block, None, stream.output())
        stream.block = block_step
        return stream

    def _hook(self, kind, layer):
        def fn(module, inp, out):
            if kind == 'kv':  # fused [k | v]: (B, T, 2 * H_kv * d_h)
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
            for i in range(0, len(windows), batch_size):
                self.keep = None if keep is None else keep[i:i + batch_size].to(device)
                self.model(windows[i:i + batch_size].to(device))  # hooks see every position
        self.keep = None
        L = len(self.model.transformer.h)
        kv = [torch.cat(self.store['kv'][l]) for l in range(L)]  # (N, 2, H_kv, d_h)
        reps = {'values': [x[:, 1].flatten(1) for x in kv]}
        rv = routed_values(self.model, kv)
        if rv is not None:
            reps['routed_values'] = rv
        reps['hidden'] = [torch.cat(self.store['hidden'][l]) for l in range(L)]
        return reps

    def close(self):
        for h in self.handles:
            h.remove()


class _StreamHook:
    """While open, every stream relatives.stream makes for the recorder's model records (Recorder.record_stream);
    remove() closes it, as a hook's handle does."""

    def __init__(self, recorder):
        self.make = make = relatives.stream

        def stream(model, x):
            stream = make(model, x)
            return stream if stream is None or model is not recorder.model else recorder.record_stream(stream)
        relatives.stream = stream

    def remove(self):
        relatives.stream = self.make


def routed_values(model, kv):
    """The values attention reads under a static LIMe router: v~_l[h] = sum_s R^l[h, s] v_s
    (eq. 2, model.route_reference). kv: per layer the recorded [k; v] (N, 2, H_kv, d_h).
    Per layer (N, H_kv * d_h); None for the baseline or a dynamic (per-token) router."""
    if not model.config.lime or model.config.router == 'dynamic':
        return None
    out = [kv[0][:, 1].flatten(1)]  # layer 0 reads its own values
    for l in range(1, len(kv)):
        R = model.transformer.h[l].attn.router.matrix().detach().double().cpu()
        # the stacked KV (S, 2, B, T, d_h), each recorded position a sequence of length 1
        sources = torch.cat(kv[:l + 1], dim=2).permute(2, 1, 0, 3).unsqueeze(3).double()
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
        res[kind] = [probe_accuracy(Z.numpy(), y, folds=folds, seed=seed, max_iter=max_iter) for Z in per_layer]
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


def plot_depth_sweep(plt, pts, path):
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


def analyze_run(out_dir, model, ckpt):
    """Router map, entropy and separability of one run on its dataset's validation split."""
    cfg = ckpt['config']
    ds = dataset or cfg.get('dataset')
    res = {'run': None, 'out_dir': out_dir, 'dataset': ds, 'model_args': ckpt['model_args'],
           'family': family(ckpt['model_args'])}
    M = router_map(model)
    res['router_map'] = None if M is None else M.tolist()
    if not ds:
        res['skipped'] = 'no dataset in ckpt config (pass --dataset)'
        return res
    try:
        ddir, meta, _ = data_info(ds, data_dir or cfg.get('data_dir') or '')
        val = np.memmap(os.path.join(ddir, 'val.bin'), dtype=np.uint16, mode='r')
        if int(meta['vocab_size']) != model.config.vocab_size:  # another dataset's tokens
            raise UserError(f"{ddir} holds another vocabulary ({int(meta['vocab_size'])} ids) than the model's "
                            f"({model.config.vocab_size}): pass the --data_dir of the '{ds}' it was trained on")
        if int(val.max()) >= model.config.vocab_size:  # the model would fail on it
            raise UserError(f"{os.path.join(ddir, 'val.bin')} is corrupt: token id {int(val.max())} is beyond the "
                            f"model's vocabulary ({model.config.vocab_size} ids); "
                            + prepare_hint(ds, data_dir or cfg.get('data_dir') or '', force=True))
    except UserError as e:
        res['skipped'] = str(e)
        print(f'{out_dir}: {e}; router map only')
        return res
    ckpt['meta'] = ckpt.get('meta') or meta  # older checkpoints carry no vocabulary: the dataset's
    encode, decode = load_codec(ckpt)
    T = min(model.config.block_size, context or model.config.block_size, len(val) - 1)
    rec = Recorder(model)
    try:
        reps = rec.run(entropy_windows(val, T, num_tokens), batch_size=batch_size)
        res['entropy'] = {k: [renyi_entropy(Z[:num_tokens], alpha) for Z in v] for k, v in reps.items()}
        res['entropy_tokens'] = int(min(num_tokens, len(reps['hidden'][0])))
        res['alpha'] = alpha
        words = probe_words or ('1,2,3,4' if ds.startswith('arithmetic') else 'is,are,was,were')
        positions = find_word_positions(val, ckpt['meta'], encode, decode, [w for w in words.split(',') if w])
        res['separability'] = separability(rec, val, positions, min(T, probe_context or T), max_per_word,
                                           folds=folds, seed=seed, max_iter=probe_iters)
    finally:
        rec.close()
    return res


if __name__ == '__main__':
    # the bare words are the runs to analyze: python analyze.py out-lime out-base --save_dir=...
    out_dirs = [a for a in sys.argv[1:] if not a.startswith('-') and not a.endswith('.py')]
    configure(globals(), [a for a in sys.argv[1:] if a not in out_dirs])
    if not out_dirs:
        raise UserError("name the runs to analyze: python analyze.py out-lime out-base [--key=value ...]")
    for key in ('num_tokens', 'max_per_word', 'probe_iters', 'batch_size'):
        if globals()[key] < 1:
            raise UserError(f"{key}={globals()[key]} must be >= 1")
    if folds < 2:
        raise UserError(f"folds={folds} must be >= 2 (the probe's cross-validation)")
    for key in ('context', 'probe_context', 'seed'):
        if globals()[key] < 0:
            raise UserError(f"{key}={globals()[key]} must be >= 0")
    if not (math.isfinite(alpha) and alpha > 0):
        raise UserError(f"alpha={alpha} must be a finite number > 0 (the Renyi entropy's order)")
    if data_dir and not os.path.isdir(data_dir):
        raise UserError(f"data_dir={data_dir} is not a directory; point it at the folder holding <dataset>/")
    for d in out_dirs:  # a mistyped run is named, not created and filled with empty analysis files
        if not any(os.path.isfile(os.path.join(d, f)) for f in (CKPT_NAME, 'log.jsonl')):
            parent = os.path.dirname(os.path.normpath(d))
            runs = [r for r in os.listdir(parent or '.') if os.path.isfile(os.path.join(parent, r, CKPT_NAME))] \
                if os.path.isdir(parent or '.') else []
            close = difflib.get_close_matches(os.path.basename(os.path.normpath(d)), runs, n=1)
            hint = f"did you mean {os.path.join(parent, close[0])}? " if close else ""
            raise UserError(f"{d} is not a run (no {CKPT_NAME} or log.jsonl there); {hint}"
                            "name the out_dirs of train.py runs")
    for d in [save_dir] if save_dir else out_dirs:  # before any work: the outputs go there
        writable_dir(d, 'save_dir')
    torch.manual_seed(seed)
    device = resolve_device(device)
    plt = get_plt()
    if plt is None:
        print('matplotlib not found: writing CSV/JSON only (pip install matplotlib for pictures)')
    names = [os.path.basename(os.path.normpath(d)) for d in out_dirs]
    if len(set(names)) < len(names):
        names = [os.path.normpath(d).strip(os.sep).replace(os.sep, '_') for d in out_dirs]
    combined_dir = save_dir or out_dirs[0]

    def run_path(i, fname):
        return os.path.join(save_dir, f'{names[i]}_{fname}') if save_dir else os.path.join(out_dirs[i], fname)

    results, logs, sweep = [], {}, []
    for i, out_dir in enumerate(out_dirs):
        rows = read_log(out_dir)
        if rows:
            logs[names[i]] = rows
        model, ckpt = None, None
        if not os.path.exists(os.path.join(out_dir, CKPT_NAME)):
            print(f'{out_dir}: no ckpt.pt, curves only')
        elif no_model:
            ckpt = load_checkpoint(os.path.join(out_dir, CKPT_NAME))
        else:
            model, ckpt = load_model(out_dir, device)
        margs = (ckpt or {}).get('model_args') or {}
        sweep.append([names[i], family(margs), margs.get('n_layer'), final_val_loss(rows, ckpt),
                      rows[-1].get('flops') if rows else None])
        if model is None:
            continue
        res = analyze_run(out_dir, model, ckpt)
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
            plot_per_layer(plt, results, 'entropy', f'Renyi entropy (alpha={alpha})',
                           os.path.join(combined_dir, 'entropy.png'))
            plot_per_layer(plt, results, 'separability', f'{folds}-fold probe accuracy',
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
        plot_depth_sweep(plt, pts, os.path.join(combined_dir, 'depth_sweep.png'))
    with open(os.path.join(combined_dir, 'summary.json'), 'w') as f:
        json.dump({'runs': names, 'results': results,
                   'depth_sweep': [dict(zip(['run', 'family', 'n_layer', 'final_val_loss', 'flops'], s))
                                   for s in sweep]}, f, indent=1)
    print(f'wrote analysis to {combined_dir}' + ('' if plt is not None else ' (CSV/JSON only)'))
