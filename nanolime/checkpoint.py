"""
The files of a run: its out_dir claimed and locked for one process, atomic writes (a crash leaves the old
file or the new one, never a part), the one checkpoint loader and the checks before resuming one, rank 0's
verdicts under DDP and the check that all ranks hold its weights, and the log train.py writes.
"""
import os
import dataclasses
import errno
import fcntl
import glob
import json
import math
import stat
import tempfile
import zipfile

from nanolime.common import UserError, printable
import torch

CKPT_NAME = 'ckpt.pt'
CKPT_MARKER = 'nanolime'  # key present in every checkpoint we write (value: format version)
# train.py writes checkpoints atomically: a damaged one was cut or changed by something else
DAMAGED = "restore it from a copy, or train again (train.py --overwrite replaces it)"


def writable_dir(path, key, fix=None):
    """Make directory `path` (set by config key `key`) if missing and check that this process can
    write files in it, before any work that the first write would otherwise lose; UserError saying
    what to change if not (`fix`, else to choose another)."""
    if not path:
        raise UserError(f"{key} is empty: name a directory (--{key}=DIR)")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        reason = "it is a file, not a directory" if isinstance(e, FileExistsError) else (e.strerror or str(e)).lower()
        fix = fix or f"choose another --{key}"
        raise UserError(f"cannot write into {key}={path}: {reason}; {fix}") from None


_locks = {}  # directory -> the open lock file; kept open (and so locked) until this process ends


def lock_dir(path, what):
    """Claim directory `path` for this process's life: an exclusive flock on <path>/.lock, with our
    pid written in it for whoever finds it taken. `what` names the directory in the error, e.g.
    'out_dir'. UserError naming the process that holds it (the lock goes with that process, however
    it ends: no stale locks to clean up), or if .lock is no plain file (not followed: nothing
    outside `path` is written) or cannot be written."""
    os.makedirs(path, exist_ok=True)
    lock = os.path.join(path, '.lock')
    existed = os.path.lexists(lock)
    try:  # O_NONBLOCK: a named pipe opens at once (and is refused) instead of waiting for a writer
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as e:  # a link (ELOOP), a directory (EISDIR), ...
        raise UserError(not_own_file(lock) or _cannot_write(lock, e, "run again")) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(not_own_file(lock))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors='replace').strip() or '?'
            raise UserError(f"{what} {path} is in use by another process (pid {pid}); wait for it "
                            f"to end, or use another {what}") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as e:  # a full disk: no empty .lock is left behind
            os.remove(lock) if not existed else None
            raise UserError(_cannot_write(lock, e, "run again")) from None
    except UserError:
        os.close(fd)
        raise
    _locks[path] = fd


