"""
sweep.py's numbers: 95% t intervals over seeds, verdicts and p-values (paired t test, Holm-adjusted over a table's
comparisons, exact sign test) on paired differences, compute multipliers (off the
reference's training curve, or off a power law fitted to its final losses at several budgets), the tables and the
plot, and sweep.csv's text. Plain functions of plain data (lists, dicts of sweep.csv's rows), so they also serve for a
sweep.csv of your own:

    import csv; from sweep_report import mean_ci
    rows = [r for r in csv.DictReader(open('out-sweep/sweep.csv')) if r['status'] == 'done']
    print(mean_ci([float(r['val_loss']) for r in rows if r['variant'] == 'lime']))
"""
import csv
import io
import json
import math
import os
import sys

from nanolime.variants import VARIANT_PLAIN

# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]

def mean_ci(xs):
    """(mean, half-width of its 95% t interval); the half-width is nan for fewer than 2 values."""
    n, m = len(xs), sum(xs) / len(xs)
    if n < 2:
        return m, math.nan
    t = T95[n - 2] if n <= 31 else 1.96 + 2.4 / (n - 1)  # beyond 30 degrees of freedom: within 0.002 of t
    return m, t * math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)

def verdict(diff, half, lower_is_better=True):
    """How a difference (variant - reference) with its interval reads: for a loss, lower is better."""
    if math.isnan(half):
        return "no interval (one seed)"
    if diff - half <= 0 <= diff + half:
        return "inside seed noise"
    return "better" if (diff < 0) == lower_is_better else "worse"

def t_test_p(diffs):
    """Two-sided p-value of the paired t test: P(|T| >= |t|), T Student's t with n - 1 degrees of freedom and
    t = mean / (sd / sqrt(n)) of the n differences, exact for integer degrees of freedom (Abramowitz & Stegun
    26.7.3-4: a finite series in cos(theta), tan(theta) = t / sqrt(n - 1)). nan for fewer than 2 differences."""
    n = len(diffs)
    if n < 2:
        return math.nan
    m = sum(diffs) / n
    se = math.sqrt(sum((x - m) ** 2 for x in diffs) / (n - 1) / n)
    return t_p(m, se, n - 1)

