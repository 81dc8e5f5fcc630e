"""What every nanoLIMe script shares: configuration (config files plus --key=value, --help) and the checks of
its ranges, one-line errors, stop signals, device and dtype, peak FLOP/s. A run's files are checkpoint.py's, the
datasets data.py's, the names of model variants variants.py's; this file imports none of them, nor any script.

    from nanolime.common import UserError, configure, resolve_device, ...
    out_dir = 'out'            # the script's config globals: its defaults
    config = configure(globals())
"""
import os
import sys
import ast
import builtins
import difflib
import math
import re
import signal
import textwrap
import time
from contextlib import contextmanager, nullcontext


def _interrupted_while_loading(etype, e, tb, hook=sys.excepthook):
    """Until configure() installs excepthook: Ctrl-C during the seconds the imports below take is one line, not
    the traceback of torch's import machinery (a script imports common before torch for this)."""
    if issubclass(etype, KeyboardInterrupt) and os.environ.get('NANOLIME_DEBUG', '') in ('', '0'):
        print("error: interrupted while starting; nothing was done", file=sys.stderr, flush=True)
    else:
        hook(etype, e, tb)


sys.excepthook = _interrupted_while_loading
import torch  # noqa: E402


# what to do when a script runs out of memory, by script (train.py's for the others)
OUT_OF_MEMORY_ADVICE = {
    'train.py': "lower batch_size (train.py then accumulates more micro-steps) or block_size; the last checkpoint, if "
                "any, is intact",
    'analyze.py': "lower num_tokens, context, max_per_word or batch_size, or analyze on another device "
                  "(--device=cpu); nothing was written for the run it was analyzing"}
_debug = False  # configure() sets it (--debug or NANOLIME_DEBUG=1): excepthook shows tracebacks instead


class UserError(Exception):
    """Bad input (config, data, checkpoint): reported as one line 'error: <msg>', exit status 1."""


def printable(text):
    """`text` with its control characters escaped (a terminal's escape sequences, a newline): text
    from a file (a checkpoint's, a log's) printed as it is could move the cursor, recolour or clear
    the terminal."""
    return ''.join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


# ----------------------------------------------------------------------------- configuration
def _type_name(t):
    return 'None' if t is type(None) else t.__name__


def check_value(key, value, default, nullable=()):
    """value, coerced where allowed (int -> float), if it is of the kind its default says; else UserError.
    Default None: an optional count (None or an int). 'auto': 'auto', a bool or a name, which the script checks
    (compile: a bool; device, dtype: a name). Any other: the default's type. `nullable`: options whose default
    is a count that also take None (sample.py's top_k: 200, or None for no limit)."""
    if default is None or key in nullable:
        if value is None or type(value) is int:
            return value
        raise UserError(f"{key}={value!r}: expected int or None, got {_type_name(type(value))}")
    if default == 'auto':
        if isinstance(value, (bool, str)):
            return value
        raise UserError(f"{key}={value!r}: expected 'auto', a bool or a string, got {_type_name(type(value))}")
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


def read_value(key, raw, default, nullable=()):
    """The value of --key=<raw> for an option whose default is `default`, as configure reads it (and so as train.py
    reads what sweep.py passes on): a Python literal, or a bare word as a string, then checked by check_value."""
    return check_value(key, _literal(raw, default), default, nullable)


def script_options(path):
    """The option names of a script of ours (train.py): the plain names its top level assigns before it calls
    configure (not _private or CAPITALS), read from its source without running it."""
    import ast
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, 'id', None) == 'configure':
            break
        if isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith('_')
                      and not t.id.isupper()]
    return names


def _exec_config_file(path, config):
    """The names a config file sets, run with the current config as its globals; UserError on any failure."""
    with open(path) as f:
        source = f.read()
    namespace = dict(config, __file__=path)
    try:
        exec(builtins.compile(source, path, 'exec'), namespace)
    except Exception as e:  # the config file is user input: report it on one line, with its line number
        line = getattr(e, 'lineno', None)
        tb = e.__traceback__
        while line is None and tb is not None:
            if tb.tb_frame.f_code.co_filename == path:
                line = tb.tb_lineno
            tb = tb.tb_next
        raise UserError(f"{path}{f', line {line}' if line else ''}: {type(e).__name__}: {e}") from None
    return {k: v for k, v in namespace.items() if not k.startswith('_') and not callable(v)
            and type(v).__name__ != 'module' and not (k in config and v is config[k])}


