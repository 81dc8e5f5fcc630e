"""
sweep.py's tables, from sweep.csv's rows (nanolime/sweep_csv.py): per depth and variant the mean over seeds with its
95% interval, the difference to the control (the first variant) paired by seed with its verdict and p-values
(nanolime/sweep_stats.py), the compute multiplier (nanolime/sweep_multipliers.py), a mark on a line whose runs are
not of one experiment; the power laws fitted, the depth trend, each arm's best, the arithmetic task's accuracies.
"""
import json
import math

from nanolime.sweep_csv import best_of_arms
from nanolime.sweep_stats import detectable, holm, mean_ci, sign_test_p, slope_ci, slope_fit, t_test_p, verdict

def _listed(values):
    """Distinct values, sorted, as one text: '0.002, 0.02'."""
    values = set(values)
    try:
        values = sorted(values)
    except TypeError:  # None beside numbers
        values = sorted(values, key=str)
    return ', '.join(map(str, values))

def mixes(runs, named=()):
    """What a table line's runs (its seeds', and the control's paired with them) differ in: their lengths
    (max_iters), data, or any training option of sweep.csv's options column but those in `named` (the ones the
    line's variant name or the control's sets after '~', which are what is compared), e.g. ['options (learning_rate
    0.002, 0.02)']; [] if they are runs of one experiment. An option some runs lack (an older version's) is not
    compared."""
    out = []
    lengths, data = {r.get('max_iters') for r in runs}, {r.get('data') for r in runs}
    if len(lengths) > 1:
        out.append(f"lengths (max_iters {_listed(lengths)})")
    if len(data) > 1:
        out.append(f"data (data {_listed(data)})")
    options = [json.loads(r['options']) for r in runs if r.get('options')]
    keys = set.intersection(*(set(o) for o in options)) - set(named) if options else set()
    differ = [k for k in sorted(keys) if len({json.dumps(o[k]) for o in options}) > 1]
    if differ:
        out.append("options (" + '; '.join(f"{k} {_listed(o[k] for o in options)}" for k in differ) + ")")
    return out

def name_keys(variant):
    """The options a variant's name sets after '~' (its other options, the model's, are not in the options column)."""
    return {part.partition('=')[0] for part in variant.split('~')[1:]}

def mixed_lines(rows, depths, variants, control):
    """{(depth, variant): mixes(...) of that table line} for the lines whose runs are not of one experiment: its
    seeds', and for a variant the control's of the same seeds, differ in length, data or options. Such a line is
    marked '!' and left out of the paired tests and the depth trend."""
    done = {(r['depth'], r['variant'], r['seed']): r for r in rows if r['status'] == 'done' and r['budget'] is None}
    out = {}
    for d in depths:
        for v in variants:
            mine = [r for (rd, rv, _), r in done.items() if (rd, rv) == (d, v)]
            paired = [done[d, control, r['seed']] for r in mine if v != control and (d, control, r['seed']) in done]
            what = mixes(mine + paired, name_keys(v) | name_keys(control))
            if what:
                out[d, v] = what
    return out

def print_fits(rows, fits, control):
    """The fitted power law per depth and the runs read beyond its range; without fits, what '>' means."""
    for d, fit in fits.items():
        far = [float(r['multiplier_note'][14:]) for r in rows if r['depth'] == d and r['compute_multiplier'] is not None
               and r['multiplier_note'].startswith('extrapolated')]
        print(f"{d} layers: {control}'s loss ~ FLOPs^-{fit[0]:.4f} over {fit[2][0]:.3g}-{fit[2][1]:.3g} FLOPs" + (
            f"; ~ {len(far)} run(s) beyond that range, up to x{max(far):.2f}: extrapolated" if far else '')
            if fit else f"{d} layers: no fit ({control} needs two budgets finished with loss falling with compute)")
    if not fits:
        print(f"> a lower bound: {control} never got to that loss in a seed; --budgets=... fits its loss against "
              "compute")

