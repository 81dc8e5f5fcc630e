"""
Compute multipliers of a sweep's runs: the FLOPs the control (the sweep's first variant, same depth and seed) needs
to reach a run's final val loss over the run's FLOPs, read off the control's training curve or off a power law fitted
to its final losses at several budgets; per CPU-second too. Functions of sweep.csv's rows (nanolime/sweep_csv.py).
"""
import math

def compute_multiplier(control_curve, loss, flops):
    """(FLOPs the control needs to reach `loss` / `flops`, 'lower' if a lower bound else ''), from its evaluations
    control_curve = [(flops, val loss), ...] in training order: the first crossing of `loss`, interpolated in log FLOPs
    (linearly from iteration 0, at 0 FLOPs); if it never gets there, its total FLOPs give the lower bound."""
    f0, v0 = 0.0, math.inf
    for f, v in control_curve:
        if v <= loss:
            x = (v0 - loss) / (v0 - v) if v0 < math.inf else 1.0  # where between the two evaluations
            return (f0 * (f / f0) ** x if f0 > 0 else f0 + x * (f - f0)) / flops, ''
        f0, v0 = f, v
    return control_curve[-1][0] / flops, 'lower'

def control_ends(rows, control, depth):
    """{seed: [(FLOPs, final val loss)] of the control's finished runs at `depth`, one per budget}: what
    fit_power_law fits."""
    ends = {}
    for r in rows:
        if (r['depth'], r['variant'], r['status']) == (depth, control, 'done'):
            ends.setdefault(r['seed'], []).append((r['train_flops'], r['val_loss']))
    return ends

def fit_power_law(points):
    """The control's final loss against its compute, L = A_s * C^-b, from runs trained to several budgets: one
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
    """(the FLOPs the fitted control of `seed` needs to reach `loss`, over `flops`; how far that lies beyond the
    fitted FLOPs, as a factor: 1.0 inside them)."""
    b, offsets, (low, high) = fit
    need = math.exp((offsets[seed] - math.log(loss)) / b)
    return need / flops, max(need / high, low / need, 1.0)

MULTIPLIERS = ('compute_multiplier', 'multiplier_note', 'time_multiplier')  # add_compute_multipliers's columns

def add_compute_multipliers(rows, curves, fits, control):
    """Each finished run's compute multiplier and how it was read (row['compute_multiplier'], 'multiplier_note'):
    with fits ({depth: fit_power_law(...)}, from --budgets), off its seed's power law; without, off the control's
    own training curve (curves: {(depth, variant, seed): {iter: (FLOPs, val loss)}}; its lr not yet decayed).
    Per CPU-second too (row['time_multiplier']): the seconds the control needs to reach the run's loss (the
    FLOPs it needs, at its own seconds per FLOP: its wall_time_s / train_flops) over the run's seconds."""
    controls = {(r['depth'], r['seed']): r for r in rows
                if (r['variant'], r['status'], r['budget']) == (control, 'done', None)}
    for row in rows:
        row['time_multiplier'] = None
        if row['status'] != 'done' or row['variant'] == control:
            continue
        fit, ctrl = fits.get(row['depth']), curves.get((row['depth'], control, row['seed']))
        if fits and fit and row['seed'] in fit[1]:
            row['compute_multiplier'], beyond = fitted_multiplier(fit, row['seed'], row['val_loss'], row['train_flops'])
            row['multiplier_note'] = f"extrapolated x{beyond:.2f}" if beyond > 1 else 'fitted'
        elif not fits and ctrl:
            row['compute_multiplier'], bound = compute_multiplier([ctrl[it] for it in sorted(ctrl)], row['val_loss'],
                                                                  row['train_flops'])
            row['multiplier_note'] = 'lower bound' if bound else 'control curve'
        ctrl = controls.get((row['depth'], row['seed']))
        if row['compute_multiplier'] is not None and ctrl and ctrl.get('wall_time_s') and row.get('wall_time_s'):
            row['time_multiplier'] = (row['compute_multiplier'] * row['train_flops'] / ctrl['train_flops']
                                      * ctrl['wall_time_s'] / row['wall_time_s'])
