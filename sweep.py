"""
Depth sweeps: train every (depth, variant, seed) with train.py, then compare the variants with
95% confidence intervals over seeds.

$ python sweep.py --depths=4,8,16,32 --variants=baseline,lime --seeds=0,1,2 --max_iters=400
$ python sweep.py config/sweep_deep_narrow_cpu.py --jobs=2
$ python sweep.py config/sweep_deep_narrow_cpu.py --report_only=True   # CSV, table, plots from the runs so far

Every run is `python train.py ... --n_layer=<depth> --seed=<seed> --out_dir=<out_dir>/<variant>-L<depth>-s<seed>`
plus the variant's options; any --key=value (or config file value) that is not one of the sweep's
own keys below is a train.py option and goes to every run (checked against train.py's options before
anything runs). Variants: baseline, lime, hc (hc2, hc8: other expansion rates), value_residual,
denseformer; combined with '+' (lime+hc) and, for LIMe, a router after ':' (lime:first-2).

Runs that finished are skipped, interrupted ones resumed from their checkpoint, so rerunning the same
command after a crash or Ctrl-C continues where it stopped. Results: <out_dir>/sweep.csv (one row
per run), a table of each variant's difference to the baseline per depth, and plots next to the CSV.
On an arithmetic dataset every finished run is also evaluated by arithmetic.py: its test accuracy
per tier goes into the CSV and a table that compares it with the tier's majority baseline.

Same seed, same data: train.py draws its training batches from an RNG seeded by the seed (and the
DDP rank) only, so runs of different variants and depths with one seed see the same batches in the
same order, and differences between them are paired by seed.
"""
import os
import re
import sys
import ast
import csv
import json
import math
import shlex
import signal
import difflib
import operator
import threading
import subprocess
import dataclasses
from concurrent.futures import ThreadPoolExecutor, as_completed
from time import time

import torch

import prepare
from common import CKPT_NAME, UserError, configure, load_checkpoint
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# sweep config; everything else is a train.py option
out_dir = 'out-sweep'      # the sweep's root: one directory per run, sweep.csv and the plots
depths = '2,4'             # n_layer values, comma-separated
variants = 'baseline,lime' # comma-separated; see the docstring
seeds = '0,1'              # comma-separated; each seed is one training-data order, shared by all variants
reference = ''             # the variant the others are compared with; '' = baseline if swept, else the first
jobs = 1                   # runs at a time
threads = 0                # torch threads per run; 0 = this machine's cores // jobs
csv_path = ''              # '' = <out_dir>/sweep.csv; the plots go next to it
plot = True                # write PNG plots (needs matplotlib)
report_only = False        # only rebuild the CSV, table and plots from the runs on disk
arith_eval = True          # arithmetic datasets: after training, each run's greedy accuracy per tier
                           # (arithmetic.py, test split) goes into the CSV and the table
# -----------------------------------------------------------------------------
TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
ARITH_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'arithmetic.py')
ARITH_JSON = 'arith_eval_test.json'  # what arithmetic.py writes into a run's directory
RUN_STATE = 'sweep.json'   # per run directory: status, wall time, the max_iters it finished
# what each variant component sets; every run starts from the plain Llama model (lime=False, hc=0)
COMPONENTS = {'baseline': {}, 'lime': {'lime': True}, 'hc': {'hc': 4},
              'value_residual': {'value_residual': True}, 'denseformer': {'denseformer': True}}
# keys the sweep sets per run (from depths, seeds, variants); a value given for them is replaced
PER_RUN = ('n_layer', 'seed', 'out_dir', 'init_from', 'lime', 'hc', 'value_residual', 'denseformer')
# options that may change between invocations without making a run's result a different experiment
# (raising max_iters with lr_decay_iters extends finished runs); any other change is refused
MAY_CHANGE = ('out_dir', 'init_from', 'max_iters', 'lr_decay_iters', 'eval_interval', 'log_interval', 'eval_only',
              'always_save_checkpoint', 'device', 'compile', 'data_dir', 'wandb_log', 'wandb_project',
              'wandb_run_name', 'peak_flops')


