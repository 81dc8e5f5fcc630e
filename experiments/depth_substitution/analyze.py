"""
The depth-substitution runs read as planned (this folder's README, "The first design"):
for L = 4, 8, 16, over the seeds whose three runs have finished,
  S(L) = LIMe(L) - baseline(2L)       final val loss, paired by seed: 95% t interval, p Holm-adjusted over the three
  G(L) = baseline(L) - baseline(2L)   the gate: above zero with its interval excluding zero, else "out of regime"
  reading                             S's interval wholly <= 0: "matches"; wholly > 0: "does not"; else "not shown"
  k(L) = 2^((baseline(L) - LIMe(L)) / G(L))   the depth multiplier, with a bootstrap interval over seeds
and per run a divergence flag: a logged training loss more than 0.3 above the running minimum of those before it,
after warmup. Reads the run directories (<variant>-L<depth>-s<seed>: sweep.json, log.jsonl), so it works while the
sweep is still running: a run counts once its sweep.json says done at max_iters.

$ python experiments/depth_substitution/analyze.py --out_dir=out-sweep-depth-substitution
  -> sweep_depth_substitution.csv (a row per run), sweep_depth_substitution_summary.csv (a row per L) and
     sweep_depth_substitution.png, in this folder
"""
import csv
import math
import os
import random
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository
from nanolime.checkpoint import read_log  # noqa: E402
from nanolime.common import UserError  # noqa: E402
from nanolime.sweep_stats import holm, mean_ci, t_test_p  # noqa: E402
from nanolime.sweep_runs import final_record, read_state  # noqa: E402

# -----------------------------------------------------------------------------
out_dir = 'out-sweep-depth-substitution'  # the sweep's out_dir
csv_path = os.path.join(HERE, 'sweep_depth_substitution.csv')  # a row per run; the summary beside it, *_summary.csv
plot_path = os.path.join(HERE, 'sweep_depth_substitution.png')  # '' for no figure
reference = 'baseline'
variant = 'lime'
depths = '4,8,16,32'       # the baseline's; S(L) for each L whose 2L is here too
max_iters = 1200           # a run counts once finished at this many iterations
warmup_iters = 30          # the divergence flag looks past warmup (a run's own, from its sweep.json, if it has one)
divergence = 0.3           # a training loss this far above its running minimum flags the run
bootstrap = 10000          # resamples of the seeds for k(L)'s interval
# -----------------------------------------------------------------------------
RUN_DIR = re.compile(r'^(?P<variant>.+)-L(?P<depth>\d+)-s(?P<seed>\d+)$')  # sweep.py's run directories


def loss_rise(log, warmup):
    """The largest rise of a logged training loss over the running minimum of those logged before it (itself
    included: >= 0), counting records past `warmup` only; 0.0 with none."""
    low, rise = math.inf, 0.0
    for r in log:
        if r['iter'] > warmup and isinstance(r.get('loss'), (int, float)):
            low = min(low, r['loss'])
            rise = max(rise, r['loss'] - low)
    return rise


def read_runs(root, iters=None, warmup=None, threshold=None):
    """A row per run directory of the sweep at `root`: its variant, depth, seed, status ('done' once its sweep.json
    says so at `iters` and its log has the val loss there; else 'running' or the status sweep.json gives), data
    identity, final val loss, FLOPs (a run finished at another length: 'other length', not counted), the largest
    loss rise after warmup and whether it passes `threshold`."""
    iters = max_iters if iters is None else iters
    warmup = warmup_iters if warmup is None else warmup
    threshold = divergence if threshold is None else threshold
    if not os.path.isdir(root):
        raise UserError(f"out_dir {root} is no directory: give the sweep's out_dir (--out_dir=...)")
    rows = []
    for name in sorted(os.listdir(root)):
        m = RUN_DIR.match(name)
        if not m or not os.path.isdir(os.path.join(root, name)):
            continue
        path = os.path.join(root, name)
        state, log = read_state(os.path.join(path, 'sweep.json'))[0], read_log(path)
        final = final_record(path, iters) if (state.get('status'), state.get('max_iters')) == ('done', iters) else None
        rise = loss_rise(log, state.get('warmup_iters', warmup))
        rows.append({'depth': int(m['depth']), 'variant': m['variant'], 'seed': int(m['seed']),
                     'status': 'done' if final else 'other length' if state.get('status') == 'done' else
                     state.get('status') or ('running' if log else 'not run'),
                     'iters': log[-1]['iter'] if log else None, 'max_iters': state.get('max_iters'),
                     'warmup_iters': state.get('warmup_iters'), 'data': state.get('data'),
                     'tokens': final and final['tokens'], 'train_flops': final and final['flops'],
                     'val_loss': final and final['val_loss'], 'wall_time_s': state.get('wall_time_s'),
                     'loss_rise': round(rise, 4), 'diverged': rise > threshold})
    datas = {r['data'] for r in rows if r['status'] == 'done'}
    if len(datas) > 1:
        names = ', '.join(map(str, sorted(datas, key=str)))
        raise UserError(f"{root}: its finished runs trained on different data ({names}"
                        "): not one comparison; analyse one data identity's runs (move the others out)")
    return rows