def t_p(estimate, se, nu):
    """Two-sided p-value of estimate / se against Student's t with nu degrees of freedom (t_test_p's series)."""
    if se == 0:  # no spread: t is infinite, or 0 / 0 when the estimate is 0
        return float(estimate == 0)
    theta = math.atan(abs(estimate) / se / math.sqrt(nu))
    c2, term, total, odd = math.cos(theta) ** 2, 1.0, 1.0, nu % 2
    for k in range(1, (nu - 1) // 2 if odd else nu // 2):  # term ratios: odd 2k / (2k+1), even (2k-1) / (2k)
        term *= c2 * (2 * k - 1 + odd) / (2 * k + odd)
        total += term
    inside = 2 / math.pi * (theta + (nu > 1) * math.sin(theta) * math.cos(theta) * total) if odd else (
        math.sin(theta) * total)  # P(|T| < t)
    return max(0.0, 1.0 - inside)

def slope_ci(xs, ys):
    """Least-squares slope of ys on xs: (slope, half-width of its 95% t interval, two-sided p of a zero slope),
    n - 2 degrees of freedom; the half-width and p are nan for fewer than 3 points. sweep.py's depth trend:
    the paired differences of every seed and depth on log2(depth)."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if n < 3:
        return slope, math.nan, math.nan
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(residual / (n - 2) / sxx)
    t = T95[n - 3] if n <= 32 else 1.96 + 2.4 / (n - 2)
    return slope, t * se, t_p(slope, se, n - 2)

def sign_test_p(diffs):
    """Exact two-sided sign test: zero differences dropped, n left, k of them on the rarer side; under no
    difference each sign is + or - with chance 1/2, and the p-value is the chance of a split at least as
    lopsided, min(1, 2 * sum_{i <= k} C(n, i) / 2^n) (1 when no difference is left)."""
    pos, neg = sum(x > 0 for x in diffs), sum(x < 0 for x in diffs)
    return min(1.0, 2 * sum(math.comb(pos + neg, i) for i in range(min(pos, neg) + 1)) / 2 ** (pos + neg))

def holm(ps):
    """Holm-Bonferroni adjusted p-values, in the order given: with the m p-values sorted, p_(1) <= ... <= p_(m),
    the i-th becomes max over j <= i of min(1, (m - j + 1) p_(j)); calling 'different' every test whose adjusted
    value is <= alpha keeps the chance of any false call among the m at most alpha. nan (no test) stays nan and
    is not counted in m."""
    order = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    out, running = [math.nan] * len(ps), 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - j) * ps[i]))  # the max keeps the order of the p-values
        out[i] = running
    return out

def compute_multiplier(ref_curve, loss, flops):
    """(FLOPs the reference needs to reach `loss` / `flops`, 'lower' if a lower bound else ''), from its evaluations
    ref_curve = [(flops, val loss), ...] in training order: the first crossing of `loss`, interpolated in log FLOPs
    (linearly from iteration 0, at 0 FLOPs); if it never gets there, its total FLOPs give the lower bound."""
    f0, v0 = 0.0, math.inf
    for f, v in ref_curve:
        if v <= loss:
            x = (v0 - loss) / (v0 - v) if v0 < math.inf else 1.0  # where between the two evaluations
            return (f0 * (f / f0) ** x if f0 > 0 else f0 + x * (f - f0)) / flops, ''
        f0, v0 = f, v
    return ref_curve[-1][0] / flops, 'lower'

def reference_ends(rows, reference, depth):
    """{seed: [(FLOPs, final val loss)] of the reference's finished runs at `depth`, one per budget}: what
    fit_power_law fits."""
    ends = {}
    for r in rows:
        if (r['depth'], r['variant'], r['status']) == (depth, reference, 'done'):
            ends.setdefault(r['seed'], []).append((r['train_flops'], r['val_loss']))
    return ends

def fit_power_law(points):
    """The reference's final loss against its compute, L = A_s * C^-b, from runs trained to several budgets: one
    exponent b for every seed, one offset log A_s per seed (its data order, shared with the variants' runs of that
    seed), least squares in log-log over {seed: [(flops, loss), ...]}. (b, {seed: log A_s}, (fewest, most FLOPs
    fitted)), or None without two budgets or if the loss does not fall with compute."""
    logs = {s: [(math.log(c), math.log(v)) for c, v in pts] for s, pts in points.items() if pts}
    sxy = sxx = 0.0
    for pts in logs.values():  # slope within each seed: the offsets take the seeds' differences
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        sxy, sxx = sxy + sum((x - mx) * (y - my) for x, y in pts), sxx + sum((x - mx) ** 2 for x, _ in pts)
    if sxx <= 0 or sxy >= 0:
        return None
    b = -sxy / sxx
    flops = [c for pts in points.values() for c, _ in pts]
    return b, {s: sum(y + b * x for x, y in pts) / len(pts) for s, pts in logs.items()}, (min(flops), max(flops))

def fitted_multiplier(fit, seed, loss, flops):
    """(the FLOPs the fitted reference of `seed` needs to reach `loss`, over `flops`; how far that lies beyond the
    fitted FLOPs, as a factor: 1.0 inside them)."""
    b, offsets, (low, high) = fit
    need = math.exp((offsets[seed] - math.log(loss)) / b)
    return need / flops, max(need / high, low / need, 1.0)

MULTIPLIERS = ('compute_multiplier', 'multiplier_note', 'time_multiplier')  # add_compute_multipliers's columns

def add_compute_multipliers(rows, curves, fits, reference):
    """Each finished run's compute multiplier and how it was read (row['compute_multiplier'], 'multiplier_note'):
    with fits ({depth: fit_power_law(...)}, from --budgets), off its seed's power law; without, off the reference's
    own training curve (curves: {(depth, variant, seed): {iter: (FLOPs, val loss)}}; its lr not yet decayed).
    Per CPU-second too (row['time_multiplier']): the seconds the reference needs to reach the run's loss (the
    FLOPs it needs, at its own seconds per FLOP: its wall_time_s / train_flops) over the run's seconds."""
    refs = {(r['depth'], r['seed']): r for r in rows
            if (r['variant'], r['status'], r['budget']) == (reference, 'done', None)}
    for row in rows:
        row['time_multiplier'] = None
        if row['status'] != 'done' or row['variant'] == reference:
            continue
        fit, ref = fits.get(row['depth']), curves.get((row['depth'], reference, row['seed']))
        if fits and fit and row['seed'] in fit[1]:
            row['compute_multiplier'], beyond = fitted_multiplier(fit, row['seed'], row['val_loss'], row['train_flops'])
            row['multiplier_note'] = f"extrapolated x{beyond:.2f}" if beyond > 1 else 'fitted'
        elif not fits and ref:
            row['compute_multiplier'], bound = compute_multiplier([ref[it] for it in sorted(ref)], row['val_loss'],
                                                                  row['train_flops'])
            row['multiplier_note'] = 'lower bound' if bound else 'reference curve'
        ref = refs.get((row['depth'], row['seed']))
        if row['compute_multiplier'] is not None and ref and ref.get('wall_time_s') and row.get('wall_time_s'):
            row['time_multiplier'] = (row['compute_multiplier'] * row['train_flops'] / ref['train_flops']
                                      * ref['wall_time_s'] / row['wall_time_s'])

def add_tier_columns(rows):
    """On the arithmetic task, each row's study/arithmetic.py scores (row['tiers']: its per_tier, removed) as columns
    acc_<n> and majority_<n> per tier, n operators per expression (None where a run has no score); the tiers'
    n, sorted."""
    tiers = sorted({int(n) for row in rows for n in row.get('tiers', {})})
    for row in rows:
        scored = row.pop('tiers', {})
        for n in tiers:
            row[f'acc_{n}'], row[f'majority_{n}'] = map(scored.get(str(n), {}).get, ('accuracy', 'majority_baseline'))
    return tiers

def run_kind(row):
    """(max_iters, data) of a row: how long its run trained, and the identity of its data (None where not
    recorded); only runs of one kind are averaged or compared without a mark."""
    return row.get('max_iters'), row.get('data')

NAMED = {*VARIANT_PLAIN, 'router', 'router_init'}  # the options a variant's name sets (nanolime/variants.py)

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
    line's variant name or the control's sets, which are what is compared), e.g. ['options (learning_rate 0.002,
    0.02)']; [] if they are runs of one experiment. An option some runs lack (an older version's) is not compared."""
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
    """The options a variant's name sets: the components' and router options, and those after '~'."""
    return NAMED | {part.partition('=')[0] for part in variant.split('~')[1:]}

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

def best_of_arms(rows):
    """Each arm's best variant at each depth among runs of one length and data, {(depth, arm, max_iters, data):
    (variant, mean final val loss, seeds)}. An arm is a variant name without its '~' options (lime~learning_rate=4e-3
    is arm lime at another lr); its best, the variant with the lowest mean final val loss over its finished seeds
    (ties: the first in rows). Runs of another max_iters or data are another comparison, with a best of its own."""
    losses = {}
    for row in rows:
        if row['status'] == 'done' and row['budget'] is None:
            losses.setdefault((row['depth'], row['variant'], *run_kind(row)), []).append(row['val_loss'])
    best = {}
    for (depth, variant, *kind), xs in losses.items():
        key, mean = (depth, variant.split('~')[0], *kind), sum(xs) / len(xs)
        if key not in best or mean < best[key][1]:
            best[key] = (variant, mean, len(xs))
    return best

class WrittenRow(dict):
    """A row of an earlier sweep.csv with a cell that is not what its column holds: kept as written (text), in no
    comparison (earlier_rows)."""

def csv_text(rows):
    """sweep.csv's text: a header of the first row's keys and best_of_arm (whether the row's variant is its
    arm's best at its depth: best_of_arms; empty for a budget run or an unfinished one), then a line per row."""
    best = best_of_arms([row for row in rows if not isinstance(row, WrittenRow)])
    rows = [row if isinstance(row, WrittenRow) else
            {**row, 'best_of_arm': best[row['depth'], row['variant'].split('~')[0], *run_kind(row)][0] == row['variant']
             if row['status'] == 'done' and row['budget'] is None else None} for row in rows]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()

CSV_NUMBERS = dict(depth=int, seed=int, budget=int, iters=int, max_iters=int, lr_decay_iters=int, warmup_iters=int,
                   tokens=int, train_flops=int, learning_rate=float, non_embedding_params=int, tokens_per_param=float,
                   val_loss=float, compute_multiplier=float, time_multiplier=float, wall_time_s=float)

def parse_row(r):
    """A row read from sweep.csv with its numbers as sweep.py has them (None where empty; acc_<N> and
    majority_<N> floats; best_of_arm, which csv_text derives, dropped). ValueError naming the first cell that
    is not what its column holds."""
    if None in r or None in r.values():  # csv.DictReader's extra cells, or missing ones
        raise ValueError(f"{'more' if None in r else 'fewer'} cells than the header has")
    out = {}
    for k, v in r.items():
        kind = CSV_NUMBERS.get(k, float if k.startswith(('acc_', 'majority_')) else str)
        try:
            out[k] = None if v == '' else kind(v)
        except ValueError:
            raise ValueError(f"its {k} is {v!r}, not {'an integer' if kind is int else 'a number'}") from None
    if not isinstance(out.get('status'), str) or not isinstance(out.get('variant'), str) or out.get('depth') is None:
        raise ValueError("its depth, variant or status is missing")
    out.pop('best_of_arm', None)
    return out

def earlier_rows(path, rows):
    """The rows an earlier command wrote into the sweep.csv at path for runs that rows do not have (another
    command's variants, depths or seeds in the same out_dir) and whose directories are still there, typed as
    rows are, their multipliers as that command computed them (against its control): a sweep run in parts
    keeps every run in its CSV, and best_of_arm spans them all. [] without a readable file. A row with a cell
    that is not what its column holds is said in a warning naming the file, line and column, and kept as
    written (a WrittenRow: in no comparison); the file's other rows are read as they are."""
    root, names, earlier = os.path.dirname(path), {os.path.basename(r['out_dir']) for r in rows}, []
    try:
        with open(path, newline='') as f:
            reader = csv.DictReader(f)
            for r in reader:
                try:
                    earlier.append(parse_row(r))
                except ValueError as e:
                    print(f"warning: {path}, line {reader.line_num}: {e}: that row is kept as written, in no "
                          "comparison; correct it, or delete the line", file=sys.stderr)
                    earlier.append(WrittenRow({k: '' if v is None else v for k, v in r.items()
                                               if k not in (None, 'best_of_arm')}))
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        if os.path.exists(path):
            print(f"warning: {path} could not be read whole ({e}): only its first {len(earlier)} rows are kept",
                  file=sys.stderr)
    return [type(r)({**r, 'out_dir': os.path.join(root, name)}) for r in earlier
            if (name := os.path.basename(r.get('out_dir') or '')) and name not in names
            and os.path.isdir(os.path.join(root, name))]

def read_rows(*paths):
    """The finished runs of one or more sweep.csv files as sweep.py's rows (numbers, None where empty), the
    multipliers empty (add_compute_multipliers fills them); a run (depth, variant, seed, budget) in more than
    one file is taken from the first. For a table over several sweeps (the reference: the first variant):
        rows = read_rows('out-a/sweep.csv', 'out-b/sweep.csv'); ref = rows[0]['variant']
        fits = {16: fit_power_law(reference_ends(rows, ref, 16))}; add_compute_multipliers(rows, {}, fits, ref)
        print_table(rows, [16], list(dict.fromkeys(r['variant'] for r in rows)), 'val_loss', 'final val loss', 3)"""
    rows, seen = [], set()
    for path in paths:
        with open(path, newline='') as f:
            reader = csv.DictReader(f)
            for r in reader:
                try:
                    r = parse_row(r)
                except ValueError as e:
                    raise ValueError(f"{path}, line {reader.line_num}: {e}") from None
                key = (r['depth'], r['variant'], r['seed'], r['budget'])
                if r['status'] == 'done' and key not in seen:
                    seen.add(key)
                    rows.append({**r, **dict.fromkeys(MULTIPLIERS)})
    return rows

def print_fits(rows, fits, reference):
    """The fitted power law per depth and the runs read beyond its range; without fits, what '>' means."""
    for d, fit in fits.items():
        far = [float(r['multiplier_note'][14:]) for r in rows if r['depth'] == d and r['compute_multiplier'] is not None
               and r['multiplier_note'].startswith('extrapolated')]
        print(f"{d} layers: {reference}'s loss ~ FLOPs^-{fit[0]:.4f} over {fit[2][0]:.3g}-{fit[2][1]:.3g} FLOPs" + (
            f"; ~ {len(far)} run(s) beyond that range, up to x{max(far):.2f}: extrapolated" if far else '')
            if fit else f"{d} layers: no fit ({reference} needs two budgets finished with loss falling with compute)")
    if not fits:
        print(f"> a lower bound: {reference} never got to that loss in a seed; --budgets=... fits its loss against "
              "compute")

def print_table(rows, depths, variants, column, title, n_budgets=0, lower_is_better=True, floor_column=None):
    """Per depth and variant: mean over seeds, 95% interval, paired difference to the reference (the first
    variant) with its interval, verdict and p-values (t test, Holm-adjusted over every comparison of the table,
    sign test); then the compute multiplier, or how the mean compares with a floor (the majority baseline).
    rows: sweep.csv's rows as sweep.py builds them (numbers, None where empty)."""
    reference, width = variants[0], max([16] + [len(v) for v in variants])  # width: the variant column's
    done = {d: {v: {r['seed']: r for r in rows if (r['depth'], r['variant'], r['status'], r['budget'])
                    == (d, v, 'done', None)} for v in variants} for d in depths}
    mixed = mixed_lines(rows, depths, variants, reference)  # lines not of one experiment: no paired test
    diffs = {(d, v): [done[d][v][s][column] - done[d][reference][s][column] for s in done[d][v]
                      if s in done[d][reference]] for d in depths for v in variants if v != reference}
    diffs = {k: x for k, x in diffs.items() if x and k not in mixed}
    p_t = {k: t_test_p(x) for k, x in diffs.items()}
    p_holm, tests = dict(zip(p_t, holm(list(p_t.values())))), sum(not math.isnan(p) for p in p_t.values())
    fmt = lambda p: '' if math.isnan(p) else f"{p:.3f}" if p >= 0.001 else '<0.001'
    how = f"fitted over {n_budgets} budgets" if n_budgets else 'off its training curve'
    last = 'vs majority baseline' if floor_column else f'compute multiplier (x {reference} FLOPs, {how}) | per CPU-s'
    holm_over = (f"p_holm that Holm-adjusted over this table's {tests} t tests" if tests else
                 "p_holm that Holm-adjusted (no row here has two paired seeds of one experiment: no t test)")
    print(f"\n{title}: mean ± 95% interval over seeds, difference to {reference} paired by seed\ntwo-sided p: "
          f"p_t paired t test, {holm_over}, p_sign exact sign test (ties dropped); tok/P tokens per "
          f"non-embedding parameter\n"
          f"{'depth':>5}  {'variant':<{width}} {'n':>2} {'tok/P':>6}  {column:<17}  "
          f"{'vs reference':<19} {'verdict':<22} {'p_t':<6} {'p_holm':<6} {'p_sign':<6} {last}\n" + '-' * (125 + width))
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
            if floor_column and mine:  # "above" only when the whole interval is above the floor
                floor = sum(r[floor_column] for r in mine.values()) / len(mine)
                where = verdict(m - floor, h, lower_is_better)
                extra = f"{floor:.4f}: {dict(better='above', worse='below').get(where, where)}"
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
        print(f"! {d} layers, {v}: its runs (its seeds, or {reference}'s it is paired with) differ in "
              f"{' and '.join(what)}: not one experiment, left out of the paired tests; see sweep.csv's max_iters, "
              "data and options columns")

def print_depth_trend(rows, depths, variants, column='val_loss'):
    """Does a variant's difference to the reference change with depth? The slope of every seed's paired
    difference on log2(depth), over the depths both finished, with its 95% interval and p (slope_ci); then, as a
    check that does not take the pairs of one seed for independent, each seed's own slope and a t interval over
    the seeds."""
    reference, width = variants[0], max([16] + [len(v) for v in variants[1:]])
    mixed = mixed_lines(rows, depths, variants, reference)  # marked '!' in the table: not one experiment
    done = {(r['depth'], r['variant'], r['seed']): r[column] for r in rows
            if r['status'] == 'done' and r['budget'] is None}
    lines = []
    for v in variants[1:]:
        by_seed = {}  # seed -> its (log2(depth), difference) pairs
        for (d, w, s) in done:
            if w == v and d in depths and (d, reference, s) in done and (d, v) not in mixed:
                by_seed.setdefault(s, []).append((math.log2(d), done[d, v, s] - done[d, reference, s]))
        pairs = [xy for xys in by_seed.values() for xy in xys]
        if len({x for x, _ in pairs}) >= 2:
            slope, half, p = slope_ci(*zip(*pairs))
            own = [slope_ci(*zip(*xys))[0] for xys in by_seed.values() if len({x for x, _ in xys}) >= 2]
            own = ("seeds' own: {:+.4f} ± {:.4f} p {:.3f} ({} seed{})".format(*mean_ci(own), t_test_p(own), len(own),
                                                                            's' * (len(own) > 1))
                   if own else "seeds' own: none (no seed at two depths)")
            lines.append(f"{v:<{width}} {slope:+.4f} ± {half:<8.4f} p {p:.3f}  ({len(pairs)} pairs over "
                         f"{len({x for x, _ in pairs})} depths); {own}")
    if lines:
        print(f"\n{column} - {reference}'s, paired by seed, against log2(depth): slope ± 95% interval (least "
              "squares over every pair; below 0: the difference falls as depth doubles); then the mean of each "
              "seed's own slope, ± its t interval over the seeds")
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
                    floor_column=f'majority_{n}')

