"""
Depth sweeps: train every (depth, variant, seed) with train.py, then compare the variants over seeds.

$ python sweep.py --depths=4,8,16,32 --variants=baseline,lime --seeds=0,1,2 --max_iters=400
$ python sweep.py config/sweep_deep_narrow_cpu.py --jobs=2
$ python sweep.py config/sweep_deep_narrow_cpu.py --report_only=True   # CSV, tables, plot of the runs so far
$ python sweep.py config/train_deep_narrow.py --depths=32,64,128 --seeds=0,1,2,3 --gpus=0,1,2,3,4,5,6,7

Each run is `python train.py ... --n_layer=<depth> --seed=<seed> --out_dir=<out_dir>/<variant>-L<depth>-s<seed>`
plus its variant's options and every key that is not the sweep's own (below); train.py checks them for each variant
before any run starts. Variants: baseline, lime, hc (hc2, hc8: other rates), mhc, value_residual, denseformer,
attnres (Full; attnres:block, attnres:block-4: Block), combined with '+' (lime+hc); for LIMe a router after ':'
(lime:first-2), a router init after '@' (lime@identity), any train.py option after '~' (lime~router_lr=0.002).
Finished runs are skipped, interrupted ones resumed: rerun the same command after a crash or Ctrl-C; one sweep per
out_dir at a time. Results in out_dir: sweep.csv (a row per run), sweep.png, and tables with 95% intervals over
seeds, differences paired by seed (one seed: one data order and, per depth, the baseline's init for every run)
and each run's compute multiplier: the FLOPs the reference (same depth and seed) needs to reach the run's final val
loss, over the run's FLOPs (> 1: the same loss with less compute), read off a power law fitted to the reference's
final losses when it is also trained to --budgets=150,300,600 (else off its own training curve).
"""
import os
import re
import sys
import io
import csv
import json
import math
import shlex
import signal
import runpy
import difflib
import tempfile
import contextlib
import queue
import threading
import subprocess
import importlib.util
from concurrent.futures import ThreadPoolExecutor, as_completed
from time import time

from tqdm import tqdm

from common import CKPT_NAME, UserError, arithmetic_tiers, configure, load_checkpoint, lock_dir, read_log

# -----------------------------------------------------------------------------
# the sweep's config; every other key is a train.py option
out_dir = 'out-sweep'      # the sweep's root: one directory per run, sweep.csv and sweep.png
depths = '2,4'             # n_layer values, comma-separated
variants = 'baseline,lime' # comma-separated, see above; the first is the reference the others are compared with
seeds = '0,1'              # comma-separated; each seed is one training-data order, shared by all variants
budgets = ''               # e.g. '150,300,600': the reference is also trained to these iteration counts, each a
                           # complete run with its own schedule; its final losses, fitted against FLOPs, give the
                           # compute multipliers ('': read them off the reference's own training curve)
jobs = 1                   # runs at a time
gpus = ''                  # e.g. 0,1,2,3: one run per GPU at a time, each seeing only its own (CUDA_VISIBLE_DEVICES)
threads = 0                # torch threads per run; 0 = this machine's cores // jobs
plot = True                # write sweep.png
report_only = False        # only rebuild the CSV, tables and plot from the runs on disk
# -----------------------------------------------------------------------------
TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
ARITH_JSON = 'arith_eval_test.json'  # what arithmetic.py writes into a run's directory
RUN_STATE = 'sweep.json'   # per run directory: status, the max_iters it finished, wall time
PLAIN = {'lime': False, 'hc': 0, 'mhc': False, 'value_residual': False, 'denseformer': False,  # the Llama baseline
         'attnres': ''}
COMPONENTS = {'baseline': {}, 'lime': {'lime': True}, 'hc': {'hc': 4}, 'mhc': {'hc': 4, 'mhc': True},
              'value_residual': {'value_residual': True}, 'denseformer': {'denseformer': True},
              'attnres': {'attnres': 'full'}}
PER_RUN = ('n_layer', 'seed', 'init_from', *PLAIN)  # set by the sweep for each run; a value given is ignored
# options that may change between invocations without making a run another experiment (raising max_iters
# with lr_decay_iters extends finished runs); a run trained with any other change is refused
MAY_CHANGE = ('out_dir', 'init_from', 'max_iters', 'lr_decay_iters', 'eval_interval', 'log_interval', 'eval_only',
              'always_save_checkpoint', 'device', 'compile', 'data_dir', 'wandb_log', 'wandb_project',
              'wandb_run_name', 'peak_flops', 'debug')