def not_own_file(path):
    """Why `path`, where a script keeps a file of its own, is not one: a link (writing it would
    write where it points), a directory, a named pipe (reading it would wait for a writer); None if
    it is a plain file or none."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    kind = (f"a symbolic link (to {os.readlink(path)})" if stat.S_ISLNK(mode) else "a directory"
            if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else
            None if stat.S_ISREG(mode) else "a socket or device")
    return kind and (f"{path} is {kind}, where a plain file belongs: nothing was read or written "
                     f"through it; move it out of {os.path.dirname(path) or '.'}, or use another "
                     "directory")


def claim_out_dir(out_dir, init_from, overwrite, trains):
    """Make out_dir train.py's alone, before any work: writable (checked now, not at the first
    save), locked until this process ends (a second run into it stops here), its files plain ones
    (never read or written through a link), a trained model in it replaced only when asked to and
    only by a run that trains (`trains`), and the temp files of a killed run's writes removed.
    UserError if not."""
    resumed = "the run to continue is there: make it writable, or copy it to a place that is and point " \
        "--out_dir there"
    writable_dir(out_dir, 'out_dir', None if init_from == 'scratch' else resumed)
    lock_dir(out_dir, 'out_dir')
    ckpt_path = os.path.join(out_dir, CKPT_NAME)
    for path in (ckpt_path, os.path.join(out_dir, 'log.jsonl')):
        if not_own_file(path):
            raise UserError(not_own_file(path))
    if init_from == 'scratch' and os.path.exists(ckpt_path) and not overwrite:
        raise UserError(f"{ckpt_path} holds a trained model: continue it with --init_from=resume, train into "
                        "another --out_dir, or replace it with --overwrite")
    if init_from == 'scratch' and os.path.exists(ckpt_path) and not trains:  # its log would be a new model's
        raise UserError(f"{ckpt_path} holds a trained model, and --overwrite with this run would only evaluate an "
                        "untrained one (eval_only=True or max_iters=0): nothing was done, the model and its log are "
                        "intact; to evaluate it use --init_from=resume --eval_only=True, to replace it train "
                        "(--max_iters >= 1)")
    for tmp in glob.glob(os.path.join(glob.escape(out_dir), '*.tmp')):  # of a killed run's writes: ours now
        if os.path.basename(tmp).startswith((CKPT_NAME, 'log.jsonl')):
            os.remove(tmp)


# How a resume treats a train.py option whose value is not its checkpoint's (docs/errors.md's
# table). The model's options (relatives.RelativesConfig's fields) are refused as the model builds
# them, all but dropout: a regularizer of the training, it leaves the model's function and weights
# as they are.
RESUME_OPTIONS = {
    # refused: they made the checkpoint: its optimizer's state; the seed of its init, of its data
    # order (every rank's stream, which the resume continues) and of its evaluation batches
    'refused': ('seed', 'optimizer'),
    # applied to the loaded optimizer (load_optimizers), and said
    'optimizer': ('learning_rate', 'min_lr', 'router_lr', 'router_lr_scaling', 'attnres_query_lr',
                  'muon_lr', 'muon_momentum', 'weight_decay', 'beta1', 'beta2', 'grad_clip',
                  'decay_lr', 'warmup_iters', 'lr_decay_iters'),
    # applied from the next iteration on (the data, the batch, the precision, the evaluation), and
    # said
    'applied': ('dropout', 'total_batch_size', 'batch_size', 'dataset', 'data_dir', 'dtype',
                'eval_iters'),
    # free, not said: how far the run goes, where and how this process runs it, what it prints and
    # writes
    'free': ('max_iters', 'eval_interval', 'log_interval', 'always_save_checkpoint', 'eval_only',
             'check_only', 'out_dir', 'init_from', 'overwrite', 'device', 'compile', 'fsdp',
             'peak_flops', 'wandb_log', 'wandb_project', 'wandb_run_name', 'debug'),
}


def check_resume(ckpt, path, model_args, config, meta, ddir):
    """UserError unless a run of `config` (its model: `model_args`, its dataset: `meta` in `ddir`)
    can continue checkpoint `ckpt` (at `path`): the same model, RESUME_OPTIONS' refused options and
    vocabulary (the ids' meaning, not only their number). Returns what it changes: {option: (the
    checkpoint's value, or None if it lacks it; this run's)} of the other options said; {} for no
    checkpoint."""
    if ckpt is None:
        return {}
    theirs, given = ckpt['model_args'], ckpt['config']
    diff = [k for k in sorted(set(model_args) | set(theirs))
            if k != 'dropout' and model_args.get(k) != theirs.get(k)]
    diff += [k for k in RESUME_OPTIONS['refused'] if k in given and given[k] != config[k]]
    if diff:
        was, now = {**given, **theirs}, {**config, **model_args}  # a model's option as it builds
        what = ', '.join(f"{k}: {was.get(k)!r} in the checkpoint, {now.get(k)!r} now" for k in diff)
        options = ' '.join(_option(k, was[k]) for k in diff if k in config)
        fix = ("resume on the checkpoint's dataset" if 'vocab_size' in diff else
               f"resume with {options}" if options else
               "resume it with the version of nanoLIMe that wrote it")  # a model option of no option
        which = 'model' if set(diff) & set(theirs) else 'run'
        raise UserError(f"cannot resume from {path}: the {which} differs ({what}; a resume continues "
                        f"the run the checkpoint holds); {fix}, or train into another out_dir")
    states = ckpt.get('optimizer')
    for number, state in enumerate(states if isinstance(states, list) else [states] if states else [], 1):
        bad = sorted({name for per_param in (state.get('state') or {}).values() for name, v in per_param.items()
                      if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()})
        if bad:  # its first step would make the weights NaN, and the run stop at a NaN loss that says otherwise
            raise UserError(f"{path} holds non-finite optimizer state (NaN or inf) in {', '.join(bad)} of optimizer "
                            f"{number}; {DAMAGED}")
    vocab = [{k: m.get(k) for k in ('kind', 'encoding', 'stoi')} for m in (ckpt.get('meta') or meta, meta)]
    if vocab[0] != vocab[1]:
        raise UserError(f"cannot resume from {path}: it was trained on dataset {given.get('dataset')!r}, "
                        f"whose vocabulary differs from that of {os.path.join(ddir, 'meta.pkl')} (same size, other "
                        "tokens); resume on the checkpoint's dataset and data_dir, or train into another out_dir")
    said = (*RESUME_OPTIONS['optimizer'], *RESUME_OPTIONS['applied'], *RESUME_OPTIONS['refused'])
    return {k: (given.get(k), config[k]) for k in said if k not in given or given[k] != config[k]}


def _option(key, value):
    """--key=value as configure reads it back."""
    return f"--{key}={value if isinstance(value, str) and value else repr(value)}"


def changes_said(changes, path, iter_num):
    """The line that says check_resume's `changes`, which hold from iteration `iter_num` on."""
    said = ', '.join(f"{k} {'(not recorded)' if old is None else repr(old)} -> {new!r}"
                     for k, (old, new) in changes.items())
    return f"resuming with other settings than {path}'s, applied from iter {iter_num} on: {said}"


