"""sweep.py end to end on the CPU: tiny models, a few iterations, every run a real train.py subprocess.

The statistics (t intervals, paired and Welch differences, verdicts) are checked as pure functions
against numbers computed by hand.
"""
import ast
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

TINY = ['--device=cpu', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4', '--total_batch_size=64',
        '--eval_iters=2', '--warmup_iters=1', '--log_interval=1', '--compile=False', '--dtype=float32']
GRID = ['--depths=1,2', '--variants=baseline,lime', '--seeds=0,1', '--jobs=2']
COLUMNS = ['depth', 'variant', 'seed', 'status', 'params', 'flops_per_token', 'n_embd', 'iters', 'tokens',
           'train_flops', 'val_loss', 'wall_time_s', 'out_dir']


def run(script, *args, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    env.pop('NANOLIME_DEBUG', None)
    return subprocess.run([sys.executable, script] + list(args), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert 'Traceback' not in p.stderr
    return p


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def read_log(run_dir):
    with open(os.path.join(run_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def data_rng_states(run_dir):
    """The numpy bit-generator states in a run's checkpoint: the training-data sampler's RNG."""
    ckpt = torch.load(os.path.join(run_dir, 'ckpt.pt'), map_location='cpu', weights_only=True)
    found = []

    def walk(x):
        if isinstance(x, dict):
            if 'bit_generator' in x and 'state' in x:
                found.append(json.dumps(x, sort_keys=True, default=str))
            else:
                for v in x.values():
                    walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(ckpt['rng'])
    assert found, "no numpy RNG state in the checkpoint's 'rng'"
    return found


@pytest.fixture(scope='module')
def swept(data_dir, tmp_path_factory):
    """2 depths x 2 variants x 2 seeds, 3 iterations each, two at a time."""
    root = str(tmp_path_factory.mktemp('sweep') / 'root')
    args = GRID + TINY + [f'--data_dir={data_dir}', f'--out_dir={root}', '--max_iters=3', '--lr_decay_iters=3',
                          '--eval_interval=1']
    return root, args, ok(run('sweep.py', *args))


def test_end_to_end_csv_table_progress(swept):
    root, _, p = swept
    rows = read_csv(os.path.join(root, 'sweep.csv'))
    assert list(rows[0]) == COLUMNS
    assert sorted((int(r['depth']), r['variant'], int(r['seed'])) for r in rows) == sorted(
        (d, v, s) for d in (1, 2) for v in ('baseline', 'lime') for s in (0, 1))
    for r in rows:
        assert r['status'] == 'done', r
        assert r['out_dir'] == os.path.join(root, f"{r['variant']}-L{r['depth']}-s{r['seed']}")
        log = read_log(r['out_dir'])
        assert float(r['val_loss']) == log[-1]['val_loss'] and log[-1]['iter'] == 3
        assert int(r['iters']) == 3 and int(r['tokens']) == 3 * 64 == log[-1]['tokens']
        assert int(r['train_flops']) == 3 * int(r['flops_per_token']) * int(r['tokens'])
        assert float(r['wall_time_s']) > 0 and int(r['n_embd']) == 16
    by = {(int(r['depth']), r['variant'], int(r['seed'])): r for r in rows}
    # the numbers come from each run's own model: deeper is bigger, LIMe's routers add to depth 2 only
    # (layer 0 has no router)
    assert int(by[2, 'baseline', 0]['params']) > int(by[1, 'baseline', 0]['params'])
    assert int(by[1, 'lime', 0]['params']) == int(by[1, 'baseline', 0]['params'])
    assert int(by[2, 'lime', 0]['params']) > int(by[2, 'baseline', 0]['params'])
    assert int(by[2, 'lime', 0]['flops_per_token']) > int(by[2, 'baseline', 0]['flops_per_token'])
    # the table: per depth, each variant's mean and the lime - baseline difference with a verdict
    for d in (1, 2):
        vals = [float(by[d, 'lime', s]['val_loss']) - float(by[d, 'baseline', s]['val_loss']) for s in (0, 1)]
        line = next(l for l in p.stdout.splitlines() if re.match(rf'\s*{d}\s+lime\s+2\s', l))
        assert f"{sum(vals) / 2:+.4f}" in line
        assert re.search(r'inside seed noise|better|worse', line)
    assert re.search(r'val loss \(mean ± 95% interval', p.stdout)
    # the gap over training: the paired difference at every evaluation after iteration 0
    gap = p.stdout.split('over training, by iteration')[1]
    for d in (1, 2):
        line = next(l for l in gap.splitlines() if re.match(rf'\s*{d}\s+lime\s', l))
        for it in (1, 2, 3):
            diffs = [curves_of(by, d, 'lime', s)[it] - curves_of(by, d, 'baseline', s)[it] for s in (0, 1)]
            assert f"{it}: {sum(diffs) / 2:+.4f} ± " in line, (it, line)
    # progress: the bar counts runs and shows a current run's iteration and loss
    assert '8/8' in p.stderr
    assert re.search(r'L\d-s\d \d/3 (val )?loss \d', p.stderr)
    # threads are split between the two runs at a time
    cores = len(os.sched_getaffinity(0))
    assert f"2 at a time, {max(1, cores // 2)} threads each" in p.stdout
    # plots, or a note saying why not
    try:
        import matplotlib  # noqa: F401
        assert os.path.exists(os.path.join(root, 'sweep_val_loss_vs_depth.png'))
        assert os.path.exists(os.path.join(root, 'sweep_val_loss_vs_flops.png'))
    except ImportError:
        assert 'matplotlib is not installed' in p.stdout


def curves_of(by, d, v, s):
    return {r['iter']: r['val_loss'] for r in read_log(by[d, v, s]['out_dir']) if 'val_loss' in r}


def test_same_seed_same_data_order(swept):
    """train.py's data sampler is seeded by the seed alone: after the same number of batches its RNG is
    in the same state in every variant and depth with that seed (so it drew the same batches: the
    generator's step is a bijection), and in a different one for the other seed."""
    root = swept[0]
    states = {(d, v, s): data_rng_states(os.path.join(root, f"{v}-L{d}-s{s}"))
              for d in (1, 2) for v in ('baseline', 'lime') for s in (0, 1)}
    for s in (0, 1):
        assert len({json.dumps(states[d, v, s]) for d in (1, 2) for v in ('baseline', 'lime')}) == 1
    assert states[2, 'lime', 0] != states[2, 'lime', 1]


def test_second_run_skips_everything_and_report_only_rebuilds(swept):
    root, args, _ = swept
    files = [os.path.join(dirpath, f) for dirpath, _, names in os.walk(root) for f in names
             if f in ('ckpt.pt', 'log.jsonl', 'train.log')]
    mtimes = {f: os.stat(f).st_mtime_ns for f in files}
    rows = read_csv(os.path.join(root, 'sweep.csv'))
    p = ok(run('sweep.py', *args))
    assert '8 already done, 0 to resume, 0 to start' in p.stdout
    assert {f: os.stat(f).st_mtime_ns for f in files} == mtimes  # no run was started
    assert read_csv(os.path.join(root, 'sweep.csv')) == rows
    os.remove(os.path.join(root, 'sweep.csv'))
    p = ok(run('sweep.py', *args, '--report_only=True'))
    assert 'already done' not in p.stdout  # nothing checked or trained
    assert read_csv(os.path.join(root, 'sweep.csv')) == rows
    assert {f: os.stat(f).st_mtime_ns for f in files} == mtimes


@pytest.fixture(scope='module')
def resumed_and_failed(data_dir, tmp_path_factory):
    """baseline and LIMe at depth 2 x seeds 0, 1 for 6 iterations, where baseline-L2-s0 was interrupted
    after 3 (a checkpoint at iter 3), and a router lr of 1e30 makes both LIMe runs diverge (train.py stops
    with an error) while the baseline, which has no router, trains normally."""
    root = str(tmp_path_factory.mktemp('sweep') / 'root')
    train_args = TINY + [f'--data_dir={data_dir}', '--lr_decay_iters=6', '--eval_interval=3', '--router_lr=1e30',
                         '--grad_clip=0.0']
    ok(run('train.py', *train_args, '--lime=False', '--hc=0', '--n_layer=2', '--seed=0', '--max_iters=3',
           f"--out_dir={os.path.join(root, 'baseline-L2-s0')}"))
    before = read_log(os.path.join(root, 'baseline-L2-s0'))
    p = run('sweep.py', '--depths=2', '--variants=baseline,lime', '--seeds=0,1', '--jobs=2', f'--out_dir={root}',
            '--max_iters=6', *train_args)
    return root, before, p


def test_interrupted_run_is_resumed(resumed_and_failed):
    root, before, p = resumed_and_failed
    assert '0 already done, 1 to resume, 3 to start' in p.stdout
    run_dir = os.path.join(root, 'baseline-L2-s0')
    with open(os.path.join(run_dir, 'train.log')) as f:
        assert 'resuming from' in f.read()
    log = read_log(run_dir)
    assert [r['iter'] for r in log] == [0, 1, 2, 3, 4, 5, 6]
    assert log[:4] == before  # the first three iterations were not trained again
    row = next(r for r in read_csv(os.path.join(root, 'sweep.csv')) if r['out_dir'] == run_dir)
    assert row['status'] == 'done' and float(row['val_loss']) == log[-1]['val_loss']


def test_failed_run_is_reported_and_the_others_finish(resumed_and_failed):
    root, _, p = resumed_and_failed
    assert p.returncode == 1 and 'Traceback' not in p.stderr
    # each failure with its train.py's last stderr line: once while the sweep runs, once at the end
    for name in ('lime-L2-s0', 'lime-L2-s1'):
        lines = [l for l in p.stderr.splitlines() if re.search(rf'{name}: error: loss is (nan|inf)', l)]
        assert len(lines) == 2, p.stderr
        assert lines[-1] in p.stderr.strip().splitlines()[-2:]
    status = {os.path.basename(r['out_dir']): r['status'] for r in read_csv(os.path.join(root, 'sweep.csv'))}
    assert status == {'baseline-L2-s0': 'done', 'lime-L2-s0': 'failed', 'baseline-L2-s1': 'done',
                      'lime-L2-s1': 'failed'}
    assert 'lime' in p.stdout and '(no finished runs)' in p.stdout


def test_changed_options_are_refused_not_mixed(swept):
    """The same out_dir with another learning rate: no run is skipped as done or resumed with it."""
    root, args, _ = swept
    mtimes = {f: os.stat(os.path.join(root, f, 'ckpt.pt')).st_mtime_ns for f in os.listdir(root) if '-L' in f}
    p = run('sweep.py', *args, '--learning_rate=0.01')
    assert p.returncode == 1
    assert "0 already done, 0 to resume, 0 to start" in p.stdout
    assert re.search(r"lime-L2-s1 was trained with other options \(learning_rate=0.002 there, 0.01 now\)", p.stderr)
    assert {f: os.stat(os.path.join(root, f, 'ckpt.pt')).st_mtime_ns for f in mtimes} == mtimes


@pytest.mark.parametrize('args, message', [
    (['--learnig_rate=1e-3'], "error: unknown config key 'learnig_rate' (--learnig_rate=1e-3); "
                              "did you mean 'learning_rate'?"),
    (['--dept=2,4'], "error: unknown config key 'dept' (--dept=2,4); did you mean 'depths'?"),
    (['--n_embd=big'], "error: n_embd='big': expected int, got str (--n_embd=big)"),
    (['--variants=baseline,lmie'], "error: unknown variant 'lmie'; did you mean 'lime'?"),
    (['--variants=baseline,lime:frist-2'], "error: depth 2, variant lime:frist-2: invalid model config"),
    (['--depths=2,x'], "error: depths='2,x': expected comma-separated integers"),
    (['--out_dir='], "error: out_dir='': name the sweep's directory"),
])
def test_bad_input_is_one_error_line_before_any_run(tmp_path, args, message):
    root = str(tmp_path / 'root')
    p = run('sweep.py', '--depths=2', f'--out_dir={root}', *args)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(message), p.stderr
    assert not os.path.exists(root)


# ----------------------------------------------------------------------------- statistics
@pytest.fixture(scope='module')
def stats():
    """sweep.py's functions (its imports and defs, not the script around them)."""
    path = os.path.join(REPO, 'sweep.py')
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef))
            or (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets))]
    namespace = {'__file__': path}
    exec(compile(ast.Module(keep, []), path, 'exec'), namespace)
    return namespace


