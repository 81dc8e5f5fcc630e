"""
Depth sweeps: train every (depth, variant, seed) with train.py, then compare the variants over seeds.

$ python sweep.py --depths=4,8,16,32 --variants=baseline,lime --seeds=0,1,2 --max_iters=400
$ python sweep.py config/sweep_deep_narrow_cpu.py --report_only=True   # CSV, tables, plot of the runs so far
$ python sweep.py config/train_deep_narrow.py --depths=32,64,128 --seeds=0,1,2,3 --gpus=0,1,2,3,4,5,6,7
$ python sweep.py config/sweep_deep_narrow_cpu.py --device=cuda --gpus=0 --jobs=8 --deadline_s=450

Each run is `python train.py ... --n_layer=<depth> --seed=<seed>
--out_dir=<out_dir>/<variant>-L<depth>-s<seed>` plus its variant's options (variant_options) and
every key that is not the sweep's own (below). Finished runs are skipped, interrupted ones resumed:
rerun the same command. Results in out_dir: sweep.csv (a row per run, written as each run ends; also
the rows an earlier command wrote there for other runs), sweep.png, tables
(nanolime/sweep_report.py) with 95% intervals over seeds, differences paired by seed (a seed: one
data order and, per depth, one init for every variant) and each run's compute multiplier: the FLOPs
the control (same depth and seed) needs to reach the run's final val loss over the run's FLOPs, off
a power law fitted to the control's final losses at --budgets=150,300,600 (else its curve).
"""
import os
import re
import sys
import json
import shlex
import signal
import tempfile
import queue
import threading
import subprocess
import importlib.util
from concurrent.futures import ThreadPoolExecutor, as_completed
from time import time

from tqdm import tqdm
from nanolime.common import DDP_ENV, UserError, configure, read_value
from nanolime.checkpoint import CKPT_NAME, atomic_write, load_checkpoint, lock_dir, writable_dir
from nanolime.data import arithmetic_tiers, data_id, dataset_dir, ends_data_id
from nanolime.sweep_runs import (MAY_CHANGE, PER_RUN, RUN_STATE, SCHEDULE, check_options,
                                 check_run_dirs, final_record, int_list, launch_order, own_columns,
                                 put_row, quiet_stdout, read_state, run_row, scores, skipped_runs,
                                 variant_options)
from nanolime.sweep_csv import WrittenRow, add_tier_columns, csv_text, earlier_rows
from nanolime.sweep_multipliers import add_compute_multipliers, control_ends, fit_power_law
from nanolime.sweep_plots import plot_lr_sweep, plot_sweep
from nanolime.sweep_report import print_report

# -----------------------------------------------------------------------------
# the sweep's config; every other key is a train.py option
out_dir = 'out-sweep'      # the sweep's root: one directory per run, sweep.csv and sweep.png
depths = '2,4'             # n_layer values, comma-separated
variants = 'baseline,lime' # comma-separated (variant_options); the first is the control for the others
seeds = '0,1'              # comma-separated; each seed is one training-data order, shared by all variants
budgets = ''               # e.g. '150,300,600': the control is also trained to these iteration counts, each a
                           # complete run with its own schedule; its final losses, fitted against FLOPs, give the
                           # compute multipliers ('': read them off the control's own training curve)
skip = ''                  # runs left out at every seed: <variant>-L<depth>, comma-separated (lime-L64)
jobs = 0                   # runs at a time; 0 = one per GPU with --gpus, else 1
gpus = ''                  # e.g. 0,1,2,3: the runs spread over these GPUs, each seeing only its own
                           # (CUDA_VISIBLE_DEVICES); --jobs above their number: several on each
threads = 0                # torch threads per run; 0 = this machine's cores // jobs
deadline_s = 0.0           # seconds after the first run starts: no run starts after it, and the
                           # running ones are stopped (each saves a checkpoint: rerun to go on); 0 = none
