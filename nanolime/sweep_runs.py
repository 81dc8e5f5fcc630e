"""sweep.py's option lists, its bookkeeping of run directories and their rows, and its check of a
sweep's options by train.py itself."""
import contextlib
import dataclasses
import difflib
import io
import json
import os
import re
import runpy
import sys

from nanolime.checkpoint import CKPT_NAME, atomic_write, load_checkpoint, read_log
from nanolime.common import UserError
from nanolime.data import data_id, dataset_dir, ends_data_id
from nanolime.sweep_csv import csv_text, earlier_rows
from nanolime.sweep_multipliers import MULTIPLIERS
from nanolime.variants import VARIANT_PLAIN, parse_variant

RUN_STATE = 'sweep.json'   # per run directory: status, the max_iters it finished, wall time
# set by the sweep for each run; a value given is ignored
PER_RUN = ('n_layer', 'seed', 'init_from', *VARIANT_PLAIN)
# the lr schedule's shape: a run continued under another would restart its schedule mid-run, and its
# result be that of no run of either length. max_iters alone may grow: a resumed run continues exactly
# where it stopped, the lr at min_lr past lr_decay_iters, as a longer run would have it
SCHEDULE = ('lr_decay_iters', 'warmup_iters', 'decay_lr')
# options that may change between invocations without making a run another experiment; a run trained
# with any other change is refused
MAY_CHANGE = ('out_dir', 'init_from', 'max_iters', 'eval_interval', 'log_interval', 'eval_only',
              'check_only', 'overwrite', 'always_save_checkpoint', 'device', 'compile', 'data_dir',
              'wandb_log', 'wandb_project', 'wandb_run_name', 'peak_flops', 'debug')


def variant_options(variant, own=()):
    """train.py options of a variant name (nanolime/variants.py's grammar: lime, lime+hc, lime:first-2,
    attnres:block, lime~router_lr=0.002, ...): the model's options, then those after '~', which may not
    be the sweep's own (own: its keys)."""
    opts, extra = parse_variant(variant)
    if set(extra) & (set(own) - {'out_dir'}):
        key = next(k for k in extra if k in own)
        raise UserError(f"variant '{variant}': {key} is the sweep's own option, not train.py's: give it "
                        f"once, to the sweep (--{key}=...), not after '~'")
    if set(extra) & {*PER_RUN, 'out_dir'}:
        raise UserError(f"variant '{variant}': expected '~key=value' with a train.py option other than "
                        f"{', '.join(PER_RUN)} and out_dir, e.g. lime~router_lr=0.002")
    if set(extra) & {'max_iters', *SCHEDULE}:
        raise UserError(f"variant '{variant}': the schedule (max_iters, {', '.join(SCHEDULE)}) is the "
                        "sweep's, the same for every variant: give it as --key=value to the sweep")
    return {**opts, **extra}


def int_list(key, text, low):
    """The distinct integers >= low of a comma-separated option (--depths=4,8,16); UserError otherwise."""
    values = [int(x) if x.isdigit() else -1 for x in str(text).replace(' ', '').split(',') if x]
    if not values or min(values) < low or len(set(values)) < len(values):  # 0 and 00 are one value: one run dir
        raise UserError(f"{key}={text!r}: expected distinct comma-separated integers >= {low}, e.g. --{key}=4,8,16")
    return values


def check_run_dirs(runs):
    """UserError if two runs would share a directory (its name maps characters other than letters, digits and
    + _ . - to _: distinct variants must stay distinct), or a directory's name is longer than a file name may be."""
    named = {}
    for run in runs:
        if len(run['name'].encode()) > 255:  # the longest file name most file systems take
            raise UserError(f"variant '{run['variant']}': its run directory's name ({run['name']}) would be "
                            f"{len(run['name'].encode())} bytes, over the 255 a file name may have: shorten the "
                            "variant")
        other = named.setdefault(run['name'], run)
        if other is not run:
            raise UserError(f"variants '{other['variant']}' and '{run['variant']}' would share the run directory "
                            f"{run['dir']} (characters other than letters, digits and + _ . - become _ in it): "
                            "make them differ in other characters")


