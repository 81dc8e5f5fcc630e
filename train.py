"""
Train a nanoLIMe model, nanoGPT-style.

$ python prepare.py && python train.py               # small LIMe on shakespeare_char, ~5 min on a laptop CPU
$ python train.py config/train_shakespeare_char.py --lime=False --out_dir=out-baseline
$ torchrun --standalone --nproc_per_node=8 train.py config/train_fineweb_edu_1b.py

Configuration: the globals below are the defaults; a config/*.py file overrides them
(it is exec'd; names starting with '_' are private helpers), then --key=value does.
Every value is checked against its default's type before any work is done; bad input
ends with one line 'error: ...' on stderr and a non-zero exit status (a traceback only
with --debug=True or NANOLIME_DEBUG=1).

Batch: batch_size sequences of block_size tokens per micro-step and per rank;
gradient_accumulation_steps is PER RANK, so the global batch is
batch_size * gradient_accumulation_steps * world_size sequences per iteration.

Iterations are numbered 1..max_iters; iteration 0 is the initial model (evaluated only).
A checkpoint's iter_num is the last finished iteration and init_from='resume' continues at
iter_num + 1, with the optimizer and the data-sampling RNG restored, so N iterations in one
run and N/2 + a resumed N/2 give the same losses and bit-identical weights.

Fault injection for the tests (documented in README "When things go wrong"): the environment
variable NANOLIME_FAULT=nan@N makes the loss of iteration N NaN; NANOLIME_FAULT=kill_in_save@K
kills the process (SIGKILL) half-way through writing its K-th checkpoint.
"""
import os
import sys
import ast
import builtins
import json
import math
import time
import pickle
import signal
import difflib
import dataclasses
from contextlib import nullcontext

import numpy as np  # torch is imported where needed, so that config errors are reported at once

# -----------------------------------------------------------------------------
# default config values: a small LIMe model (4 x 128, 0.86M parameters) on shakespeare_char that
# trains in ~5 min on a 2-core CPU to val loss ~1.55; config/train_shakespeare_char.py has the same
# values and the measurements behind them
# I/O
out_dir = 'out-shakespeare-char'
eval_interval = 500        # evaluate train/val loss (and checkpoint) every this many iterations, and at the end
log_interval = 50          # print and append to out_dir/log.jsonl every this many iterations
eval_iters = 20            # batches per split and evaluation (shared out between DDP ranks)
eval_only = False          # evaluate the initial (or resumed) model and exit
always_save_checkpoint = True  # False: checkpoint only when val loss improves
init_from = 'scratch'      # 'scratch' or 'resume' (from out_dir/ckpt.pt)
# wandb logging (needs `pip install wandb`)
wandb_log = False
wandb_project = 'nanolime'
wandb_run_name = 'run'
# data: <data_dir>/<dataset>/{train,val}.bin + meta.pkl, written by prepare.py
dataset = 'shakespeare_char'
data_dir = ''              # '' = prepare.py's default (data/ next to this file)
batch_size = 16            # sequences per micro-step, per rank
block_size = 128
gradient_accumulation_steps = 1  # PER RANK; global batch = batch_size * this * world_size
# model
n_layer = 4
n_head = 4
n_kv_head = None           # None: n_head (MHA); fewer heads: GQA
n_embd = 128
mlp_hidden = None          # None: the Llama rule (8/3 * n_embd, rounded up to 64)
dropout = 0.0
lime = True                # the paper's method; False: the Llama baseline
router = 'full'            # full, average, dynamic, last-<j>, first-<j>
hc = 0                     # Hyper-Connections expansion rate (0: off; the paper uses 4)
hc_dynamic = False
# AdamW
learning_rate = 2e-3       # peak lr
router_lr = 1e-2           # peak lr of the LIMe routers (paper: 10x the model's)
max_iters = 2500
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0            # clip gradients at this norm; 0.0 = off
# learning rate schedule: linear warm-up, then cosine down to min_lr at lr_decay_iters
decay_lr = True
warmup_iters = 100
lr_decay_iters = 2500      # usually = max_iters
min_lr = 2e-4
# system
device = 'auto'            # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'             # 'auto' (CUDA: bfloat16 if supported, else float16; float32 elsewhere), 'float32', ...
compile = 'auto'           # 'auto' (on CUDA only), True or False
seed = 1337
peak_flops = 0.0           # per-device peak FLOP/s for MFU; 0.0: model.GPU_PEAK_FLOPS by GPU name, no MFU on CPU
debug = False              # show tracebacks for errors
# -----------------------------------------------------------------------------

