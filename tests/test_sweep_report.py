"""sweep.py's compute multipliers (nanolime/sweep_multipliers.py), sweep.csv (sweep_csv.py), tables (sweep_report.py)
and figures (sweep_plots.py) as functions of plain data, against numbers computed by hand (the statistics:
test_sweep_stats.py; sweep.py end to end: test_sweep.py)."""
import math
import re

import pytest
import torch

from conftest import REPO  # noqa: F401  (the repo on sys.path)
from nanolime import sweep_csv, sweep_multipliers, sweep_plots, sweep_report, sweep_stats
from nanolime.sweep_runs import put_row


def test_compute_multiplier_interpolation_by_hand():
    """Hand-made control curves [(FLOPs, val loss)], evaluated at 0, 100 and 1000 FLOPs."""
    multiplier = sweep_multipliers.compute_multiplier
    curve = [(0, 4.0), (100, 3.0), (1000, 2.0)]
    # 2.5 is halfway from 3.0 to 2.0: halfway in log FLOPs between 100 and 1000 is sqrt(100 * 1000) = 316.2
    # (not 550, halfway in FLOPs); the run used 500 FLOPs
    assert multiplier(curve, 2.5, 500) == pytest.approx((math.sqrt(1e5) / 500, ''))
    assert multiplier(curve, 2.8, 100) == pytest.approx((100 * 10 ** 0.2 / 100, ''))
    assert multiplier(curve, 3.0, 50) == (2.0, '')  # exactly an evaluation
    assert multiplier(curve, 2.0, 1000) == (1.0, '')  # the control itself
    # from iteration 0 (0 FLOPs) linearly: 3.5 is halfway from 4.0 to 3.0, so 50 FLOPs
    assert multiplier(curve, 3.5, 200) == pytest.approx((0.25, ''))
    assert multiplier(curve, 4.5, 200) == (0.0, '')  # the initial model is already as good
    # never reached: the control's total FLOPs over the run's, a lower bound
    assert multiplier(curve, 1.5, 250) == (4.0, 'lower')
    # the first crossing counts, not a later one after a bump
    assert multiplier([(0, 4.0), (100, 3.0), (200, 3.5), (400, 2.0)], 3.2, 8) == pytest.approx((10.0, ''))


def test_fitted_multiplier_recovers_a_known_multiplier():
    """Synthetic control runs on exact power laws L = A_s C^-b (b and each seed's A_s known) at three budgets;
    a variant whose final loss is the control's at m times its FLOPs has multiplier m."""
    fit_power_law, fitted = sweep_multipliers.fit_power_law, sweep_multipliers.fitted_multiplier
    b, scale = 0.08, {0: 4.0, 1: 4.3, 2: 3.9}  # seeds differ in level (data order), not in exponent
    budgets = [1e12, 2e12, 4e12]
    fit = fit_power_law({s: [(c, a * c ** -b) for c in budgets] for s, a in scale.items()})
    assert fit[0] == pytest.approx(b) and fit[2] == (1e12, 4e12)
    for s, a in scale.items():
        for m, c in [(1.3, 2e12), (0.7, 3e12), (1.0, 1.5e12)]:  # inside the fitted FLOPs: no extrapolation
            mult, beyond = fitted(fit, s, a * (m * c) ** -b, c)
            assert mult == pytest.approx(m, rel=1e-9) and beyond == 1.0
    # with noise: losses near 2 falling 2.8 % per doubling of compute (b = 0.04, a flat curve, where noise
    # costs most), and a loss error of 0.002 per run. An error e moves a multiplier by about e / (b L) = 2.5 %;
    # each seed's offset averages 3 budgets, so 5 seeds stay within 6 % (about 4 standard errors)
    gen, b = torch.Generator().manual_seed(0), 0.04
    level = {s: 2.0 * (1 + 0.01 * s) * 2e12 ** b for s in range(5)}
    noisy = {s: [(c, a * c ** -b + 0.002 * torch.randn(1, generator=gen).item()) for c in budgets]
             for s, a in level.items()}
    fit = fit_power_law(noisy)
    assert fit[0] == pytest.approx(b, rel=0.25)
    for s, a in level.items():
        mult, _ = fitted(fit, s, a * (1.25 * 2e12) ** -b, 2e12)
        assert mult == pytest.approx(1.25, rel=0.06)
    # a loss the control only reaches at 4x its largest budget is flagged, by that factor; below the smallest too
    fit = fit_power_law({0: [(c, 4.0 * c ** -b) for c in budgets]})
    assert fitted(fit, 0, 4.0 * 16e12 ** -b, 4e12) == pytest.approx((4.0, 4.0))
    assert fitted(fit, 0, 4.0 * 0.25e12 ** -b, 1e12) == pytest.approx((0.25, 4.0))
    # no fit from one budget, nor from losses that do not fall with compute
    assert fit_power_law({0: [(1e12, 2.0)], 1: [(1e12, 2.1)]}) is None
    assert fit_power_law({0: [(1e12, 2.0), (2e12, 2.1)]}) is None