def skipped_runs(text, variants, depths):
    """{(variant, depth)} of --skip's comma-separated <variant>-L<depth>: runs left out at every seed
    (a design whose arms differ in depth: lime-L64 beside the baseline at 64); UserError naming one
    that is not of this sweep's variants and depths."""
    pairs = set()
    for name in (s.strip() for s in str(text).split(',') if s.strip()):
        variant, _, depth = name.rpartition('-L')
        if variant not in variants or not depth.isdigit() or int(depth) not in depths:
            raise UserError(f"skip={text!r}: '{name}' is no <variant>-L<depth> of this sweep's "
                            f"variants and depths, e.g. {variants[-1]}-L{depths[-1]}")
        pairs.add((variant, int(depth)))
    return pairs


def launch_order(runs):
    """The runs in the order they start: seed by seed, so that each finished seed is a complete paired
    result (across depths too) when a sweep is cut short; deepest first within a seed, so that the
    longest runs do not end up alone at the end; the variants in their order."""
    return sorted(runs, key=lambda r: (r['seed'], -r['depth']))


def read_json(path):
    """The JSON object in the file at path; None if it is missing, or holds no JSON object (damaged, say: the
    caller decides)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


STATE_TYPES = {'status': str, 'max_iters': int, 'lr_decay_iters': int, 'warmup_iters': int, 'wall_time_s': float,
               'data': str}  # the fields of a run's sweep.json that sweep.py reads (data may also be null)


def read_state(path):
    """(the fields of a run's sweep.json, what is wrong with it or None): ({}, None) if there is none; ({}, what) if
    it holds no JSON object, no status, or a field of another type than STATE_TYPES's."""
    if not os.path.exists(path):
        return {}, None
    state = read_json(path)
    if state is None:
        return {}, "not a JSON object"
    for key, kind in STATE_TYPES.items():
        value = state.get(key)
        if key in state and not (value is None and key == 'data') and (
                isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind)):
            what = {str: 'a string', int: 'an integer', float: 'a number'}[kind]
            return {}, f"its {key} is {json.dumps(value)}, not {what}"
    return (state, None) if state.get('status') else ({}, "no status")


ARITH_JSON = 'arith_eval_test.json'  # what study/arithmetic.py writes into a run's directory


def scores(run_dir):
    """study/arithmetic.py's accuracies per tier of the run's final checkpoint, or None if it has not scored that
    (or if its scores are damaged: said in a warning, they are made again)."""
    path = os.path.join(run_dir, ARITH_JSON)
    if os.path.exists(path) and os.path.getmtime(path) >= os.path.getmtime(os.path.join(run_dir, CKPT_NAME)):
        try:
            return tier_scores(path)
        except UserError as e:
            print(f"warning: {e}; its run is scored again", file=sys.stderr)


def tier_scores(path):
    """study/arithmetic.py's accuracies per tier from the file at path ({tier: {'accuracy': ..., ...}}), or None
    if it is missing; UserError naming the file if they are not that."""
    scores = read_json(path)
    per_tier = scores.get('per_tier') if scores is not None else None
    if os.path.exists(path) and not (isinstance(per_tier, dict) and all(
            isinstance(v, dict) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values())
            for v in per_tier.values())):
        raise UserError(f"{path} is damaged: no per_tier of numbers")
    return per_tier


def run_log(run_dir):
    """The records of a run's log.jsonl (checkpoint.read_log); [] with a warning naming the file and the line if it
    is damaged: a report goes on with the other runs."""
    try:
        return read_log(run_dir)
    except UserError as e:
        print(f"warning: {e}; its run is reported without its log", file=sys.stderr)
        return []