def load_optimizers(optimizers, scaler, ckpt, path, changes, adapt=None):
    """The optimizer states of checkpoint `ckpt` (at `path`) into `optimizers`, made for this run's
    config, and the GradScaler's into `scaler` (float16) if it has one: each group keeps this run's
    settings (peak lr, weight decay, betas, eps; load_state_dict would bring back the checkpoint's),
    so that what the run logs and saves is what its optimizer does. UserError if the groups differ
    (another one: `changes`, check_resume's, name the options that can make one), or if the state is
    not an optimizer's. `adapt(optimizer, state)`: the state that optimizer loads (FSDP's shards of
    it), if not the checkpoint's own."""
    states = ckpt.get('optimizer')
    for opt, state in zip(optimizers, states if isinstance(states, list) else [states] if states else []):
        ours = [{k: v for k, v in group.items() if k != 'params'} for group in opt.param_groups]
        try:
            opt.load_state_dict(adapt(opt, state) if adapt else state)
        except ValueError as e:  # a group more or less: attnres_query_lr set or unset, say
            fix = ' '.join(_option(k, old) for k, (old, _) in changes.items()
                           if k in RESUME_OPTIONS['optimizer'] and old is not None)
            fix = fix or 'the options it was trained with'
            raise UserError(f"cannot resume from {path}: its optimizer's parameter groups differ from "
                            f"this run's ({e}); resume with {fix}, or train into another out_dir") from None
        except (KeyError, TypeError, IndexError, AttributeError, RuntimeError):
            raise UserError(f"{path} is damaged: its optimizer state is not that of an optimizer; "
                            f"{DAMAGED}") from None
        for group, settings in zip(opt.param_groups, ours):
            group.update(settings)
    if ckpt.get('scaler') and scaler.is_enabled():
        scaler.load_state_dict(ckpt['scaler'])


