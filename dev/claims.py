"""
The numbers README's results and docs/results.md's readings quote, recomputed from the CSVs in assets/ (nothing
trained): each paired difference with its 95 % t interval, seeds ahead, paired t p and the Holm p over its table's
family where the table has one; the depth curve's slope and the slope its test detects at 80 % power.

$ python dev/claims.py
"""
import csv
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from nanolime.sweep_stats import detectable, holm, mean_ci, slope_ci, slope_fit, t95, t_test_p  # noqa: E402

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'assets')


def rows(name):
    with open(os.path.join(ASSETS, name), newline='') as f:
        return [r for r in csv.DictReader(f) if r['status'] == 'done' and not r.get('budget')]


def by_seed(rs, depth, variant, column):
    return {int(r['seed']): float(r[column]) for r in rs if int(r['depth']) == depth and r['variant'] == variant}


def paired(a, b, scale=1.0):
    """a - b over the seeds both have (dicts seed -> value): (mean, half-width, seeds ahead (a < b for a loss,
    reported as the count of a - b < 0), n, paired t p, the differences)."""
    seeds = sorted(set(a) & set(b))
    d = [(a[s] - b[s]) * scale for s in seeds]
    m, h = mean_ci(d)
    return m, h, sum(x < 0 for x in d), len(d), t_test_p(d), d


def show(label, result, unit=''):
    m, h, below, n, p, _ = result
    print(f"{label}: {m:+.4f} ± {h:.4f}{unit}, {below} of {n} below zero, p_t {p:.3f}")


def main():
    # README's intro and the default model: LIMe against the baseline, 4 x 128, AdamW, 5 seeds; Holm over 2 (Muon)
    d, m = rows('sweep_default.csv'), rows('sweep_muon.csv')
    adamw = paired(by_seed(d, 4, 'lime', 'val_loss'), by_seed(d, 4, 'baseline', 'val_loss'))
    muon = paired(by_seed(m, 4, 'lime', 'val_loss'), by_seed(m, 4, 'baseline', 'val_loss'))
    show('default model, AdamW, LIMe - baseline', adamw)
    print(f"  Holm over AdamW and Muon: {holm([adamw[4], muon[4]])[0]:.3f}")
    mult = [float(r['compute_multiplier']) for r in d if r['variant'] == 'lime']
    mm, mh = mean_ci(mult)
    print(f"  compute multiplier {mm:.3f} ± {mh:.3f}: the baseline's FLOPs over LIMe's for one loss; LIMe needs "
          f"{1 / mm - 1:.1%} more FLOPs than the baseline")

    # the lr that transfers: seed 20 only; each depth's best lr per setting
    t = rows('sweep_transfer.csv')
    print(f"lr transfer: seeds {sorted({int(r['seed']) for r in t})}")
    for arm in ('baseline', 'lime'):
        for depth in (4, 8, 16, 32):
            pts = {float(r['learning_rate']): float(r['val_loss']) for r in t if int(r['depth']) == depth
                   and r['variant'].split('~')[0] == arm and 'depth_scaling' not in r['variant']}
            best = min(pts, key=pts.get)
            print(f"  {arm}, standard, {depth} layers: best lr {best:g} ({pts[best]:.4f})")

    # arithmetic at the Shakespeare lr (4e-3) against the 2e-3 table: the baseline's drop; the group's Holm
    a8, b8 = rows('sweep_arithmetic_relatives_8.csv'), rows('sweep_arithmetic_best_8.csv')
    high = by_seed(b8, 8, 'baseline~learning_rate=4e-3~min_lr=4e-4', 'acc_2')
    low = by_seed(a8, 8, 'baseline', 'acc_2')
    show('arithmetic, baseline at 4e-3 - at 2e-3 (points)', paired(high, low, 100), ' points')
    print(f"  baseline means: 2e-3 {100 * sum(low.values()) / 3:.1f} %, 4e-3 {100 * sum(high.values()) / 3:.1f} %")
    group = [v for v in dict.fromkeys(r['variant'] for r in b8) if not v.startswith('baseline')]
    results = {v: paired(by_seed(b8, 8, v, 'acc_2'), high, 100) for v in group if v.split('~')[0] != 'mhc'}
    eq9 = rows('sweep_arithmetic_mhc_eq9_8.csv')  # the group's sixth test: mHC against the current code's baseline
    eq9_base = [v for v in dict.fromkeys(r['variant'] for r in eq9) if v.startswith('baseline')][0]
    eq9_mhc = [v for v in dict.fromkeys(r['variant'] for r in eq9) if v.startswith('mhc')][0]
    results['mhc (eq. 9, current code)'] = paired(by_seed(eq9, 8, eq9_mhc, 'acc_2'), by_seed(eq9, 8, eq9_base, 'acc_2'),
                                                  100)
    ps = holm([r[4] for r in results.values()])
    for (v, r), p in zip(results.items(), ps):
        m_, h_ = r[0], r[1]
        print(f"  {v}: {m_:+.2f} ± {h_:.2f} points (interval {m_ - h_:+.2f} .. {m_ + h_:+.2f}: "
              f"{'excludes' if m_ - h_ > 0 or m_ + h_ < 0 else 'contains'} zero), p_t {r[4]:.3f}, Holm {p:.3f}")

    # the depth curve: LIMe - baseline on log2(depth), and the slope detectable at 80 % power
    c = rows('sweep_depth_curve.csv')
    ref = [v for v in dict.fromkeys(r['variant'] for r in c) if v.startswith('baseline')][0]
    for arm in ('lime', 'attnres:block'):
        v = [x for x in dict.fromkeys(r['variant'] for r in c) if x.split('~')[0] == arm][0]
        xs, ys = [], []
        for depth in (8, 16, 32, 64):
            a, b = by_seed(c, depth, v, 'val_loss'), by_seed(c, depth, ref, 'val_loss')
            for s in sorted(set(a) & set(b)):
                xs.append(math.log2(depth))
                ys.append(a[s] - b[s])
        slope, half, p = slope_ci(xs, ys)
        df = len(xs) - 2
        se = slope_fit(xs, ys)[1]
        t80 = detectable(se, df) / se - t95(df)  # Student's t's 80 % quantile
        print(f"depth curve, {arm} - baseline: slope {slope:+.4f} ± {half:.4f} per doubling, p {p:.3f}, {len(xs)} "
              f"pairs; SE {se:.4f}; detectable at 80 % power (t_0.975,{df} {t95(df)} + t_0.8,{df} {t80:.3f}) "
              f"x SE = {detectable(se, df):.3f} per doubling")


if __name__ == '__main__':
    main()