def final_record(run_dir, iters):
    """The log record of the evaluation at iteration `iters`, or None if the run has not got there (or its log is
    damaged: run_log says so)."""
    try:
        log = read_log(run_dir)
    except UserError:
        return None
    return next((r for r in reversed(log) if r.get('iter') == iters and 'val_loss' in r), None)


CHECKPOINT_COLUMNS = ('learning_rate', 'non_embedding_params', 'tokens_per_param', 'options')


def checkpoint_columns(run_dir, tokens, exclude, data=None):
    """sweep.csv's columns of a run that its own checkpoint gives: learning_rate (the peak lr it trained with),
    non_embedding_params (of the model its options build), tokens_per_param (`tokens`, those it trained on, per
    non-embedding parameter) and options (its training options as JSON, less `exclude`: those the sweep sets per
    run or that may change between commands); and data, the identity of the data it trained on (data.data_id),
    as data_id gives it now where `data` is the form earlier versions recorded (data.ends_data_id) of the data its
    checkpoint names. UserError naming the file and what in it does not fit."""
    import torch
    from relatives import RelativesConfig, build_model
    path = os.path.join(run_dir, CKPT_NAME)
    ckpt = load_checkpoint(path)
    config, args = ckpt['config'], ckpt['model_args']
    if not isinstance(config, dict) or not isinstance(args, dict):
        raise UserError(f"{path} is damaged: its config or model_args is no dict")
    unknown = sorted(set(args) - {f.name for f in dataclasses.fields(RelativesConfig)})
    if unknown:
        raise UserError(f"{path}: model option '{unknown[0]}' is not one of this model.py's (a checkpoint of another "
                        "nanoLIMe version)")
    try:
        with torch.device('meta'):  # the shapes only: no memory, no time
            size = build_model(RelativesConfig(**args)).get_num_params(non_embedding=True)
    except Exception as e:  # a value this model.py refuses (GPTConfig's checks)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"{path}: its model options build no model of this model.py ({first})") from None
    lr = config.get('learning_rate')
    if data is not None:  # recorded by an earlier version: the same data, named as this version names it
        ddir = dataset_dir(str(config.get('dataset', '')), config.get('data_dir') or None)
        ident = data_id(ddir)
        data = ident if ident and data != ident and data == ends_data_id(ddir) else data
    return {'data': data, 'learning_rate': lr if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None,
            'non_embedding_params': size,
            'tokens_per_param': round(tokens / size, 3) if isinstance(tokens, int) and size else None,
            'options': json.dumps({k: v for k, v in sorted(config.items()) if k not in exclude},
                                  separators=(',', ':'), default=str)}


def own_columns(row, exclude, keep=False):
    """A finished row's CHECKPOINT_COLUMNS from its run's own checkpoint (checkpoint_columns); a warning naming the
    file and what in it does not fit if they cannot be read, the columns then empty (with keep: as they were)."""
    try:
        row.update(checkpoint_columns(row['out_dir'], row['tokens'], exclude, row.get('data')))
    except UserError as e:
        kept = 'as an earlier command wrote them' if keep else 'left empty'
        print(f"warning: {e}; its row's {', '.join(CHECKPOINT_COLUMNS)} are {kept}", file=sys.stderr)