def constant(node, names):
    """The value of a constant expression (literals, arithmetic, earlier constants), e.g. 16 * 128."""
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp):
        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
        return ops[type(node.op)](constant(node.left, names), constant(node.right, names))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -constant(node.operand, names)
    return ast.literal_eval(node)


def train_options(path):
    """train.py's config keys with their defaults, and its nullable/tristate keys, read from its source
    (the plain literal assignments before its configure() call), so nothing is run to check a key."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    consts, defaults, special = {}, {}, {'nullable': set(), 'tristate': set()}
    configured = False
    for node in tree.body:
        calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and
                 getattr(c.func, 'id', getattr(c.func, 'attr', None)) == 'configure'] \
            if isinstance(node, (ast.Expr, ast.Assign)) else []
        if calls:
            for kw in calls[0].keywords:
                if kw.arg in special:
                    try:
                        special[kw.arg].update(ast.literal_eval(kw.value))
                    except ValueError:  # a name, e.g. nullable=NULLABLE
                        special[kw.arg].update(consts.get(getattr(kw.value, 'id', None), ()))
            configured = True
            break
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = constant(node.value, consts)
            except Exception:  # computed from something else: not a config default
                continue
            name = node.targets[0].id
            consts[name] = value
            if not name.startswith('_') and not name.isupper() and (value is None or type(value) in (bool, int, float, str)):
                defaults[name] = value
    if not configured:  # a train.py that parses its config in a function: NULLABLE / TRISTATE constants
        special = {'nullable': set(consts.get('NULLABLE', ())), 'tristate': set(consts.get('TRISTATE', ()))}
    return defaults, special['nullable'], special['tristate']


def int_list(key, text):
    try:
        values = [int(x) for x in str(text).replace(' ', '').split(',') if x]
    except ValueError:
        raise UserError(f"{key}={text!r}: expected comma-separated integers, e.g. --{key}=4,8,16") from None
    if not values or len(set(values)) != len(values):
        raise UserError(f"{key}={text!r}: expected distinct comma-separated integers, e.g. --{key}=4,8,16")
    return values


def variant_options(variant, train_keys):
    """train.py options of a variant name: 'lime', 'lime+hc', 'lime:first-2', 'hc2', ..."""
    name, _, router = variant.partition(':')
    opts = {'lime': False, 'hc': 0}
    for part in name.split('+'):
        m = re.fullmatch(r'hc(\d+)', part)
        if m:
            opts['hc'] = int(m.group(1))
        elif part in COMPONENTS:
            opts.update(COMPONENTS[part])
        else:
            close = difflib.get_close_matches(part, list(COMPONENTS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise UserError(f"unknown variant '{variant}'{hint} (known: {', '.join(COMPONENTS)}, combined "
                            "with '+', e.g. lime+hc, and a LIMe router after ':', e.g. lime:first-2)")
    if name.split('+').count('baseline') and name != 'baseline':
        raise UserError(f"variant '{variant}': baseline combines with nothing (write e.g. 'hc' for baseline+hc)")
    if router:
        if not opts['lime']:
            raise UserError(f"variant '{variant}': a router (':{router}') needs lime, e.g. lime:{router}")
        opts['router'] = router
    missing = [k for k in opts if k not in train_keys]
    if missing:
        raise UserError(f"variant '{variant}' needs train.py's option {missing[0]}, which this train.py "
                        "does not have")
    return opts


def render(value):
    """A config value as train.py reads it back from --key=value."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return value  # a bare word
        return repr(value)
    return repr(value)


def run_name(variant, depth, seed):
    return f"{re.sub(r'[^A-Za-z0-9+_.-]', '_', variant)}-L{depth}-s{seed}"


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def read_log(run_dir):
    """The records of a run's log.jsonl (a torn last line is skipped)."""
    records = []
    try:
        with open(os.path.join(run_dir, 'log.jsonl')) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return records