plot = True                # write sweep.png
report_only = False        # only rebuild the CSV, tables and plot from the runs on disk
# -----------------------------------------------------------------------------
TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
# ----------------------------------------------------------------------------- configuration
train_opts = {}  # every key that is not the sweep's: train.py's --key=<text>, which train.py checks
sweep_keys = list(configure(globals(), extra=train_opts))
# A sweep is one process that starts its own runs: started by torchrun, or as one of a job's ranks,
# each would run the whole sweep. Variables a cluster scheduler sets for a job of one process would
# make every run (and the sweep's own check of their options) one rank of it.
several = os.environ.get('WORLD_SIZE', '1').strip() not in ('', '1')
if 'TORCHELASTIC_RUN_ID' in os.environ or several:
    raise UserError("sweep.py was started by torchrun or as one rank of several: it is one process "
                    "that starts its own runs; start it once with python sweep.py (--gpus=0,1,... "
                    "spreads the runs over GPUs)")
for key in [k for k in os.environ if k in DDP_ENV or k.startswith('TORCHELASTIC_')]:
    del os.environ[key]
# --check_only=True: train.py's checks of the options alone
check_only = read_value('check_only', train_opts.pop('check_only', 'False'), False)

def excepthook(etype, e, tb, hook=sys.excepthook):
    """configure()'s hook, but a closed pipe (`sweep.py | head -1`) ends the sweep quietly, as it ends other tools."""
    if issubclass(etype, BrokenPipeError):
        quiet_stdout()
        sys.exit(1)
    hook(etype, e, tb)
sys.excepthook = excepthook
depth_list, seed_list = int_list('depths', depths, 1), int_list('seeds', seeds, 0)
variant_list = [v.strip() for v in variants.split(',') if v.strip()]  # a space inside a '~' value is the value's
if not variant_list or len(set(variant_list)) != len(variant_list):
    raise UserError(f"variants={variants!r}: expected distinct comma-separated names, e.g. --variants=baseline,lime")
variant_opts = {v: variant_options(v, sweep_keys) for v in variant_list}
control = variant_list[0]
if not out_dir or jobs < 0 or threads < 0 or deadline_s < 0:
    raise UserError(f"out_dir={out_dir!r}, jobs={jobs}, threads={threads}, deadline_s={deadline_s}: "
                    "expected a directory name, jobs >= 0, threads >= 0, deadline_s >= 0")
gpu_list = int_list('gpus', gpus, 0) if gpus else []
if gpu_list:  # the runs spread over the GPUs: by default one on each at a time
    import torch
    if not torch.cuda.is_available() or max(gpu_list) >= torch.cuda.device_count():
        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise UserError(f"gpus={gpus}: this machine has {n_gpus} CUDA GPUs; name GPUs it has (numbered from 0), "
                        "or leave --gpus out")
    if str(train_opts.get('device', 'cuda')).startswith('cuda:'):
        raise UserError(f"gpus={gpus}: each run sees only its own GPU, as cuda: leave --device=cuda:N "
                        "out")
jobs = jobs or len(gpu_list) or 1
if plot and importlib.util.find_spec('matplotlib') is None:
    raise UserError("plot=True needs matplotlib: pip install -r requirements.txt (or --plot=False)")
for key in PER_RUN:
    if key in train_opts:
        print(f"note: --{key}={train_opts.pop(key)} is ignored: the sweep sets it for each run")
train_opts.update({'debug': 'True'} if debug else {})  # --debug: tracebacks from the runs too
left_out = skipped_runs(skip, variant_list, depth_list)
runs = [{'depth': d, 'variant': v, 'seed': s, 'name': f"{re.sub(r'[^A-Za-z0-9+_.-]', '_', v)}-L{d}-s{s}"}
        for d in depth_list for s in seed_list for v in variant_list if (v, d) not in left_out]
budget_list = int_list('budgets', budgets, 1) if str(budgets).strip() else []
# the control's budget runs (one at max_iters is the control's own run: dropped once max_iters is known)
runs += [{'depth': d, 'variant': control, 'seed': s, 'budget': b, 'name': f"{runs_name}-L{d}-s{s}-i{b}"}
         for runs_name in [re.sub(r'[^A-Za-z0-9+_.-]', '_', control)] for d in depth_list for s in seed_list
         for b in budget_list if (control, d) not in left_out]