def test_the_depth_trend_is_printed_from_the_paired_differences(capsys):
    """LIMe - baseline per seed: -0.01 (seed 0) and -0.02 (seed 1) x depth doublings plus a seed offset; one seed
    of LIMe at 32 layers has no baseline and is left out. Pooled: every pair, slope -0.015; each seed's own
    slope: -0.01 and -0.02, mean -0.015 ± 12.706 x 0.005 (t, 1 df)."""
    rows = [row(d, 'baseline', s, 2.0 + 0.1 * s) for d in (8, 16, 32) for s in (0, 1)]
    diffs = {(d, s): (-0.01 - 0.01 * s) * math.log2(d) + 0.003 * s for d in (8, 16, 32) for s in (0, 1)}
    rows += [row(d, 'lime', s, 2.0 + 0.1 * s + x) for (d, s), x in diffs.items()] + [row(32, 'lime', 2, 9.0)]
    rows += [row(8, 'hc', 0, 2.0), row(16, 'hc', 1, 2.2)]  # two depths, but no seed at both: no seed's own slope
    sweep_report.print_depth_trend(rows, [8, 16, 32], ['baseline', 'lime', 'hc'])
    out = capsys.readouterr().out
    want = sweep_stats.slope_ci([math.log2(d) for d, _ in diffs], list(diffs.values()))
    assert want[0] == pytest.approx(-0.015)
    own_p = sweep_stats.t_test_p([-0.01, -0.02])
    found = re.search(rf"lime\s+{want[0]:+.4f} ± {want[1]:.4f}\s+p {want[2]:.3f}\s+detectable (\S+)\s+\(6 pairs over "
                      rf"3 depths\); seeds' own: -0\.0150 ± {12.706 * 0.005:.4f} p {own_p:.3f} \(2 seeds\)", out)
    assert found, out  # at 80 % power: (t_0.975,4 + t_0.8,4) x SE, SE = the interval's half-width / t_0.975,4
    assert float(found[1]) == pytest.approx((2.776 + 0.941) * want[1] / 2.776, abs=2e-4)
    assert re.search(r"hc\s+\+0\.1000 ± nan\s+p nan\s+detectable nan\s+\(2 pairs over 2 depths\); seeds' own: none",
                     out), out


def row(depth, variant, seed, loss):
    return dict(depth=depth, variant=variant, seed=seed, status='done', budget=None, val_loss=loss,
                compute_multiplier=None, multiplier_note='')


def test_table_shows_the_p_values_holm_over_the_table(capsys):
    """2 and 4 layers, baseline (the control), lime, hc; differences to baseline paired by seed:
    2 layers: lime 0.02, -0.03 x4 (t = -2, 4 df: p 0.1161; 1 of 5 above: sign 0.375), hc -0.01 x5 (no spread:
    p 0; 5 of 5 below: 0.0625); 4 layers: lime 0.01, 0.03 (seeds 0 and 1 only: t = 2, 1 df, p 0.2952; sign 0.5),
    hc one seed (no t test; sign 1). Holm over the 3 t tests: 0 x3, 0.1161 x2 = 0.232, 0.2952 x1."""
    base = {s: 2.0 + 0.1 * s for s in range(5)}
    rows = [row(d, 'baseline', s, x) for d in (2, 4) for s, x in base.items()]
    rows += [row(2, 'lime', s, base[s] + x) for s, x in enumerate([0.02, -0.03, -0.03, -0.03, -0.03])]
    rows += [row(2, 'hc', s, base[s] - 0.01) for s in range(5)]
    rows += [row(4, 'lime', 0, base[0] + 0.01), row(4, 'lime', 1, base[1] + 0.03), row(4, 'hc', 3, base[3] + 0.02)]
    sweep_report.print_table(rows, [2, 4], ['baseline', 'lime', 'hc'], 'val_loss', 'final val loss')
    out = capsys.readouterr().out
    header = next(l for l in out.splitlines() if l.startswith('depth'))
    assert re.search(r'verdict\s+p_t\s+p_holm\s+p_sign\s+compute multiplier', header)
    assert "Holm-adjusted over this table's 3 t tests" in out
    line = {tuple(l.split()[:2]): l for l in out.splitlines() if re.match(r'\s*\d+\s', l)}
    assert re.search(r'inside seed noise\s+0\.116\s+0\.232\s+0\.375$', line['2', 'lime'])
    assert re.search(r'better\s+<0\.001\s+<0\.001\s+0\.062$', line['2', 'hc'])
    assert re.search(r'inside seed noise\s+0\.295\s+0\.295\s+0\.500$', line['4', 'lime'])
    assert re.search(r'no interval \(one seed\)\s+1\.000$', line['4', 'hc'])
    assert re.search(r'2\.\d{4} ± \S+$', line['2', 'baseline'])  # the control: no comparison
    # the columns line up under their headers
    for key in [('2', 'lime'), ('4', 'lime')]:
        assert line[key].index('0.', header.index('p_holm')) == header.index('p_holm')