def on_rank_0(work, *args, error_prefix=''):
    """work(*args) on rank 0 only (the process group's, when there is one), and its UserError, if any, raised on every
    rank (under DDP all of them call this at the same point): they all stop together, none waits in a collective for
    the others."""
    error, ddp = None, torch.distributed.is_available() and torch.distributed.is_initialized()
    if not ddp or torch.distributed.get_rank() == 0:
        try:
            work(*args)
        except UserError as e:
            error = error_prefix + str(e)
    if ddp:
        box = [error]
        torch.distributed.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise UserError(error)


def check_same_weights(model):
    """DDP: UserError unless every rank holds rank 0's parameters, bit for bit (what DDP promises)."""
    dist = torch.distributed
    differ = torch.zeros((), dtype=torch.long, device=next(model.parameters()).device)  # tensors unlike rank 0's
    for p in model.parameters():
        p0 = p.detach().clone()
        dist.broadcast(p0, 0)
        differ += not torch.equal(p0, p.detach())
    dist.all_reduce(differ)
    if differ.item():
        raise UserError(f"DDP ranks diverged: {differ.item()} parameter tensors differ from rank 0's")
    if dist.get_rank() == 0:
        print(f"ddp: weights identical on all {dist.get_world_size()} ranks")




def atomic_write(path, write, then="run again"):
    """write(f) into a temp file in the same directory (its name unique to this process), fsync,
    then os.replace: a crash, a kill or a full disk at any point leaves either the old or the new
    file at `path`, never a partial one; a link at either name is replaced, never written through.
    UserError if it cannot be written (the old file is then untouched, the temp file removed), which
    says what to do about it, then to do `then`."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        if os.path.lexists(tmp):  # a killed process's of the same pid
            os.remove(tmp)
        with open(tmp, 'xb', opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW, 0o666)) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # whatever stops the write (Ctrl-C too), its temp file goes
        try:
            os.remove(tmp)
        except OSError:
            pass
        cause = e if isinstance(e, Exception) else None  # torch.save reports a failed write as a RuntimeError
        while cause is not None and not isinstance(cause, OSError):  # of its own, with the OSError as context
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise UserError(_cannot_write(path, cause, then)) from None
    try:  # make the rename itself durable
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _cannot_write(path, e, then):
    """The error of a write of `path` that failed with OSError `e`: what to do about its cause, then
    `then`."""
    where = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(where):
        return (f"cannot write {path}: its directory {where} is gone (deleted or moved while this "
                f"ran); nothing was written: put it back, then {then}")
    fix = "make it writable" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else \
        "free some space (or fix the permissions)"
    return (f"cannot write {path}: {(e.strerror or str(e)).lower()}; the file there, if any, is "
            f"unchanged: {fix}, then {then}")


def atomic_save(obj, path, then="run again"):
    """torch.save, atomically (see atomic_write)."""
    atomic_write(path, lambda f: torch.save(obj, f), then)


def git_commit():
    """The git commit of this code, '+dirty' appended when files differ from it; None outside a git checkout."""
    import subprocess
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, above nanolime/
    try:
        commit = subprocess.run(['git', '-C', here, 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=10)
        if commit.returncode:
            return None
        dirty = subprocess.run(['git', '-C', here, 'status', '--porcelain', '--untracked-files=no'],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git
        return None
    return commit.stdout.strip() + ('+dirty' if dirty else '')


def trained_with(ckpt):
    """'iter N, torch X, commit Y' of a checkpoint (older checkpoints did not record the last two)."""
    torch_version, commit = (printable(ckpt.get(k) or 'not recorded') for k in ('torch_version', 'git_commit'))
    return f"iter {ckpt['iter_num']}, torch {torch_version}, commit {commit}"


# the fields of a checkpoint and their types (as torch.load gives them back); REQUIRED ones must be
# there
FIELDS = {'model': dict, 'model_args': dict, 'iter_num': int, 'config': dict, 'optimizer': (list, dict),
          'scaler': dict, 'meta': dict, 'best_val_loss': (float, int), 'rng': list, 'tokens': int,
          'flops': (int, float), 'world_size': int, 'log': list, 'imported_from': str,
          'data_id': str, 'git_commit': str, 'torch_version': str}
REQUIRED = ('model', 'model_args', 'iter_num', 'config')
ITEMS = {'model': torch.Tensor, 'rng': dict, 'log': str}  # the type of the items of these


def load_checkpoint(path, what="checkpoint", verify=True):
    """One of our checkpoints, loaded on the CPU (weights only, memory-mapped), with the prefixes
    that torch.compile ('_orig_mod.') and DDP ('module.') add stripped from the state dict;
    UserError if it is missing, not ours or damaged: cut, of other types than FIELDS', or (`verify`:
    every byte is read) with bytes that are not those written (the zip's checksums, which torch.load
    does not check)."""
    if not os.path.exists(path):
        raise UserError(f"no {what} at {path}")
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a checkpoint file")
    if not os.path.isfile(path):  # a named pipe would block the read until something writes into it
        raise UserError(f"{path} is a named pipe or a device, not a checkpoint file; point at the "
                        "checkpoint itself")
    try:
        with zipfile.ZipFile(path) as z:
            changed = z.testzip() if verify else None
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except Exception:  # torch's messages here are about its internals (--debug shows them)
        raise UserError(f"{path} is truncated or not a checkpoint; {DAMAGED}") from None
    if changed is not None:
        raise UserError(f"{path} is damaged: the bytes of {changed} are not those written (their "
                        f"checksum differs); {DAMAGED}")
    if not isinstance(ckpt, dict) or CKPT_MARKER not in ckpt:
        raise UserError(f"{path} is not a nanoLIMe checkpoint (no '{CKPT_MARKER}' marker; it was written by "
                        "another program); point --out_dir at a directory train.py wrote")
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise UserError(f"{path} is damaged: missing {', '.join(missing)}; {DAMAGED}")
    wrong = [k for k, kind in FIELDS.items() if (k in REQUIRED or ckpt.get(k) is not None) and (
        not isinstance(ckpt[k], kind) or isinstance(ckpt[k], bool) or k in ITEMS and not all(
            isinstance(v, ITEMS[k]) for v in (ckpt[k].values() if k == 'model' else ckpt[k])))]
    if wrong:
        raise UserError(f"{path} is damaged: its {wrong[0]} is not what train.py writes there; "
                        f"{DAMAGED}")
    ckpt['model'] = {_strip_prefixes(k): v for k, v in ckpt['model'].items()}
    bad = [k for k, v in ckpt['model'].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:  # train.py stops at a non-finite loss before it saves: these came from somewhere else
        raise UserError(f"{path} holds non-finite weights (NaN or inf) in {bad[0]}"
                        f"{f' and {len(bad) - 1} more tensors' if len(bad) > 1 else ''}; {DAMAGED}")
    from relatives import RelativesConfig  # older checkpoints lack the newer model options: those are off
    args = ckpt['model_args']
    if args.pop('value_residual', False):
        raise UserError(f"{path} uses value_residual, which this version no longer has; sample or resume it "
                        "with the nanoLIMe version that wrote it")
    if isinstance(args.get('mhc'), bool):  # mhc was a flag, for what is now mhc='static'
        args['mhc'] = 'static' if args['mhc'] else ''
    ckpt['model_args'] = {**{f.name: f.default for f in dataclasses.fields(RelativesConfig)}, **args}
    return ckpt


def checkpoint_id(path):
    """A short identity of the checkpoint file at `path`, from the checksums its zip records of its
    parts (its bytes are not read): copies are the same checkpoint, any other save is another."""
    import hashlib
    with zipfile.ZipFile(path) as z:
        crcs = ' '.join(f"{i.filename}:{i.CRC}" for i in z.infolist())
    return hashlib.sha256(crcs.encode()).hexdigest()[:12]


def collect_states(model, data_rng, device):
    """(every rank's RNG states, for the checkpoint; whether every rank's weights are finite): a collective under
    DDP, so that all ranks reach the same verdict (a rank that stopped alone would leave the others hanging).
    `data_rng`: the numpy Generator of the data order; `device`: the resolved device."""
    state = {'data': data_rng.bit_generator.state, 'torch': torch.get_rng_state(),
             'cuda': torch.cuda.get_rng_state(device) if device.startswith('cuda') else None}
    finite = torch.stack([(p.to_local() if hasattr(p, 'to_local') else p).detach().isfinite().all()  # FSDP: a shard
                          for p in model.parameters()]).all().float()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [state], finite.item() == 1
    states = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
    return states, finite.item() == 1


def resumed_counts(ckpt):
    """(iter_num, best_val_loss, tokens, flops) of checkpoint `ckpt`: where its run stopped; a new run's for None."""
    if ckpt is None:
        return 0, float('inf'), 0, 0
    return (int(ckpt['iter_num']), float(ckpt.get('best_val_loss', float('inf'))), int(ckpt.get('tokens', 0)),
            int(ckpt.get('flops', 0)))