NULLABLE = {'n_kv_head', 'mlp_hidden'}  # None or int
TRISTATE = {'compile'}                  # 'auto' or a bool
CKPT_NAME = 'ckpt.pt'
CKPT_MARKER = 'nanolime'                # key present in every checkpoint we write (value: format version)


class UserError(Exception):
    """A problem with the input (config, data, checkpoint): reported as one 'error:' line."""


# ----------------------------------------------------------------------------- config parsing
def config_defaults(namespace):
    """The config keys of a module namespace: plain values, not modules, functions or private names."""
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and (v is None or isinstance(v, (bool, int, float, str)))
            and k not in ('NULLABLE', 'TRISTATE', 'CKPT_NAME', 'CKPT_MARKER')}


def _type_name(t):
    return {bool: 'bool', int: 'int', float: 'float', str: 'str', type(None): 'None'}.get(t, t.__name__)


def check_value(key, value, default, nullable=(), tristate=()):
    """value, coerced where allowed (int -> float), if its type matches the default's; else UserError."""
    if key in tristate:
        if isinstance(value, bool) or value == 'auto':
            return value
        raise UserError(f"{key}={value!r}: expected 'auto', True or False")
    if key in nullable:
        if value is None or type(value) is int:
            return value
        raise UserError(f"{key}={value!r}: expected int or None, got {_type_name(type(value))}")
    expected = type(default)
    if expected is float and type(value) is int:
        return float(value)
    if type(value) is not expected:
        raise UserError(f"{key}={value!r}: expected {_type_name(expected)}, got {_type_name(type(value))}")
    return value


def _literal(raw, default):
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw  # a bare word: a string
    if isinstance(default, str) and not isinstance(value, (str, bool)):
        return raw  # --out_dir=2024 is the string '2024'
    return value


def parse_config(defaults, argv, nullable=NULLABLE, tristate=TRISTATE):
    """nanoGPT-style configuration: `defaults` overridden by config files, then --key=value, in order.

    Returns a new dict. Raises UserError for an unknown key (naming the closest known one),
    a value whose type does not match the default's, a missing or broken config file.
    """
    config = dict(defaults)

    def set_key(key, value, where):
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise UserError(f"unknown config key '{key}' ({where}){hint}")
        try:
            config[key] = check_value(key, value, defaults[key], nullable, tristate)
        except UserError as e:
            raise UserError(f"{e} ({where})") from None

    for arg in argv:
        if arg.startswith('--'):
            key, eq, raw = arg[2:].partition('=')
            if not eq:
                raise UserError(f"expected --key=value, got '{arg}'")
            set_key(key, _literal(raw, defaults.get(key)), arg)
        else:
            if not os.path.isfile(arg):
                hint = " (options are written --key=value)" if not arg.endswith('.py') else ""
                raise UserError(f"no such config file: {arg}{hint}")
            with open(arg) as f:
                source = f.read()
            namespace = dict(config)
            namespace['__file__'] = arg
            try:
                exec(builtins.compile(source, arg, 'exec'), namespace)
            except Exception as e:  # the config file is user input: report it on one line
                line = getattr(e, 'lineno', None)
                if line is None:
                    tb = e.__traceback__
                    while tb is not None:
                        if tb.tb_frame.f_code.co_filename == arg:
                            line = tb.tb_lineno
                        tb = tb.tb_next
                raise UserError(f"{arg}{f', line {line}' if line else ''}: {type(e).__name__}: {e}") from None
            for key, value in namespace.items():
                if key.startswith('_') or callable(value) or type(value).__name__ == 'module':
                    continue
                if key in config and value is config[key]:
                    continue
                set_key(key, value, arg)
    return config