def test_a_table_of_one_seed_per_row_says_it_has_no_t_test(capsys):
    """An lr sweep on one seed: no row has two paired seeds, so the header says there is no t test
    instead of counting zero of them, and no row prints a p_t or p_holm."""
    rows = [row(8, 'baseline', 20, 2.04), row(8, 'lime', 20, 2.05), row(16, 'baseline', 20, 2.0), row(16, 'lime', 20, 1.98)]
    sweep_report.print_table(rows, [8, 16], ['baseline', 'lime'], 'val_loss', 'final val loss')
    out = capsys.readouterr().out
    assert "no row here has two paired seeds of one experiment: no t test" in out
    assert "0 t tests" not in out
    for l in out.splitlines():
        if re.match(r'\s*\d+\s+lime', l):
            assert re.search(r'no interval \(one seed\)\s+1\.000$', l), l


def test_columns_line_up_under_a_long_variant_name(capsys):
    """Variant names longer than the column's 16 characters widen the column: every line's numbers stay
    under their headers, the control's and the other's alike."""
    ref, long = 'baseline~learning_rate=4e-3~min_lr=4e-4', 'mudd:prepost~learning_rate=4e-3~min_lr=4e-4'
    rows = [row(16, ref, s, 2.0 + 0.1 * s) for s in range(3)]
    rows += [row(16, long, s, 1.95 + 0.1 * s + 0.01 * s * s) for s in range(3)]
    sweep_report.print_table(rows, [16], [ref, long], 'val_loss', 'final val loss')
    out = capsys.readouterr().out.splitlines()
    header = next(l for l in out if l.startswith('depth'))
    lines = [l for l in out if re.match(r'\s*16\s', l)]
    assert len(lines) == 2
    for l in lines:
        assert l.index(' 3 ') + 1 == header.index(' n ') + 1, (header, l)  # n under n
        assert re.match(r'2\.\d{4} ± ', l[header.index('val_loss'):]), (header, l)  # the loss under its header
    assert re.match(r'[+-]0\.\d{4} ± ', lines[1][header.index('vs control'):]), (header, lines[1])
    assert re.match(r'inside seed noise', lines[1][header.index('verdict'):]), (header, lines[1])


def scored_rows():
    """2 layers, 2 seeds: the control (baseline) at max_iters and at a budget of 50 iterations, LIMe finished in
    seed 0 and failed in seed 1; the finished runs at max_iters scored on tier 2 of the arithmetic task."""
    def tier2(accuracy, key='majority_answer'):  # majority_baseline: what study/arithmetic.py wrote before
        return {'2': {'accuracy': accuracy, key: 0.25}}
    return [dict(row(2, 'baseline', 0, 2.0), train_flops=100.0, tiers=tier2(0.5)),
            dict(row(2, 'baseline', 1, 2.2), train_flops=100.0, tiers=tier2(0.7)),
            dict(row(2, 'lime', 0, 1.9), train_flops=110.0, tiers=tier2(0.6, 'majority_baseline')),
            dict(row(2, 'baseline', 0, 2.5), budget=50, train_flops=50.0),
            dict(row(2, 'lime', 1, None), status='failed', train_flops=None)]


def test_control_ends_tier_columns_and_csv_by_hand():
    """The control's final losses per seed (what fit_power_law fits), the scores as columns acc_<n> and
    majority_<n> per tier (empty for a run without them), and sweep.csv's text."""
    rows = scored_rows()
    assert sweep_multipliers.control_ends(rows, 'baseline', 2) == {0: [(100.0, 2.0), (50.0, 2.5)], 1: [(100.0, 2.2)]}
    assert sweep_multipliers.control_ends(rows, 'lime', 2) == {0: [(110.0, 1.9)]}  # not the failed run
    assert sweep_multipliers.control_ends(rows, 'baseline', 4) == {}
    assert sweep_csv.add_tier_columns(rows) == [2]
    assert all('tiers' not in r for r in rows)
    assert (rows[1]['acc_2'], rows[1]['majority_2'], rows[3]['acc_2'], rows[3]['majority_2']) == (0.7, 0.25, None, None)
    lines = sweep_csv.csv_text(rows).splitlines()
    assert lines[0] == ('depth,variant,seed,status,budget,val_loss,compute_multiplier,multiplier_note,train_flops,'
                        'acc_2,majority_2,best_of_arm')
    assert lines[1:] == ['2,baseline,0,done,,2.0,,,100.0,0.5,0.25,True', '2,baseline,1,done,,2.2,,,100.0,0.7,0.25,True',
                         '2,lime,0,done,,1.9,,,110.0,0.6,0.25,True', '2,baseline,0,done,50,2.5,,,50.0,,,',
                         '2,lime,1,failed,,,,,,,,']


def test_report_prints_the_runs_finished_the_loss_then_a_table_per_tier(capsys):
    rows = scored_rows()
    sweep_report.print_report(rows, [2], ['baseline', 'lime'], {}, 0, sweep_csv.add_tier_columns(rows))
    out = capsys.readouterr().out
    titles = [line.split(':')[0] for line in out.splitlines() if ': mean ± 95% interval' in line]
    assert out.startswith('\n4/5 runs finished\n') and titles == ['final val loss', 'test accuracy, 2 operators']
    assert "> a lower bound: baseline never got to that loss" in out  # no fits: what '>' means
    assert re.search(r'\n\s+2\s+lime\s+1\s+–\s+0\.6000 .* 0\.2500: no interval \(one seed\)\n', out)  # vs the majority


