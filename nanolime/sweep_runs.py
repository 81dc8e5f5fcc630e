"""sweep.py's bookkeeping of run directories, and its check of a sweep's options by train.py itself."""
import contextlib
import dataclasses
import difflib
import io
import json
import os
import re
import runpy
import sys

from nanolime.checkpoint import CKPT_NAME, load_checkpoint, read_log
from nanolime.common import UserError
from nanolime.data import data_id, dataset_dir, ends_data_id


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


def quiet_stdout():
    """stdout to /dev/null: after a write to a closed pipe (`sweep.py | head -1`), so that the exit flushes
    nothing into it and the command ends quietly, as other command-line tools do."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def check_options(train_py, variant_args, sweep_keys):
    """{variant: its runs' train.py config}, from train.py itself: run here with each variant's arguments
    (variant_args: {variant: train.py's argv}) and --check_only=True, it checks them (the model and its optimizer
    built), prints the config it would run with and exits before it claims its out_dir; UserError with its message
    if it refuses (an unknown key: the closest of sweep_keys suggested)."""
    configs, errors, argv = {}, {}, sys.argv
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
    finally:
        sys.argv = argv
    if errors:  # the first; named by its variant if another variant passed (then the problem is that one's)
        v, msg = next(iter(errors.items()))
        prefix = '' if len(errors) == len(variant_args) else f"variant {v}: "
        key = re.match(r"unknown config key '(\w+)'", msg)
        close = difflib.get_close_matches(key.group(1), sweep_keys, n=1) if key and 'did you' not in msg else []
        raise UserError(prefix + msg + (f"; did you mean '{close[0]}'?" if close else ''))
    return configs
