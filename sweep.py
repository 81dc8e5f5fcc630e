"""
Depth sweeps: train every (depth, variant, seed) with train.py, then compare the variants over seeds.

$ python sweep.py --depths=4,8,16,32 --variants=baseline,lime --seeds=0,1,2 --max_iters=400
$ python sweep.py config/sweep_deep_narrow_cpu.py --jobs=2
$ python sweep.py config/sweep_deep_narrow_cpu.py --report_only=True   # CSV, tables, plot of the runs so far

Each run is `python train.py ... --n_layer=<depth> --seed=<seed> --out_dir=<out_dir>/<variant>-L<depth>-s<seed>`
plus its variant's options and every key that is not the sweep's own (below); train.py checks them for each
variant before any run starts. Variants: baseline, lime, hc (hc2, hc8: other rates), value_residual,
denseformer, combined with '+' (lime+hc); for LIMe a router after ':' (lime:first-2), a router init after
'@' (lime@identity). Finished runs are skipped, interrupted ones resumed: rerun the same command after a
crash or Ctrl-C; one sweep per out_dir at a time. Results in out_dir: sweep.csv (a row per run), sweep.png,
and tables with 95% intervals over seeds, differences paired by seed (one seed is one training-data order
for every run) and each run's compute multiplier: the FLOPs its reference run (same depth and seed) needs
to reach the run's final val loss, over the run's FLOPs (> 1: the same loss with less compute).
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
jobs = 1                   # runs at a time
threads = 0                # torch threads per run; 0 = this machine's cores // jobs
plot = True                # write sweep.png
report_only = False        # only rebuild the CSV, tables and plot from the runs on disk
# -----------------------------------------------------------------------------
TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
ARITH_JSON = 'arith_eval_test.json'  # what arithmetic.py writes into a run's directory
RUN_STATE = 'sweep.json'   # per run directory: status, the max_iters it finished, wall time
PLAIN = {'lime': False, 'hc': 0, 'value_residual': False, 'denseformer': False}  # the Llama baseline
COMPONENTS = {'baseline': {}, 'lime': {'lime': True}, 'hc': {'hc': 4}, 'value_residual': {'value_residual': True},
              'denseformer': {'denseformer': True}}
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
    'lime~router_lr=0.002' (any train.py option after '~', repeatable), ..."""
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
                            "':', e.g. lime:first-2, and a router init after '@', e.g. lime@identity)")
        opts.update(COMPONENTS[part] if part in COMPONENTS else {'hc': int(part[2:])})
    if (router or init) and not opts['lime']:
        raise UserError(f"variant '{variant}': a router (':') or router init ('@') needs lime, e.g. lime:first-2")
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
if plot and importlib.util.find_spec('matplotlib') is None:
    raise UserError("plot=True needs matplotlib: pip install -r requirements.txt (or --plot=False)")
for key in PER_RUN:
    if key in train_opts:
        print(f"note: --{key}={train_opts.pop(key)} is ignored: the sweep sets it for each run")
train_opts.update({'debug': 'True'} if debug else {})  # --debug: tracebacks from the runs too
runs = [{'depth': d, 'variant': v, 'seed': s, 'name': f"{re.sub(r'[^A-Za-z0-9+_.-]', '_', v)}-L{d}-s{s}"}
        for d in depth_list for s in seed_list for v in variant_list]
runs = [{**run, 'dir': os.path.join(out_dir, run['name'])} for run in runs]