def bootstrap_k(triples, n, rng):
    """k = 2^(mean(b_L - v_L) / mean(b_L - b_2L)) over n resamples (with replacement) of the seeds' triples
    (b_L, v_L, b_2L): (2.5th, 97.5th percentile of the resamples where the mean gate is above zero, how many
    resamples had it at or below zero and so no k)."""
    ks, undefined = [], 0
    for _ in range(n):
        pick = [rng.choice(triples) for _ in triples]
        gain, gate = (sum(t[0] - t[i] for t in pick) / len(pick) for i in (1, 2))
        if gate <= 0:
            undefined += 1
        else:
            ks.append(2 ** (gain / gate))
    if not ks:
        return math.nan, math.nan, undefined
    ks.sort()
    at = lambda q: ks[min(len(ks) - 1, max(0, round(q * (len(ks) - 1))))]
    return at(0.025), at(0.975), undefined


def reading(s_mean, s_half, g_mean, g_half):
    """The plan's reading of one L."""
    if math.isnan(s_half) or math.isnan(g_half):
        return 'no interval (one seed)'
    if not g_mean - g_half > 0:
        return 'out of regime'
    if s_mean + s_half <= 0:
        return 'matches'
    return 'does not' if s_mean - s_half > 0 else 'not shown'


def analyse(rows, base_depths, ref='baseline', var='lime', resamples=10000, seed=0):
    """A summary row per L of base_depths whose 2L is there too: the seeds with LIMe(L), baseline(L) and
    baseline(2L) all finished, S(L), G(L) (mean, 95% half-width, paired t p), S's Holm p over the L's, the
    reading, k(L) with its bootstrap interval."""
    loss = {(r['variant'], r['depth'], r['seed']): r['val_loss'] for r in rows if r['status'] == 'done'}
    out, rng = [], random.Random(seed)
    for L in base_depths:
        if 2 * L not in base_depths:
            continue
        seeds = sorted(s for (v, d, s) in loss
                       if (v, d) == (var, L) and (ref, L, s) in loss and (ref, 2 * L, s) in loss)
        triples = [(loss[ref, L, s], loss[var, L, s], loss[ref, 2 * L, s]) for s in seeds]
        row = {'L': L, 'n_seeds': len(seeds), 'seeds': ' '.join(map(str, seeds))}
        if triples:
            s_diffs = [v - b2 for _, v, b2 in triples]
            g_diffs = [b - b2 for b, _, b2 in triples]
            (sm, sh), (gm, gh) = mean_ci(s_diffs), mean_ci(g_diffs)
            gain = sum(b - v for b, v, _ in triples) / len(triples)
            k = 2 ** (gain / gm) if gm > 0 else math.nan
            lo, hi, undefined = bootstrap_k(triples, resamples, rng) if len(triples) > 1 else (math.nan, math.nan, 0)
            row.update(S=sm, S_half=sh, S_p=t_test_p(s_diffs), G=gm, G_half=gh, G_p=t_test_p(g_diffs),
                       lime_gain=gain, k=k, k_low=lo, k_high=hi, k_undefined=undefined / resamples if len(triples) > 1
                       else math.nan, reading=reading(sm, sh, gm, gh))
        else:
            row.update(reading='no seed finished')
        out.append(row)
    for row, p in zip(out, holm([r.get('S_p', math.nan) for r in out])):
        row['S_p_holm'] = p
    return out


def complete_seeds(rows, base_depths, ref='baseline', var='lime'):
    """The seeds with every run of the design finished: the baseline at every depth, LIMe at every depth whose
    double is there, and at the deepest if any seed has it (the CPU design runs it, the GPU design does not). A
    sweep makes a run's directory only when it starts it, so the design comes from the depths, not the directories."""
    done = {(r['variant'], r['depth'], r['seed']) for r in rows if r['status'] == 'done'}
    design = {(ref, d) for d in base_depths} | {(var, d) for d in base_depths if 2 * d in base_depths}
    design |= {(var, r['depth']) for r in rows if (r['variant'], r['depth']) == (var, max(base_depths))}
    return sorted(s for s in {r['seed'] for r in rows} if all((v, d, s) in done for v, d in design))


def write_csv(path, rows):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)