def int_list(key, text, low):
    values = [int(x) if x.isdigit() else -1 for x in str(text).replace(' ', '').split(',') if x]
    if not values or min(values) < low or len(set(values)) < len(values):  # 0 and 00 are one value: one run dir
        raise UserError(f"{key}={text!r}: expected distinct comma-separated integers >= {low}, e.g. --{key}=4,8,16")
    return values

def variant_options(variant):
    """train.py options of a variant name: 'lime', 'lime+hc', 'hc8', 'lime:first-2', 'lime@identity',
    'lime~router_lr=0.002' (any train.py option after '~', repeatable), 'attnres:block' (':' after attnres,
    the last part, is its mode), ..."""
    variant, *overrides = variant.split('~')
    extra = dict(o.partition('=')[::2] for o in overrides)
    if any(not k or not v or k in (*PER_RUN, 'out_dir') for k, v in extra.items()):
        raise UserError(f"variant '{variant}~{'~'.join(overrides)}': expected '~key=value' with a train.py option "
                        f"other than {', '.join(PER_RUN)} and out_dir, e.g. lime~router_lr=0.002")
    name, _, init = variant.partition('@')
    name, _, router = name.partition(':')
    opts, parts = dict(PLAIN), name.split('+')
    for part in parts:
        if part not in COMPONENTS and not re.fullmatch(r'hc\d+', part):
            close = difflib.get_close_matches(part, list(COMPONENTS), n=1)
            raise UserError(f"unknown variant '{part}'{f'; did you mean {close[0]!r}?' if close else ''} (known: "
                            f"{', '.join(COMPONENTS)}, combined with '+', e.g. lime+hc; for LIMe a router after "
                            "':', e.g. lime:first-2, and a router init after '@', e.g. lime@identity; attnres:block)")
        opts.update(COMPONENTS[part] if part in COMPONENTS else {'hc': int(part[2:])})
    if router and parts[-1] == 'attnres':  # attnres:block
        opts['attnres'], router = router, ''
    if (router or init) and not opts['lime']:
        raise UserError(f"variant '{variant}': a router (':') or router init ('@') needs lime, e.g. lime:first-2 "
                        "(or ':' after attnres: attnres:block)")
    return {**opts, **({'router': router} if router else {}), **({'router_init': init} if init else {}), **extra}

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}

def final_record(run_dir, iters):
    """The log record of the evaluation at iteration `iters`, or None if the run has not got there."""
    return next((r for r in reversed(read_log(run_dir)) if r.get('iter') == iters and 'val_loss' in r), None)

# ----------------------------------------------------------------------------- statistics
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

# ----------------------------------------------------------------------------- configuration
train_opts = {}  # every key that is not the sweep's: train.py's --key=<text>, which train.py checks
sweep_keys = list(configure(globals(), extra=train_opts))
depth_list, seed_list = int_list('depths', depths, 1), int_list('seeds', seeds, 0)
variant_list = [v for v in variants.replace(' ', '').split(',') if v]
if not variant_list or len(set(variant_list)) != len(variant_list):
    raise UserError(f"variants={variants!r}: expected distinct comma-separated names, e.g. --variants=baseline,lime")
variant_opts = {v: variant_options(v) for v in variant_list}
reference = variant_list[0]
if not out_dir or jobs < 1 or threads < 0:
    raise UserError(f"out_dir={out_dir!r}, jobs={jobs}, threads={threads}: expected a directory name, jobs >= 1, "
                    "threads >= 0")
gpu_list = int_list('gpus', gpus, 0) if gpus else []
if gpu_list:  # one run per GPU at a time: as many jobs as GPUs
    import torch
    if not torch.cuda.is_available() or max(gpu_list) >= torch.cuda.device_count():
        raise UserError(f"gpus={gpus}: this machine has {torch.cuda.device_count() if torch.cuda.is_available() else 0} "
                        "CUDA GPUs; name GPUs it has (numbered from 0), or leave --gpus out")
    if jobs not in (1, len(gpu_list)) or str(train_opts.get('device', 'cuda')).startswith('cuda:'):
        raise UserError(f"gpus={gpus} runs one run per GPU, each seeing only its own as cuda: leave --jobs and "
                        "--device=cuda:N out")
    jobs = len(gpu_list)
