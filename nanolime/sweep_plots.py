"""
sweep.py's figures: sweep.png (final val loss against depth and against training FLOPs; each depth's curves) and
sweep_lr.png (final val loss against the learning rate). The only module of the sweep that imports matplotlib, and
only when a figure is drawn: --plot=False needs none.
"""
import math

from nanolime.sweep_multipliers import control_ends
from nanolime.sweep_stats import mean_ci

def plot_sweep(path, curves, depths, variants, fits, rows):
    """First row: final val loss against depth, and against training FLOPs (a point per depth: does a deeper model
    pay for its FLOPs?). Second row, a panel per depth: val loss against training FLOPs over training, with the
    control's final losses at its budgets and the power law fitted through them. curves: {(depth, variant,
    seed): {iter: (FLOPs, val loss)}} of the finished runs; fits: {depth: fit_power_law(...)}; rows: sweep.csv's,
    for the control's final losses (control_ends)."""
    import matplotlib  # only here: plot=False needs no matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    control, ncols = variants[0], max(2, len(depths))
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
            for x, y, depth in zip(flops, m, d) if v == control else ():  # the depths named once, at the control
                summary[1].annotate(str(depth), (x, y), textcoords='offset points', xytext=(4, 4), fontsize=8)
        for ax, cs in zip(axes, by_depth):
            its = sorted(set.intersection(*map(set, cs)) - {0}) if cs else []  # no log(0 FLOPs)
            if its:
                x = [sum(c[it][0] for c in cs) / len(cs) for it in its]
                m, h = zip(*(mean_ci([c[it][1] for c in cs]) for it in its))
                ax.plot(x, m, marker='.', label=f"{label[v]} ({len(cs)} seeds)", color=color[v])
                ax.fill_between(x, [a - b for a, b in zip(m, h)], [a + b for a, b in zip(m, h)], alpha=0.2,
                                color=color[v])
    for ax, d in zip(axes, depths):  # the control's final losses at its budgets, and the fit through them
        if fits.get(d):
            b, offsets, (low, high) = fits[d]
            x = [low * (high / low) ** (i / 20) for i in range(21)]
            a = sum(offsets.values()) / len(offsets)
            ax.plot(x, [math.exp(a) * c ** -b for c in x], 'k--', lw=1, label=f"{label[control]} fit: FLOPs^-{b:.3f}")
            ends = [end for per_seed in control_ends(rows, control, d).values() for end in per_seed]
            ax.plot(*zip(*ends), 'kx', label=f"{label[control]}, final at each budget")
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