def test_each_arm_s_best_setting_is_chosen_recorded_and_printed(capsys):
    """An arm is a variant name before '~': its best at each depth is the setting with the lowest mean final val
    loss over its finished seeds (a budget run or a failed one counts for nothing), marked in sweep.csv and
    printed for arms run in more than one setting."""
    def row(depth, variant, seed, loss, status='done', budget=None):
        return dict(depth=depth, variant=variant, seed=seed, status=status, budget=budget, val_loss=loss,
                    compute_multiplier=None, multiplier_note=None)
    lr = '~learning_rate=4e-3'
    rows = [row(2, 'baseline', 0, 2.0), row(2, 'baseline', 1, 2.4), row(2, 'baseline' + lr, 0, 2.1),
            row(2, 'baseline' + lr, 1, 2.2), row(2, 'lime', 0, 1.9), row(2, 'lime' + lr, 0, 1.0, budget=50),
            row(2, 'lime' + lr, 1, None, status='failed'), row(4, 'baseline', 0, 3.0), row(4, 'baseline' + lr, 0, 2.9)]
    best = sweep_csv.best_of_arms(rows)
    assert best == {(2, 'baseline', None, None): ('baseline' + lr, pytest.approx(2.15), 2),
                    (2, 'lime', None, None): ('lime', 1.9, 1),
                    (4, 'baseline', None, None): ('baseline' + lr, 2.9, 1)}  # 2.15 < the mean of 2.0 and 2.4
    marks = [line.rsplit(',', 1)[1] for line in sweep_csv.csv_text(rows).splitlines()[1:]]
    assert marks == ['False', 'False', 'True', 'True', 'True', '', '', 'False', 'True']
    variants = ['baseline', 'baseline' + lr, 'lime', 'lime' + lr]
    sweep_report.print_report(rows, [2, 4], variants, {}, 0, [])
    out = capsys.readouterr().out.split("each arm's best")[1].splitlines()[1:]
    assert [line.split() for line in out] == [['2', 'baseline', 'baseline' + lr, '2.1500', '(2', 'seeds)'],
                                              ['2', 'lime', 'lime', '1.9000', '(1', 'seed)'],
                                              ['4', 'baseline', 'baseline' + lr, '2.9000', '(1', 'seed)']]


def test_the_plot_marks_the_reference_s_final_losses(tmp_path):
    """Each depth's panel marks the control's final losses at every budget, every seed, with the fit through
    them."""
    pytest.importorskip('matplotlib')
    import matplotlib.pyplot as plt
    rows = scored_rows()
    fit = sweep_multipliers.fit_power_law(sweep_multipliers.control_ends(rows, 'baseline', 2))
    curves = {(2, 'baseline', 0): {0: (0.0, 4.0), 10: (100.0, 2.0)}, (2, 'lime', 0): {0: (0.0, 4.0), 10: (110.0, 1.9)}}
    sweep_plots.plot_sweep(str(tmp_path / 'sweep.png'), curves, [2], ['baseline', 'lime'], {2: fit}, rows)
    try:
        panel = next(ax for ax in plt.gcf().axes if ax.get_title().startswith('2 layers'))
        marks = [line for line in panel.lines if line.get_marker() == 'x']
        assert len(marks) == 1 and sorted(zip(marks[0].get_xdata(), marks[0].get_ydata())) == [
            (50.0, 2.5), (100.0, 2.0), (100.0, 2.2)]
    finally:
        plt.close('all')
    assert (tmp_path / 'sweep.png').stat().st_size > 0


def test_the_plot_puts_final_loss_against_depth_and_against_flops(tmp_path):
    """The first row: each variant's mean final loss per depth, against n_layer and against its mean final
    training FLOPs (two seeds at 2 layers, one at 4), beside each other; a per-depth panel each below."""
    pytest.importorskip('matplotlib')
    import matplotlib.pyplot as plt
    curves = {(2, 'baseline', 0): {0: (0.0, 4.0), 10: (100.0, 2.0)}, (2, 'baseline', 1): {0: (0.0, 4.0), 10: (100.0, 2.2)},
              (4, 'baseline', 0): {0: (0.0, 4.0), 10: (200.0, 1.8)},
              (2, 'lime', 0): {0: (0.0, 4.0), 10: (110.0, 1.9)}, (4, 'lime', 0): {0: (0.0, 4.0), 10: (220.0, 1.7)}}
    sweep_plots.plot_sweep(str(tmp_path / 'sweep.png'), curves, [2, 4], ['baseline', 'lime'], {}, [])
    try:
        axes = {ax.get_title(): ax for ax in plt.gcf().axes if ax.get_visible()}
        assert len(axes) == 4 and {'2 layers: val loss (mean, 95% band)', '4 layers: val loss (mean, 95% band)'} < set(axes)
        by_depth, by_flops = axes['final val loss (mean, 95% interval)'], axes['final val loss against FLOPs (labels: n_layer)']
        points = lambda ax, v: next(list(zip(*c.lines[0].get_data())) for c in ax.containers if c.get_label() == v)
        assert points(by_depth, 'baseline') == [(2, pytest.approx(2.1)), (4, 1.8)]
        assert points(by_flops, 'baseline') == [(100.0, pytest.approx(2.1)), (200.0, 1.8)]
        assert points(by_flops, 'lime') == [(110.0, 1.9), (220.0, 1.7)]
    finally:
        plt.close('all')