def final_val(run_dir, max_iters):
    """(val loss, tokens) logged at iteration max_iters, or None if the run has not got there."""
    for r in reversed(read_log(run_dir)):
        if r.get('iter') == max_iters and r.get('val_loss') is not None:
            return r['val_loss'], r.get('tokens')
    return None


# ----------------------------------------------------------------------------- statistics
# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df):
    """Two-sided 95% t quantile for df degrees of freedom (fractional df, from Welch, interpolated)."""
    if not df >= 1:
        return math.nan
    if df <= 30:
        lo = int(df)
        hi = min(lo + 1, 30)
        return T95[lo - 1] + (df - lo) * (T95[hi - 1] - T95[lo - 1])
    z = 1.959964  # Cornish-Fisher expansion around the normal quantile: within 0.001 for df > 30
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_ci(xs):
    """(mean, half-width of its 95% t interval); the half-width is nan for fewer than 2 values."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    m = sum(xs) / n
    if n < 2:
        return m, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, t95(n - 1) * sd / math.sqrt(n)


def diff_ci(ref, other):
    """other - ref with a 95% interval, from {seed: value} dicts: (mean, half-width, paired).
    Paired by seed (mean of per-seed differences) when both have the same seeds, since a seed fixes
    the data order; otherwise Welch's unpaired interval."""
    if ref and set(ref) == set(other):
        m, h = mean_ci([other[s] - ref[s] for s in sorted(ref)])
        return m, h, True
    a, b = list(ref.values()), list(other.values())
    if not a or not b:
        return math.nan, math.nan, False
    (ma, _), (mb, _) = mean_ci(a), mean_ci(b)
    if len(a) < 2 or len(b) < 2:
        return mb - ma, math.nan, False
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return mb - ma, 0.0, False
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return mb - ma, t95(df) * se, False


def verdict(diff, half, lower_is_better=True):
    """How a difference (variant - reference) with its interval reads: for a loss, lower is better."""
    if math.isnan(half):
        return "no interval (one seed)"
    if diff - half <= 0 <= diff + half:
        return "inside seed noise"
    return "better" if (diff < 0) == lower_is_better else "worse"


def fmt(x, digits=4):
    return '' if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


# ----------------------------------------------------------------------------- configuration
_train_defaults, _nullable, _tristate = train_options(TRAIN_PY)
_own = {k: v for k, v in globals().items() if not k.startswith('_') and not k.isupper()
        and (v is None or type(v) in (bool, int, float, str))}
# one namespace for both, so config files may set sweep and train.py keys, and a typo in either
# gets "did you mean" before anything runs
_config = {**_train_defaults, **_own}
configure(_config, nullable=_nullable, tristate=_tristate)
globals().update({k: _config[k] for k in _own})
train_config = {k: _config[k] for k in _train_defaults if k != 'out_dir'}

depth_list = int_list('depths', depths)
seed_list = int_list('seeds', seeds)
if min(depth_list) < 1:
    raise UserError(f"depths={depths!r}: every depth must be >= 1")
variant_list = [v for v in variants.replace(' ', '').split(',') if v]
if not variant_list or len(set(variant_list)) != len(variant_list):
    raise UserError(f"variants={variants!r}: expected distinct comma-separated names, e.g. --variants=baseline,lime")
variant_opts = {v: variant_options(v, _train_defaults) for v in variant_list}
reference = reference or ('baseline' if 'baseline' in variant_list else variant_list[0])
if reference not in variant_list:
    raise UserError(f"reference={reference!r} is not one of the swept variants ({', '.join(variant_list)})")
if not out_dir:
    raise UserError("out_dir='': name the sweep's directory, e.g. --out_dir=out-sweep")
if jobs < 1 or threads < 0:
    raise UserError(f"jobs={jobs} must be >= 1 and threads={threads} >= 0")