def test_t_quantiles(stats):
    t95 = stats['t95']
    assert t95(1) == 12.706 and t95(2) == 4.303 and t95(10) == 2.228 and t95(30) == 2.042
    assert t95(1.5) == pytest.approx((12.706 + 4.303) / 2)
    assert t95(40) == pytest.approx(2.021, abs=1e-3) and t95(120) == pytest.approx(1.980, abs=1e-3)
    assert math.isnan(t95(0))


def test_mean_interval_and_differences_by_hand(stats):
    mean_ci, diff_ci, verdict = stats['mean_ci'], stats['diff_ci'], stats['verdict']
    # 1, 2, 3: mean 2, sd 1, n 3 -> 4.303 / sqrt(3)
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 / math.sqrt(3))
    m, h = mean_ci([1.5])
    assert m == 1.5 and math.isnan(h)
    # paired by seed: differences 0.1, 0.05, 0.1 -> mean 1/12, variance 1/1200, so sd / sqrt(3) = 1/60
    # and the half-width is 4.303 / 60
    ref = {0: 1.0, 1: 1.1, 2: 1.2}
    other = {2: 1.3, 0: 1.1, 1: 1.15}  # the order of the seeds does not matter, the pairing does
    d, h, paired = diff_ci(ref, other)
    assert paired and d == pytest.approx(1 / 12) and h == pytest.approx(4.303 / 60)
    assert verdict(d, h) == 'worse'  # 0.0116 .. 0.1550: higher loss
    assert verdict(-d, h) == 'better'
    # unpaired differences of the same values would be noise: the pairing is what makes it significant
    d2, h2, _ = diff_ci({10: 1.0, 11: 1.1, 12: 1.2}, {20: 1.1, 21: 1.15, 22: 1.3})
    assert d2 == pytest.approx(d) and verdict(d2, h2) == 'inside seed noise'
    # Welch, by hand: ref 1.0, 1.2 (var/n 0.01), other 1.5, 1.7, 1.6 (var/n 0.003333); se 0.115470,
    # df 1.684211, t = 12.706 - 0.684211 * (12.706 - 4.303) = 6.956576, half 0.803276
    d, h, paired = diff_ci({0: 1.0, 1: 1.2}, {2: 1.5, 3: 1.7, 4: 1.6})
    assert not paired and d == pytest.approx(0.5) and h == pytest.approx(0.803276, abs=1e-5)
    assert verdict(d, h) == 'inside seed noise'
    assert verdict(0.01, float('nan')) == 'no interval (one seed)'
    assert verdict(0.0, 0.0) == 'inside seed noise'  # identical runs