def configure(namespace, argv=None, nullable=(), positional=None, extra=None, given=None):
    """nanoGPT's configurator: the defaults are the plain values of `namespace` (a script's globals(), less
    _private and CAPITALS names); config files (path.py, exec'd), then --key=value override them in order, each
    checked by check_value (with `nullable`). Updates `namespace`, returns the config (checkpoints save it) and
    installs excepthook; -h or --help prints usage() and exits. `positional`: the key a bare word sets (prepare.py's
    dataset). `extra`: a dict that collects unknown keys instead of refusing them, each as the text of its
    --key=<text> (sweep.py passes them on to train.py, which checks them). `given`: a set that collects the keys
    a config file or --key=value set (whatever their value)."""
    global _debug
    argv = sys.argv[1:] if argv is None else argv
    _debug = os.environ.get('NANOLIME_DEBUG', '') not in ('', '0') or any(
        a in ('--debug', '--debug=True', '--debug=1') for a in argv)
    sys.excepthook = excepthook
    defaults = {k: v for k, v in namespace.items() if not k.startswith('_') and not k.isupper()
                and (v is None or isinstance(v, (bool, int, float, str)))}
    defaults.setdefault('debug', False)
    if '-h' in argv or '--help' in argv:
        print(usage(namespace, defaults, positional, extra is not None))
        sys.exit(0)
    config = dict(defaults)

    def set_key(key, value, where, raw=None):
        if key not in defaults and extra is not None:  # as typed, or the value written so that it reads back
            bare = isinstance(value, str) and _literal(value, None) == value
            extra[key] = raw if raw is not None else value if bare else repr(value)
        elif key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise UserError(f"unknown config key '{key}' ({where}){hint}")
        else:
            try:
                config[key] = check_value(key, value, defaults[key], nullable)
                if given is not None:
                    given.add(key)
            except UserError as e:
                raise UserError(f"{e} ({where})") from None

    bare = None  # the bare word given for `positional`
    for arg in argv:
        if arg.startswith('--') and '=' not in arg and isinstance(defaults.get(arg[2:]), bool):
            set_key(arg[2:], True, arg)  # a bare --flag of a bool key: --debug, --force
        elif arg.startswith('--'):
            key, eq, raw = arg[2:].partition('=')
            if not eq:
                raise UserError(f"expected --key=value, got '{arg}'")
            set_key(key, _literal(raw, defaults.get(key)), arg, raw)
        elif positional and not arg.endswith('.py'):
            if bare is not None:
                raise UserError(f"one {positional} at a time: got '{bare}' and '{arg}'; run once for each")
            bare = arg
            set_key(positional, arg, arg)
        elif not os.path.isfile(arg):
            hint = " (options are written --key=value)" if not arg.endswith('.py') else ""
            raise UserError(f"no such config file: {arg}{hint}")
        else:
            for key, value in _exec_config_file(arg, config).items():
                set_key(key, value, arg)
    _debug = _debug or config['debug']
    namespace.update(config)
    return config


def check_ranges(config, at_least_1=(), at_least_0=(), finite=(), positive=(), fraction=(), choices=None):
    """UserError for the first option out of its range: at_least_1 / at_least_0 (ints), finite (>= 0 and not
    inf: 1e999 parses as inf), positive (finite and > 0), fraction (in [0, 1)), choices {key: allowed values}."""
    for low, keys in ((1, at_least_1), (0, at_least_0)):
        for key in keys:
            if config[key] < low:
                raise UserError(f"{key}={config[key]} must be >= {low}")
    for key, allowed in (choices or {}).items():
        if config[key] not in allowed:
            raise UserError(f"{key}={config[key]!r}: expected {', '.join(map(repr, allowed[:-1]))} or {allowed[-1]!r}")
    for key in (*finite, *positive):
        if not (math.isfinite(config[key]) and config[key] >= 0):
            raise UserError(f"{key}={config[key]} must be a finite number >= 0")
        if key in positive and config[key] == 0:
            raise UserError(f"{key}={config[key]} must be > 0")
    for key in fraction:
        if not 0.0 <= config[key] < 1.0:
            raise UserError(f"{key}={config[key]} must be in [0, 1)")


def script_command(path):
    """(how the user runs the script at `path`, its file as the help names it): `python -m study.analyze` and
    study/analyze.py for a module of a package of the repository (a folder with an __init__.py: study/,
    integrations/), run from the repository's root; `python train.py` and train.py for any other script."""
    folder, name = os.path.split(os.path.abspath(path))
    if os.path.isfile(os.path.join(folder, '__init__.py')):
        package = os.path.basename(folder)
        return f"python -m {package}.{os.path.splitext(name)[0]}", f"{package}/{name}"
    return f"python {name}", name


