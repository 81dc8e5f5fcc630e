"""
The depth-substitution design (this folder's README, "The first design") sized for one GPU
lease: seeds 0-7 and a 64-layer baseline as well, so that S(32) = LIMe(32) - baseline(64), the paper's 64 against 128
layers (§5.5, Fig. 6) at half the scale. One sweep.py command runs it: every run a train.py process with
config/sweep_deep_narrow_cpu.py's options (width 64, 4 heads, shakespeare_char, lr 2e-3, 1,200 iterations) on device
cuda, many of them sharing the one GPU at once (--jobs), seed by seed and deepest first, so that the seeds finished
first are complete. sweep.csv gets a row as each run ends; at the deadline (under 8 minutes after the start) the
sweep stops whatever still runs (train.py saves a checkpoint: rerunning resumes it), and this script reads the
out_dir with analyze.py.

$ python prepare.py shakespeare_char
$ python experiments/depth_substitution/gpu.py --dry_run=True  # the runs in launch order with estimated times; no GPU
$ python experiments/depth_substitution/gpu.py                 # out-gpu-depth-substitution/
$ python experiments/depth_substitution/analyze.py --out_dir=out-gpu-depth-substitution --depths=4,8,16,32,64
"""
import os
import runpy
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from nanolime.common import UserError  # noqa: E402
from nanolime.sweep_runs import launch_order, read_state  # noqa: E402

# -----------------------------------------------------------------------------
out_dir = 'out-gpu-depth-substitution'
config = 'config/sweep_deep_narrow_cpu.py'  # train.py's options of every run (its sweep keys overridden below)
base_depths = '4,8,16,32,64'  # the baseline's depths; LIMe's: all but the deepest (S(L) = LIMe(L) - baseline(2L))
seeds = '0,1,2,3,4,5,6,7'
max_iters = 1200
device = 'cuda'
jobs = 8                    # runs at once on the GPU: one process each, one CPU thread each
deadline_s = 450.0          # stop everything this many seconds after the first run starts (at most MAX_DEADLINE_S)
est_ms_base = 28.0          # the dry run's estimate of one iteration: est_ms_base + est_ms_per_layer * n_layer,
est_ms_per_layer = 2.3      # times lime_cost for LIMe, per process with `jobs` processes sharing a GPU and its CPU
lime_cost = 1.3             # (measured on an H200 with 8 runs at once beside other work: 4 layers 40 s, 64 layers 210 s)
dry_run = False
# -----------------------------------------------------------------------------
MAX_DEADLINE_S = 480.0      # a lease's run command may take at most 10 minutes: 8 for the runs, the rest to report


def plan(depth_list, seed_list, root):
    """The runs in sweep.py's launch order (seed by seed, deepest first within a seed), each {'depth', 'variant',
    'seed', 'dir'}: the baseline at every depth, LIMe at all but the deepest."""
    return launch_order({'depth': d, 'variant': v, 'seed': s, 'dir': os.path.join(root, f"{v}-L{d}-s{s}")}
                        for s in seed_list for d in depth_list for v in ('baseline', 'lime')
                        if (v, d) != ('lime', max(depth_list)))


def estimate(run, iters, base_ms, per_layer_ms, lime_factor):
    """Estimated seconds of a run (the dry run's model, not a measurement)."""
    return iters * (base_ms + per_layer_ms * run['depth'] * (lime_factor if run['variant'] == 'lime' else 1)) / 1e3


def schedule(runs, n_jobs, seconds):
    """(start, end) of each run when n_jobs run at once, each started as soon as a slot frees, in order."""
    free, times = [0.0] * n_jobs, []
    for run, sec in zip(runs, seconds):
        slot = min(range(n_jobs), key=free.__getitem__)
        times.append((free[slot], free[slot] + sec))
        free[slot] += sec
    return times


def finished(run, iters):
    """Whether the run directory says done at iters (its sweep.json)."""
    state = read_state(os.path.join(run['dir'], 'sweep.json'))[0]
    return state.get('status') == 'done' and state.get('max_iters') == iters