def test_arithmetic_runs_get_accuracy_per_tier(tmp_path):
    """On the arithmetic task each finished run is evaluated by arithmetic.py; the accuracy per tier and
    its majority baseline go into the CSV and a table; a rerun evaluates only what lacks an evaluation."""
    import arithmetic
    data = tmp_path / 'data'
    arithmetic.prepare(str(data / 'arithmetic'), samples=200, n_val=20, n_test=10)
    root = str(tmp_path / 'root')
    args = ['--depths=2', '--variants=baseline', '--seeds=0', f'--out_dir={root}', '--dataset=arithmetic',
            f'--data_dir={data}', '--device=cpu', '--n_head=2', '--n_embd=16', '--block_size=64', '--batch_size=4',
            '--total_batch_size=256', '--eval_iters=2', '--warmup_iters=1', '--max_iters=2', '--lr_decay_iters=2',
            '--eval_interval=2', '--compile=False', '--dtype=float32']
    p = ok(run('sweep.py', *args))
    rows = read_csv(os.path.join(root, 'sweep.csv'))
    assert len(rows) == 1 and {'acc_4', 'acc_5', 'acc_6', 'majority_4', 'majority_5', 'majority_6'} <= set(rows[0])
    for r in rows:
        with open(os.path.join(r['out_dir'], 'arith_eval_test.json')) as f:
            tiers = json.load(f)['per_tier']
        for n in (4, 5, 6):
            assert float(r[f'acc_{n}']) == tiers[str(n)]['accuracy'] and tiers[str(n)]['n'] == 10
            assert float(r[f'majority_{n}']) == tiers[str(n)]['majority_baseline']
    assert 'test accuracy, 6 operators' in p.stdout and 'vs majority baseline' in p.stdout
    os.remove(os.path.join(root, 'baseline-L2-s0', 'arith_eval_test.json'))
    p = ok(run('sweep.py', *args))
    assert '0 already done, 1 to evaluate, 0 to resume, 0 to start' in p.stdout
    assert os.path.exists(os.path.join(root, 'baseline-L2-s0', 'arith_eval_test.json'))
    with open(os.path.join(root, 'baseline-L2-s0', 'train.log')) as f:
        commands = [l for l in f if l.startswith('$ ')]
    assert [c.split()[2].endswith('train.py') for c in commands] == [True, False, False]  # evaluated again,
    # not trained again