def resumed_rng(ckpt, seed, rank, world_size, device, announce=True):
    """The numpy Generator of this rank's data order: a new run's (ckpt None), or as checkpoint `ckpt` left it,
    torch's (and CUDA's) RNG state restored too, if it was written by as many ranks; else a Generator of its own for
    this iteration (`announce`: say that the data order is then not resumed exactly)."""
    import numpy as np
    if ckpt is None:
        return np.random.default_rng([seed, rank])
    states = ckpt.get('rng') or []
    if len(states) != world_size:
        if announce:
            print(f"note: the checkpoint was written by {len(states)} ranks, this run has {world_size}: the data "
                  "order is not resumed exactly")
        return np.random.default_rng([seed, rank, int(ckpt['iter_num'])])
    try:
        data_rng = np.random.default_rng()
        data_rng.bit_generator.state = states[rank]['data']
        torch.set_rng_state(states[rank]['torch'])
        if device.startswith('cuda') and states[rank].get('cuda') is not None:
            torch.cuda.set_rng_state(states[rank]['cuda'], device)
    except (KeyError, TypeError, ValueError, RuntimeError):
        raise UserError(f"the checkpoint is damaged: rank {rank}'s random number state is not one; "
                        f"{DAMAGED}") from None
    return data_rng


class RunLog:
    """log.jsonl: the records of the training that led to the checkpoint. A resumed run keeps the lines up to its
    checkpoint and adds its own. The file is replaced with every checkpoint and at the end, and not in between: a
    run that fails or is killed leaves it as it was (its progress is on stdout); so does a run that logs nothing.
    Each checkpoint holds a copy (`lines`): after a kill between the two writes, the run that resumes it writes the
    records the file lacks."""

    def __init__(self, out_dir, resumed=None, changes=None):
        """`resumed`: the checkpoint this run continues, or None; `changes`: what it changes of that
        run (check_resume's), logged as {'iter': from when they hold, 'changed': {option: [before,
        now]}}."""
        self.path, self.lines, self.changed = os.path.join(out_dir, 'log.jsonl'), [], False
        if resumed is not None:
            upto = resumed['iter_num']
            self.lines = [line for line in _log_lines(self.path) if _logged_iter(line) <= upto]
            copy = _copied_lines(resumed)
            if copy is not None and copy != self.lines:  # killed between the checkpoint's and log's writes
                self.lines, self.changed = copy, True
            if changes:
                self.add({'iter': upto + 1, 'changed': changes})

    def add(self, record):
        self.lines.append(json.dumps(record) + '\n')
        self.changed = True

    def write(self, then="run again"):
        """log.jsonl replaced whole (atomically) if it changed; `then` as atomic_write's."""
        if self.changed:
            atomic_write(self.path, lambda f: f.write(''.join(self.lines).encode()), then)
        self.changed = False