if plot and importlib.util.find_spec('matplotlib') is None:
    raise UserError("plot=True needs matplotlib: pip install -r requirements.txt (or --plot=False)")
for key in PER_RUN:
    if key in train_opts:
        print(f"note: --{key}={train_opts.pop(key)} is ignored: the sweep sets it for each run")
train_opts.update({'debug': 'True'} if debug else {})  # --debug: tracebacks from the runs too
runs = [{'depth': d, 'variant': v, 'seed': s, 'name': f"{re.sub(r'[^A-Za-z0-9+_.-]', '_', v)}-L{d}-s{s}"}
        for d in depth_list for s in seed_list for v in variant_list]
budget_list = int_list('budgets', budgets, 1) if str(budgets).strip() else []
runs += [{'depth': d, 'variant': reference, 'seed': s, 'budget': b, 'name': f"{runs_name}-L{d}-s{s}-i{b}"}
         for runs_name in [re.sub(r'[^A-Za-z0-9+_.-]', '_', reference)] for d in depth_list for s in seed_list
         for b in budget_list]  # those at max_iters are the reference's own runs: dropped once it is known
runs = [{**run, 'dir': os.path.join(out_dir, run['name'])} for run in runs]

def iters_of(run):
    """The iterations a run trains for: its budget, or max_iters."""
    return run.get('budget') or max_iters

def run_args(variant, depth, seed, run_dir, budget=None):
    per_run = {**variant_opts[variant], 'n_layer': depth, 'seed': seed, 'out_dir': run_dir}
    if budget:  # a complete run with its own schedule: the decay stretched or shrunk with it
        per_run.update(max_iters=budget, lr_decay_iters=budget_decay(budget))
    return [f"--{k}={v}" for k, v in {**train_opts, **per_run}.items()]

def check_options():
    """{variant: its runs' train.py config}, from train.py itself: run here, it checks a variant's options (at
    the deepest depth) and stops before any work, printing its config; UserError with its message if it refuses."""
    configs, errors, argv = {}, {}, sys.argv
    os.environ['NANOLIME_CHECK_ONLY'] = '1'
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for v in variant_list:
                sys.argv, out = [TRAIN_PY, *run_args(v, max(depth_list), seed_list[0], tmp)], io.StringIO()
                try:
                    with contextlib.redirect_stdout(out):
                        runpy.run_path(TRAIN_PY, run_name='__main__')
                except SystemExit:
                    configs[v] = json.loads(out.getvalue().splitlines()[-1])
                except UserError as e:
                    errors[v] = str(e)
    finally:
        sys.argv = argv
        del os.environ['NANOLIME_CHECK_ONLY']
    if errors:  # the first; named by its variant if another variant passed (then the problem is that one's)
        v, msg = next(iter(errors.items()))
        prefix = '' if len(errors) == len(variant_list) else f"variant {v}: "
        key = re.match(r"unknown config key '(\w+)'", msg)
        close = difflib.get_close_matches(key.group(1), sweep_keys, n=1) if key and 'did you' not in msg else []
        raise UserError(prefix + msg + (f"; did you mean '{close[0]}'?" if close else ''))
    return configs

def budget_decay(budget):
    """lr_decay_iters of a run of `budget` iterations: the reference schedule's, scaled to the budget."""
    return max(1, round(configs[reference]['lr_decay_iters'] * budget / max_iters))

def scores(run_dir):
    """arithmetic.py's accuracies per tier of the run's final checkpoint, or None if it has not scored that."""
    path = os.path.join(run_dir, ARITH_JSON)
    if os.path.exists(path) and os.path.getmtime(path) >= os.path.getmtime(os.path.join(run_dir, CKPT_NAME)):
        return read_json(path).get('per_tier')