for key in PER_RUN:
    if key in train_config and key != 'init_from' and train_config[key] != _train_defaults[key]:
        print(f"note: {key}={train_config[key]!r} is ignored: the sweep sets it per run "
              f"({'depths' if key == 'n_layer' else 'seeds' if key == 'seed' else 'variants'})")
if train_config.get('init_from', 'scratch') != 'scratch':
    print("note: init_from is ignored: the sweep resumes interrupted runs by itself")
max_iters = train_config['max_iters']
evaluate_arith = arith_eval and bool(prepare.arithmetic_tiers(str(train_config.get('dataset'))))
csv_path = csv_path or os.path.join(out_dir, 'sweep.csv')
# passed to every run: the train.py values that differ from train.py's defaults
common_args = [f"--{k}={render(v)}" for k, v in train_config.items()
               if k not in PER_RUN and (type(v) is not type(_train_defaults[k]) or v != _train_defaults[k])]

# every model must be valid before the first run starts (shapes, router names)
_fields = {f.name for f in dataclasses.fields(GPTConfig)}
for _d in depth_list:
    for _v in variant_list:
        _args = {k: v for k, v in {**train_config, **variant_opts[_v], 'n_layer': _d}.items() if k in _fields}
        try:
            GPTConfig(**{'vocab_size': 256, **_args})
        except (TypeError, ValueError) as e:
            raise UserError(f"depth {_d}, variant {_v}: invalid model config: {e}") from None

runs = []
for _d in depth_list:
    for _s in seed_list:
        for _v in variant_list:
            name = run_name(_v, _d, _s)
            args = common_args + [f"--n_layer={_d}", f"--seed={_s}", f"--out_dir={os.path.join(out_dir, name)}"] \
                + [f"--{k}={render(v)}" for k, v in variant_opts[_v].items()]
            runs.append({'depth': _d, 'variant': _v, 'seed': _s, 'name': name,
                         'dir': os.path.join(out_dir, name), 'args': args})



def needs_eval(run):
    """Whether a finished arithmetic run lacks an accuracy evaluation of its final checkpoint."""
    path = os.path.join(run['dir'], ARITH_JSON)
    return evaluate_arith and (not os.path.exists(path) or
                               os.path.getmtime(path) < os.path.getmtime(os.path.join(run['dir'], CKPT_NAME)))


def run_status(run):
    """'done', 'resume' (checkpoint before max_iters) or 'scratch'; UserError for a checkpoint past it
    or one trained with other options."""
    state = read_json(os.path.join(run['dir'], RUN_STATE), {})
    ckpt_path = os.path.join(run['dir'], CKPT_NAME)
    if not os.path.exists(ckpt_path):
        return 'scratch'
    ckpt = load_checkpoint(ckpt_path)
    wanted = {**_train_defaults, **train_config, 'n_layer': run['depth'], 'seed': run['seed'],
              **variant_opts[run['variant']]}
    diff = [k for k in wanted if k not in MAY_CHANGE and k in ckpt['config'] and ckpt['config'][k] != wanted[k]]
    if diff:
        what = ', '.join(f"{k}={ckpt['config'][k]!r} there, {wanted[k]!r} now" for k in diff[:3])
        raise UserError(f"{run['dir']} was trained with other options ({what}); "
                        "use another out_dir for this sweep, or delete that run")
    if state.get('status') == 'done' and state.get('max_iters') == max_iters:
        return 'done'
    it = int(ckpt['iter_num'])
    if it < max_iters:
        return 'resume'
    if it == max_iters and final_val(run['dir'], max_iters) is not None:
        return 'done'  # finished outside the sweep, or before its state was written
    raise UserError(f"{ckpt_path} is at iter {it}, beyond max_iters={max_iters}; use another out_dir")