def usage(namespace, defaults, positional=None, passes_on=False):
    """--help: the script's docstring, then where its options are: its globals, config files, --key=value."""
    command, script = script_command(namespace.get('__file__') or sys.argv[0])
    word = f" [{positional.upper()}]" if positional else ""
    text = (f"The options are the globals at the top of {script}: their defaults, with a comment on each. A config "
            "file (Python, e.g. one in config/) sets any of them; then --key=value sets one (a bool also as a bare "
            "--key); later ones win. --debug shows tracebacks instead of one-line errors."
            + (f" A bare word sets {positional}." if positional else "")
            + (" Any other --key=value is a train.py option, passed on to every run (python train.py --help lists "
               "them)." if passes_on else ""))
    width = max(len(k) for k in defaults)
    return '\n'.join([(namespace.get('__doc__') or '').strip() + '\n',
                      f"usage: {command}{word} [CONFIG.py ...] [--key=value ...]", textwrap.fill(text, 100),
                      "options and their defaults:", *(f"  {k:<{width}} = {v!r}" for k, v in defaults.items())
                      ]).lstrip()


def excepthook(etype, e, tb):
    """Any uncaught exception: one line 'error: ...' on stderr, exit status 1 (130 for Ctrl-C); with
    --debug or NANOLIME_DEBUG=1 the traceback. Under torchrun, ranks other than 0 prefix '[rank N]'."""
    try:
        sys.stdout.flush()
    except OSError:  # a closed pipe: said below
        pass
    if _debug:
        sys.__excepthook__(etype, e, tb)
        return
    rank = os.environ.get('RANK', '')  # read as text: a bad RANK is reported by ddp_env, not here
    rank = int(rank) if rank.isdigit() else 0
    first = (str(e).strip().splitlines() or [''])[0][:500]
    ddp = torch.distributed.is_available() and torch.distributed.is_initialized()
    if issubclass(etype, KeyboardInterrupt):
        msg = "interrupted; nothing more was saved (the last checkpoint, if any, is intact)"
    elif issubclass(etype, UserError):
        msg = str(e)
    elif issubclass(etype, BrokenPipeError):  # `train.py | head -1`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing flushed into it
        msg = "stdout was closed by its reader (a pipe into head, say): stopped here; what was saved " \
            "is intact"
    elif _out_of_memory(e):
        advice = OUT_OF_MEMORY_ADVICE
        msg = f"out of memory: {advice.get(os.path.basename(sys.argv[0]), advice['train.py'])}"
    elif ddp and (issubclass(etype, torch.distributed.DistError) or re.search('gloo|nccl', first, re.I)):
        msg = ("lost the connection to another rank, which stopped (killed, or with an error it reports itself): "
               "stopping too; the last checkpoint, if any, is intact (rank 0 writes it whole): fix what stopped that "
               "rank, then continue with --init_from=resume")
    else:
        msg = f"{etype.__name__}: {first} (rerun with --debug for the traceback)"
    try:
        print(f"error: {f'[rank {rank}] ' if rank else ''}{printable(msg)}", file=sys.stderr,
              flush=True)
    except OSError:  # stderr closed too
        pass
    status = 130 if issubclass(etype, KeyboardInterrupt) else 1
    if ddp:
        # no teardown (nothing is left to save): once a peer is gone, gloo's threads can abort it (SIGABRT, 134)
        os._exit(status)
    sys.exit(status)