runs = [{**run, 'dir': os.path.join(out_dir, run['name'])} for run in runs]
check_run_dirs(runs)  # one directory per run, each a name the file system takes

def iters_of(run):
    """The iterations a run trains for: its budget, or max_iters."""
    return run.get('budget') or max_iters

def run_args(run):
    """train.py's options for a run: its variant's, at its depth and seed, into its dir, with its budget's schedule."""
    per_run = {**variant_opts[run['variant']], 'n_layer': run['depth'], 'seed': run['seed'], 'out_dir': run['dir']}
    if run.get('budget'):  # a complete run with its own schedule: the decay stretched or shrunk with it
        per_run.update(max_iters=run['budget'], lr_decay_iters=budget_decay(run['budget']))
    return [f"--{k}={v}" for k, v in {**train_opts, **per_run}.items()]

def run_config(run):
    """The train.py config of a run: its variant's, at its depth and seed, with its budget's schedule."""
    config = {**configs[run['variant']], 'n_layer': run['depth'], 'seed': run['seed']}
    if run.get('budget'):
        config.update(max_iters=run['budget'], lr_decay_iters=budget_decay(run['budget']))
    return config

def data_of(run):
    """(the dataset directory a run trains on, its identity: data.data_id, the same wherever the data is copied)."""
    config = run_config(run)
    ddir = dataset_dir(config['dataset'], config['data_dir'])
    return ddir, data_id(ddir)

def budget_decay(budget):
    """lr_decay_iters of a run of `budget` iterations: the control's schedule, scaled to the budget."""
    return max(1, round(configs[control]['lr_decay_iters'] * budget / max_iters))

def run_status(run):
    """'scratch', 'resume', 'eval' (trained, not yet scored) or 'done'; UserError if trained with other options."""
    ckpt_path = os.path.join(run['dir'], CKPT_NAME)
    if os.path.exists(run['dir']) and not os.path.isdir(run['dir']):
        raise UserError(f"{run['dir']} is a file, not a run directory: move it out of out_dir, or use another out_dir")
    if not os.path.exists(ckpt_path):
        return 'scratch'
    ckpt = load_checkpoint(ckpt_path)
    iters = iters_of(run)
    if ckpt['iter_num'] > iters:  # its evaluation at `iters` is mid-schedule, not the end of a shorter run
        raise UserError(f"{run['dir']} was trained to iter {ckpt['iter_num']}, past max_iters={iters}: its "
                        f"evaluation at {iters} is not that of a {iters}-iteration run; rerun with "
                        f"--max_iters={ckpt['iter_num']} or more, or use another out_dir")
    run['trained'] = ckpt['iter_num'] == iters  # a resume then trains nothing: train.py completes its log
    ddir, ident = data_of(run)
    if ckpt.get('data_id') and ident and ckpt['data_id'] not in (ident, ends_data_id(ddir)):  # another dataset's
        raise UserError(f"{run['dir']} was trained on other data (data {ckpt['data_id']}; {ddir} is data {ident}): "
                        "its results are not this data's; point --data_dir at the data it was trained on, or use "
                        "another out_dir for this data")
    there, now = ckpt['config'], run_config(run)
    diff = [k for k in now if k not in MAY_CHANGE and k in there and there[k] != now[k]]
    what = ', '.join(f"{k}={there[k]!r} there, {now[k]!r} now" for k in diff[:3])
    if set(diff) & set(SCHEDULE):
        raise UserError(f"{run['dir']} was trained with another lr schedule ({what}): continued, its lr would "
                        "restart mid-run and its result be no run's; use another out_dir for this schedule (a longer "
                        "run on the same schedule: raise max_iters alone)")
    if diff:
        raise UserError(f"{run['dir']} was trained with other options ({what}); "
                        "use another out_dir for this sweep, or delete that run")
    state = read_state(os.path.join(run['dir'], RUN_STATE))[0]
    if state.get('status') != 'done' or state.get('max_iters') != iters or \
            final_record(run['dir'], iters) is None:  # a log that lost its end: train.py restores it
        return 'resume'  # also a run finished outside the sweep: train.py then has nothing to do
    return 'eval' if arithmetic and scores(run['dir']) is None else 'done'