def run_row(run, iters, exclude):
    """A run's row of sweep.csv, from its directory, and if it finished its val loss curve {iter:
    (FLOPs, val loss)} (else None). `iters`: the iterations it is to finish (None: those its sweep.json
    says); `exclude`: the options its options column leaves out (checkpoint_columns)."""
    state_path, log_path = os.path.join(run['dir'], RUN_STATE), os.path.join(run['dir'], 'log.jsonl')
    (state, damage), log = read_state(state_path), run_log(run['dir'])
    if damage:
        print(f"warning: {state_path} is damaged ({damage}): its run is reported as 'unknown'; rerun the "
              "sweep (without --report_only) to check it and finish it if it is not", file=sys.stderr)
        state = {'status': 'unknown'}
    iters = state.get('max_iters') if iters is None else iters
    finished = (state.get('status'), state.get('max_iters')) == ('done', iters)
    final = final_record(run['dir'], iters) if finished else None
    if finished and not final and 'error' not in run:
        print(f"warning: {log_path} lacks the final evaluation (iter {iters}) of a run its sweep.json "
              "says finished: reported without it; rerun the sweep (without --report_only) to restore it "
              "from the run's checkpoint", file=sys.stderr)
    status = run['status'] if 'error' in run else 'done' if final else state['status'] \
        if state.get('status') in ('failed', 'interrupted', 'unknown') else \
        'incomplete' if log else 'not run'
    row = {'depth': run['depth'], 'variant': run['variant'], 'seed': run['seed'],
           'budget': run.get('budget'), 'status': status, 'iters': log[-1]['iter'] if log else None,
           # the schedule it ran, and the identity of the data it trained on (data.data_id)
           **{k: state.get(k) for k in ('max_iters', 'lr_decay_iters', 'warmup_iters', 'data')},
           'tokens': final and final['tokens'], 'train_flops': final and final['flops'],
           'learning_rate': None, 'non_embedding_params': None, 'tokens_per_param': None,  # own_columns
           'val_loss': final and final['val_loss'],
           **dict.fromkeys(MULTIPLIERS),  # add_compute_multipliers's
           'wall_time_s': round(state['wall_time_s'], 1) if 'wall_time_s' in state else None,
           'options': None, 'out_dir': run['dir']}
    if final:
        own_columns(row, exclude)
    if status != 'done' or run.get('budget'):
        return row, None
    row['tiers'] = scores(run['dir']) or {}
    return row, {r['iter']: (r['flops'], r['val_loss']) for r in log
                 if 'val_loss' in r and r['iter'] <= iters}


def put_row(path, row):
    """The sweep.csv at path with `row` in place of its run's earlier row (or after the others): written
    as each run ends, so that a sweep cut short leaves the rows of the runs it finished (the report then
    rewrites it whole, with the compute multipliers)."""
    rows, name = earlier_rows(path, []), os.path.basename(row['out_dir'])
    names = [os.path.basename(r['out_dir']) for r in rows]
    if name in names:
        rows[names.index(name)] = row
    else:
        rows.append(row)
    atomic_write(path, lambda f: f.write(csv_text(rows).encode()))


def quiet_stdout():
    """stdout to /dev/null: after a write to a closed pipe (`sweep.py | head -1`), so that the exit flushes
    nothing into it and the command ends quietly, as other command-line tools do."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def check_options(train_py, variant_args, sweep_keys):
    """{variant: its runs' train.py config}, from train.py itself: run here with each variant's arguments
    (variant_args: {variant: train.py's argv}) and --check_only=True, it checks them (the model and its optimizer
    built), prints the config it would run with and exits before it claims its out_dir; UserError with its message
    if it refuses (an unknown key: the closest of sweep_keys suggested)."""
    configs, errors, argv, hook = {}, {}, sys.argv, sys.excepthook
    try:
        for v, args in variant_args.items():
            sys.argv, out = [train_py, *args, '--check_only=True'], io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    runpy.run_path(train_py, run_name='__main__')
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
                configs[v] = json.loads(out.getvalue().splitlines()[-1])  # its last line
                configs[v].pop('check_only')  # the runs' own is False
            except UserError as e:
                errors[v] = str(e)
    finally:  # train.py's configure() installed its error hook in this process: the sweep's again
        sys.argv, sys.excepthook = argv, hook
    if errors:  # the first; named by its variant if another variant passed (then the problem is that one's)
        v, msg = next(iter(errors.items()))
        prefix = '' if len(errors) == len(variant_args) else f"variant {v}: "
        key = re.match(r"unknown config key '(\w+)'", msg)
        close = difflib.get_close_matches(key.group(1), sweep_keys, n=1) if key and 'did you' not in msg else []
        raise UserError(prefix + msg + (f"; did you mean '{close[0]}'?" if close else ''))
    return configs