def report(rows, summary, seeds_done):
    fmt = lambda x, spec: '–' if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)
    done = sum(r['status'] == 'done' for r in rows)
    print(f"{done}/{len(rows)} run directories finished; complete seeds (every run of the design done): "
          f"{len(seeds_done)} ({' '.join(map(str, seeds_done)) or 'none'})")
    print("\n    L  n  S(L) = LIMe(L) - base(2L)  p_t    p_holm  G(L) = base(L) - base(2L)  reading          "
          "k(L) [bootstrap 95%]")
    for r in summary:
        if 'S' not in r:
            print(f"{r['L']:>5}  0  {r['reading']}")
            continue
        k = f"{fmt(r['k'], '.3f')} [{fmt(r['k_low'], '.3f')}, {fmt(r['k_high'], '.3f')}]"
        if r['k_undefined'] > 0:
            k += f" ({r['k_undefined']:.1%} of resamples: G <= 0, no k)"
        print(f"{r['L']:>5} {r['n_seeds']:>2}  {r['S']:+.4f} ± {fmt(r['S_half'], '<8.4f')}           "
              f"{fmt(r['S_p'], '<6.3f')} {fmt(r['S_p_holm'], '<6.3f')}  {r['G']:+.4f} ± {fmt(r['G_half'], '<8.4f')}"
              f"           {r['reading']:<16} {k}")
    flagged = [r for r in rows if r['diverged']]
    print(f"\ndivergence (training loss > {divergence} above its running minimum after warmup): "
          + (', '.join(f"{r['variant']}-L{r['depth']}-s{r['seed']} (+{r['loss_rise']:.3f})" for r in flagged)
             if flagged else 'no run'))


def plot(path, rows, summary, base_depths, ref, var):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for v, marker in ((ref, 'o'), (var, 's')):
        pts = []
        for d in base_depths:
            xs = [r['val_loss'] for r in rows if (r['variant'], r['depth'], r['status']) == (v, d, 'done')]
            if xs:
                pts.append((d, *mean_ci(xs), len(xs)))
        if pts:
            d, m, h, n = zip(*pts)
            left.errorbar(d, m, [0 if math.isnan(x) else x for x in h], marker=marker, capsize=3,
                          label=f"{v} (seeds per depth: {', '.join(map(str, n))})")
    left.set(xscale='log', xlabel='n_layer', ylabel='final val loss', title='final val loss (mean, 95% interval)')
    left.set_xticks(base_depths, [str(d) for d in base_depths])
    left.minorticks_off()
    stats = [r for r in summary if 'S' in r]
    for i, (key, label) in enumerate((('S', f'S(L) = {var}(L) - {ref}(2L)'), ('G', f'G(L) = {ref}(L) - {ref}(2L)'))):
        x = [math.log2(r['L']) + (i - 0.5) * 0.12 for r in stats]
        right.errorbar(x, [r[key] for r in stats], [0 if math.isnan(r[key + '_half']) else r[key + '_half']
                                                    for r in stats], marker='os'[i], ls='', capsize=3, label=label)
    for r in stats:
        right.annotate(f"{r['reading']} (n {r['n_seeds']})", (math.log2(r['L']), r['S']), textcoords='offset points',
                       xytext=(6, -12), fontsize=7)
    right.axhline(0, color='k', lw=0.8)
    right.set_xticks([math.log2(r['L']) for r in summary], [str(r['L']) for r in summary])
    right.set(xlabel='L', ylabel='final val loss difference', title='paired by seed (95% t interval)')
    for ax in (left, right):
        if ax.get_legend_handles_labels()[0]:  # nothing finished yet: no legend
            ax.legend(fontsize='small')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    from nanolime.common import configure
    configure(globals())
    base_depths = sorted(int(d) for d in str(depths).split(',') if d.strip())
    rows = [r for r in read_runs(out_dir) if r['variant'] in (reference, variant)]
    if not rows:
        raise UserError(f"{out_dir}: no run directory of {reference} or {variant} (<variant>-L<depth>-s<seed>) there")
    summary = analyse(rows, base_depths, reference, variant, bootstrap)
    seeds_done = complete_seeds(rows, base_depths, reference, variant)
    report(rows, summary, seeds_done)
    rows.sort(key=lambda r: (r['seed'], r['depth'], r['variant']))
    write_csv(csv_path, rows)
    summary_path = re.sub(r'(\.csv)?$', '_summary.csv', csv_path, count=1)
    write_csv(summary_path, summary)
    print(f"CSV: {csv_path}, {summary_path}")
    if plot_path:
        plot(plot_path, rows, summary, base_depths, reference, variant)
        print(f"plot: {plot_path}")


if __name__ == '__main__':
    main()