# ----------------------------------------------------------------------------- training
if not report_only:
    todo, failed = [], []
    for run in runs:
        try:
            run['status'] = run_status(run)
        except UserError as e:
            run['status'], run['error'] = 'failed', str(e)
            failed.append(run)
            continue
        if run['status'] == 'done' and needs_eval(run):
            run['status'] = 'eval'
        if run['status'] != 'done':
            todo.append(run)
    n_done = len(runs) - len(todo) - len(failed)
    # deepest first: with jobs > 1 the long runs do not end up alone at the end
    todo.sort(key=lambda r: -r['depth'])
    n_threads = threads or max(1, (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
                                   else os.cpu_count() or 1) // jobs)
    count = {k: sum(r['status'] == k for r in todo) for k in ('eval', 'resume', 'scratch')}
    print(f"sweep: {len(runs)} runs ({len(depth_list)} depths x {len(variant_list)} variants x {len(seed_list)} "
          f"seeds) in {out_dir}: {n_done} already done, "
          + (f"{count['eval']} to evaluate, " if count['eval'] else "")
          + f"{count['resume']} to resume, {count['scratch']} to start"
          + (f", {len(failed)} refused (see the end)" if failed else "")
          + f"; {jobs} at a time, {n_threads} threads each")
    from tqdm import tqdm
    bar = tqdm(total=len(runs), initial=n_done, unit='run', dynamic_ncols=True)
    lock = threading.Lock()
    live = {}        # run name -> progress text, for the bar
    procs = {}       # run name -> Popen, to forward Ctrl-C
    stopping = threading.Event()
    env = dict(os.environ, OMP_NUM_THREADS=str(n_threads), MKL_NUM_THREADS=str(n_threads), PYTHONUNBUFFERED='1')
    iter_re = re.compile(r'iter (\d+): (?:loss ([-+\w.]+)|train loss [-+\w.]+, val loss ([-+\w.]+))')

    def show():
        bar.set_postfix_str(' | '.join(f"{k} {v}" for k, v in live.items()), refresh=True)

    def spawn(run, cmd, err):
        """Start a child; None if the sweep is stopping."""
        with lock:
            if stopping.is_set():
                return None
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                 start_new_session=True)  # Ctrl-C reaches it once, through us
            procs[run['name']] = p
            live[run['name']] = 'starting' if cmd[1] == TRAIN_PY else 'evaluating'
            show()
        return p

    def run_child(run, cmd, log_mode, err_path, on_line=None):
        """One child process: its stdout appended to <run>/train.log (line by line, each passed to
        on_line), its stderr to err_path; its exit status (130 if the sweep is stopping)."""
        with open(os.path.join(run['dir'], 'train.log'), log_mode) as out, open(err_path, 'w') as err:
            out.write(f"$ {shlex.join(cmd)}\n")
            out.flush()
            p = spawn(run, cmd, err)
            if p is None:
                return 130
            for line in p.stdout:
                out.write(line)
                if on_line is not None:
                    on_line(line)
            code = p.wait()
        with lock:
            procs.pop(run['name'], None)
            live.pop(run['name'], None)
        return code

    def last_error(path, code):
        with open(path) as f:
            lines = [l.strip() for l in f if l.strip()]
        return (lines[-1] if lines else f"exit status {code}") + f" (full output: {path})"

    def evaluate(run):
        """arithmetic.py on the final checkpoint: accuracy per tier into <run>/arith_eval_test.json."""
        cmd = [sys.executable, ARITH_PY, f"--out_dir={run['dir']}"]
        err_path = os.path.join(run['dir'], 'arith.err')
        code = run_child(run, cmd, 'a', err_path)
        if code not in (0, 130):
            run['error'] = last_error(err_path, code)
        return code

    def train(run):
        """One train.py process (its stdout goes to <run>/train.log, its stderr to <run>/train.err), then,
        on the arithmetic task, the accuracy evaluation."""
        try:
            os.makedirs(run['dir'], exist_ok=True)
            code = 0 if run['status'] == 'eval' else train_run(run)
            if code == 0 and 'error' not in run and evaluate_arith:
                code = evaluate(run)
            return code
        except Exception as e:  # e.g. a full disk: this run failed, the others go on
            run['error'] = f"{type(e).__name__}: {e}"
            return 1

    def train_run(run):
        cmd = [sys.executable, TRAIN_PY] + run['args'] + (['--init_from=resume'] if run['status'] == 'resume' else [])
        state_path = os.path.join(run['dir'], RUN_STATE)
        state = read_json(state_path, {}) if run['status'] == 'resume' else {}
        t0 = time()

        def progress(line):
            m = iter_re.match(line)
            if m:
                with lock:
                    loss = m.group(2) or m.group(3)
                    live[run['name']] = f"{m.group(1)}/{max_iters} {'val ' if m.group(3) else ''}loss {loss}"
                    show()

        code = run_child(run, cmd, 'a' if run['status'] == 'resume' else 'w',
                         os.path.join(run['dir'], 'train.err'), progress)
        wall = state.get('wall_time_s', 0.0) + time() - t0
        status = 'done' if code == 0 and final_val(run['dir'], max_iters) else 'interrupted' if code == 130 else 'failed'
        if code == 0 and status == 'failed':
            run['error'] = f"exited normally but logged no val loss at iter {max_iters}"
        elif status == 'failed':
            run['error'] = last_error(os.path.join(run['dir'], 'train.err'), code)
        with open(state_path, 'w') as f:
            json.dump({'status': status, 'max_iters': max_iters, 'wall_time_s': wall, 'error': run.get('error'),
                       'command': shlex.join(cmd)}, f, indent=1)
        return code

    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {pool.submit(train, run): run for run in todo}
    try:
        for fut in as_completed(futures):
            run = futures[fut]
            code = fut.result()
            if code == 0 and 'error' not in run:
                val = final_val(run['dir'], max_iters)[0]
                bar.write(f"done {run['name']}: val loss {val:.4f}")
            elif code != 130:
                failed.append(run)
                bar.write(f"FAILED {run['name']}: {run['error']}", file=sys.stderr)
            with lock:
                bar.update(1)
                show()
    except KeyboardInterrupt:
        # the runs save a checkpoint and stop (train.py's Ctrl-C handling); rerunning resumes them
        stopping.set()
        with lock:
            for p in procs.values():
                p.send_signal(signal.SIGINT)
        for fut in futures:
            fut.cancel()
        pool.shutdown(wait=True)
        bar.close()
        print(f"\ninterrupted: the running runs saved a checkpoint; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    pool.shutdown()
    bar.close()


# ----------------------------------------------------------------------------- report
def model_cost(model_args, cache={}):
    """(parameters, forward FLOPs per token) of a checkpoint's model, built on the meta device (no memory)."""
    key = json.dumps(model_args, sort_keys=True)
    if key not in cache:
        with torch.device('meta'):
            m = GPT(GPTConfig(**model_args))
        cache[key] = (m.get_num_params(), m.flops_per_token(model_args['block_size']))
    return cache[key]


rows = []
for run in runs:
    row = {'depth': run['depth'], 'variant': run['variant'], 'seed': run['seed'], 'status': 'not run',
           'params': None, 'flops_per_token': None, 'n_embd': train_config.get('n_embd'), 'iters': None,
           'tokens': None, 'train_flops': None, 'val_loss': None, 'wall_time_s': None, 'out_dir': run['dir']}
    state = read_json(os.path.join(run['dir'], RUN_STATE), {})
    ckpt_path = os.path.join(run['dir'], CKPT_NAME)
    if os.path.exists(ckpt_path):
        try:
            ckpt = load_checkpoint(ckpt_path)
            row['params'], row['flops_per_token'] = model_cost(ckpt['model_args'])
            row['n_embd'], row['iters'] = ckpt['model_args'].get('n_embd'), int(ckpt['iter_num'])
            del ckpt
        except (UserError, TypeError, ValueError) as e:
            row['status'] = f"unreadable checkpoint: {e}"
    final = final_val(run['dir'], max_iters)
    if final is not None and state.get('status', 'done') == 'done' and row['params'] is not None:
        row['status'], row['iters'] = 'done', max_iters
        row['val_loss'], row['tokens'] = final
        if row['tokens'] is not None:
            row['train_flops'] = 3 * row['flops_per_token'] * row['tokens']
    elif state.get('status') in ('failed', 'interrupted'):
        row['status'] = state['status']
    elif row['iters'] is not None and row['status'] == 'not run':
        row['status'] = 'incomplete'
    if state.get('wall_time_s') is not None:
        row['wall_time_s'] = round(state['wall_time_s'], 1)
    arith = read_json(os.path.join(run['dir'], ARITH_JSON)) if row['status'] == 'done' else None
    row['tiers'] = {}
    if arith and not needs_eval(run):
        row['tiers'] = {int(n): t for n, t in arith.get('per_tier', {}).items()}
    rows.append(row)

# arithmetic: test accuracy per tier (number of operators) and the tier's majority baseline
tiers = sorted({n for row in rows for n in row['tiers']})
for row in rows:
    for n in tiers:
        t = row['tiers'].get(n, {})
        row[f'acc_{n}'], row[f'majority_{n}'] = t.get('accuracy'), t.get('majority_baseline')
    del row['tiers']

os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
with open(csv_path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def print_table(column, title, lower_is_better=True, floor_column=None):
    """Per depth and variant: the mean of `column` over seeds with its 95% interval, the difference to
    the reference variant with its interval and verdict, and where given, how the mean compares with
    a floor (the arithmetic majority baseline)."""
    values = {}  # (depth, variant) -> {seed: value} of the finished runs
    floors = {}
    for row in rows:
        if row['status'] == 'done' and row[column] is not None:
            values.setdefault((row['depth'], row['variant']), {})[row['seed']] = row[column]
            if floor_column:
                floors.setdefault(row['depth'], []).append(row[floor_column])
    print(f"\n{title} (mean ± 95% interval over seeds), difference to {reference} (paired by seed when "
          "the seeds match):")
    header = (f"{'depth':>5}  {'variant':<16} {'n':>2}  {column:<17}  {'vs ' + reference:<19}  verdict"
              + ("      vs majority baseline" if floor_column else ""))
    print(header)
    print('-' * len(header))
    unpaired = False
    for d in depth_list:
        ref = values.get((d, reference), {})
        for v in variant_list:
            vals = values.get((d, v), {})
            if not vals:
                print(f"{d:>5}  {v:<16} {0:>2}  (no finished runs)")
                continue
            m, h = mean_ci(list(vals.values()))
            line = f"{d:>5}  {v:<16} {len(vals):>2}  {fmt(m)} ± {fmt(h) or '  -   ':<8}"
            if v != reference and ref:
                dm, dh, paired = diff_ci(ref, vals)
                unpaired = unpaired or not paired
                line += (f"  {dm:+.4f} ± {fmt(dh) or '  -   ':<8}{' ' if paired else '*'} "
                         f"{verdict(dm, dh, lower_is_better):<18}")
            elif floor_column:
                line += ' ' * 40
            if floor_column and floors.get(d):
                floor = sum(floors[d]) / len(floors[d])
                where = verdict(m - floor, h, lower_is_better)
                line += f"  {floor:.4f}: {dict(better='above', worse='below').get(where, where)}"
            print(line.rstrip())
    if unpaired:
        print("* seeds differ from the reference's: unpaired (Welch) interval")


n_finished = sum(row['status'] == 'done' for row in rows)
print(f"\n{n_finished}/{len(rows)} runs finished")
print_table('val_loss', 'final val loss')
for n in tiers:
    print_table(f'acc_{n}', f"test accuracy, {n} operators", lower_is_better=False, floor_column=f'majority_{n}')


def print_gap_over_training():
    """Per depth and variant: the val loss difference to the reference at every evaluation of the
    finished runs (paired by seed), so one sees whether a gap opens, closes or stays inside the noise
    as training goes on."""
    curves = {}  # (depth, variant) -> {seed: {iter: val loss}}
    for row in rows:
        if row['status'] == 'done':
            curves.setdefault((row['depth'], row['variant']), {})[row['seed']] = {
                r['iter']: r['val_loss'] for r in read_log(row['out_dir']) if r.get('val_loss') is not None}
    lines = []
    for d in depth_list:
        ref = curves.get((d, reference), {})
        for v in variant_list:
            runs_v = curves.get((d, v), {})
            if v == reference or not ref or not runs_v:
                continue
            iters = sorted(set.intersection(*(set(c) for c in (*ref.values(), *runs_v.values()))) - {0})
            cells = []
            for it in iters:
                dm, dh, paired = diff_ci({s: c[it] for s, c in ref.items()}, {s: c[it] for s, c in runs_v.items()})
                cells.append(f"{it}: {dm:+.4f} ± {fmt(dh) or '-'}{'' if paired else '*'}")
            lines.append(f"{d:>5}  {v:<16} " + "   ".join(cells))
    if lines:
        print(f"\nval loss difference to {reference} over training, by iteration (mean ± 95% interval):")
        print("\n".join(lines))


print_gap_over_training()
# per depth and variant: {seed: final val loss}, for the plots
results = {}
for row in rows:
    if row['status'] == 'done':
        results.setdefault((row['depth'], row['variant']), {})[row['seed']] = row['val_loss']
print(f"CSV: {csv_path}")

if plot and n_finished:
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
        print("note: matplotlib is not installed, so no plots (pip install matplotlib); the CSV has every number")
    if plt is not None:
        flops = {}
        for row in rows:
            if row['status'] == 'done' and row['train_flops']:
                flops.setdefault((row['depth'], row['variant']), []).append(row['train_flops'])
        for xname, title in (('depth', 'final val loss vs depth'), ('flops', 'final val loss vs training FLOPs')):
            fig, ax = plt.subplots(figsize=(6.4, 4.4))
            for v in variant_list:
                pts = []
                for d in depth_list:
                    vals = results.get((d, v))
                    if not vals or (xname == 'flops' and (d, v) not in flops):
                        continue
                    x = d if xname == 'depth' else sum(flops[(d, v)]) / len(flops[(d, v)])
                    m, h = mean_ci(list(vals.values()))
                    pts.append((x, m, 0.0 if math.isnan(h) else h, list(vals.values())))
                if not pts:
                    continue
                line = ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                                   marker='o', capsize=3, label=v)
                for x, _, _, vals in pts:
                    ax.scatter([x] * len(vals), vals, s=8, alpha=0.35, color=line[0].get_color())
            ax.set_xscale('log', base=2 if xname == 'depth' else 10)
            if xname == 'depth':
                ax.set_xticks(depth_list)
                ax.set_xticklabels([str(d) for d in depth_list])
            ax.set_xlabel('n_layer' if xname == 'depth' else 'training FLOPs (3 x FLOPs/token x tokens)')
            ax.set_ylabel('final val loss')
            ax.set_title(f"{title}\nmean and 95% interval over seeds; dots: single runs")
            ax.legend()
            fig.tight_layout()
            path = os.path.join(os.path.dirname(os.path.abspath(csv_path)), f"sweep_val_loss_vs_{xname}.png")
            fig.savefig(path, dpi=120)
            plt.close(fig)
            print(f"plot: {path}")

if not report_only and failed:
    print(f"\n{len(failed)} run(s) failed:", file=sys.stderr)
    for run in failed:
        print(f"  {run['name']}: {run['error']}", file=sys.stderr)
    sys.exit(1)