def run_status(run):
    """'scratch', 'resume', 'eval' (trained, not yet scored) or 'done'; UserError if trained with other options."""
    ckpt_path = os.path.join(run['dir'], CKPT_NAME)
    if not os.path.exists(ckpt_path):
        return 'scratch'
    ckpt = load_checkpoint(ckpt_path)
    iters = iters_of(run)
    if ckpt['iter_num'] > iters:  # its evaluation at `iters` is mid-schedule, not the end of a shorter run
        raise UserError(f"{run['dir']} was trained to iter {ckpt['iter_num']}, past max_iters={iters}: its "
                        f"evaluation at {iters} is not that of a {iters}-iteration run; rerun with "
                        f"--max_iters={ckpt['iter_num']} or more, or use another out_dir")
    there, now = ckpt['config'], {**configs[run['variant']], 'n_layer': run['depth'], 'seed': run['seed']}
    diff = [k for k in now if k not in MAY_CHANGE and k in there and there[k] != now[k]]
    if diff:
        what = ', '.join(f"{k}={there[k]!r} there, {now[k]!r} now" for k in diff[:3])
        raise UserError(f"{run['dir']} was trained with other options ({what}); "
                        "use another out_dir for this sweep, or delete that run")
    state = read_json(os.path.join(run['dir'], RUN_STATE))
    if state.get('status') != 'done' or state.get('max_iters') != iters:
        return 'resume'  # also a run finished outside the sweep: train.py then has nothing to do
    return 'eval' if arithmetic and scores(run['dir']) is None else 'done'

# ----------------------------------------------------------------------------- training
lock, procs, stopping = threading.Lock(), {}, threading.Event()  # procs: the running children, for Ctrl-C
free_gpus = queue.Queue()  # --gpus: the GPUs no run is using; a run takes one and gives it back when it ends
visible = os.environ.get('CUDA_VISIBLE_DEVICES')  # if the sweep itself sees only some GPUs, its GPU g is the g-th
for g in gpu_list:
    free_gpus.put(visible.split(',')[g].strip() if visible else str(g))
# a run starts through this: it gets SIGTERM (train.py: save and stop) when the sweep dies, even by kill -9 (Linux)
ORPHAN_GUARD = ("import ctypes, os, signal, sys\ntry:\n    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PDEATHSIG\n"
                "except (AttributeError, OSError):\n    pass\nif os.getppid() != int(sys.argv[1]):\n    sys.exit(130)\n"
                "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")

def child(run, script, args, log_mode):
    """Exit status of a child writing to <run>/train.log (130: stopping); run['error']: its last line if it failed."""
    cmd = [sys.executable, os.path.join(os.path.dirname(TRAIN_PY), script), *args]
    log_path = os.path.join(run['dir'], 'train.log')
    gpu = {'CUDA_VISIBLE_DEVICES': run['gpu']} if run.get('gpu') is not None else {}
    with open(log_path, log_mode) as out:
        print(f"$ {shlex.join([*(f'{k}={v}' for k, v in gpu.items()), *cmd])}", file=out, flush=True)
        with lock:
            if stopping.is_set():
                return 130
            p = procs[run['name']] = subprocess.Popen(  # Ctrl-C reaches it through us
                [sys.executable, '-c', ORPHAN_GUARD, str(os.getpid()), *cmd[1:]], stdout=out, stderr=subprocess.STDOUT,
                env={**env, **gpu}, start_new_session=True)
        code = p.wait()
    with lock:
        del procs[run['name']]
    if code not in (0, 130):
        with open(log_path) as f:
            run['error'] = f"{[line.strip() for line in f if line.strip()][-1]} (full output: {log_path})"
    return code

def train(run):
    """train.py (resuming from the run's checkpoint if it has one), then on the arithmetic task arithmetic.py."""
    run['gpu'] = free_gpus.get() if gpu_list else None  # never waits: the pool has a worker per GPU
    try:
        os.makedirs(run['dir'], exist_ok=True)
        code, resume, state_path = 0, run['status'] == 'resume', os.path.join(run['dir'], RUN_STATE)
        if run['status'] != 'eval':
            wall, t0 = read_json(state_path).get('wall_time_s', 0.0) if resume else 0.0, time()
            code = child(run, 'train.py', run_args(run['variant'], run['depth'], run['seed'], run['dir'],
                                                   run.get('budget')) + ['--init_from=resume'] * resume,
                         'a' if resume else 'w')
            if code == 0 and final_record(run['dir'], iters_of(run)) is None:
                code, run['error'] = 1, f"exited normally but logged no val loss at iter {iters_of(run)}"
            with open(state_path, 'w') as f:
                json.dump({'status': {0: 'done', 130: 'interrupted'}.get(code, 'failed'), 'max_iters': iters_of(run),
                           'wall_time_s': wall + time() - t0}, f)
        if code == 0 and arithmetic:
            code = child(run, 'arithmetic.py', [f"--out_dir={run['dir']}"], 'a')
        return code
    except Exception as e:  # e.g. a full disk: this run failed, the others go on
        run['error'] = f"{type(e).__name__}: {e}"
        return 1
    finally:
        if gpu_list:
            free_gpus.put(run['gpu'])