def _copied_lines(ckpt):
    """The log lines checkpoint `ckpt` holds a copy of, as train.py writes them: its iterations'
    records, one JSON object a line (a crafted copy is not written back as it is); None if it holds
    none (older checkpoints)."""
    copy = ckpt.get('log')
    return None if copy is None else [json.dumps(json.loads(line)) + '\n' for line in copy
                                      if _logged_iter(line) <= ckpt['iter_num']]


def _log_lines(path):
    """The lines of a log.jsonl (each with its newline, a last one cut short without), bytes that
    are no UTF-8 replaced; [] if there is no such file (nor for a named pipe: reading it would wait
    for a writer)."""
    if not os.path.isfile(path):
        return []
    with open(path, 'rb') as f:
        return f.read().decode(errors='replace').splitlines(keepends=True)


def _logged_iter(line):
    """The iteration of a log line; inf for a line cut short by a crash, or anything else that is not a record."""
    try:
        record = json.loads(line) if line.endswith('\n') else None
    except ValueError:
        return math.inf
    iter_num = record.get('iter') if isinstance(record, dict) else None
    return iter_num if type(iter_num) is int else math.inf


def read_log(out_dir):
    """The records of out_dir/log.jsonl that train.py writes, one dict per logged iteration (a last
    line that is no JSON, cut short by a crash, is skipped); [] if there is none. UserError naming
    a line that is no record."""
    records, path = [], os.path.join(out_dir, 'log.jsonl')
    lines = _log_lines(path)
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            if number == len(lines) or not line.strip():
                continue
            records.append(None)
        if not isinstance(records[-1], dict) or type(records[-1].get('iter')) is not int:
            raise UserError(f"{path}, line {number}: not a record of train.py ({line.strip()[:60]!r}; "
                            "each line is a JSON object with its 'iter'): delete that line, or restore the "
                            "file")
    return records