def test_the_plot_names_options_every_variant_shares_once_and_keeps_each_variant_s_colour(tmp_path):
    """A depth curve at one lr: the lr goes to the figure's title, the lines are labelled by what differs, and a
    variant has one colour in every panel, also at a depth where a variant before it has no run."""
    pytest.importorskip('matplotlib')
    import matplotlib.pyplot as plt
    lr = '~learning_rate=4e-3~min_lr=4e-4'
    variants = ['baseline' + lr, 'lime' + lr, 'attnres:block~n_block=2' + lr]
    curves = {(d, v, 0): {0: (0.0, 4.0), 10: (100.0 * d, 2.0 - 0.1 * k)}
              for d in (2, 4) for k, v in enumerate(variants) if (d, k) != (4, 1)}  # no lime at 4 layers
    sweep_plots.plot_sweep(str(tmp_path / 'sweep.png'), curves, [2, 4], variants, {}, [])
    try:
        fig = plt.gcf()
        assert fig._suptitle.get_text() == 'every variant: learning_rate=4e-3 min_lr=4e-4'
        by_depth = next(ax for ax in fig.axes if ax.get_title() == 'final val loss (mean, 95% interval)')
        assert [t.get_text() for t in by_depth.get_legend().get_texts()] == ['baseline', 'lime',
                                                                             'attnres:block~n_block=2']
        panels = [ax for ax in fig.axes if ax.get_title().endswith('layers: val loss (mean, 95% band)')]
        colour = {line.get_label(): line.get_color() for ax in panels for line in ax.lines}
        assert colour['attnres:block~n_block=2 (1 seeds)'] == by_depth.containers[2].lines[0].get_color()
        assert [line.get_color() for line in panels[1].lines] == [
            by_depth.containers[k].lines[0].get_color() for k in (0, 2)]
    finally:
        plt.close('all')


def test_the_lr_plot_finds_each_depth_s_best_learning_rate(tmp_path):
    """Two settings of LIMe (standard, CompleteP) at lr 1e-3, 2e-3, 4e-3 and 2 depths, 2 seeds each: loss
    (lr - best)^2 around a best lr of 2e-3 at 4 layers and 4e-3 at 8 (standard), 2e-3 at both (CompleteP)."""
    pytest.importorskip('matplotlib')
    assert sweep_plots.lr_setting('lime~learning_rate=2e-3~min_lr=2e-4~depth_base=4') == 'lime~depth_base=4'
    best = {('lime', 4): 2e-3, ('lime', 8): 4e-3, ('lime~depth_scaling=completep', 4): 2e-3,
            ('lime~depth_scaling=completep', 8): 2e-3}
    rows = [dict(row(d, f"{arm.split('~')[0]}~learning_rate={lr}~min_lr={lr / 10}" + arm[4:], s,
                     2.0 + 1e5 * (lr - b) ** 2 + 0.001 * s), learning_rate=lr)
            for (arm, d), b in best.items() for lr in (1e-3, 2e-3, 4e-3) for s in (0, 1)]
    rows.append(dict(row(8, 'baseline', 0, 1.0), learning_rate=1e-3))  # one lr: not a setting of the plot
    assert sweep_plots.plot_lr_sweep(str(tmp_path / 'lr.png'), rows, [4, 8]) == best
    assert (tmp_path / 'lr.png').stat().st_size > 0
    assert sweep_plots.plot_lr_sweep(str(tmp_path / 'none.png'), rows[-1:], [8]) == {}
    assert not (tmp_path / 'none.png').exists()


def test_the_lr_plot_gives_a_depth_one_colour_and_lays_four_panels_out_square(tmp_path, monkeypatch):
    """CompleteP run at 8 layers only: its 8-layer line has the standard panel's 8-layer colour, not the first
    colour of its own panel. Four settings: 2 x 2 panels."""
    pytest.importorskip('matplotlib')
    import matplotlib.colors
    import matplotlib.pyplot as plt
    closed = []
    monkeypatch.setattr(plt, 'close', closed.append)  # keep the figure open to read its panels
    rows = [dict(row(d, f"lime~learning_rate={lr}" + cp, 0, 2.0 + lr), learning_rate=lr)
            for d, cp in [(4, ''), (8, ''), (8, '~depth_scaling=completep')] for lr in (1e-3, 2e-3)]
    sweep_plots.plot_lr_sweep(str(tmp_path / 'lr.png'), rows, [4, 8])
    axes = closed[0].axes
    assert [ax.get_title() for ax in axes] == ['lime', 'lime\ndepth_scaling=completep']
    colours = [{c.get_label(): matplotlib.colors.to_hex(c.lines[0].get_color()) for c in ax.containers} for ax in axes]
    assert colours[1] == {'8 layers': colours[0]['8 layers']} and colours[0]['4 layers'] != colours[0]['8 layers']
    four = [dict(r, variant=r['variant'] + f"~n_embd={k}") for k in (32, 48) for r in rows]
    sweep_plots.plot_lr_sweep(str(tmp_path / 'lr4.png'), four, [4, 8])
    shown = [ax for ax in closed[1].axes if ax.get_visible()]
    assert len(shown) == 4 and {ax.get_subplotspec().get_geometry()[:2] for ax in shown} == {(2, 2)}
    monkeypatch.undo()
    plt.close('all')