# ----------------------------------------------------------------------------- training
lock, procs, stopping = threading.Lock(), {}, threading.Event()  # procs: the running children, for Ctrl-C
free_gpus = queue.Queue()  # --gpus: a slot per job, the GPUs in turn; a run takes one, then gives it back
visible = os.environ.get('CUDA_VISIBLE_DEVICES')  # if the sweep itself sees only some GPUs, its GPU g is the g-th
for k in range(jobs if gpu_list else 0):
    g = gpu_list[k % len(gpu_list)]
    free_gpus.put(visible.split(',')[g].strip() if visible else str(g))
# a run starts through this: it gets SIGTERM (train.py: save and stop) when the sweep dies, even by kill -9 (Linux)
ORPHAN_GUARD = ("import ctypes, os, signal, sys\ntry:\n    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PDEATHSIG\n"
                "except (AttributeError, OSError):\n    pass\nif os.getppid() != int(sys.argv[1]):\n    sys.exit(130)\n"
                "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")

def stop_runs(sig):
    """No run starts any more, and the running ones get `sig` (SIGINT, SIGTERM: train.py saves and
    stops)."""
    with lock:
        stopping.set()
        for p in procs.values():
            p.send_signal(sig)

def child(run, script, args, log_mode):
    """Exit status of a child writing to <run>/train.log (130: stopped by the sweep); run['error']: its
    last line if it failed. `script`: a script at the top of the repository ('train.py'), or a module
    (study.arithmetic), run as `python -m` with the repository on PYTHONPATH; either from this working
    directory, to which a run's paths are relative."""
    if script.endswith('.py'):
        cmd, extra = [sys.executable, os.path.join(os.path.dirname(TRAIN_PY), script), *args], {}
    else:
        cmd = [sys.executable, '-m', script, *args]
        extra = {'PYTHONPATH': os.pathsep.join(p for p in (os.path.dirname(TRAIN_PY), env.get('PYTHONPATH')) if p)}
    log_path = os.path.join(run['dir'], 'train.log')
    if run.get('gpu') is not None:
        extra['CUDA_VISIBLE_DEVICES'] = run['gpu']
    with open(log_path, log_mode) as out:
        print(f"$ {shlex.join([*(f'{k}={v}' for k, v in extra.items()), *cmd])}", file=out, flush=True)
        with lock:
            if stopping.is_set():
                return 130
            p = procs[run['name']] = subprocess.Popen(  # Ctrl-C reaches it through us
                [sys.executable, '-c', ORPHAN_GUARD, str(os.getpid()), *cmd[1:]], stdout=out, stderr=subprocess.STDOUT,
                env={**env, **extra}, start_new_session=True)
        code = p.wait()
    with lock:
        del procs[run['name']]
        if code and stopping.is_set():  # stopped, also before train.py could catch the signal
            return 130
    if code:
        with open(log_path) as f:
            run['error'] = f"{[line.strip() for line in f if line.strip()][-1]} (full output: {log_path})"
    return code

def train(run):
    """train.py (resuming from the run's checkpoint if it has one), then on the arithmetic task study/arithmetic.py."""
    if stopping.is_set():  # the deadline passed before this run's turn: it is left as it was
        run['late'] = True
        return 130
    run['gpu'] = free_gpus.get() if gpu_list else None  # never waits: a worker per slot
    try:
        os.makedirs(run['dir'], exist_ok=True)
        code, resume, state_path = 0, run['status'] == 'resume', os.path.join(run['dir'], RUN_STATE)
        if run['status'] != 'eval':
            wall, t0 = read_state(state_path)[0].get('wall_time_s', 0.0) if resume else 0.0, time()
            code = child(run, 'train.py', run_args(run) + ['--init_from=resume'] * resume, 'a' if resume else 'w')
            if code == 0 and final_record(run['dir'], iters_of(run)) is None:
                code, log_path = 1, os.path.join(run['dir'], 'log.jsonl')
                run['error'] = f"exited normally, but {log_path} holds no val loss at iter {iters_of(run)}"
            config, spent = run_config(run), 0.0 if run.get('trained') and wall else time() - t0
            state = {'status': {0: 'done', 130: 'interrupted'}.get(code, 'failed'), 'wall_time_s': wall + spent,
                     **{k: config[k] for k in ('max_iters', 'lr_decay_iters', 'warmup_iters')},
                     'data': data_of(run)[1]}
            atomic_write(state_path, lambda f: f.write(json.dumps(state).encode()))
        if code == 0 and arithmetic:
            code = child(run, 'study.arithmetic', [f"--out_dir={run['dir']}"], 'a')
        return code
    except Exception as e:  # e.g. a full disk: this run failed, the others go on
        run['error'] = f"{run['dir']} was deleted while the sweep ran; rerun the sweep to train it again" if \
            not os.path.isdir(run['dir']) else str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
        return 1
    finally:
        if gpu_list:
            free_gpus.put(run['gpu'])