def _out_of_memory(e):
    """Whether exception `e` says that memory ran out: on a GPU, or on the CPU (torch's allocator,
    or Python's)."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or 'DefaultCPUAllocator' in str(e)


@contextmanager
def out_of_memory(doing):
    """Running out of memory within is a UserError that says what it was `doing` and what to do (in
    place of OUT_OF_MEMORY_ADVICE's, which is for the run's steps)."""
    try:
        yield
    except Exception as e:
        if not _out_of_memory(e):
            raise
        raise UserError(f"out of memory {doing}") from None


def catch_stop_signals(announce=True):
    """From now on the first Ctrl-C (SIGINT) or SIGTERM only asks to stop: its number goes into the list returned,
    and train.py finishes its iteration, saves a checkpoint and exits. A second Ctrl-C aborts at once. `announce`:
    print that it was received (rank 0 does)."""
    received = []  # [(signum, time)]

    def on_signal(signum, frame):
        if received:
            # abort on a SIGINT over a second after the first: under torchrun a worker gets the terminal's Ctrl-C
            # and torchrun's relayed copy (or a SIGTERM) together
            if signum == signal.SIGINT and time.time() - received[0][1] > 1.0:
                signal.signal(signum, signal.SIG_DFL)
                raise KeyboardInterrupt
            return
        received.append((signum, time.time()))
        if announce:
            print(f"\n{signal.Signals(signum).name} received: finishing this iteration, saving a checkpoint, then "
                  "exiting (Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return received


# ----------------------------------------------------------------------------- DDP: torchrun's environment
# the variables torchrun sets in each process it starts (a rank of a distributed job); sweep.py unsets them all
DDP_ENV = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE', 'ROLE_RANK',
           'ROLE_WORLD_SIZE', 'ROLE_NAME', 'MASTER_ADDR', 'MASTER_PORT')
DDP_RANKS = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')  # a process is a DDP rank when these are set, one only when none is


def ddp_env(env=None):
    """(rank, local_rank, world_size) of a DDP rank as torchrun starts it, or None for a process of its own (none of
    DDP_RANKS set, or set empty); read from `env` (os.environ). UserError naming the variable at fault: some of
    DDP_RANKS set and not all (a shell that exported WORLD_SIZE would count ranks that do not exist), one that is no
    integer, RANK not below WORLD_SIZE, MASTER_ADDR or MASTER_PORT (where the ranks meet) missing or no port."""
    env = os.environ if env is None else env
    given = [k for k in DDP_RANKS if env.get(k, '') != '']
    if not given:
        return None
    fix = f"start DDP with torchrun (it sets {', '.join(DDP_RANKS)}, MASTER_ADDR and MASTER_PORT)"
    if len(given) < len(DDP_RANKS):
        missing = [k for k in DDP_RANKS if k not in given]
        set_ = ', '.join(f'{k}={env[k]}' for k in given)
        raise UserError(f"the DDP environment is half set: {' and '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} missing ({set_} {'is' if len(given) == 1 else 'are'} "
                        f"set); {fix}, or unset {' and '.join(given)} for one process")
    for k in DDP_RANKS:
        if not env[k].isdigit():
            raise UserError(f"{k}={env[k]!r} in the environment is not an integer >= 0; {fix}, or unset "
                            f"{', '.join(DDP_RANKS)} for one process")
    rank, local_rank, world_size = (int(env[k]) for k in DDP_RANKS)
    if not rank < world_size:
        raise UserError(f"RANK={rank} in the environment must be below WORLD_SIZE={world_size} (ranks count from 0); "
                        f"{fix}")
    if env.get('MASTER_ADDR', '') == '':
        raise UserError(f"MASTER_ADDR is not set: the {world_size} DDP ranks meet at MASTER_ADDR:MASTER_PORT (the "
                        f"address of rank 0's machine); {fix} (--standalone on one machine, --master_addr on several)")
    port = env.get('MASTER_PORT', '')
    if not (port.isdigit() and 0 < int(port) < 65536):
        raise UserError(f"MASTER_PORT={port!r} in the environment is not a port (an integer from 1 to 65535): the "
                        f"DDP ranks meet at MASTER_ADDR:MASTER_PORT; {fix} (--master_port on several machines)")
    return rank, local_rank, world_size


def start_ddp(device, rank, world_size, run):
    """torch.distributed's process group of this rank on `device` (a resolved one: NCCL on CUDA,
    gloo on the CPU), said first: it waits until all world_size ranks have joined (a rank that was
    never started is waited for until torch's timeout, 10-30 minutes). Then, before any other
    collective, the ranks compare `run` (a dict of what defines the run: they must run the same one,
    or they would wait in collectives that do not match, or train apart): UserError on every rank
    naming the first key whose value differs, and each rank's."""
    if device == 'mps':
        raise UserError("DDP (torchrun) is not supported on MPS; use --device=cpu")
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    print(f"ddp: rank {rank} waits for all {world_size} ranks (WORLD_SIZE) to join at {where} "
          "(MASTER_ADDR:MASTER_PORT); torchrun starts them together", flush=True)
    try:
        torch.distributed.init_process_group('nccl' if device.startswith('cuda') else 'gloo')
    except torch.distributed.DistNetworkError as e:  # rank 0 listens at MASTER_PORT
        reason = "the port is in use by another program" if 'EADDRINUSE' in str(e) else \
            (str(e).strip().splitlines() or [''])[0][:200]
        raise UserError(f"the ranks cannot meet at MASTER_ADDR:MASTER_PORT={where} ({reason}); "
                        "choose another MASTER_PORT (torchrun --master_port=N), or end what holds it") \
            from None
    sys.excepthook = excepthook  # init_process_group wraps it, and the wrapper loses our one-line errors
    runs = [None] * world_size
    torch.distributed.all_gather_object(runs, run)
    keys = list(dict.fromkeys(k for r in runs for k in r))  # rank 0's in order, then others' own
    differ = [k for k in keys if len({repr(r.get(k, 'not set')) for r in runs}) > 1]
    if differ:
        ranks = {}
        for r, values in enumerate(runs):
            ranks.setdefault(repr(values.get(differ[0], 'not set')), []).append(str(r))
        said = '; '.join(f"{value} on rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}"
                         for value, rs in ranks.items())
        more = f" ({', '.join(differ[1:])} too)" if differ[1:] else ''
        raise UserError(f"the ranks were started for different runs: {differ[0]} is {said}{more}; "
                        "start every rank with the same options, data and checkpoint (torchrun passes "
                        "its command line to each)")


def wrap_ddp(model, device):
    """`model` in DistributedDataParallel on `device` (a resolved one), without the broadcast of its buffers at every
    forward: they (RoPE's tables) are the same on every rank."""
    import inspect
    from torch.nn.parallel import DistributedDataParallel as DDP
    # the option's name from torch 2.13 on; broadcast_buffers before, deprecated since
    no_sync = 'forward_sync_buffers' if 'forward_sync_buffers' in inspect.signature(DDP).parameters else \
        'broadcast_buffers'
    index = [torch.device(device).index] if device.startswith('cuda') else None
    return DDP(model, device_ids=index, **{no_sync: False})


# ----------------------------------------------------------------------------- device and dtype
def resolve_device(device):
    """'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' -> 'cpu', 'mps' or an indexed 'cuda:N' ('cuda' means this
    process's GPU: cuda:LOCAL_RANK under torchrun, else cuda:0); UserError when it is not available."""
    mps = torch.backends.mps.is_available()
    if device == 'auto':
        device = 'cuda' if torch.cuda.is_available() else 'mps' if mps else 'cpu'
    kind, _, index = str(device).partition(':')  # device=True (a bool: 'auto' takes them) is refused below
    if kind not in ('cpu', 'cuda', 'mps') or (index and kind != 'cuda'):
        raise UserError(f"device={device!r}: expected 'auto', 'cpu', 'cuda', 'cuda:<n>' or 'mps'")
    if kind == 'cuda' and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but CUDA is not available here; use --device=cpu or --device=auto")
    if kind == 'mps' and not mps:
        raise UserError(f"device={device!r} but MPS is not available here; use --device=cpu")
    if kind == 'cuda':
        index = index or os.environ.get('LOCAL_RANK', '0')
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            raise UserError(f"device={device!r}: there are {torch.cuda.device_count()} CUDA devices")
        return f'cuda:{int(index)}'
    return kind


def resolve_dtype(dtype, device):
    """'auto' (CUDA: bfloat16 if the GPU has it, else float16; float32 elsewhere), 'float32', 'bfloat16' or
    'float16' -> torch.dtype for `device` (a resolved device string)."""
    cuda = device.startswith('cuda')
    if dtype == 'auto':  # bf16 only where the GPU computes in it (Ampere on): T4 and V100 emulate it, slowly
        native = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
        dtype = 'bfloat16' if native else 'float16' if cuda else 'float32'
    if dtype not in ('float32', 'bfloat16', 'float16'):
        raise UserError(f"dtype={dtype!r}: expected 'auto', 'float32', 'bfloat16' or 'float16'")
    if dtype == 'float16' and not cuda:
        raise UserError("dtype='float16' needs CUDA (it trains with a GradScaler); use 'bfloat16' or 'float32'")
    return getattr(torch, dtype)


def autocast(device, dtype):
    """Mixed precision for the forward pass; nothing to do in float32."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device_type=device.split(':')[0], dtype=dtype)


# dense bf16 peak FLOP/s by device name, for MFU; more specific names first ('H100 PCIe' before 'H100')
PEAK_FLOPS = [('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', 989e12), ('H200', 989e12), ('A100', 312e12)]


def device_peak_flops(device_name):
    """The dense bf16 peak FLOP/s of a GPU from its name (torch.cuda.get_device_name), or None if unknown."""
    return next((flops for key, flops in PEAK_FLOPS if key in device_name), None)
