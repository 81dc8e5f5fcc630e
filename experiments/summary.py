"""
The studies' answers recomputed from their CSVs (nothing trained), and the two figures README and docs/results.md
show: assets/results.png, each result's paired difference in final val loss against its reference with its 95 % t
interval, and assets/arithmetic.png, the same in accuracy points on the arithmetic task. A row is a paired t over
seeds (a slope over depths for the depth curve) with the Holm-adjusted p over its study's family of tests. Each
PNG carries the rows it plots in its metadata ('rows', JSON): tests/test_experiments.py checks them against the
CSVs and docs/results.md's table, so a figure left behind by a changed CSV fails there. Also printed: the further
numbers the study READMEs quote (the compute multiplier, the best lrs of the transfer runs, the detectable slope).

$ python experiments/summary.py               # prints the rows and the numbers; redraws both figures
$ python experiments/summary.py --plot=False  # prints only
"""
import csv
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from nanolime.common import configure  # noqa: E402
from nanolime.sweep_stats import holm, mean_ci, slope_ci, t_test_p  # noqa: E402

# -----------------------------------------------------------------------------
plot = True                # False: print only
# -----------------------------------------------------------------------------
FIGURES = {'results': os.path.join(REPO, 'assets', 'results.png'),
           'arithmetic': os.path.join(REPO, 'assets', 'arithmetic.png')}
DEPTHS = (8, 16, 32, 64)  # the depth curve's
TUNED = '~learning_rate=4e-3~min_lr=4e-4'  # the tuned comparison's lr at 16 and 32 layers (arithmetic at 4e-3 too)
NAMES = {'lime': 'LIMe', 'attnres:block': 'Block AttnRes', 'lime+attnres:block': 'LIMe + Block AttnRes',
         'mudd': 'MUDDFormer', 'moda': 'MoDA', 'mhc': "the paper's mHC", 'mudd:prepost': 'MUDDFormer + PrePostDANorm'}


def runs(path, iters=None):
    """The finished runs of experiments/<path> (a budget run only when its iterations are asked for)."""
    with open(os.path.join(HERE, path), newline='') as f:
        return [r for r in csv.DictReader(f) if r['status'] == 'done'
                and (r['iters'] == str(iters) if iters else not r.get('budget'))]


def arm(path, depth, variant, iters=None, column='val_loss', scale=1.0):
    """Where one arm's values are: its CSV (under experiments/), depth, variant (its full name, or its first part:
    'lime' for 'lime~learning_rate=...'), length (None: the CSV's full runs), column and scale."""
    return dict(path=path, depth=depth, variant=variant, iters=iters, column=column, scale=scale)


def values(a):
    """{seed: value} of an arm()."""
    return {int(r['seed']): float(r[a['column']]) * a['scale'] for r in runs(a['path'], a['iters'])
            if int(r['depth']) == a['depth'] and a['variant'] in (r['variant'], r['variant'].split('~')[0])}


def paired(a, b):
    """values(a) - values(b) over the seeds both have."""
    x, y = values(a), values(b)
    return [x[s] - y[s] for s in sorted(set(x) & set(y))]


def row(figure, group, label, a, b):
    """The paired difference a - b (two arm()s) over seeds: its mean, 95 % t half-width and t test's p."""
    d = paired(a, b)
    m, h = mean_ci(d)
    return dict(figure=figure, group=group, label=label, a=a, b=b, n=len(d), mean=m, half=h, p=t_test_p(d),
                holm=None, shown=True)


def family(rs):
    """Holm over the rows of one family of tests, in place."""
    for r, p in zip(rs, holm([r['p'] for r in rs])):
        r['holm'] = p
    return rs