def run_args(variant, depth, seed, run_dir):
    per_run = {**variant_opts[variant], 'n_layer': depth, 'seed': seed, 'out_dir': run_dir}
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
    if ckpt['iter_num'] > max_iters:  # its evaluation at max_iters is mid-schedule, not the end of a shorter run
        raise UserError(f"{run['dir']} was trained to iter {ckpt['iter_num']}, past max_iters={max_iters}: its "
                        f"evaluation at {max_iters} is not that of a {max_iters}-iteration run; rerun with "
                        f"--max_iters={ckpt['iter_num']} or more, or use another out_dir")
    there, now = ckpt['config'], {**configs[run['variant']], 'n_layer': run['depth'], 'seed': run['seed']}
    diff = [k for k in now if k not in MAY_CHANGE and k in there and there[k] != now[k]]
    if diff:
        what = ', '.join(f"{k}={there[k]!r} there, {now[k]!r} now" for k in diff[:3])
        raise UserError(f"{run['dir']} was trained with other options ({what}); "
                        "use another out_dir for this sweep, or delete that run")
    state = read_json(os.path.join(run['dir'], RUN_STATE))
    if state.get('status') != 'done' or state.get('max_iters') != max_iters:
        return 'resume'  # also a run finished outside the sweep: train.py then has nothing to do
    return 'eval' if arithmetic and scores(run['dir']) is None else 'done'

# ----------------------------------------------------------------------------- training
lock, procs, stopping = threading.Lock(), {}, threading.Event()  # procs: the running children, for Ctrl-C
# a run starts through this: it gets SIGTERM (train.py: save and stop) when the sweep dies, even by kill -9 (Linux)
ORPHAN_GUARD = ("import ctypes, os, signal, sys\ntry:\n    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PDEATHSIG\n"
                "except (AttributeError, OSError):\n    pass\nif os.getppid() != int(sys.argv[1]):\n    sys.exit(130)\n"
                "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")

def child(run, script, args, log_mode):
    """Exit status of a child writing to <run>/train.log (130: stopping); run['error']: its last line if it failed."""
    cmd = [sys.executable, os.path.join(os.path.dirname(TRAIN_PY), script), *args]
    log_path = os.path.join(run['dir'], 'train.log')
    with open(log_path, log_mode) as out:
        print(f"$ {shlex.join(cmd)}", file=out, flush=True)
        with lock:
            if stopping.is_set():
                return 130
            p = procs[run['name']] = subprocess.Popen(  # Ctrl-C reaches it through us
                [sys.executable, '-c', ORPHAN_GUARD, str(os.getpid()), *cmd[1:]], stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True)
        code = p.wait()
    with lock:
        del procs[run['name']]
    if code not in (0, 130):
        with open(log_path) as f:
            run['error'] = f"{[line.strip() for line in f if line.strip()][-1]} (full output: {log_path})"
    return code

def train(run):
    """train.py (resuming from the run's checkpoint if it has one), then on the arithmetic task arithmetic.py."""
    try:
        os.makedirs(run['dir'], exist_ok=True)
        code, resume, state_path = 0, run['status'] == 'resume', os.path.join(run['dir'], RUN_STATE)
        if run['status'] != 'eval':
            wall, t0 = read_json(state_path).get('wall_time_s', 0.0) if resume else 0.0, time()
            code = child(run, 'train.py', run_args(run['variant'], run['depth'], run['seed'], run['dir'])
                         + ['--init_from=resume'] * resume, 'a' if resume else 'w')
            if code == 0 and final_record(run['dir'], max_iters) is None:
                code, run['error'] = 1, f"exited normally but logged no val loss at iter {max_iters}"
            with open(state_path, 'w') as f:
                json.dump({'status': {0: 'done', 130: 'interrupted'}.get(code, 'failed'), 'max_iters': max_iters,
                           'wall_time_s': wall + time() - t0}, f)
        if code == 0 and arithmetic:
            code = child(run, 'arithmetic.py', [f"--out_dir={run['dir']}"], 'a')
        return code
    except Exception as e:  # e.g. a full disk: this run failed, the others go on
        run['error'] = f"{type(e).__name__}: {e}"
        return 1