# not in a run's options column: the sweep's per run, its variant name's (in the variant column), or not the
# experiment's
OWN = {*MAY_CHANGE, *PER_RUN, 'router', 'router_init'}

failed = []  # runs refused or failed in this invocation
csv_path = os.path.join(out_dir, 'sweep.csv')
if report_only and not os.path.isdir(out_dir):
    raise UserError(f"out_dir {out_dir} is no directory: nothing to report; check its name")
if os.path.isdir(csv_path):
    raise UserError(f"{csv_path} is a directory: move it away, or use another out_dir")
if not report_only:  # every check before out_dir is claimed: a refused sweep leaves nothing behind
    with tempfile.TemporaryDirectory() as tmp:  # each variant's options at the deepest depth, checked by train.py
        configs = check_options(TRAIN_PY, {v: run_args({'variant': v, 'depth': max(depth_list), 'seed': seed_list[0],
                                                        'dir': tmp}) for v in variant_list}, sweep_keys)
    given = [key for key in ('eval_only', 'overwrite') if configs[control][key]]
    if given:
        raise UserError(f"{given[0]}=True: a sweep trains each run once, evaluates it at its end and never "
                        "replaces it; to evaluate a run again: python train.py --init_from=resume "
                        "--eval_only=True --out_dir=<its directory>; to train it again, delete its "
                        "directory")
    if check_only:
        print(f"checked by train.py: the options of {', '.join(variant_list)}; {len(runs)} runs, "
              "nothing started")
        sys.exit(0)
    max_iters = configs[control]['max_iters']
    if max_iters < 1:
        raise UserError(f"max_iters={max_iters}: a sweep compares trained runs; give max_iters >= 1")
    runs = [r for r in runs if r.get('budget') != max_iters]
    warmup = configs[control]['warmup_iters']
    if configs[control]['decay_lr'] and any(budget_decay(b) <= warmup for b in budget_list):
        raise UserError(f"budgets={budgets!r}: the shortest budget's lr decay ({budget_decay(min(budget_list))} "
                        f"iterations) must outlast warmup_iters={warmup}; use longer budgets or a shorter warmup")
    arithmetic = bool(arithmetic_tiers(configs[control]['dataset']))
    writable_dir(out_dir, 'out_dir')
    lock_dir(out_dir, 'out_dir')
    for run in runs:
        try:
            run['status'] = run_status(run)
        except UserError as e:
            run['status'], run['error'] = 'refused', str(e)
            failed.append(run)
    todo = launch_order(r for r in runs if r['status'] in ('scratch', 'resume', 'eval'))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    n_threads = threads or max(1, cores // jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(n_threads), MKL_NUM_THREADS=str(n_threads), PYTHONUNBUFFERED='1')
    n = {k: sum(r['status'] == k for r in runs) for k in ('done', 'eval', 'resume', 'scratch', 'refused')}
    print(f"sweep: {len(runs)} runs in {out_dir}: {n['done']} already done, {n['eval']} to evaluate, {n['resume']} "
          f"to resume, {n['scratch']} to start, {n['refused']} refused; {jobs} at a time, {n_threads} threads each"
          + (f", on GPUs {gpus}" if gpu_list else '')
          + (f"; deadline {deadline_s:g} s" if deadline_s else ''))
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), unit='run', disable=not sys.stderr.isatty())
    pool = ThreadPoolExecutor(max_workers=jobs)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the runs save a checkpoint, stop
    deadline = threading.Timer(deadline_s, stop_runs, [signal.SIGTERM])  # as a scheduler's end
    deadline.daemon = True
    if deadline_s:
        deadline.start()
    futures, stopped = {pool.submit(train, run): run for run in todo}, 0
    try:
        for k, fut in enumerate(as_completed(futures), 1):
            run, code = futures[fut], fut.result()
            if code == 130:
                stopped += 1
                continue
            if code:
                run['status'] = 'failed'
                failed.append(run)
            # its row now: a sweep cut short keeps the rows of the runs it finished
            row = run_row(run, iters_of(run), OWN)[0]
            add_tier_columns([row])
            put_row(csv_path, row)
            msg = f"FAILED {run['name']} ({k}/{len(todo)}): {run['error']}" if code else \
                f"done {run['name']} ({k}/{len(todo)}): val loss {row['val_loss']:.4f}"
            bar.write(msg, file=sys.stderr if code else sys.stdout)
            bar.update(1)
    except (KeyboardInterrupt, BrokenPipeError) as e:  # the runs save a checkpoint and stop (train.py's Ctrl-C)
        stop_runs(signal.SIGINT)
        pool.shutdown(wait=True, cancel_futures=True)
        print("\ninterrupted: the running runs saved a checkpoint; rerun the same command to resume", file=sys.stderr)
        if isinstance(e, BrokenPipeError):  # `sweep.py | head`: stdout is gone, the rest is said on stderr
            quiet_stdout()
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 1)
    deadline.cancel()
    pool.shutdown()
    bar.close()
    if stopping.is_set():
        late = sum('late' in r for r in todo)
        print(f"deadline_s={deadline_s:g} passed: {stopped - late} run(s) stopped, {late} not started; "
              "rerun the same command to go on (a stopped run resumes from its last checkpoint)")