def tuned_comparison():
    """The 25 tests of the tuned comparison's table (the two withdrawn ones included: its Holm values are over
    them); shown: LIMe and Block AttnRes at 16 and 32 layers x 64 and at 8 x 96, the rows README names."""
    g = 'The tuned comparison, 300 iterations: − baseline'
    t = 'tuned_comparison/'
    out = []
    arms = ('lime', 'attnres:block', 'lime+attnres:block', 'mudd', 'moda')
    for depth in (16, 32):
        best = t + f'sweep_best_lr_{depth}.csv'
        out += [row('results', g, f'{depth} × 64, {NAMES[a]}', arm(best, depth, a), arm(best, depth, 'baseline'))
                for a in arms]
    wide, base16 = arm(t + 'sweep_wide_8.csv', 8, 'baseline'), arm(t + 'sweep_best_lr_16.csv', 16, 'baseline')
    out.append(row('results', g, '8 × 96, the baseline, against 16 × 64', wide, base16))
    out += [row('results', g, f'8 × 96, {NAMES[a]}', arm(t + 'sweep_wide_8.csv', 8, a), wide)
            for a in ('lime', 'attnres:block')]
    base600 = arm(t + 'sweep_fit_16.csv', 16, 'baseline', iters=600)
    out += [row('results', g, f'16 × 64, {NAMES[a]}, 600 it.', arm(t + 'sweep_600_16.csv', 16, a), base600)
            for a in ('lime', 'attnres:block')]
    base1200 = arm(t + 'sweep_1200_16.csv', 16, 'baseline')
    out += [row('results', g, f'16 × 64, {NAMES[a]}, 1200 it.', arm(t + 'sweep_1200_16.csv', 16, a), base1200)
            for a in arms]
    # the rows of the current code, each against that code's baseline; the two withdrawn PrePostDANorm tests
    for name, label, depth, variant in (('sweep_mhc_eq9_16.csv', '16 × 64', 16, 'mhc'),
                                        ('sweep_mhc_eq9_1200_16.csv', '16 × 64, 1200 it.', 16, 'mhc'),
                                        ('sweep_mhc_eq9_32.csv', '32 × 64', 32, 'mhc'),
                                        ('sweep_prepost_16.csv', '16 × 64', 16, 'mudd:prepost'),
                                        ('sweep_prepost_32.csv', '32 × 64', 32, 'mudd:prepost')):
        out.append(row('results', g, f'{label}, {NAMES[variant]}', arm(t + name, depth, variant),
                       arm(t + name, depth, 'baseline')))
    family(out)
    for r in out:
        r['shown'] = r['label'] in [f'{shape}, {NAMES[a]}' for shape in ('16 × 64', '32 × 64', '8 × 96')
                                    for a in ('lime', 'attnres:block')]
    assert len(out) == 25
    return out


def default_model():
    """LIMe against the baseline at the default 4 x 128, under AdamW (5 seeds) and Muon (3); Holm over the two."""
    g = 'The default model, 4 × 128, 2,500 iterations: − baseline'
    return family([row('results', g, f'LIMe, {opt}', arm(path, 4, 'lime'), arm(path, 4, 'baseline'))
                   for opt, path in (('AdamW', 'default_model/sweep_default.csv'),
                                     ('Muon', 'default_model/sweep_muon.csv'))])


def depth_curve():
    """The slope of each arm's paired difference on log2(depth), over every (depth, seed); Holm over the two. Its
    arm()s name no depth: the rows' depths are DEPTHS."""
    path = 'depth_curve/sweep_depth_curve.csv'
    out = []
    for variant in ('lime', 'attnres:block'):
        xs, ys = [], []
        for depth in DEPTHS:
            d = paired(arm(path, depth, variant), arm(path, depth, 'baseline'))
            xs += [math.log2(depth)] * len(d)
            ys += d
        slope, half, p = slope_ci(xs, ys)
        out.append(dict(figure='results', group='The depth curve, 8-64 × 64: slope of − baseline per doubling',
                        label=NAMES[variant], a=arm(path, None, variant), b=arm(path, None, 'baseline'), n=len(xs),
                        mean=slope, half=half, p=p, holm=None, shown=True))
    return family(out)


def depth_substitution():
    """S(L) = LIMe(L) - baseline(2L) of the first design at L = 4, 8, 16; Holm over the three."""
    path = 'depth_substitution/sweep_depth_substitution.csv'
    return family([row('results', 'LIMe at L − the baseline at 2L, 1,200 iterations', f'L = {L}',
                       arm(path, L, 'lime', iters=1200), arm(path, 2 * L, 'baseline', iters=1200)) for L in (4, 8, 16)])


def arithmetic():
    """Accuracy in points, tier 2: every arm at 2e-3 at 4 and 8 layers (Holm over 6); each arm at its Shakespeare
    lr at 8 layers (Holm over 6; mHC against the current code's baseline); the baseline at 4e-3 against 2e-3."""
    acc = dict(column='acc_2', scale=100.0)
    static = {**NAMES, 'mhc': 'static mHC'}  # the name `mhc` in CSVs made before 2026-11-25
    low = []
    for depth in (4, 8):
        path = f'arithmetic/sweep_arithmetic_relatives_{depth}.csv'
        low += [row('arithmetic', 'Every arm at lr 2e-3: − baseline', f'{depth} layers, {static[a]}',
                    arm(path, depth, a, **acc), arm(path, depth, 'baseline', **acc))
                for a in ('lime', 'attnres:block', 'mhc')]
    best, eq9 = 'arithmetic/sweep_arithmetic_best_8.csv', 'arithmetic/sweep_arithmetic_mhc_eq9_8.csv'
    base = arm(best, 8, 'baseline' + TUNED, **acc)
    g = 'Each arm at its 16 × 64 Shakespeare lr, 8 layers: − baseline'
    high = [row('arithmetic', g, f'{NAMES[a]} ({lr})', arm(best, 8, a, **acc), base)
            for a, lr in (('lime', '4e-3'), ('attnres:block', '4e-3'), ('lime+attnres:block', '4e-3'), ('mudd', '2e-3'),
                          ('moda', '8e-3'))]
    high.append(row('arithmetic', g, "the paper's mHC, eq. 9 (4e-3)", arm(eq9, 8, 'mhc', **acc),
                    arm(eq9, 8, 'baseline', **acc)))
    lr = row('arithmetic', 'The baseline, 8 layers', 'at 4e-3 − at 2e-3', base,
             arm('arithmetic/sweep_arithmetic_relatives_8.csv', 8, 'baseline', **acc))
    return family(low) + family(high) + [lr]