failed = []  # runs refused or failed in this invocation
if not report_only:
    lock_dir(out_dir, 'out_dir')
    configs = check_options()
    max_iters = configs[reference]['max_iters']
    arithmetic = bool(arithmetic_tiers(configs[reference]['dataset']))
    for run in runs:
        try:
            run['status'] = run_status(run)
        except UserError as e:
            run['status'], run['error'] = 'refused', str(e)
            failed.append(run)
    todo = sorted((r for r in runs if r['status'] in ('scratch', 'resume', 'eval')), key=lambda r: -r['depth'])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    n_threads = threads or max(1, cores // jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(n_threads), MKL_NUM_THREADS=str(n_threads), PYTHONUNBUFFERED='1')
    n = {k: sum(r['status'] == k for r in runs) for k in ('done', 'eval', 'resume', 'scratch', 'refused')}
    print(f"sweep: {len(runs)} runs in {out_dir}: {n['done']} already done, {n['eval']} to evaluate, {n['resume']} "
          f"to resume, {n['scratch']} to start, {n['refused']} refused; {jobs} at a time, {n_threads} threads each")
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
            msg = f"FAILED {run['name']} ({k}/{len(todo)}): {run['error']}" if code else \
                f"done {run['name']} ({k}/{len(todo)}): val loss {final_record(run['dir'], max_iters)['val_loss']:.4f}"
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
    iters = state.get('max_iters') if report_only else max_iters
    finished = (state.get('status'), state.get('max_iters')) == ('done', iters)
    final = final_record(run['dir'], iters) if finished else None
    status = run['status'] if 'error' in run else 'done' if final else state['status'] \
        if state.get('status') in ('failed', 'interrupted') else 'incomplete' if log else 'not run'
    rows.append({'depth': run['depth'], 'variant': run['variant'], 'seed': run['seed'], 'status': status,
                 'iters': log[-1]['iter'] if log else None, 'tokens': final and final['tokens'],
                 'train_flops': final and final['flops'], 'val_loss': final and final['val_loss'],
                 'compute_multiplier': None, 'compute_multiplier_bound': None,
                 'wall_time_s': round(state['wall_time_s'], 1) if 'wall_time_s' in state else None,
                 'out_dir': run['dir']})
    if status == 'done':
        curves[run['depth'], run['variant'], run['seed']] = {r['iter']: (r['flops'], r['val_loss'])
                                                             for r in log if 'val_loss' in r and r['iter'] <= iters}
        rows[-1]['tiers'] = scores(run['dir']) or {}

tier_list = sorted({int(n) for row in rows for n in row.get('tiers', {})})  # arithmetic: operators per expression
for row in rows:
    ref = curves.get((row['depth'], reference, row['seed']))
    if row['status'] == 'done' and row['variant'] != reference and ref:
        row['compute_multiplier'], row['compute_multiplier_bound'] = compute_multiplier(
            [ref[it] for it in sorted(ref)], row['val_loss'], row['train_flops'])
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
    last = 'vs majority baseline' if floor_column else f'compute multiplier (x {reference} FLOPs)'
    print(f"\n{title}: mean ± 95% interval over seeds, difference to {reference} paired by seed\n{'depth':>5}  "
          f"{'variant':<16} {'n':>2}  {column:<17}  {'vs ' + reference:<19} {'verdict':<18} {last}\n" + '-' * 110)
    for d in depth_list:
        done = {v: {r['seed']: r for r in rows if (r['depth'], r['variant'], r['status']) == (d, v, 'done')}
                for v in variant_list}
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
                mark = '>' if any(r['compute_multiplier_bound'] for r in mults) else ''
                extra = f"{mark}{mm:.3f} ± {mh:.3f}"
            print(f"{line:<73} {extra}".rstrip() if mine else f"{d:>5}  {v:<16}  0  (no finished runs)")

print(f"\n{sum(row['status'] == 'done' for row in rows)}/{len(rows)} runs finished")
print_table('val_loss', 'final val loss')
print(f"* paired over the seeds both finished; > a lower bound: {reference} never got to that loss in a seed")
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