def test_per_cpu_second_multiplier_by_hand(capsys):
    """Control curve (100, 3.0), (200, 2.0) FLOPs per seed; lime ends at 2.0 having spent 100 FLOPs (x 2.0 per
    FLOP). The control took 10 s for 200 FLOPs (0.05 s per FLOP), lime 8 s: the control reaches 2.0 in
    200 FLOPs = 10 s, so per CPU-second lime is 10 / 8 = 1.25."""
    rows = [dict(row(4, 'baseline', 0, 2.0), train_flops=200, wall_time_s=10.0),
            dict(row(4, 'lime', 0, 2.0), train_flops=100, wall_time_s=8.0),
            dict(row(4, 'hc', 0, 2.0), train_flops=100, wall_time_s=None)]  # no wall time: no time multiplier
    curves = {(4, 'baseline', 0): {1: (100, 3.0), 2: (200, 2.0)}}
    sweep_multipliers.add_compute_multipliers(rows, curves, {}, 'baseline')
    assert rows[1]['compute_multiplier'] == pytest.approx(2.0) and rows[1]['time_multiplier'] == pytest.approx(1.25)
    assert rows[0]['time_multiplier'] is None and rows[2]['time_multiplier'] is None
    sweep_report.print_table(rows, [4], ['baseline', 'lime', 'hc'], 'val_loss', 'final val loss')
    lime_line = next(line for line in capsys.readouterr().out.splitlines() if ' lime ' in line)
    assert lime_line.endswith('2.000 ± nan | 1.250 ± nan')


def test_read_rows_joins_sweeps_for_one_table(tmp_path, capsys):
    """Two sweep.csv files: the control (budgets 150 and 300 at seeds 0, 1, a power law with b = 0.5 and both
    seeds' offsets equal) in one, lime in the other (with a duplicate control row, its loss changed: the first
    file's is kept). lime at 2.0 in 100 FLOPs; the fitted control reaches 2.0 at 400 FLOPs: multiplier 4."""
    ref = lambda s, budget, flops: dict(row(16, 'baseline', s, 40 / math.sqrt(flops)), budget=budget,
                                        train_flops=flops, wall_time_s=1.0)
    a = [ref(s, b, f) for s in (0, 1) for b, f in ((None, 200), (150, 100))]
    b = [dict(row(16, 'lime', s, 2.0), train_flops=100, wall_time_s=1.0) for s in (0, 1)]
    b += [dict(ref(0, None, 200), val_loss=9.0), dict(row(16, 'lime', 2, 3.0), status='failed', train_flops=None)]
    for name, rows in (('a.csv', a), ('b.csv', b)):
        (tmp_path / name).write_text(sweep_csv.csv_text(rows))
    rows = sweep_csv.read_rows(tmp_path / 'a.csv', tmp_path / 'b.csv')
    assert [(r['variant'], r['seed'], r['budget']) for r in rows] == [
        ('baseline', 0, None), ('baseline', 0, 150), ('baseline', 1, None), ('baseline', 1, 150),
        ('lime', 0, None), ('lime', 1, None)]  # the duplicate and the failed run dropped
    assert rows[0]['val_loss'] == pytest.approx(40 / math.sqrt(200)) and rows[0]['train_flops'] == 200
    fits = {16: sweep_multipliers.fit_power_law(sweep_multipliers.control_ends(rows, 'baseline', 16))}
    assert fits[16][0] == pytest.approx(0.5)
    sweep_multipliers.add_compute_multipliers(rows, {}, fits, 'baseline')
    assert [r['compute_multiplier'] for r in rows[4:]] == pytest.approx([4.0, 4.0])


def test_earlier_rows_are_typed_and_keep_their_columns(tmp_path):
    """An earlier command's arithmetic rows (acc_1, majority_1) carried into a CSV whose own rows have no tier
    columns: read back as numbers, written under the union of both commands' columns; a row of a run this
    command has, or whose directory is gone, is not carried; no file, no rows."""
    for name in ('lime-L4-s0', 'hc-L4-s0'):
        (tmp_path / name).mkdir()
    old = [dict(row(4, v, 0, loss), iters=300, acc_1=acc, majority_1=0.25, out_dir=f'/elsewhere/{v}-L4-s0')
           for v, loss, acc in (('lime', 2.5, 0.75), ('hc', 2.25, 0.5), ('attnres', 2.0, 1.0))]
    (tmp_path / 'sweep.csv').write_text(sweep_csv.csv_text(old))
    new = [dict(row(4, 'lime', 0, 2.75), iters=300, out_dir=str(tmp_path / 'lime-L4-s0'))]
    carried = sweep_csv.earlier_rows(str(tmp_path / 'sweep.csv'), new)
    assert carried == [dict(row(4, 'hc', 0, 2.25), iters=300, acc_1=0.5, majority_1=0.25, multiplier_note=None,
                            out_dir=str(tmp_path / 'hc-L4-s0'))]
    lines = sweep_csv.csv_text(new + carried).splitlines()
    assert lines[0].split(',')[-3:] == ['best_of_arm', 'acc_1', 'majority_1']
    assert lines[1].endswith(',True,,') and lines[2].endswith(',True,0.5,0.25')
    assert sweep_csv.earlier_rows(str(tmp_path / 'missing.csv'), new) == []