def debug_requested(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return (os.environ.get('NANOLIME_DEBUG', '') not in ('', '0')
            or any(a in ('--debug=True', '--debug=1', '--debug') for a in argv))


def run_main(main, argv=None):
    """Run main(argv); user errors and crashes become one 'error:' line on stderr and exit status 1."""
    argv = sys.argv[1:] if argv is None else argv
    debug = debug_requested(argv)
    rank = int(os.environ.get('RANK', 0))
    try:
        code = main(argv)
    except KeyboardInterrupt:
        if debug:
            raise
        print("error: interrupted; nothing more was saved (the last checkpoint, if any, is intact)", file=sys.stderr)
        code = 130
    except UserError as e:
        if debug:
            raise
        if rank == 0 or getattr(e, 'all_ranks', False):
            print(f"error: {e}", file=sys.stderr)
        code = 1
    except Exception as e:
        if debug:
            raise
        torch = sys.modules.get('torch')
        if torch is not None and isinstance(e, torch.OutOfMemoryError):
            msg = "out of memory: lower batch_size (raising gradient_accumulation_steps) or block_size"
        else:
            first = (str(e).strip().splitlines() or [''])[0][:500]
            msg = f"{type(e).__name__}: {first} (rerun with --debug=True for the traceback)"
        print(f"error: {f'[rank {rank}] ' if rank else ''}{msg}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.exit(code or 0)


# ----------------------------------------------------------------------------- checkpoints
def atomic_save(obj, path, fault=None):
    """torch.save to a temp file in the same directory, flush, fsync, then os.replace: a crash
    at any point leaves either the old or the new file at `path`, never a partial one."""
    import torch
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        torch.save(obj, f)
        f.flush()
        if fault:  # NANOLIME_FAULT=kill_in_save@K: leave half a temp file and die like `kill -9`
            f.truncate(f.tell() // 2)
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def load_checkpoint(path, what="checkpoint"):
    """Load one of our checkpoints on the CPU (memory-mapped); UserError if it is missing, not ours or damaged."""
    import torch
    if not os.path.exists(path):
        raise UserError(f"no {what} at {path}")
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a checkpoint file")
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except Exception as e:
        first = (str(e).strip().splitlines() or [''])[0][:200]
        raise UserError(f"{path} is truncated or not a checkpoint ({type(e).__name__}: {first})") from None
    if not isinstance(ckpt, dict) or CKPT_MARKER not in ckpt:
        raise UserError(f"{path} is not a nanoLIMe checkpoint (no '{CKPT_MARKER}' marker; "
                        "it was written by another program)")
    missing = [k for k in ('model', 'model_args', 'iter_num', 'config') if k not in ckpt]
    if missing:
        raise UserError(f"{path} is damaged: missing {', '.join(missing)}")
    return ckpt


def clean_state_dict(state_dict):
    """Strip the prefixes torch.compile ('_orig_mod.') and DDP ('module.') add."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ('_orig_mod.', 'module.'):
            while k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


# ----------------------------------------------------------------------------- helpers
def resolve_device(device):
    import torch
    if device == 'auto':
        if torch.cuda.is_available():
            return 'cuda'
        if getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available():
            return 'mps'
        return 'cpu'
    kind = device.split(':')[0]
    if kind not in ('cpu', 'cuda', 'mps'):
        raise UserError(f"device={device!r}: expected 'auto', 'cpu', 'cuda', 'cuda:<n>' or 'mps'")
    if kind == 'cuda' and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but CUDA is not available here; use --device=cpu or --device=auto")
    if kind == 'cuda' and ':' in device:
        idx = device.split(':', 1)[1]
        if not idx.isdigit() or int(idx) >= torch.cuda.device_count():
            raise UserError(f"device={device!r}: there are {torch.cuda.device_count()} CUDA devices")
    if kind == 'mps' and not (getattr(torch.backends, 'mps', None) and torch.backends.mps.is_available()):
        raise UserError(f"device={device!r} but MPS is not available here; use --device=cpu")
    return device


def resolve_dtype(dtype, device_type):
    import torch
    if dtype == 'auto':
        if device_type == 'cuda':
            return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
        return 'float32'
    if dtype not in ('float32', 'bfloat16', 'float16'):
        raise UserError(f"dtype={dtype!r}: expected 'auto', 'float32', 'bfloat16' or 'float16'")
    if dtype == 'float16' and device_type != 'cuda':
        raise UserError("dtype='float16' needs CUDA (it trains with a GradScaler); use 'bfloat16' or 'float32'")
    return dtype


def parse_faults(spec):
    """NANOLIME_FAULT='nan@5' or 'kill_in_save@2' (comma-separated): {kind: n}."""
    faults = {}
    for item in filter(None, (s.strip() for s in spec.split(','))):
        kind, _, n = item.partition('@')
        if kind not in ('nan', 'kill_in_save') or not n.isdigit():
            raise UserError(f"NANOLIME_FAULT={spec!r}: expected nan@<iter> or kill_in_save@<k>")
        faults[kind] = int(n)
    return faults


def data_info(dataset, data_dir):
    """(directory, meta, {split: tokens}) of a prepared dataset; UserError with the command to prepare it."""
    import prepare
    ddir = prepare.dataset_dir(dataset, data_dir or None)
    if dataset not in prepare.DATASETS and not os.path.isdir(ddir):
        close = difflib.get_close_matches(dataset, prepare.DATASETS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(f"unknown dataset '{dataset}'; {hint}known: {', '.join(prepare.DATASETS)}")
    missing = [f for f in ('train.bin', 'val.bin', 'meta.pkl') if not os.path.isfile(os.path.join(ddir, f))]
    if missing:
        cmd = f"python prepare.py {dataset}" + (f" --data_dir={data_dir}" if data_dir else "")
        raise UserError(f"dataset '{dataset}' is not prepared ({os.path.join(ddir, missing[0])} is missing); "
                        f"run: {cmd}")
    try:
        with open(os.path.join(ddir, 'meta.pkl'), 'rb') as f:
            meta = pickle.load(f)
        vocab_size = int(meta['vocab_size'])
    except Exception as e:
        raise UserError(f"{os.path.join(ddir, 'meta.pkl')} is unreadable ({type(e).__name__}: {e}); "
                        f"prepare again: python prepare.py {dataset} --force") from None
    sizes = {s: os.path.getsize(os.path.join(ddir, f'{s}.bin')) // 2 for s in ('train', 'val')}
    return ddir, meta, sizes


def cosine_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr, decay_lr=True):
    """lr of iteration it (1-based): linear warm-up to learning_rate at warmup_iters, cosine down to
    min_lr at lr_decay_iters, then min_lr."""
    if not decay_lr:
        return learning_rate
    if it <= warmup_iters:
        return learning_rate * it / warmup_iters
    if it >= lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def weights_checksum(model):
    """An exact integer fingerprint of all parameters (bit patterns), cheap on any device."""
    import torch
    total = 0
    for i, p in enumerate(model.parameters()):
        bits = p.detach().contiguous().view(-1)
        if bits.element_size() == 4:
            ints = bits.view(torch.int32).long()
        elif bits.element_size() == 2:
            ints = bits.view(torch.int16).long()
        else:
            ints = bits.view(torch.int64)
        pos = torch.arange(1, ints.numel() + 1, device=ints.device) % 1000003
        total = (total + (i + 1) * int(((ints % 1000003) * pos % 1000003).sum().item())) % (2 ** 61 - 1)
    return total


# ----------------------------------------------------------------------------- training
def main(argv):
    cfg = parse_config(config_defaults(globals()), argv)
    C = type('Config', (), cfg)  # attribute access: C.batch_size

    # ---- validation: everything that can be checked before any work
    for key in ('batch_size', 'gradient_accumulation_steps', 'eval_interval', 'log_interval', 'eval_iters'):
        if cfg[key] < 1:
            raise UserError(f"{key}={cfg[key]} must be >= 1")
    for key in ('max_iters', 'warmup_iters', 'lr_decay_iters'):
        if cfg[key] < 0:
            raise UserError(f"{key}={cfg[key]} must be >= 0")
    if C.init_from not in ('scratch', 'resume'):
        raise UserError(f"init_from={C.init_from!r}: expected 'scratch' or 'resume'")
    if not 0.0 <= C.dropout < 1.0:
        raise UserError(f"dropout={C.dropout} must be in [0, 1)")
    if C.learning_rate <= 0 or C.router_lr < 0 or C.min_lr < 0 or C.weight_decay < 0 or C.grad_clip < 0:
        raise UserError("learning_rate must be > 0; router_lr, min_lr, weight_decay, grad_clip >= 0")
    if C.decay_lr and C.lr_decay_iters <= C.warmup_iters:
        raise UserError(f"lr_decay_iters={C.lr_decay_iters} must be > warmup_iters={C.warmup_iters} "
                        "(or set decay_lr=False)")
    if C.wandb_log:
        import importlib.util
        if importlib.util.find_spec('wandb') is None:
            raise UserError("wandb_log=True but wandb is not installed: pip install wandb (or --wandb_log=False)")
    faults = parse_faults(os.environ.get('NANOLIME_FAULT', ''))

    ddir, meta, sizes = data_info(C.dataset, C.data_dir)
    for split, n in sizes.items():
        if n <= C.block_size:
            raise UserError(f"block_size={C.block_size} is too large for dataset '{C.dataset}': its {split} split "
                            f"has only {n} tokens (needs more than block_size)")

    import torch
    from model import GPT, GPTConfig, GPU_PEAK_FLOPS
    model_keys = ('block_size', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden', 'dropout',
                  'lime', 'router', 'hc', 'hc_dynamic')
    model_args = {k: cfg[k] for k in model_keys}
    try:  # shapes and the router variant
        gptconf = GPTConfig(vocab_size=int(meta['vocab_size']), **model_args)
    except ValueError as e:
        raise UserError(f"invalid model config: {e}") from None

    ckpt_path = os.path.join(C.out_dir, CKPT_NAME)
    ckpt = None
    if C.init_from == 'resume':
        ckpt = load_checkpoint(ckpt_path, "checkpoint to resume from (init_from='resume')")
        ours, theirs = dataclasses.asdict(gptconf), ckpt['model_args']
        diff = [k for k in sorted(set(ours) | set(theirs)) if k != 'dropout' and ours.get(k) != theirs.get(k)]
        if diff:
            what = ', '.join(f"{k}: {theirs.get(k)!r} in the checkpoint, {ours.get(k)!r} now" for k in diff)
            raise UserError(f"cannot resume from {ckpt_path}: the model differs ({what}); "
                            "use the checkpoint's settings or another out_dir")

    # ---- devices, DDP
    ddp = int(os.environ.get('RANK', -1)) != -1
    device = resolve_device(C.device)
    device_type = device.split(':')[0]
    dtype = resolve_dtype(C.dtype, device_type)
    use_compile = (device_type == 'cuda') if C.compile == 'auto' else C.compile
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        rank, local_rank, world = int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
        if device_type == 'cuda':
            device = f'cuda:{local_rank}'
            torch.cuda.set_device(device)
        elif device_type == 'mps':
            raise UserError("DDP (torchrun) is not supported on MPS; use --device=cpu")
        dist.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    else:
        rank, local_rank, world = 0, 0, 1
    master = rank == 0
    tokens_per_iter = C.batch_size * C.block_size * C.gradient_accumulation_steps * world
    if master:
        os.makedirs(C.out_dir, exist_ok=True)
        print(f"global batch: {C.batch_size} seqs x {C.block_size} tokens x {C.gradient_accumulation_steps} "
              f"accumulation steps x {world} ranks = {tokens_per_iter:,} tokens/iter")
    if device_type == 'cuda':
        torch.cuda.set_device(device)  # so that 'cuda' (RNG state, autocast) means this device
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
    ctx = nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=ptdtype)

    # ---- model and optimizer
    torch.manual_seed(C.seed)
    with torch.device(device) if device_type == 'cuda' else nullcontext():
        raw_model = GPT(gptconf)
    raw_model.to(device)
    optimizer = raw_model.configure_optimizers(C.weight_decay, C.learning_rate, C.router_lr,
                                               (C.beta1, C.beta2), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
    iter_num, best_val_loss, tokens_seen, flops_seen = 0, float('inf'), 0, 0
    data_rng = np.random.default_rng([C.seed, rank])
    torch.manual_seed(C.seed + 1 + rank)  # dropout
    if ckpt is not None:
        raw_model.load_state_dict(clean_state_dict(ckpt['model']))
        if 'optimizer' in ckpt:
            optimizer.load_state_dict(ckpt['optimizer'])
        if ckpt.get('scaler') and scaler.is_enabled():
            scaler.load_state_dict(ckpt['scaler'])
        iter_num, best_val_loss = int(ckpt['iter_num']), float(ckpt.get('best_val_loss', float('inf')))
        tokens_seen, flops_seen = int(ckpt.get('tokens', 0)), int(ckpt.get('flops', 0))
        rng = ckpt.get('rng') or []
        if len(rng) == world:
            data_rng.bit_generator.state = rng[rank]['data']
            torch.set_rng_state(rng[rank]['torch'])
            if device_type == 'cuda' and rng[rank].get('cuda') is not None:
                torch.cuda.set_rng_state(rng[rank]['cuda'])
        else:
            data_rng = np.random.default_rng([C.seed, rank, iter_num])
            if master:
                print(f"note: the checkpoint was written by {len(rng)} ranks, this run has {world}: "
                      "the data order is not resumed exactly")
        if master:
            print(f"resuming from {ckpt_path} at iter {iter_num + 1} (best val loss {best_val_loss:.4f})")
        ckpt = None  # free the memory-mapped file
    n_params = raw_model.get_num_params()
    flops_per_token = raw_model.flops_per_token(C.block_size)
    if master:
        print(f"model: {n_params / 1e6:.2f}M parameters, {'LIMe (router ' + C.router + ')' if C.lime else 'baseline'}, "
              f"{flops_per_token / 1e6:.2f} MFLOPs/token forward; device {device}, {dtype}, "
              f"compile {use_compile}")
    model = raw_model
    if use_compile:
        model = torch.compile(raw_model)
    eval_model = model
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)

    peak = C.peak_flops or None
    if peak is None and device_type == 'cuda':
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), None)

    # ---- data
    def batch_at(split, ix):
        data = np.memmap(os.path.join(ddir, f'{split}.bin'), dtype=np.uint16, mode='r')
        buf = torch.from_numpy(data[ix[:, None] + np.arange(C.block_size + 1)].astype(np.int64))
        x, y = buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
        if device_type == 'cuda':
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    def get_batch():
        return batch_at('train', data_rng.integers(0, sizes['train'] - C.block_size, size=C.batch_size))

    @torch.no_grad()
    def estimate_loss():
        """Mean loss over the same eval_iters batches per split at every evaluation (their own RNG, so
        evaluating never changes the training data order); DDP ranks share the batches out."""
        out = {}
        model.eval()
        for split in ('train', 'val'):
            ix = np.random.default_rng([C.seed, 999, split == 'val']).integers(
                0, sizes[split] - C.block_size, size=(C.eval_iters, C.batch_size))
            acc = torch.zeros(2, device=device)
            for k in range(rank, C.eval_iters, world):
                x, y = batch_at(split, ix[k])
                with ctx:
                    _, loss = eval_model(x, y)
                acc += torch.stack([loss.float(), torch.ones((), device=device)])
            if ddp:
                dist.all_reduce(acc)
            out[split] = (acc[0] / acc[1]).item()
        model.train()
        return out

    # ---- checkpoints and logs
    log_path = os.path.join(C.out_dir, 'log.jsonl')
    if master:
        kept = []
        if C.init_from == 'resume' and os.path.exists(log_path):  # drop lines after the checkpoint
            with open(log_path) as f:
                for line in f:
                    try:
                        if json.loads(line).get('iter', 0) <= iter_num:
                            kept.append(line if line.endswith('\n') else line + '\n')
                    except json.JSONDecodeError:
                        pass
        with open(log_path, 'w') as f:
            f.writelines(kept)
    wandb = None
    if C.wandb_log and master:
        import wandb
        wandb.init(project=C.wandb_project, name=C.wandb_run_name, config=cfg)

    def log(record):
        if not master:
            return
        with open(log_path, 'a') as f:
            f.write(json.dumps(record) + '\n')
        if wandb is not None:
            wandb.log(record, step=record['iter'])

    saves = [0]
    last_saved = [None]

    def save_checkpoint():
        """Collective (all ranks gather their RNG states); rank 0 writes. Refuses non-finite weights."""
        state = {'data': data_rng.bit_generator.state, 'torch': torch.get_rng_state(),
                 'cuda': torch.cuda.get_rng_state(device) if device_type == 'cuda' else None}
        states = [state]
        if ddp:
            states = [None] * world
            dist.all_gather_object(states, state)
        last_saved[0] = iter_num  # on every rank: they all take part in the next save decision
        if not master:
            return
        finite = torch.stack([p.detach().isfinite().all() for p in raw_model.parameters()]).all().item()
        if not finite:
            raise NonFinite(f"the weights are not finite at iter {iter_num}")
        saves[0] += 1
        atomic_save({
            CKPT_MARKER: 1,
            'model': raw_model.state_dict(),
            'optimizer': optimizer.state_dict(),
            'scaler': scaler.state_dict() if scaler.is_enabled() else None,
            'model_args': dataclasses.asdict(gptconf),
            'iter_num': iter_num,
            'best_val_loss': best_val_loss,
            'config': cfg,
            'meta': meta,
            'rng': states,
            'tokens': tokens_seen,
            'flops': flops_seen,
            'world_size': world,
        }, ckpt_path, fault=faults.get('kill_in_save') == saves[0])
        print(f"saved checkpoint to {ckpt_path} (iter {iter_num})")

    class NonFinite(Exception):
        pass

    def evaluate_and_checkpoint(save=True):
        nonlocal best_val_loss
        losses = estimate_loss()
        if master:
            print(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        improved = losses['val'] < best_val_loss
        best_val_loss = min(best_val_loss, losses['val'])
        if save and iter_num > 0 and (improved or C.always_save_checkpoint):
            save_checkpoint()
        return losses

    # ---- Ctrl-C / SIGTERM: finish the iteration, save, exit; a second one aborts at once
    stop = {'signal': None}

    def on_signal(signum, frame):
        if stop['signal'] is not None:
            # A second Ctrl-C aborts. Not a SIGTERM, nor a SIGINT within a second of the first: under
            # torchrun a worker gets the terminal's SIGINT and torchrun's relayed copy (or a SIGTERM).
            if signum == signal.SIGINT and time.time() - stop['time'] > 1.0:
                signal.signal(signum, signal.SIG_DFL)
                raise KeyboardInterrupt
            return
        stop['signal'], stop['time'] = signum, time.time()
        if master:
            print(f"\n{signal.Signals(signum).name} received: finishing this iteration, saving a checkpoint, then "
                  "exiting (Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    # ---- the loop
    t_start = time.time()
    try:
        if C.init_from == 'scratch' or C.eval_only:
            losses = evaluate_and_checkpoint(save=False)
            log({'iter': iter_num, 'tokens': tokens_seen, 'flops': flops_seen,
                 'train_loss_eval': losses['train'], 'val_loss': losses['val']})
            if C.eval_only:
                return 0
        if iter_num >= C.max_iters and master:
            print(f"nothing to do: iter {iter_num} >= max_iters={C.max_iters} (raise --max_iters to train on)")
        while iter_num < C.max_iters:
            it = iter_num + 1
            lr = cosine_lr(it, C.learning_rate, C.warmup_iters, C.lr_decay_iters, C.min_lr, C.decay_lr)
            for g in optimizer.param_groups:
                g['lr'] = g['peak_lr'] * lr / C.learning_rate
            t0 = time.time()
            loss_sum = torch.zeros((), device=device)
            x, y = get_batch()
            for micro_step in range(C.gradient_accumulation_steps):
                if ddp:  # gradients are all-reduced on the last micro-step only
                    model.require_backward_grad_sync = micro_step == C.gradient_accumulation_steps - 1
                with ctx:
                    _, loss = model(x, y)
                    if faults.get('nan') == it:
                        loss = loss * float('nan')
                    loss = loss / C.gradient_accumulation_steps
                loss_sum += loss.detach().float()
                if micro_step < C.gradient_accumulation_steps - 1:
                    x, y = get_batch()  # while the backward runs on the GPU
                scaler.scale(loss).backward()
            if C.grad_clip > 0.0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), C.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            # one sync per iteration: the loss (mean over ranks) and whether any rank was signalled
            stats = torch.stack([loss_sum, torch.tensor(float(stop['signal'] is not None), device=device)])
            if ddp:
                dist.all_reduce(stats)
            lossf, stop_now = stats[0].item() / world, stats[1].item() > 0
            dt = time.time() - t0
            iter_num = it
            tokens_seen += tokens_per_iter
            flops_seen += 3 * flops_per_token * tokens_per_iter
            if not math.isfinite(lossf):
                raise NonFinite(f"loss is {lossf} at iter {iter_num}")
            record = None
            if iter_num % C.log_interval == 0 or iter_num in (1, C.max_iters) or stop_now:
                mfu = 3 * flops_per_token * tokens_per_iter / dt / (peak * world) if peak else None
                record = {'iter': iter_num, 'tokens': tokens_seen, 'flops': flops_seen, 'loss': lossf, 'lr': lr,
                          'dt_ms': dt * 1000, 'tokens_per_s': tokens_per_iter / dt, 'mfu': mfu}
                if master:
                    print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                          f"{tokens_per_iter / dt:,.0f} tok/s, {flops_seen:.3e} FLOPs"
                          + (f", mfu {mfu * 100:.2f}%" if mfu is not None else ""), flush=True)
            if iter_num % C.eval_interval == 0 or iter_num == C.max_iters:
                losses = evaluate_and_checkpoint()
                record = record or {'iter': iter_num, 'tokens': tokens_seen, 'flops': flops_seen, 'loss': lossf,
                                    'lr': lr}
                record.update(train_loss_eval=losses['train'], val_loss=losses['val'])
            if record is not None:
                log(record)
            if stop_now:
                if last_saved[0] != iter_num:
                    save_checkpoint()
                if master:
                    print(f"interrupted at iter {iter_num}: checkpoint saved to {ckpt_path}; "
                          "continue with --init_from=resume", flush=True)
                return 130
        if master:
            print(f"done: {iter_num} iters in {time.time() - t_start:.1f} s, best val loss {best_val_loss:.4f}")
        if ddp:  # every rank must end with the same weights
            sums = [None] * world
            dist.all_gather_object(sums, weights_checksum(raw_model))
            if master:
                if len(set(sums)) != 1:
                    raise UserError(f"DDP ranks diverged: weight checksums {sums}")
                print(f"ddp: weights identical on all {world} ranks (checksum {sums[0]})")
        return 0
    except NonFinite as e:
        kept = (f"the last good checkpoint ({ckpt_path}, iter {last_saved[0]}) is kept" if last_saved[0] is not None
                else f"no checkpoint was written by this run" + (f"; {ckpt_path} is unchanged"
                                                                   if os.path.exists(ckpt_path) else ""))
        raise UserError(f"{e}: training stopped; {kept}. Try a lower learning_rate, "
                        "grad_clip, or dtype='float32'") from None
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if wandb is not None:
            wandb.finish()
        if ddp:  # free DDP (its reducer) before the process group: the other order can hang at exit with gloo
            model = eval_model = None
            import gc
            gc.collect()
            dist.destroy_process_group()


if __name__ == '__main__':
    run_main(main)