def print_table(rows, depths, variants, column, title, n_budgets=0, lower_is_better=True, majority_column=None):
    """Per depth and variant: mean over seeds, 95% interval, paired difference to the control (the first
    variant) with its interval, verdict and p-values (t test, Holm-adjusted over every comparison of the table,
    sign test); then the compute multiplier, or how the mean compares with majority_column's (the accuracy of always
    giving the majority answer).
    rows: sweep.csv's rows as sweep.py builds them (numbers, None where empty)."""
    control, width = variants[0], max([16] + [len(v) for v in variants])  # width: the variant column's
    done = {d: {v: {r['seed']: r for r in rows if (r['depth'], r['variant'], r['status'], r['budget'])
                    == (d, v, 'done', None)} for v in variants} for d in depths}
    mixed = mixed_lines(rows, depths, variants, control)  # lines not of one experiment: no paired test
    diffs = {(d, v): [done[d][v][s][column] - done[d][control][s][column] for s in done[d][v]
                      if s in done[d][control]] for d in depths for v in variants if v != control}
    diffs = {k: x for k, x in diffs.items() if x and k not in mixed}
    p_t = {k: t_test_p(x) for k, x in diffs.items()}
    p_holm, tests = dict(zip(p_t, holm(list(p_t.values())))), sum(not math.isnan(p) for p in p_t.values())
    fmt = lambda p: '' if math.isnan(p) else f"{p:.3f}" if p >= 0.001 else '<0.001'
    how = f"fitted over {n_budgets} budgets" if n_budgets else 'off its training curve'
    last = 'vs majority answer' if majority_column else f'compute multiplier (x {control} FLOPs, {how}) | per CPU-s'
    holm_over = (f"p_holm that Holm-adjusted over this table's {tests} t tests" if tests else
                 "p_holm that Holm-adjusted (no row here has two paired seeds of one experiment: no t test)")
    print(f"\n{title}: mean ± 95% interval over seeds, difference to {control} paired by seed\ntwo-sided p: "
          f"p_t paired t test, {holm_over}, p_sign exact sign test (ties dropped); tok/P tokens per "
          f"non-embedding parameter\n"
          f"{'depth':>5}  {'variant':<{width}} {'n':>2} {'tok/P':>6}  {column:<17}  "
          f"{'vs control':<19} {'verdict':<22} {'p_t':<6} {'p_holm':<6} {'p_sign':<6} {last}\n" + '-' * (125 + width))
    for d in depths:
        for v, mine in done[d].items():
            m, h = mean_ci([r[column] for r in mine.values()]) if mine else (math.nan, math.nan)
            mark = '!' if (d, v) in mixed else ' '
            per_param = [r['tokens_per_param'] for r in mine.values() if r.get('tokens_per_param')]
            per_param = f"{sum(per_param) / len(per_param):.2f}" if per_param else '–'
            line, extra = f"{d:>5}{mark} {v:<{width}} {len(mine):>2} {per_param:>6}  {m:.4f} ± {h:<8.4f}", ''
            if (d, v) in diffs:
                dm, dh = mean_ci(diffs[d, v])
                star = '*' if len(diffs[d, v]) < len(mine) else ' '
                line += (f"  {dm:+.4f} ± {dh:<8.4f}{star} {verdict(dm, dh, lower_is_better):<22} {fmt(p_t[d, v]):<6} "
                         f"{fmt(p_holm[d, v]):<6} {fmt(sign_test_p(diffs[d, v])):<6}")
            mults = [r for r in mine.values() if r['compute_multiplier'] is not None and (d, v) not in mixed]
            if majority_column and mine:  # "above" only when the whole interval is above the majority answer's
                majority = sum(r[majority_column] for r in mine.values()) / len(mine)
                where = verdict(m - majority, h, lower_is_better)
                extra = f"{majority:.4f}: {dict(better='above', worse='below').get(where, where)}"
            elif mults:
                mm, mh = mean_ci([r['compute_multiplier'] for r in mults])
                mark = '>' if any(r['multiplier_note'] == 'lower bound' for r in mults) else '~' if any(
                    r['multiplier_note'].startswith('extrapolated') for r in mults) else ''
                extra = f"{mark}{mm:.3f} ± {mh:.3f}"
                times = [r['time_multiplier'] for r in mults if r.get('time_multiplier') is not None]
                if times:  # the same, per CPU-second (off wall times: a machine busy with more is noise here)
                    extra += " | {}{:.3f} ± {:.3f}".format(mark, *mean_ci(times))
            print(f"{line:<{101 + width}} {extra}".rstrip() if mine else f"{d:>5}  {v:<{width}}  0  (no finished runs)")
    for (d, v), what in mixed.items():
        whose = 'its seeds' if v == control else f"its seeds, or {control}'s it is paired with"
        print(f"! {d} layers, {v}: its runs ({whose}) differ in "
              f"{' and '.join(what)}: not one experiment, left out of the paired tests; see sweep.csv's max_iters, "
              "data and options columns")