def plot_sweep(path, curves, depths, variants, fits, rows):
    """First row: final val loss against depth, and against training FLOPs (a point per depth: does a deeper model
    pay for its FLOPs?). Second row, a panel per depth: val loss against training FLOPs over training, with the
    reference's final losses at its budgets and the power law fitted through them. curves: {(depth, variant,
    seed): {iter: (FLOPs, val loss)}} of the finished runs; fits: {depth: fit_power_law(...)}; rows: sweep.csv's,
    for the reference's final losses (reference_ends)."""
    import matplotlib  # only here: plot=False needs no matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    reference, ncols = variants[0], max(2, len(depths))
    # options every variant has (the lr of a depth curve) go to the figure's title, the rest label the lines;
    # a variant keeps its colour in every panel
    shared = set.intersection(*(set(v.split('~')[1:]) for v in variants))
    label = {v: '~'.join(p for p in v.split('~') if p not in shared) for v in variants}
    colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
    color = {v: colors[i % len(colors)] for i, v in enumerate(variants)}
    fig, grid = plt.subplots(2, ncols, figsize=(4.2 * ncols, 8.4), squeeze=False)
    summary, axes = grid[0, :2], grid[1, :len(depths)]
    for ax in [*grid[0, 2:], *grid[1, len(depths):]]:
        ax.set_visible(False)
    for v in variants:
        by_depth = [[c for (cd, cv, _), c in curves.items() if (cd, cv) == (d, v)] for d in depths]
        pts = [(d, sum(c[max(c)][0] for c in cs) / len(cs), *mean_ci([c[max(c)][1] for c in cs]))
               for d, cs in zip(depths, by_depth) if cs]
        if pts:
            d, flops, m, h = zip(*pts)
            summary[0].errorbar(d, m, h, marker='o', capsize=3, label=label[v], color=color[v])  # one seed: nan
            summary[1].errorbar(flops, m, h, marker='o', capsize=3, label=label[v], color=color[v])
            for x, y, depth in zip(flops, m, d) if v == reference else ():  # the depths named once, at the reference
                summary[1].annotate(str(depth), (x, y), textcoords='offset points', xytext=(4, 4), fontsize=8)
        for ax, cs in zip(axes, by_depth):
            its = sorted(set.intersection(*map(set, cs)) - {0}) if cs else []  # no log(0 FLOPs)
            if its:
                x = [sum(c[it][0] for c in cs) / len(cs) for it in its]
                m, h = zip(*(mean_ci([c[it][1] for c in cs]) for it in its))
                ax.plot(x, m, marker='.', label=f"{label[v]} ({len(cs)} seeds)", color=color[v])
                ax.fill_between(x, [a - b for a, b in zip(m, h)], [a + b for a, b in zip(m, h)], alpha=0.2,
                                color=color[v])
    for ax, d in zip(axes, depths):  # the reference's final losses at its budgets, and the fit through them
        if fits.get(d):
            b, offsets, (low, high) = fits[d]
            x = [low * (high / low) ** (i / 20) for i in range(21)]
            a = sum(offsets.values()) / len(offsets)
            ax.plot(x, [math.exp(a) * c ** -b for c in x], 'k--', lw=1, label=f"{label[reference]} fit: FLOPs^-{b:.3f}")
            ends = [end for per_seed in reference_ends(rows, reference, d).values() for end in per_seed]
            ax.plot(*zip(*ends), 'kx', label=f"{label[reference]}, final at each budget")
    summary[0].set(xscale='log', xlabel='n_layer', ylabel='final val loss', title='final val loss (mean, 95% interval)')
    summary[0].set_xticks(depths, [str(d) for d in depths])
    summary[1].set(xscale='log', xlabel='training FLOPs', ylabel='final val loss',
                   title='final val loss against FLOPs (labels: n_layer)')
    for ax, d in zip(axes, depths):
        ax.set(xscale='log', xlabel='training FLOPs', ylabel='val loss', title=f"{d} layers: val loss (mean, 95% band)")
    for ax in [*summary, *axes]:
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # labels at powers of 10 only
        ax.legend(fontsize='small')
    if shared:
        fig.suptitle('every variant: ' + ' '.join(sorted(shared)))
    fig.tight_layout()
    fig.savefig(path, dpi=100)

