"""
The depth-substitution design (this folder's README, "The first design") sized for one GPU
lease: seeds 0-7 and a 64-layer baseline as well, so that S(32) = LIMe(32) - baseline(64), the paper's 64 against 128
layers (§5.5, Fig. 6) at half the scale. Every run is a train.py process with config/sweep_deep_narrow_cpu.py's
options (width 64, 4 heads, shakespeare_char, lr 2e-3, 1,200 iterations) on device cuda; many of them share the one
GPU at once (--jobs), seed by seed and deepest first, so that the seeds finished first are complete. A row goes to
<out_dir>/runs.csv as each run ends; at the deadline (under 8 minutes after the start) the script stops whatever still
runs (train.py saves a checkpoint: rerunning resumes it), and reads the out_dir with analyze.py.

$ python prepare.py shakespeare_char
$ python experiments/depth_substitution/gpu.py --dry_run=True  # the runs in launch order with estimated times; no GPU
$ python experiments/depth_substitution/gpu.py                 # out-gpu-depth-substitution/
$ python experiments/depth_substitution/analyze.py --out_dir=out-gpu-depth-substitution --depths=4,8,16,32,64
"""
import csv
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from nanolime.common import UserError  # noqa: E402

# -----------------------------------------------------------------------------
out_dir = 'out-gpu-depth-substitution'
config = 'config/sweep_deep_narrow_cpu.py'  # train.py's options of every run (its sweep keys left out)
base_depths = '4,8,16,32,64'  # the baseline's depths; LIMe's: all but the deepest (S(L) = LIMe(L) - baseline(2L))
seeds = '0,1,2,3,4,5,6,7'
max_iters = 1200
device = 'cuda'
jobs = 8                    # runs at once on the GPU: one process each, one CPU thread each
deadline_s = 450.0          # stop everything this many seconds after the start (at most MAX_DEADLINE_S)
est_ms_base = 28.0          # the dry run's estimate of one iteration: est_ms_base + est_ms_per_layer * n_layer,
est_ms_per_layer = 2.3      # times lime_cost for LIMe, per process with `jobs` processes sharing a GPU and its CPU
lime_cost = 1.3             # (measured on an H200 with 8 runs at once beside other work: 4 layers 40 s, 64 layers 210 s)
dry_run = False
# -----------------------------------------------------------------------------
MAX_DEADLINE_S = 480.0      # a lease's run command may take at most 10 minutes: 8 for the runs, the rest to report
SWEEP_KEYS = ('out_dir', 'depths', 'variants', 'seeds', 'jobs')  # the config's sweep keys, not train.py's
ROW_KEYS = ('depth', 'variant', 'seed', 'status', 'val_loss', 'wall_time_s', 'ended_at_s')


def train_options(path, iters, dev):
    """train.py's options from a sweep config: its plain values less the sweep's own keys, the schedule over iters."""
    scope = {}
    with open(path if os.path.isabs(path) else os.path.join(REPO, path)) as f:
        exec(f.read(), scope)
    opts = {k: v for k, v in scope.items() if not k.startswith('_') and k not in SWEEP_KEYS
            and isinstance(v, (bool, int, float, str))}
    return {**opts, 'max_iters': iters, 'lr_decay_iters': iters, 'device': dev}


def plan(depth_list, seed_list, root):
    """The runs in launch order: seed by seed (the first seeds finish complete), deepest first within a seed; each
    {'depth', 'variant', 'seed', 'dir'}. The baseline at every depth, LIMe at all but the deepest."""
    runs = []
    for s in seed_list:
        for d in sorted(depth_list, reverse=True):
            for v in ('baseline', 'lime') if d != max(depth_list) else ('baseline',):
                runs.append({'depth': d, 'variant': v, 'seed': s, 'dir': os.path.join(root, f"{v}-L{d}-s{s}")})
    return runs


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
    """Whether the run directory says done at iters (sweep.json, as sweep.py writes it)."""
    try:
        with open(os.path.join(run['dir'], 'sweep.json')) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return False
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
                                                              f"(after the deadline: {deadline_s:g} s)"))


