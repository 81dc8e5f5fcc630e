"""sweep.py's bookkeeping of run directories, and its check of a sweep's options by train.py itself."""
import contextlib
import difflib
import io
import json
import re
import runpy
import sys

from nanolime import checkpoint
from nanolime.checkpoint import read_log
from nanolime.common import UserError


def int_list(key, text, low):
    """The distinct integers >= low of a comma-separated option (--depths=4,8,16); UserError otherwise."""
    values = [int(x) if x.isdigit() else -1 for x in str(text).replace(' ', '').split(',') if x]
    if not values or min(values) < low or len(set(values)) < len(values):  # 0 and 00 are one value: one run dir
        raise UserError(f"{key}={text!r}: expected distinct comma-separated integers >= {low}, e.g. --{key}=4,8,16")
    return values


def read_json(path):
    """A JSON object from path; {} if it is missing or is no JSON object (damaged, say: the caller decides)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def final_record(run_dir, iters):
    """The log record of the evaluation at iteration `iters`, or None if the run has not got there."""
    return next((r for r in reversed(read_log(run_dir)) if r.get('iter') == iters and 'val_loss' in r), None)


class _Checked(Exception):
    """Raised where train.py claims its out_dir: everything it can check is checked by then."""


def check_options(train_py, variant_args, sweep_keys):
    """{variant: its runs' train.py config}, from train.py itself: run here with each variant's arguments
    (variant_args: {variant: train.py's argv}, into a scratch out_dir), it checks them and is stopped where it
    would claim its out_dir, before any work; UserError with its message if it refuses (an unknown key: the
    closest of sweep_keys suggested)."""
    configs, errors, argv, claim = {}, {}, sys.argv, checkpoint.on_rank_0

    def stop(*args, **kwargs):  # train.py's config, read from the frame that calls it
        raise _Checked(sys._getframe(1).f_globals['config'])
    checkpoint.on_rank_0 = stop  # train.py imports it when run_path runs it: this stand-in
    try:
        for v, args in variant_args.items():
            sys.argv = [train_py, *args]
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    runpy.run_path(train_py, run_name='__main__')
            except _Checked as checked:
                configs[v] = json.loads(json.dumps(checked.args[0]))  # a copy, as the printed config was
            except UserError as e:
                errors[v] = str(e)
    finally:
        sys.argv, checkpoint.on_rank_0 = argv, claim
    if errors:  # the first; named by its variant if another variant passed (then the problem is that one's)
        v, msg = next(iter(errors.items()))
        prefix = '' if len(errors) == len(variant_args) else f"variant {v}: "
        key = re.match(r"unknown config key '(\w+)'", msg)
        close = difflib.get_close_matches(key.group(1), sweep_keys, n=1) if key and 'did you' not in msg else []
        raise UserError(prefix + msg + (f"; did you mean '{close[0]}'?" if close else ''))
    return configs