def lr_setting(variant):
    """A variant name without its learning rates (~learning_rate=, ~min_lr=): the setting an lr sweep varies them in."""
    return '~'.join(part for part in variant.split('~') if not part.startswith(('learning_rate=', 'min_lr=')))

def plot_lr_sweep(path, rows, depths):
    """Final val loss against the learning rate, a panel per setting (lr_setting) run at two lrs or more, a line
    per depth (mean over seeds, 95% interval), each depth's best lr ringed: does the optimum stay put as depth
    grows? rows: sweep.csv's, with learning_rate (the run's own, from its checkpoint). Returns {(setting, depth):
    its best lr}; {} (and no plot) if no setting has two lrs."""
    done = [r for r in rows if r['status'] == 'done' and r['budget'] is None and r.get('learning_rate')]
    settings = {}
    for r in done:
        settings.setdefault(lr_setting(r['variant']), set()).add(r['learning_rate'])
    settings = [s for s, lrs in settings.items() if len(lrs) > 1]
    if not settings:
        return {}
    import matplotlib  # only here: plot=False needs no matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    best_lrs = {}
    ncols = math.ceil(len(settings) / math.ceil(len(settings) / 3))  # at most 3 a row; 4 panels as 2 x 2
    nrows = math.ceil(len(settings) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(settings):]:
        ax.set_visible(False)
    colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for ax, setting in zip(axes.flat, settings):
        for i, d in enumerate(depths):
            by_lr = {}
            for r in done:
                if r['depth'] == d and lr_setting(r['variant']) == setting:
                    by_lr.setdefault(r['learning_rate'], []).append(r['val_loss'])
            if by_lr:
                lrs = sorted(by_lr)
                m, h = zip(*(mean_ci(by_lr[lr]) for lr in lrs))
                line = ax.errorbar(lrs, m, h, marker='o', capsize=3, label=f"{d} layers",
                                   color=colors[i % len(colors)])  # a depth's colour is the same in every panel
                best = min(range(len(lrs)), key=lambda j: m[j])
                ax.plot(lrs[best], m[best], 'o', ms=12, mfc='none', color=line[0].get_color())
                best_lrs[setting, d] = lrs[best]
        arm, *options = setting.split('~')
        title = arm + ('\n' + ' '.join(options) if options else '')  # options on a line of their own: one fits
        ax.set(xscale='log', xlabel='learning rate', ylabel='final val loss', title=title)
        lrs = sorted({r['learning_rate'] for r in done if lr_setting(r['variant']) == setting})
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return best_lrs