def test_sweep_csv_names_run_folders_relative_to_the_sweep(tmp_path):
    """sweep.csv's out_dir column holds each run's folder relative to the sweep's out_dir (no path of the machine
    that ran it); an earlier CSV's absolute paths read the same way; put_row writes one run's row in place of its
    earlier one, or after the others, as each run ends."""
    import csv
    for name in ('baseline-L4-s0', 'lime-L4-s0', 'lime-L4-s1'):
        (tmp_path / name).mkdir()
    rows = [dict(row(4, v, 0, loss), out_dir=f'/elsewhere/sweep/{v}-L4-s0') for v, loss in (('baseline', 2.5),
                                                                                          ('lime', 2.25))]
    assert [r['out_dir'] for r in csv.DictReader(sweep_csv.csv_text(rows).splitlines())] == [
        'baseline-L4-s0', 'lime-L4-s0']
    with open(tmp_path / 'sweep.csv', 'w', newline='') as f:  # as earlier versions wrote it: absolute paths
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert [r['out_dir'] for r in sweep_csv.earlier_rows(str(tmp_path / 'sweep.csv'), [])] == [
        str(tmp_path / 'baseline-L4-s0'), str(tmp_path / 'lime-L4-s0')]
    assert [r['out_dir'] for r in sweep_csv.read_rows(tmp_path / 'sweep.csv')] == [
        str(tmp_path / 'baseline-L4-s0'), str(tmp_path / 'lime-L4-s0')]
    for name in ('lime-L4-s1', 'lime-L4-s0'):  # a row after the others, then one in place of its earlier one
        put_row(str(tmp_path / 'sweep.csv'), dict(row(4, 'lime', int(name[-1]), 2.0), out_dir=str(tmp_path / name)))
    written = list(csv.DictReader((tmp_path / 'sweep.csv').read_text().splitlines()))
    assert [(r['out_dir'], r['val_loss']) for r in written] == [
        ('baseline-L4-s0', '2.5'), ('lime-L4-s0', '2.0'), ('lime-L4-s1', '2.0')]
    assert [r['out_dir'] for r in sweep_csv.read_rows(tmp_path / 'sweep.csv')] == [
        str(tmp_path / name) for name in ('baseline-L4-s0', 'lime-L4-s0', 'lime-L4-s1')]


def test_a_table_line_that_mixes_run_lengths_or_data_says_so(capsys):
    """Seeds that ran different lengths (or on different data) are never averaged or paired without a mark."""
    def row(variant, seed, loss, max_iters=100, data='d1'):
        return dict(depth=2, variant=variant, seed=seed, status='done', budget=None, val_loss=loss, max_iters=max_iters,
                    data=data, compute_multiplier=None, multiplier_note='')
    rows = [row('baseline', 0, 2.0), row('baseline', 1, 2.1), row('lime', 0, 1.9), row('lime', 1, 1.5, max_iters=400),
            row('hc', 0, 2.0), row('hc', 1, 1.9, data='d2'), row('mudd', 0, 2.0), row('mudd', 1, 2.05)]
    sweep_report.print_table(rows, [2], ['baseline', 'lime', 'hc', 'mudd'], 'val_loss', 'final val loss')
    out = capsys.readouterr().out.splitlines()
    line = {v: next(l for l in out if re.match(rf'\s*2!?\s+{v}\s', l)) for v in ('baseline', 'lime', 'hc', 'mudd')}
    assert '!' in line['lime'] and '!' in line['hc'] and '!' not in line['baseline'] and '!' not in line['mudd']
    assert any(l.startswith('! ') and 'max_iters 100, 400' in l for l in out), out
    assert any(l.startswith('! ') and 'data d1, d2' in l for l in out), out


def test_best_of_arm_compares_runs_of_one_length_and_data():
    def row(variant, seed, loss, max_iters=100, data='d1'):
        return dict(depth=2, variant=variant, seed=seed, status='done', budget=None, val_loss=loss, max_iters=max_iters,
                    data=data, compute_multiplier=None, multiplier_note='')
    lr = '~learning_rate=4e-3'
    rows = [row('lime', 0, 2.0), row('lime', 1, 2.0), row('lime' + lr, 0, 1.0, max_iters=400),
            row('lime' + lr, 1, 1.1, max_iters=400)]
    best = sweep_csv.best_of_arms(rows)
    assert best == {(2, 'lime', 100, 'd1'): ('lime', 2.0, 2), (2, 'lime', 400, 'd1'): ('lime' + lr, 1.05, 2)}
    marks = [line.rsplit(',', 1)[1] for line in sweep_csv.csv_text(rows).splitlines()[1:]]
    assert marks == ['True'] * 4  # each the best of its own length: not one better than the other