def summary():
    """Every row, in the figures' order."""
    return default_model() + tuned_comparison() + depth_curve() + depth_substitution() + arithmetic()


def signed(x, digits):
    """x with its sign, the minus a typographic one (as the docs write it)."""
    return f'{x:+.{digits}f}'.replace('-', '−')


def draw(path, shown, unit):
    """A row per result under its group's title: the mean paired difference and its 95 % interval, filled where
    the row's p (Holm-adjusted where it has a family) is below 0.05, its value on the right. The rows go into the
    PNG's metadata."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    lines = []  # (group title or None, row or None), top to bottom
    for r in shown:
        if not lines or lines[-1][1]['group'] != r['group']:
            lines.append((r['group'], None))
        lines.append((None, r))
    fig, ax = plt.subplots(figsize=(8, 0.26 * len(lines) + 1.0))
    ys = list(range(len(lines)))[::-1]
    for y, (title, r) in zip(ys, lines):
        if r is None:
            continue
        holds = (r['p'] if r['holm'] is None else r['holm']) < 0.05
        ax.errorbar(r['mean'], y, xerr=r['half'], fmt='o', ms=4, color='C0', mfc='C0' if holds else 'white', capsize=2)
        digits = 1 if r['figure'] == 'arithmetic' else 3
        ax.annotate(f"{signed(r['mean'], digits)} ± {r['half']:.{digits}f}", (1.01, y), xycoords=('axes fraction',
                    'data'), va='center', fontsize=7)
    ax.axvline(0, color='0.5', lw=0.8)
    ax.set_yticks(ys, [title if r is None else f"{r['label']} (n {r['n']})" for title, r in lines], fontsize=7)
    for label, (title, _) in zip(ax.get_yticklabels(), lines):
        label.set_fontweight('bold' if title else 'normal')
    ax.set_ylim(-0.7, len(lines) - 0.3)
    ax.set_xlabel(unit, fontsize=8)
    ax.set_title('paired by seed, 95 % t intervals; filled: p < 0.05 after Holm over its study\'s tests', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={'rows': json.dumps(shown)})
    plt.close(fig)


def main():
    configure(globals())
    every = summary()
    for r in every:
        holm_p = '' if r['holm'] is None else f", Holm {r['holm']:.3f}"
        print(f"{r['figure']}: {r['group']}: {r['label']}: {r['mean']:+.4f} ± {r['half']:.4f} over {r['n']}, "
              f"p_t {r['p']:.3f}{holm_p}")

    mult = [float(r['compute_multiplier']) for r in runs('default_model/sweep_default.csv') if r['variant'] == 'lime']
    mm, mh = mean_ci(mult)
    print(f"default model: compute multiplier {mm:.3f} ± {mh:.3f}: the baseline's FLOPs over LIMe's for one loss; "
          f"LIMe needs {1 / mm - 1:.1%} more FLOPs than the baseline")

    t = runs('lr_transfer/sweep_transfer.csv')
    print(f"lr transfer: seeds {sorted({int(r['seed']) for r in t})}")
    for arm in ('baseline', 'lime'):
        for depth in (4, 8, 16, 32):
            pts = {float(r['learning_rate']): float(r['val_loss']) for r in t if int(r['depth']) == depth
                   and r['variant'].split('~')[0] == arm and 'depth_scaling' not in r['variant']}
            best = min(pts, key=pts.get)
            print(f"  {arm}, standard, {depth} layers: best lr {best:g} ({pts[best]:.4f})")

    from scipy import stats
    lime = next(r for r in every if r['group'].startswith('The depth curve') and r['label'] == 'LIMe')
    df = lime['n'] - 2
    t95, t80 = stats.t.ppf(0.975, df), stats.t.ppf(0.8, df)
    se = lime['half'] / t95
    print(f"depth curve, lime - baseline: SE {se:.4f} per doubling; detectable at 80 % power (t_0.975,{df} "
          f"{t95:.3f} + t_0.8,{df} {t80:.3f}) x SE = {(t95 + t80) * se:.3f} per doubling")

    if plot:
        units = {'results': 'difference in final val loss (negative: lower than its reference)',
                 'arithmetic': 'difference in test accuracy, points (positive: more right than its reference)'}
        for name, path in FIGURES.items():
            draw(path, [r for r in every if r['figure'] == name and r['shown']], units[name])
            print(f"figure: {os.path.relpath(path, REPO)}")


if __name__ == '__main__':
    main()
