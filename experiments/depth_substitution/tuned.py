"""
LIMe at L against the baseline at 2L, each arm at its own learning rate: the runs and their reading, as planned in
this folder's README ("LIMe at L against the baseline at 2L, each at its own learning rate").

Arms: baseline at 4, 8 and 16 layers, LIMe at 4 and 8 (width 64, 4 heads, 1,200 iterations, the deep-narrow CPU
config). Three steps, each sweep.py commands into one out_dir; run this again after an interruption and every step
resumes where it stopped (finished runs are skipped):
  1. lr, seed 10: each arm at learning_rate 1e-3, 2e-3, 4e-3, 8e-3 (min_lr = lr / 10; LIMe's router_lr 1e-2), and
     one step further (5e-4 or 1.6e-2) for an arm whose best is at an end of the grid;
  2. router_lr, seed 10: LIMe at its best lr with router_lr 3e-3 and 3e-2 (1e-2 ran in step 1), and one step
     further (1e-3 or 1e-1) where the best is at an end;
  3. test, seeds 0-4, one seed at a time: each arm at its tuned settings.
Best = the lowest final val loss (a run without one counts as the worst). Then the test runs are read as the first
design's (analyze.py): S(L) = LIMe(L) - baseline(2L) and the gate G(L) = baseline(L) - baseline(2L) for L = 4 and 8,
paired by seed, 95% t intervals, S's p Holm-adjusted over the two L, the reading, k(L) with a bootstrap interval.

$ python experiments/depth_substitution/tuned.py                  # runs what is missing, then reads it
$ python experiments/depth_substitution/tuned.py --run=False      # reads the runs so far
  -> tuned.csv (a row per run, the settings it ran at), tuned_summary.csv (a row per L), tuned.png
"""
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
from nanolime.common import UserError, configure  # noqa: E402
from analyze import analyse, plot, read_runs, report, complete_seeds, write_csv  # noqa: E402

# -----------------------------------------------------------------------------
out_dir = 'out-sweep-depth-substitution-tuned'
csv_path = os.path.join(HERE, 'tuned.csv')  # a row per run; tuned_summary.csv and tuned.png beside it
run = True                 # False: only read the runs so far
bootstrap = 10000          # resamples of the seeds for k(L)'s interval
# -----------------------------------------------------------------------------
CONFIG = os.path.join(REPO, 'config', 'sweep_deep_narrow_cpu.py')
SCHEDULE = ['--max_iters=1200', '--lr_decay_iters=1200', '--plot=False']
ARMS = [('baseline', 4), ('baseline', 8), ('baseline', 16), ('lime', 4), ('lime', 8)]
LRS = ['1e-3', '2e-3', '4e-3', '8e-3']           # the grid; one step beyond an end: EXTEND
ROUTER_LRS = ['3e-3', '1e-2', '3e-2']
EXTEND = {'1e-3': '5e-4', '8e-3': '1.6e-2', '3e-3': '1e-3', '3e-2': '1e-1'}
MIN_LR = {'5e-4': '5e-5', '1e-3': '1e-4', '2e-3': '2e-4', '4e-3': '4e-4', '8e-3': '8e-4', '1.6e-2': '1.6e-3'}
ROUTER_LR = '1e-2'         # the paper's, while the lr is tuned
TUNE_SEED, TEST_SEEDS = 10, [0, 1, 2, 3, 4]


def variant(arm, lr, router_lr=ROUTER_LR):
    """sweep.py's variant name of an arm at lr (min_lr = lr / 10, as the first design's 2e-3 / 2e-4)."""
    name = f"{arm}~learning_rate={lr}~min_lr={MIN_LR[lr]}"
    return name + f"~router_lr={router_lr}" if arm == 'lime' else name


def dir_variant(name):
    """The variant part of its run directories' names (sweep.py maps other characters to '_')."""
    return re.sub(r'[^A-Za-z0-9+_.-]', '_', name)


def sweep(depth, variants, seeds, jobs):
    cmd = [sys.executable, os.path.join(REPO, 'sweep.py'), CONFIG, *SCHEDULE, f'--out_dir={out_dir}',
           f'--depths={depth}', f"--seeds={','.join(map(str, seeds))}", f"--variants={','.join(variants)}",
           f'--jobs={jobs}']
    print('+', ' '.join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)


def losses(seed):
    """{variant name as in its directory: (depth, final val loss or inf)} of the finished runs of `seed`."""
    rows = read_runs(os.path.join(REPO, out_dir)) if os.path.isdir(os.path.join(REPO, out_dir)) else []
    return {(r['variant'], r['depth']): r['val_loss'] if r['status'] == 'done' and r['val_loss'] is not None
            and math.isfinite(r['val_loss']) else math.inf for r in rows if r['seed'] == seed}