def test_a_line_whose_runs_differ_in_an_option_is_marked_and_not_tested(capsys):
    """Runs of a line that differ in a training option its variant name does not set (their own, or from the
    control's they are paired with) are marked '!', the option and its values named, and have no p-value; options
    the names set after '~' (router_lr) are what is compared, not a mix."""
    import json

    def row(variant, seed, loss, **options):
        base = dict(learning_rate=0.002, n_embd=16, router_lr=0.01)  # the options its name sets are not among them
        return dict(depth=2, variant=variant, seed=seed, status='done', budget=None, val_loss=loss, max_iters=100,
                    data='d1', compute_multiplier=None, multiplier_note='', options=json.dumps({**base, **options}))
    lr = 'lime~router_lr=0.002'
    rows = [row('baseline', s, 2.0 + s / 10) for s in range(3)]
    rows += [row('lime', 0, 1.9), row('lime', 1, 2.0, learning_rate=0.02), row('lime', 2, 2.1)]
    rows += [row(lr, s, 1.95 + s / 10 + s * s / 100, router_lr=0.002) for s in range(3)]
    rows += [row('hc', s, 1.9 + s / 10, n_embd=32) for s in range(3)]
    sweep_report.print_table(rows, [2], ['baseline', 'lime', lr, 'hc'], 'val_loss', 'final val loss')
    out = capsys.readouterr().out.splitlines()
    line = {v: next(l for l in out if re.match(rf'\s*2!?\s+{re.escape(v)}\s', l))
            for v in ('baseline', 'lime', lr, 'hc')}
    assert [v for v in line if '!' in line[v][:6]] == ['lime', 'hc']
    assert 'over this table\'s 1 t tests' in '\n'.join(out)
    assert re.search(r'\d\.\d{3}\s+\d\.\d{3}\s+\d\.\d{3}$', line[lr]), line[lr]  # p_t, p_holm, p_sign
    for v in ('lime', 'hc'):
        assert not re.search(r'inside seed noise|better|worse|\d\.\d{3}\s+\d\.\d{3}', line[v]), line[v]
    marks = [l for l in out if l.startswith('! ')]
    assert marks == [
        "! 2 layers, lime: its runs (its seeds, or baseline's it is paired with) differ in options (learning_rate "
        "0.002, 0.02): not one experiment, left out of the paired tests; see sweep.csv's max_iters, data and options "
        "columns",
        "! 2 layers, hc: its runs (its seeds, or baseline's it is paired with) differ in options (n_embd 16, 32): not "
        "one experiment, left out of the paired tests; see sweep.csv's max_iters, data and options columns"]
    # nor in the depth trend: a marked line's pairs are not a trend
    deeper = [{**r, 'depth': 4} for r in rows]
    sweep_report.print_depth_trend(rows + deeper, [2, 4], ['baseline', 'lime', lr, 'hc'])
    trend = capsys.readouterr().out
    assert re.search(rf'^{re.escape(lr)}\s', trend, re.M) and not re.search(r'^(lime|hc)\s', trend, re.M), trend


def test_an_earlier_row_with_a_bad_cell_is_kept_as_written_and_the_others_read(tmp_path, capsys):
    """One cell that is not a number (or a line with a cell too many) in an earlier command's sweep.csv: a
    warning naming the file, the line and the column; that row kept as written, in no comparison; the others
    read as numbers."""
    for name in ('lime-L4-s0', 'hc-L4-s0', 'mudd-L4-s0', 'moda-L4-s0'):
        (tmp_path / name).mkdir()
    old = [dict(row(4, v, 0, loss), iters=300, out_dir=f'/elsewhere/{v}-L4-s0')
           for v, loss in (('lime', 2.5), ('hc', 2.25), ('mudd', 2.0), ('moda', 2.1))]
    lines = sweep_csv.csv_text(old).splitlines()
    lines[2] = lines[2].replace(',2.25,', ',2.25 nats,')
    lines[4] += ',extra'
    (tmp_path / 'sweep.csv').write_text('\n'.join(lines) + '\n')
    carried = sweep_csv.earlier_rows(str(tmp_path / 'sweep.csv'), [])
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'sweep.csv'}, line 3: its val_loss is '2.25 nats', not a number: that row is " \
           "kept as written, in no comparison" in err
    assert f"warning: {tmp_path / 'sweep.csv'}, line 5: more cells than the header has" in err
    assert [r['variant'] for r in carried] == ['lime', 'hc', 'mudd', 'moda']
    assert carried[0]['val_loss'] == 2.5 and carried[2]['val_loss'] == 2.0  # typed
    assert isinstance(carried[1], sweep_csv.WrittenRow) and carried[1]['val_loss'] == '2.25 nats'
    text = sweep_csv.csv_text(carried).splitlines()
    assert ',2.25 nats,' in text[2] and text[1].endswith(',True') and text[3].endswith(',True')
