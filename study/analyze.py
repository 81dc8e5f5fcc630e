"""
Representation-collapse and training-curve analysis of trained runs
(paper Sec. 5.2, 5.4, Figs. 1, 2, 4a, 5, 7, 9).

$ python -m study.analyze out-lime out-base [--save_dir=DIR] [--device=cpu] [--num_tokens=4096]
                          [--probe_words=is,are,was,were] [--max_per_word=400] [--data_dir=data]
$ python -m study.analyze out-results/sc-* --no_model=True --save_dir=DIR   # curves and depth sweep only

For every out_dir with a ckpt.pt ('model_args', 'model', 'config' incl. 'dataset'),
on the dataset's val.bin (data/<dataset>/, read with meta.pkl):
  * router map (LIMe only): for layer l >= 1, |R^l| averaged over heads for every
    source layer j <= l, normalised per layer (rows sum to 1; layer 0 reads only
    itself) -> router_map.csv / router_map.png
  * matrix-based Renyi entropy of order renyi_order (0.99; the paper's alpha,
    Sec. 5.2), float64 eigenvalues, K = Z Z^T, p = lambda / tr K, per layer of
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

The measures, and the recording of the representations they read, are in representations.py.
Outputs go to --save_dir if given (per-run files prefixed with the run name),
else per-run files into each out_dir and combined files into the first out_dir.
Without matplotlib only CSV/JSON are written.
"""

import csv
import difflib
import json
import math
import os
import sys
from types import SimpleNamespace

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from nanolime.common import UserError, configure, resolve_device
from nanolime.checkpoint import CKPT_NAME, load_checkpoint, load_model, read_log, writable_dir
from nanolime.data import data_info, load_codec, prepare_hint
from nanolime.variants import DEFAULTS
import numpy as np
import torch
import relatives
from study.representations import (Recorder, entropy_windows, find_word_positions, renyi_entropy, router_map,
                                   separability)

# config: the bare words are the out_dirs, the rest --key=value (or a config file)
save_dir = ''          # '' = per-run files into each out_dir, combined files into the first
device = 'cpu'
num_tokens = 4096      # validation tokens for the entropy
renyi_order = 0.99     # the Renyi entropy's order (the paper's alpha, Sec. 5.2)
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

# ----------------------------------------------------------------------------- runs


def family(model_args):
    """What a run is: 'LLaMA' (the baseline), 'LIMe', 'LIMe-first-2', 'mHC-dynamic',
    'LIMe+DenseFormer', ...: each relative named by its file (relatives/). model_args: a
    checkpoint's (load_checkpoint completes older ones)."""
    if not model_args:
        return 'unknown'
    a = SimpleNamespace(**{**DEFAULTS, **model_args})
    parts = [('LIMe' if a.router in (None, 'full') else f'LIMe-{a.router}')] * bool(a.lime)
    parts += [r.family(a) for r in relatives.RELATIVES if relatives.on(r, a)]
    depth = f" (CompleteP, L_base={a.depth_base})" if a.depth_scaling != 'standard' else ''
    return ('+'.join(parts) or 'LLaMA') + depth


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
    fig, ax = plt.subplots(figsize=(max(4.5, 1 + 0.5 * L), max(3.5, 0.8 + 0.45 * L)))  # room for the title
    masked = np.ma.masked_where(np.triu(np.ones_like(M), 1) > 0, M)
    im = ax.imshow(masked, cmap='viridis', vmin=0, vmax=1, origin='upper')
    if L <= 16:
        for layer in range(L):
            for source in range(layer + 1):
                ax.text(source, layer, f'{M[layer, source]:.2f}', ha='center', va='center', fontsize=7,
                        color='white' if M[layer, source] < 0.6 else 'black')
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
        res['entropy'] = {k: [renyi_entropy(Z[:num_tokens], renyi_order) for Z in v] for k, v in reps.items()}
        res['entropy_tokens'] = int(min(num_tokens, len(reps['hidden'][0])))
        res['renyi_order'] = renyi_order
        words = probe_words or ('1,2,3,4' if ds.startswith('arithmetic') else 'is,are,was,were')
        positions = find_word_positions(val, ckpt['meta'], encode, decode, [w for w in words.split(',') if w])
        res['separability'] = separability(rec, val, positions, min(T, probe_context or T), max_per_word,
                                           folds=folds, seed=seed, max_iter=probe_iters)
    finally:
        rec.close()
    return res


if __name__ == '__main__':
    # the bare words are the runs to analyze: python -m study.analyze out-lime out-base --save_dir=...
    out_dirs = [a for a in sys.argv[1:] if not a.startswith('-') and not a.endswith('.py')]
    configure(globals(), [a for a in sys.argv[1:] if a not in out_dirs])
    if not out_dirs:
        raise UserError("name the runs to analyze: python -m study.analyze out-lime out-base [--key=value ...]")
    for key in ('num_tokens', 'max_per_word', 'probe_iters', 'batch_size'):
        if globals()[key] < 1:
            raise UserError(f"{key}={globals()[key]} must be >= 1")
    if folds < 2:
        raise UserError(f"folds={folds} must be >= 2 (the probe's cross-validation)")
    for key in ('context', 'probe_context', 'seed'):
        if globals()[key] < 0:
            raise UserError(f"{key}={globals()[key]} must be >= 0")
    if not (math.isfinite(renyi_order) and renyi_order > 0):
        raise UserError(f"renyi_order={renyi_order} must be a finite number > 0")
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
                      [[layer] + [f'{x:.6f}' for x in M[layer]] for layer in range(len(M))])
            if plt is not None:
                shape = f"{res['model_args'].get('n_layer')} layers x {res['model_args'].get('n_embd')}"
                plot_router_map(plt, M, f"{res['family']}, {shape}\nnormalised mean |router| weight",
                                run_path(i, 'router_map.png'))
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
                rows += [[r['run'], r['family'], kind, layer, f'{x:.6f}'] for layer, x in enumerate(v)]
        write_csv(os.path.join(combined_dir, 'entropy.csv'), ['run', 'family', 'kind', 'layer', 'entropy'], rows)
        rows = []
        for r in results:
            sep = r.get('separability') or {}
            for kind in ('values', 'routed_values', 'hidden'):
                rows += [[r['run'], r['family'], kind, layer, f'{m:.6f}', f'{s:.6f}', sep.get('n_per_word')]
                         for layer, (m, s) in enumerate(sep.get(kind) or [])]
        write_csv(os.path.join(combined_dir, 'separability.csv'),
                  ['run', 'family', 'kind', 'layer', 'accuracy', 'std', 'n_per_word'], rows)
        if plt is not None:
            plot_per_layer(plt, results, 'entropy', f'Renyi entropy (order {renyi_order})',
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