def _strip_prefixes(key):
    for prefix in ('_orig_mod.', 'module.'):
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key


def load_weights(model, ckpt, path):
    """model.load_state_dict(ckpt['model']); UserError naming a tensor the checkpoint lacks (damaged, or of another
    version of model.py) or one it has that the model does not (another version), with the commit that wrote it."""
    ours, theirs = model.state_dict(), ckpt['model']
    missing, unexpected = [k for k in ours if k not in theirs], [k for k in theirs if k not in ours]
    who = f"use the version of model.py it was trained with ({trained_with(ckpt)})"
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ''
        raise UserError(f"{path} lacks the tensor {missing[0]}{more} of its model: it is damaged, or was written by a version of model.py without it; restore it "
                        f"from a copy, or {who}")
    if unexpected:
        raise UserError(f"{path} has a tensor this model.py does not ({unexpected[0]}): {who}")
    try:
        model.load_state_dict(theirs)
    except RuntimeError as e:  # a shape that differs
        first = (str(e).strip().splitlines() or [''])[-1].strip()[:300]
        raise UserError(f"{path} does not fit this version of model.py ({first}); {who}") from None


def load_model(path, device='cpu'):
    """(model in eval mode on `device`, checkpoint) from an out_dir or a checkpoint file."""
    from relatives import RelativesConfig, build_model
    if os.path.isfile(path) and not path.endswith('.pt'):
        raise UserError(f"{path} is a file, not a run directory (nor a .pt checkpoint); point --out_dir at the "
                        f"directory holding {CKPT_NAME}")
    if os.path.isdir(path) or not path.endswith('.pt'):  # an out_dir
        if not os.path.exists(os.path.join(path, CKPT_NAME)):
            raise UserError(f"no checkpoint at {os.path.join(path, CKPT_NAME)}; train one first (python train.py "
                            f"--out_dir={path}) or point --out_dir at the directory holding {CKPT_NAME}")
        path = os.path.join(path, CKPT_NAME)
    ckpt = load_checkpoint(path)
    try:
        model = build_model(RelativesConfig(**ckpt['model_args']))
    except (TypeError, ValueError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [''])[0][:300]
        raise UserError(f"{path} does not fit this version of model.py ({first}); use the version of model.py "
                        "it was trained with") from None
    load_weights(model, ckpt, path)
    return model.eval().to(device), ckpt