def check_config():
    if not 0 < deadline_s <= MAX_DEADLINE_S:
        raise UserError(f"deadline_s={deadline_s}: expected 0 < deadline_s <= {MAX_DEADLINE_S:g} (8 minutes: the runs "
                        "and the report fit one command of a GPU lease)")
    if jobs < 1 or max_iters < 1:
        raise UserError(f"jobs={jobs}, max_iters={max_iters}: expected both >= 1")
    depth_list = sorted({int(d) for d in str(base_depths).split(',') if d.strip()})
    seed_list = [int(s) for s in str(seeds).split(',') if s.strip()]
    if len(depth_list) < 2 or any(2 * d not in depth_list for d in depth_list[:-1]):
        raise UserError(f"base_depths={base_depths!r}: expected doublings, e.g. 4,8,16,32,64 (S(L) needs the baseline "
                        "at 2L)")
    if not seed_list or len(set(seed_list)) != len(seed_list) or min(seed_list) < 0:
        raise UserError(f"seeds={seeds!r}: expected distinct integers >= 0, e.g. 0,1,2,3,4,5,6,7")
    return depth_list, seed_list


def print_plan(runs, times, skip):
    print(f"{len(runs)} runs ({sum(skip)} already done), {jobs} at a time on {device}, deadline {deadline_s:g} s; "
          f"estimated per run {est_ms_base:g} ms + {est_ms_per_layer:g} ms x n_layer (x {lime_cost:g} LIMe) per "
          f"iteration, {max_iters} iterations")
    print(f"{'order':>5}  {'run':<18} {'est. start':>10} {'est. end':>9}")
    for i, (run, (start, end), done) in enumerate(zip(runs, times, skip), 1):
        late = '  after the deadline: would be stopped' if end > deadline_s and not done else ''
        print(f"{i:>5}  {os.path.basename(run['dir']):<18} {'done' if done else f'{start:9.0f}s':>10} "
              f"{'' if done else f'{end:8.0f}s':>9}{late}")
    depth_list = sorted({r['depth'] for r in runs})
    print("statistics: " + '; '.join(f"S({d}) = lime-L{d} - baseline-L{2 * d}, "
                                     f"G({d}) = baseline-L{d} - baseline-L{2 * d}" for d in depth_list[:-1]))
    last = max((end for (_, end), done in zip(times, skip) if not done), default=0.0)
    print(f"estimated: the last run ends at {last:.0f} s " + ("(inside the deadline)" if last <= deadline_s else
                                                              f"(after the deadline: {deadline_s:g} s)"), flush=True)


def main():
    from nanolime.common import configure
    configure(globals())
    depth_list, seed_list = check_config()
    runs = plan(depth_list, seed_list, out_dir)
    skip = [finished(r, max_iters) for r in runs]
    seconds = [0.0 if done else estimate(r, max_iters, est_ms_base, est_ms_per_layer, lime_cost)
               for r, done in zip(runs, skip)]
    print_plan(runs, schedule(runs, jobs, seconds), skip)
    if dry_run:
        return
    depths = ','.join(map(str, depth_list))
    code = subprocess.run([  # its lines go to this script's output as they come
        sys.executable, os.path.join(REPO, 'sweep.py'), config if os.path.isabs(config) else os.path.join(REPO, config),
        f'--out_dir={out_dir}', f'--depths={depths}', '--variants=baseline,lime', f'--skip=lime-L{depth_list[-1]}',
        f"--seeds={','.join(map(str, seed_list))}", f'--max_iters={max_iters}', f'--lr_decay_iters={max_iters}',
        f'--device={device}', f'--jobs={jobs}', '--threads=1', f'--deadline_s={deadline_s}', '--plot=False']).returncode
    if not os.path.exists(os.path.join(out_dir, 'sweep.csv')):
        raise UserError(f"sweep.py ran no run (exit status {code}): its error is above")
    sys.argv = [sys.argv[0], f'--out_dir={out_dir}', f'--depths={depths}', f'--max_iters={max_iters}',
                f'--csv_path={os.path.join(out_dir, "depth_substitution.csv")}',
                f'--plot_path={os.path.join(out_dir, "depth_substitution.png")}']
    runpy.run_path(os.path.join(HERE, 'analyze.py'), run_name='__main__')


if __name__ == '__main__':
    main()