def best(arm, depth, names, seed_losses):
    """The name of `names` (variants of one arm at one depth) with the lowest final val loss at the tuning seed."""
    return min(names, key=lambda n: seed_losses.get((dir_variant(n), depth), math.inf))


def tune():
    """{(arm, depth): the variant name at its tuned settings}, running what is missing when `run`."""
    grid = {arm: [variant(arm[0], lr) for lr in LRS] for arm in ARMS}
    for extend in (False, True):  # the grid, then one step beyond an end where the best is there
        if extend:
            seen = losses(TUNE_SEED)
            for arm, names in grid.items():
                lr = LRS[[variant(arm[0], x) for x in LRS].index(best(*arm, names, seen))]
                grid[arm] = names + ([variant(arm[0], EXTEND[lr])] if lr in (LRS[0], LRS[-1]) else [])
        if run:
            sweep(4, [v for a in ('baseline', 'lime') for v in grid[a, 4]], [TUNE_SEED], 2)
            sweep(8, [v for a in ('baseline', 'lime') for v in grid[a, 8]], [TUNE_SEED], 2)
            sweep(16, grid['baseline', 16], [TUNE_SEED], 2)
    seen = losses(TUNE_SEED)
    tuned = {arm: best(*arm, names, seen) for arm, names in grid.items()}
    for depth in (4, 8):  # router_lr at LIMe's best lr
        lr = re.search(r'learning_rate=([^~]+)', tuned['lime', depth])[1]
        names = [variant('lime', lr, r) for r in ROUTER_LRS]
        if run:
            sweep(depth, names, [TUNE_SEED], 2)
        r = ROUTER_LRS[names.index(best('lime', depth, names, losses(TUNE_SEED)))]
        if r in (ROUTER_LRS[0], ROUTER_LRS[-1]):
            names.append(variant('lime', lr, EXTEND[r]))
            if run:
                sweep(depth, names, [TUNE_SEED], 2)
        tuned['lime', depth] = best('lime', depth, names, losses(TUNE_SEED))
    return tuned


def settings(name):
    return dict(re.findall(r'~([a-z_]+)=([^~]+)', name))


def main():
    configure(globals())
    tuned = tune()
    for arm, name in tuned.items():
        print(f"tuned: {arm[0]} at {arm[1]} layers: {name}")
    for seed in TEST_SEEDS if run else []:  # one seed at a time: the seeds done so far form complete triples
        for depth in (4, 8):
            sweep(depth, [tuned['baseline', depth], tuned['lime', depth]], [seed], 2)
        sweep(16, [tuned['baseline', 16]], [seed], 1)
    rows = read_runs(os.path.join(REPO, out_dir))
    arm_of = {(dir_variant(name), depth): arm for (arm, depth), name in tuned.items()}
    names = {dir_variant(n): n for depth in (4, 8, 16) for a in ('baseline', 'lime')
             for lr in MIN_LR for r in ROUTER_LRS + list(EXTEND.values())
             for n in [variant(a, lr, r)]}
    for r in rows:
        r['arm'] = r['variant'].split('_')[0]
        r['variant'] = names.get(r['variant'], r['variant'])
        r['role'] = 'tuning' if r['seed'] == TUNE_SEED else 'test'
        r.update({k: settings(r['variant']).get(k) for k in ('learning_rate', 'min_lr', 'router_lr')})
        r['tuned'] = (dir_variant(r['variant']), r['depth']) in arm_of
    test = [{**r, 'variant': r['arm']} for r in rows if r['role'] == 'test' and r['tuned']]
    summary = analyse(test, [4, 8, 16], 'baseline', 'lime', bootstrap)
    report(test, summary, complete_seeds(test, [4, 8, 16]))
    rows.sort(key=lambda r: (r['role'] == 'test', r['seed'], r['depth'], r['arm'], r['variant']))
    write_csv(csv_path, rows)
    write_csv(csv_path.replace('.csv', '_summary.csv'), summary)
    plot(csv_path.replace('.csv', '.png'), test, summary, [4, 8, 16], 'baseline', 'lime')
    print(f"CSV: {csv_path}; summary and figure beside it")


if __name__ == '__main__':
    try:
        main()
    except subprocess.CalledProcessError as e:
        raise UserError(f"a sweep failed (exit {e.returncode}); its error is above. Fix it and run this again: "
                        "finished runs are kept") from None