def main():
    from nanolime.common import configure
    configure(globals())
    depth_list, seed_list = check_config()
    runs = plan(depth_list, seed_list, out_dir)
    skip = [finished(r, max_iters) for r in runs]
    todo = [r for r, done in zip(runs, skip) if not done]
    seconds = [0.0 if done else estimate(r, max_iters, est_ms_base, est_ms_per_layer, lime_cost)
               for r, done in zip(runs, skip)]
    times = schedule(runs, jobs, seconds)
    print_plan(runs, times, skip)
    if dry_run:
        return
    opts = train_options(config, max_iters, device)
    from nanolime.checkpoint import read_log
    from nanolime.data import data_id, dataset_dir
    ident = data_id(dataset_dir(opts['dataset'], opts.get('data_dir')))
    if ident is None:
        raise UserError(f"{opts['dataset']} is not prepared: python prepare.py {opts['dataset']}")
    os.makedirs(out_dir, exist_ok=True)
    rows_path = os.path.join(out_dir, 'runs.csv')
    new = not os.path.exists(rows_path)
    t0, running, queue = time.time(), {}, list(todo)
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    with open(rows_path, 'a', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=ROW_KEYS)
        if new:
            writer.writeheader()

        def record(run, status, started):
            log = read_log(run['dir'])
            final = next((r for r in reversed(log) if r.get('iter') == max_iters and 'val_loss' in r), None)
            status = 'done' if status == 0 and final else 'stopped at the deadline' if status == 'stopped' \
                else f"failed ({status})"
            wall = time.time() - started
            if status == 'done':
                with open(os.path.join(run['dir'], 'sweep.json'), 'w') as s:
                    json.dump({'status': 'done', 'max_iters': max_iters, 'lr_decay_iters': max_iters,
                               'warmup_iters': opts.get('warmup_iters'), 'data': ident, 'wall_time_s': wall}, s)
            writer.writerow({'depth': run['depth'], 'variant': run['variant'], 'seed': run['seed'], 'status': status,
                             'val_loss': final and final['val_loss'], 'wall_time_s': round(wall, 1),
                             'ended_at_s': round(time.time() - t0, 1)})
            f.flush()  # a row as each run ends
            print(f"{time.time() - t0:6.0f}s  {os.path.basename(run['dir'])}: {status}"
                  + (f", val loss {final['val_loss']:.4f}" if status == 'done' else ''), flush=True)

        try:
            while queue or running:
                while queue and len(running) < jobs and time.time() - t0 < deadline_s:
                    run = queue.pop(0)
                    os.makedirs(run['dir'], exist_ok=True)
                    resume = os.path.exists(os.path.join(run['dir'], 'ckpt.pt'))
                    args = {**opts, 'lime': run['variant'] == 'lime', 'n_layer': run['depth'], 'seed': run['seed'],
                            'out_dir': run['dir'], **({'init_from': 'resume'} if resume else {})}
                    with open(os.path.join(run['dir'], 'train.log'), 'a') as out:
                        p = subprocess.Popen([sys.executable, os.path.join(REPO, 'train.py'),
                                              *(f"--{k}={v}" for k, v in args.items())], stdout=out,
                                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
                    running[p] = (run, time.time())
                if time.time() - t0 >= deadline_s:  # SIGTERM: train.py saves a checkpoint and exits
                    queue.clear()
                    for p in running:
                        p.send_signal(signal.SIGTERM)
                    for p, (run, started) in list(running.items()):
                        try:
                            p.wait(timeout=30)
                        except subprocess.TimeoutExpired:
                            p.kill()
                            p.wait()
                        record(run, 0 if p.returncode == 0 and finished_log(run) else 'stopped', started)
                    running.clear()
                    break
                for p, (run, started) in list(running.items()):
                    if p.poll() is not None:
                        del running[p]
                        record(run, p.returncode, started)
                time.sleep(0.5)
        finally:  # an interrupted or failing launcher leaves no run behind on the GPU
            for p in running:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
    print(f"rows: {rows_path}; {time.time() - t0:.0f} s")
    sys.argv = [sys.argv[0], f'--out_dir={out_dir}', f'--depths={",".join(map(str, depth_list))}',
                f'--max_iters={max_iters}', f'--csv_path={os.path.join(out_dir, "depth_substitution.csv")}',
                f'--plot_path={os.path.join(out_dir, "depth_substitution.png")}']
    import runpy
    runpy.run_path(os.path.join(HERE, 'analyze.py'), run_name='__main__')


def finished_log(run):
    """Whether a run stopped at the deadline had just written its final evaluation."""
    from nanolime.checkpoint import read_log
    return any(r.get('iter') == max_iters and 'val_loss' in r for r in read_log(run['dir']))


if __name__ == '__main__':
    main()