failed = []  # runs refused or failed in this invocation
if not report_only:
    lock_dir(out_dir, 'out_dir')
    configs = check_options()
    max_iters = configs[reference]['max_iters']
    runs = [r for r in runs if r.get('budget') != max_iters]
    warmup = configs[reference]['warmup_iters']
    if configs[reference]['decay_lr'] and any(budget_decay(b) <= warmup for b in budget_list):
        raise UserError(f"budgets={budgets!r}: the shortest budget's lr decay ({budget_decay(min(budget_list))} "
                        f"iterations) must outlast warmup_iters={warmup}; use longer budgets or a shorter warmup")
    arithmetic = bool(arithmetic_tiers(configs[reference]['dataset']))
    for run in runs:
        try:
            run['status'] = run_status(run)
        except UserError as e:
            run['status'], run['error'] = 'refused', str(e)
            failed.append(run)
    todo = sorted((r for r in runs if r['status'] in ('scratch', 'resume', 'eval')),
                  key=lambda r: (-r['depth'], r['seed']))  # seed by seed: each finished seed is a paired result
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    n_threads = threads or max(1, cores // jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(n_threads), MKL_NUM_THREADS=str(n_threads), PYTHONUNBUFFERED='1')
    n = {k: sum(r['status'] == k for r in runs) for k in ('done', 'eval', 'resume', 'scratch', 'refused')}
    print(f"sweep: {len(runs)} runs in {out_dir}: {n['done']} already done, {n['eval']} to evaluate, {n['resume']} "
          f"to resume, {n['scratch']} to start, {n['refused']} refused; {jobs} at a time, {n_threads} threads each"
          + (f", one per GPU ({gpus})" if gpu_list else ''))
    # deepest first: the longest runs do not end up alone at the end; a progress bar on a terminal only
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), unit='run', disable=not sys.stderr.isatty())
    pool = ThreadPoolExecutor(max_workers=jobs)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the runs save a checkpoint, stop
    futures = {pool.submit(train, run): run for run in todo}
    try:
        for k, fut in enumerate(as_completed(futures), 1):
            run, code = futures[fut], fut.result()
            if code == 130:
                continue
            if code:
                run['status'] = 'failed'
                failed.append(run)
            final = None if code else final_record(run['dir'], iters_of(run))
            msg = f"FAILED {run['name']} ({k}/{len(todo)}): {run['error']}" if code else \
                f"done {run['name']} ({k}/{len(todo)}): val loss {final['val_loss']:.4f}"
            bar.write(msg, file=sys.stderr if code else sys.stdout)
            bar.update(1)
    except KeyboardInterrupt:  # the runs save a checkpoint and stop (train.py's Ctrl-C); rerunning resumes them
        stopping.set()
        with lock:
            for p in procs.values():
                p.send_signal(signal.SIGINT)
        pool.shutdown(wait=True, cancel_futures=True)
        print("\ninterrupted: the running runs saved a checkpoint; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    pool.shutdown()
    bar.close()

# ----------------------------------------------------------------------------- report
rows, curves = [], {}  # curves: (depth, variant, seed) -> {iter: (flops, val loss)} of a finished run
for run in runs:
    state, log = read_json(os.path.join(run['dir'], RUN_STATE)), read_log(run['dir'])
    if report_only and run.get('budget') and not log:
        continue  # a budget run never started (or at max_iters: the reference's own run)
    iters = state.get('max_iters') if report_only else iters_of(run)
    finished = (state.get('status'), state.get('max_iters')) == ('done', iters)
    final = final_record(run['dir'], iters) if finished else None
    status = run['status'] if 'error' in run else 'done' if final else state['status'] \
        if state.get('status') in ('failed', 'interrupted') else 'incomplete' if log else 'not run'
    rows.append({'depth': run['depth'], 'variant': run['variant'], 'seed': run['seed'], 'budget': run.get('budget'),
                 'status': status, 'iters': log[-1]['iter'] if log else None, 'tokens': final and final['tokens'],
                 'train_flops': final and final['flops'], 'val_loss': final and final['val_loss'],
                 'compute_multiplier': None, 'multiplier_note': None,
                 'wall_time_s': round(state['wall_time_s'], 1) if 'wall_time_s' in state else None,
                 'out_dir': run['dir']})
    if status == 'done' and not run.get('budget'):
        curves[run['depth'], run['variant'], run['seed']] = {r['iter']: (r['flops'], r['val_loss'])
                                                             for r in log if 'val_loss' in r and r['iter'] <= iters}
        rows[-1]['tiers'] = scores(run['dir']) or {}

# the compute multiplier: with budgets, off the power law fitted to the reference's final losses at every budget
# (per depth); without, off the reference's own training curve (its learning rate not yet decayed mid-run)
def reference_ends(depth, seed):
    """[(FLOPs, final val loss)] of the reference's finished runs at `depth` and `seed`, one per budget."""
    return [(r['train_flops'], r['val_loss']) for r in rows
            if (r['depth'], r['variant'], r['seed'], r['status']) == (depth, reference, seed, 'done')]

fits = {d: fit_power_law({s: reference_ends(d, s) for s in seed_list}) for d in depth_list} if budget_list else {}
tier_list = sorted({int(n) for row in rows for n in row.get('tiers', {})})  # arithmetic: operators per expression
for row in rows:
    ref, fit = curves.get((row['depth'], reference, row['seed'])), fits.get(row['depth'])
    if row['status'] != 'done' or row['variant'] == reference:
        pass
    elif budget_list and fit and row['seed'] in fit[1]:
        row['compute_multiplier'], beyond = fitted_multiplier(fit, row['seed'], row['val_loss'], row['train_flops'])
        row['multiplier_note'] = f"extrapolated x{beyond:.2f}" if beyond > 1 else 'fitted'
    elif not budget_list and ref:
        row['compute_multiplier'], bound = compute_multiplier([ref[it] for it in sorted(ref)], row['val_loss'],
                                                              row['train_flops'])
        row['multiplier_note'] = 'lower bound' if bound else 'reference curve'
    tiers = row.pop('tiers', {})
    for n in tier_list:
        row[f'acc_{n}'], row[f'majority_{n}'] = map(tiers.get(str(n), {}).get, ('accuracy', 'majority_baseline'))
csv_path = os.path.join(out_dir, 'sweep.csv')
os.makedirs(out_dir, exist_ok=True)
with open(csv_path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)

def print_table(column, title, lower_is_better=True, floor_column=None):
    """Per depth and variant: mean over seeds, 95% interval, paired difference to the reference with its interval
    and verdict; then the compute multiplier, or how the mean compares with a floor (the majority baseline)."""
    how = f"fitted over {len(budget_list)} budgets" if budget_list else 'off its training curve'
    last = 'vs majority baseline' if floor_column else f'compute multiplier (x {reference} FLOPs, {how})'
    print(f"\n{title}: mean ± 95% interval over seeds, difference to {reference} paired by seed\n{'depth':>5}  "
          f"{'variant':<16} {'n':>2}  {column:<17}  {'vs ' + reference:<19} {'verdict':<18} {last}\n" + '-' * 110)
    for d in depth_list:
        done = {v: {r['seed']: r for r in rows if (r['depth'], r['variant'], r['status'], r['budget'])
                    == (d, v, 'done', None)} for v in variant_list}
        for v, mine in done.items():
            m, h = mean_ci([r[column] for r in mine.values()]) if mine else (math.nan, math.nan)
            line, extra = f"{d:>5}  {v:<16} {len(mine):>2}  {m:.4f} ± {h:<8.4f}", ''
            pairs = [s for s in mine if s in done[reference]] if v != reference else []
            if pairs:
                dm, dh = mean_ci([mine[s][column] - done[reference][s][column] for s in pairs])
                star = '*' if len(pairs) < len(mine) else ' '
                line += f"  {dm:+.4f} ± {dh:<8.4f}{star} {verdict(dm, dh, lower_is_better)}"
            mults = [r for r in mine.values() if r['compute_multiplier'] is not None]
            if floor_column and mine:  # "above" only when the whole interval is above the floor
                floor = sum(r[floor_column] for r in mine.values()) / len(mine)
                where = verdict(m - floor, h, lower_is_better)
                extra = f"{floor:.4f}: {dict(better='above', worse='below').get(where, where)}"
            elif mults:
                mm, mh = mean_ci([r['compute_multiplier'] for r in mults])
                mark = '>' if any(r['multiplier_note'] == 'lower bound' for r in mults) else '~' if any(
                    r['multiplier_note'].startswith('extrapolated') for r in mults) else ''
                extra = f"{mark}{mm:.3f} ± {mh:.3f}"
            print(f"{line:<73} {extra}".rstrip() if mine else f"{d:>5}  {v:<16}  0  (no finished runs)")

print(f"\n{sum(row['status'] == 'done' for row in rows)}/{len(rows)} runs finished")
print_table('val_loss', 'final val loss')
print(f"* paired over the seeds both finished; the compute multiplier's interval is over seeds too (t)")
for d, fit in fits.items():
    far = [float(r['multiplier_note'][14:]) for r in rows if r['depth'] == d and r['compute_multiplier'] is not None
           and r['multiplier_note'].startswith('extrapolated')]
    print(f"{d} layers: {reference}'s loss ~ FLOPs^-{fit[0]:.4f} over {fit[2][0]:.3g}-{fit[2][1]:.3g} FLOPs" + (
        f"; ~ {len(far)} run(s) beyond that range, up to x{max(far):.2f}: extrapolated" if far else '')
        if fit else f"{d} layers: no fit ({reference} needs two budgets finished with loss falling with compute)")
if not budget_list:
    print(f"> a lower bound: {reference} never got to that loss in a seed; --budgets=... fits its loss against compute")
for n in tier_list:
    print_table(f'acc_{n}', f"test accuracy, {n} operators", lower_is_better=False, floor_column=f'majority_{n}')
print(f"CSV: {csv_path}")

if plot and curves:  # final val loss vs depth, then a panel per depth: val loss vs training FLOPs over training
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 1 + len(depth_list), figsize=(4.2 * (1 + len(depth_list)), 4.2))
    for v in variant_list:
        by_depth = [[c for (cd, cv, _), c in curves.items() if (cd, cv) == (d, v)] for d in depth_list]
        pts = [(d, *mean_ci([c[max(c)][1] for c in cs])) for d, cs in zip(depth_list, by_depth) if cs]
        if pts:
            d, m, h = zip(*pts)
            axes[0].errorbar(d, m, h, marker='o', capsize=3, label=v)  # one seed: no interval (nan)
        for ax, cs in zip(axes[1:], by_depth):
            its = sorted(set.intersection(*map(set, cs)) - {0}) if cs else []  # no log(0 FLOPs)
            if its:
                x = [sum(c[it][0] for c in cs) / len(cs) for it in its]
                m, h = zip(*(mean_ci([c[it][1] for c in cs]) for it in its))
                ax.plot(x, m, marker='.', label=f"{v} ({len(cs)} seeds)")
                ax.fill_between(x, [a - b for a, b in zip(m, h)], [a + b for a, b in zip(m, h)], alpha=0.2)
    for ax, d in zip(axes[1:], depth_list):  # the reference's final losses at its budgets, and the fit through them
        ends = [end for s in seed_list for end in reference_ends(d, s)]
        if fits.get(d):
            b, offsets, (low, high) = fits[d]
            x = [low * (high / low) ** (i / 20) for i in range(21)]
            a = sum(offsets.values()) / len(offsets)
            ax.plot(x, [math.exp(a) * c ** -b for c in x], 'k--', lw=1, label=f"{reference} fit: FLOPs^-{b:.3f}")
            ax.plot(*zip(*ends), 'kx', label=f"{reference}, final at each budget")
    axes[0].set(xscale='log', xlabel='n_layer', ylabel='final val loss', title='final val loss (mean, 95% interval)')
    axes[0].set_xticks(depth_list, [str(d) for d in depth_list])
    for ax, d in zip(axes[1:], depth_list):
        ax.set(xscale='log', xlabel='training FLOPs', ylabel='val loss', title=f"{d} layers: val loss (mean, 95% band)")
    for ax in axes:
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # labels at powers of 10 only
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, 'sweep.png'), dpi=100)
    print(f"plot: {os.path.join(out_dir, 'sweep.png')}")

if failed:
    print(f"\n{len(failed)} run(s) failed:", file=sys.stderr)
    for run in failed:
        print(f"  {run['name']}: {run['error']}", file=sys.stderr)
    sys.exit(1)