def print_depth_trend(rows, depths, variants, column='val_loss'):
    """Does a variant's difference to the control change with depth? The slope of every seed's paired
    difference on log2(depth), over the depths both finished, with its 95% interval and p (slope_ci); then, as a
    check that does not take the pairs of one seed for independent, each seed's own slope and a t interval over
    the seeds."""
    control, width = variants[0], max([16] + [len(v) for v in variants[1:]])
    mixed = mixed_lines(rows, depths, variants, control)  # marked '!' in the table: not one experiment
    done = {(r['depth'], r['variant'], r['seed']): r[column] for r in rows
            if r['status'] == 'done' and r['budget'] is None}
    lines = []
    for v in variants[1:]:
        by_seed = {}  # seed -> its (log2(depth), difference) pairs
        for (d, w, s) in done:
            if w == v and d in depths and (d, control, s) in done and (d, v) not in mixed:
                by_seed.setdefault(s, []).append((math.log2(d), done[d, v, s] - done[d, control, s]))
        pairs = [xy for xys in by_seed.values() for xy in xys]
        if len({x for x, _ in pairs}) >= 2:
            slope, half, p = slope_ci(*zip(*pairs))
            power80 = detectable(*slope_fit(*zip(*pairs))[1:])  # what this test finds 4 times in 5
            own = [slope_ci(*zip(*xys))[0] for xys in by_seed.values() if len({x for x, _ in xys}) >= 2]
            own = ("seeds' own: {:+.4f} ± {:.4f} p {:.3f} ({} seed{})".format(*mean_ci(own), t_test_p(own), len(own),
                                                                            's' * (len(own) > 1))
                   if own else "seeds' own: none (no seed at two depths)")
            lines.append(f"{v:<{width}} {slope:+.4f} ± {half:<8.4f} p {p:.3f}  detectable {power80:.4f}  "
                         f"({len(pairs)} pairs over {len({x for x, _ in pairs})} depths); {own}")
    if lines:
        print(f"\n{column} - {control}'s, paired by seed, against log2(depth): slope ± 95% interval (least "
              "squares over every pair; below 0: the difference falls as depth doubles), p, and the slope (either "
              "sign) this test detects at 80% power, (t_0.975 + t_0.8) x its standard error: a smaller one it "
              "may well not show; then the mean of each seed's own slope, ± its t interval over the seeds")
        print('\n'.join(lines))

def print_report(rows, depths, variants, fits, n_budgets, tiers):
    """A sweep's tables: how many runs finished, the final val loss with the power laws fitted (fits:
    {depth: fit_power_law(...)}, from n_budgets budgets), then the test accuracy per arithmetic tier (tiers:
    add_tier_columns's)."""
    print(f"\n{sum(row['status'] == 'done' for row in rows)}/{len(rows)} runs finished")
    print_table(rows, depths, variants, 'val_loss', 'final val loss', n_budgets)
    print("* paired over the seeds both finished; the compute multiplier's interval is over seeds too (t)")
    print_fits(rows, fits, variants[0])
    print_depth_trend(rows, depths, variants)
    best = {key: b for key, b in best_of_arms(rows).items()
            if sum(v.split('~')[0] == key[1] for v in variants) > 1}  # arms run in more than one setting
    if best:
        print("\neach arm's best (lowest mean final val loss; sweep.csv's best_of_arm):")
    kinds = {}  # (depth, arm) -> its kinds of runs: with more than one, each line says which
    for depth, arm, *kind in best:
        kinds.setdefault((depth, arm), []).append(tuple(kind))
    for (depth, arm, *kind), (variant, mean, n) in sorted(best.items(), key=lambda kv: tuple(map(str, kv[0]))):
        among = f"  (among runs of max_iters {kind[0]}, data {kind[1]})" if len(kinds[depth, arm]) > 1 else ''
        print(f"{depth:>5}  {arm:<16} {variant}  {mean:.4f} ({n} seed{'s' * (n > 1)}){among}")
    for n in tiers:
        print_table(rows, depths, variants, f'acc_{n}', f"test accuracy, {n} operators", lower_is_better=False,
                    majority_column=f'majority_{n}')