# ----------------------------------------------------------------------------- report
rows, curves = [], {}  # curves: (depth, variant, seed) -> {iter: (flops, val loss)} of a finished run
for run in runs:
    row, curve = run_row(run, None if report_only else iters_of(run), OWN)
    if report_only and run.get('budget') and row['iters'] is None:
        continue  # a budget run never started (or at max_iters: the control's own run)
    rows.append(row)
    if curve:
        curves[run['depth'], run['variant'], run['seed']] = curve

fits = {d: fit_power_law(control_ends(rows, control, d)) for d in depth_list} if budget_list else {}
add_compute_multipliers(rows, curves, fits, control)
tier_list = add_tier_columns(rows)  # arithmetic: a test accuracy per number of operators
# sweep.csv: this command's rows, then an earlier command's of the other runs; a run refused now keeps its earlier
# row (what it trained is still there: a refusal loses nothing), and is listed at the end
checked = [r for r in rows if r['status'] != 'refused']
earlier = earlier_rows(csv_path, checked)
for row in earlier:  # its columns from its checkpoint, as this command's rows have them
    if row['status'] == 'done' and not isinstance(row, WrittenRow):
        own_columns(row, OWN, keep=True)
had = {os.path.basename(r['out_dir']) for r in earlier}
refused_new = [r for r in rows if r['status'] == 'refused' and os.path.basename(r['out_dir']) not in had]
atomic_write(csv_path, lambda f: f.write(csv_text(checked + refused_new + earlier).encode()))
print_report(rows, depth_list, variant_list, fits, len(budget_list), tier_list)
print(f"CSV: {csv_path}")

if plot and curves:
    plot_sweep(os.path.join(out_dir, 'sweep.png'), curves, depth_list, variant_list, fits, rows)
    print(f"plot: {os.path.join(out_dir, 'sweep.png')}")
    if plot_lr_sweep(os.path.join(out_dir, 'sweep_lr.png'), rows, depth_list):
        print(f"plot: {os.path.join(out_dir, 'sweep_lr.png')}")

if failed:
    print(f"\n{len(failed)} run(s) failed:", file=sys.stderr)
    for run in failed:
        print(f"  {run['name']}: {run['error']}", file=sys.stderr)
    sys.exit(1)
