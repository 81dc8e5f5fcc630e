"""Shared by the tests: the repo on sys.path, small prepared datasets, the scripts run as a user runs them (a
subprocess, DDP ranks) or, cheaper, in this process; the tiny models and plain references of the model tests;
the small runs of train.py that the tests of errors and faults start, copy and break. Test files share helpers
only through this file (`from conftest import build`), never by importing one another.

Two ways to run a script. What only a process shows (the one-line `error:` and exit status that
common.excepthook prints, --debug's traceback, a SIGKILL during a save, Ctrl-C, DDP ranks) runs as real
subprocesses (run, launch_ranks); faults are injected into those from outside by a `python -c` that patches torch
or the model, then runs train.py with runpy (patched). Everything else runs the scripts in this process (run_here,
script_here, run_script: the same code, without a fresh Python importing torch each time) and checks the
UserError each raises, which common.excepthook would print as that one line; faults are patched in from here
(a NaN loss, a full disk, another process holding a lock).
"""
import contextlib
import io
import json
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# one torch thread, as in the tests' subprocesses (OMP_NUM_THREADS=1): the tests' tiny shapes gain nothing
# from more, and on a busy machine a second thread makes every small op wait for a core
torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own (also tryfirst; this file registers later, so runs first)
def pytest_cmdline_main(config):
    """The tests on every core (pytest-xdist's -n auto) when the plugin is installed and no -n was given; one
    process without it, so that plain `python -m pytest` works either way (-n0: in this process). A worker that
    runs out of tests takes some queued for another (--dist worksteal, unless a --dist was given), so the
    suite's long tests do not wait in one worker's queue while another has nothing left. Not in a worker
    (it has workerinput): a worker would start workers of its own."""
    if hasattr(config, 'workerinput'):
        return
    if config.pluginmanager.hasplugin('xdist') and config.getoption('numprocesses', None) is None:
        config.option.numprocesses = 'auto'
        if config.getoption('dist', 'no') == 'no':
            config.option.dist = 'worksteal'


from nanolime import checkpoint  # noqa: E402
from nanolime import common  # noqa: E402
from nanolime import data  # noqa: E402
import model  # noqa: E402
import prepare  # noqa: E402
from model import GPT, GPTConfig, KVCache  # noqa: E402
from relatives import RelativesConfig, build_model  # noqa: E402


@pytest.fixture
def full_float32():
    """float32 matmuls in full float32 on CUDA (no TF32, which train.py turns on), set back after the test. Set
    and set back by hand, not with monkeypatch: torch answers allow_tf32 from its __getattr__, so monkeypatch's
    undo deletes the attribute, which raises from pytest 9.2 on and stops every later undo."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32 = before


# Muon is torch.optim.Muon, from torch 2.9 on: its tests skip on older releases, saying so
MUON = pytest.mark.skipif(not hasattr(torch.optim, 'Muon'), reason="optimizer='muon' needs torch.optim.Muon, "
                          f"in torch 2.9 and newer; this is torch {torch.__version__}")
OPTIMIZERS = ['adamw', pytest.param('muon', marks=MUON)]


def child_env(**extra):
    """A script's environment as a subprocess: one torch thread, unbuffered output, no debug or DDP variables."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    for k in ('NANOLIME_DEBUG', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE'):
        env.pop(k, None)
    return {**env, **{k: str(v) for k, v in extra.items()}}


def run(cmd, *args, env=None, timeout=600, **popen):
    """A script of the repository ('train.py'), a module of its packages run with -m ('study.analyze'), or a
    command (a list), run as a subprocess from the repository: its CompletedProcess, its output decoded as written
    (a text-mode pipe would turn '\r' into '\n')."""
    if isinstance(cmd, str):
        cmd = [sys.executable, cmd] if cmd.endswith('.py') else [sys.executable, '-m', cmd]
    p = subprocess.run([*cmd, *args], cwd=REPO, env=child_env(**(env or {})), timeout=timeout,
                       **(popen or {'capture_output': True}))
    p.stdout, p.stderr = (x.decode() if isinstance(x, bytes) else x for x in (p.stdout, p.stderr))
    return p


class Terminal(io.StringIO):
    """A stream that says it is a terminal: where tqdm draws its progress bars (disable=None)."""

    def isatty(self):
        return True


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr}"
    assert 'Traceback' not in (p.stderr or '')
    return p


def patched(patch):
    """The command of train.py with `patch` (Python source) run first in the same process."""
    code = f"{patch}\nimport runpy, sys\nsys.argv[0] = 'train.py'\nrunpy.run_path('train.py', run_name='__main__')\n"
    return [sys.executable, '-c', code]


def interrupted(args, sig, after):
    """train.py with `args` as a subprocess from the repository, sent `sig` once it prints a line starting with
    `after` (or after 120 s): (exit status, its whole stdout, stderr)."""
    import time
    proc = subprocess.Popen([sys.executable, 'train.py', *args], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen, deadline = [], time.time() + 120
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(after) or time.time() > deadline:
                break
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, ''.join(seen) + stdout, stderr


def launch_ranks(cmd, *args, world=2, timeout=300):
    """A command started as torchrun starts its ranks on one machine (RANK, WORLD_SIZE, MASTER_* in the
    environment; gloo on a CPU), without torchrun's own process: the CompletedProcess of each rank."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([*cmd, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=child_env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=world, LOCAL_WORLD_SIZE=world,
                                            MASTER_ADDR='127.0.0.1', MASTER_PORT=port))
             for r in range(world)]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
        return [subprocess.CompletedProcess(cmd, p.returncode, *out) for p, out in zip(procs, outputs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    """<tmp>/shakespeare_char: the first 200k characters of the corpus, prepared by prepare.py's writer."""
    root = tmp_path_factory.mktemp('data')
    prepare.prepare_char(prepare.read_shakespeare()[:200_000], str(root / 'shakespeare_char'))
    return str(root)


@pytest.fixture(scope='session')
def tiny_data_dir(tmp_path_factory):
    """A dataset with only 200 validation tokens."""
    root = tmp_path_factory.mktemp('tinydata')
    prepare.prepare_char(prepare.read_shakespeare()[:2000], str(root / 'shakespeare_char'))
    return str(root)


def script_here(script, *args, env=None, capture=True):
    """The script run in this process as `python <script> <args>` runs it from another directory (a module's
    file, study/analyze.py: as `python -m study.analyze <args>` with the repository on PYTHONPATH), without
    the seconds a fresh Python spends importing torch: (exit status, stdout, stderr), its output kept from
    the terminal unless capture=False. A UserError (what the user would see as one 'error:' line)
    propagates. For the messages and what a script does and writes; what only a process shows (the
    one-line printing by common.excepthook, signals, exit on SIGKILL) is tested with real processes."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (env or {}).items():
            mp.setenv(k, str(v))
        mp.chdir('/')
        mp.setattr(sys, 'argv', [script, *args])
        mp.setattr(sys, 'excepthook', sys.excepthook)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # train.py sets its own
        try:
            with contextlib.redirect_stdout(out) if capture else contextlib.nullcontext(), \
                    contextlib.redirect_stderr(err) if capture else contextlib.nullcontext():
                runpy.run_path(os.path.join(REPO, script), run_name='__main__')
            code = 0
        except SystemExit as e:
            code = e.code or 0
        finally:
            for s, handler in handlers.items():
                signal.signal(s, handler)
            for fd in checkpoint._locks.values():  # the directories the script locked: free, as at a process's end
                os.close(fd)
            checkpoint._locks.clear()
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def run_here():
    """run_here('prepare.py', *args) (or 'study/analyze.py', a module's file: `python -m study.analyze` in this
    process): script_here for a test, its output left to capsys: the exit status."""
    return lambda script, *args: script_here(script, *args, capture=False)[0]


# ----------------------------------------------------------------------------- the model tests' tiny models
# (tests/test_model.py, test_relatives.py, test_compile.py, test_cuda.py)
VARIANTS = ["full", "average", "dynamic", "last-2", "first-1", "first-2"]
V = 50


def tiny(**kw):
    args = dict(block_size=16, vocab_size=V, n_layer=4, n_head=4, n_kv_head=4, n_embd=32)
    args.update(kw)
    return RelativesConfig(**args)  # model.GPTConfig's fields and the relatives' (build_model picks the class)


def build(seed=0, **kw):
    torch.manual_seed(seed)
    model = build_model(tiny(**kw))
    for block in model.transformer.h:  # make dynamic routers non-trivial so they are tested
        router = block.attn.router
        if router is not None and router.dynamic is not None:
            torch.nn.init.normal_(router.dynamic.weight, std=0.1)
    return model


def plain_routed(self, router, x):
    """KVStack.routed through the plain eq. (2): the router's full matrix over the whole stacked KV."""
    R = router.matrix()
    if router.dynamic is not None:
        R = R + router.dynamic(x).view(*x.shape[:2], *R.shape)
    return model.route_reference(R, torch.cat(self.sources))


def scramble(model):
    """Move DenseFormer weights off their init, so tests see them act."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("dwa."):
                p.add_(torch.randn_like(p) * 0.3)
    return model


def loss_and_grads(model, x, y):
    model.zero_grad()
    logits, loss = model(x, y)
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# (layers, layers per group of the two-phase sum): the default rule; a depth that is not a multiple
# of the group; the degenerate groups of 1 layer (phase 1 does everything) and >= L (phase 2 does)
GROUPINGS = [(4, None), (7, 3), (5, 1), (4, 4), (3, 8)]


def step_logits(model, idx, n_new):
    """Greedy decoding step by step with the cache; returns tokens and each step's logits."""
    cache, logits_steps = KVCache(model.config), []
    logits, _ = model(idx, cache=cache)
    for _ in range(n_new):
        logits_steps.append(logits[:, -1])
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], 1)
        logits, _ = model(nxt, cache=cache)
    return idx, logits_steps


def saved_bytes(model, x):
    """Bytes of the distinct storages autograd saves for backward in one training forward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x)
    return sum(storages.values())


# ----------------------------------------------------------------------------- small runs, and what goes wrong
# train.py's options for the small runs of the tests of errors and faults: 2 layers, 4 x 32 tokens per step
TINY_RUN = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
            '--total_batch_size=128', '--eval_iters=2', '--warmup_iters=2', '--lr_decay_iters=50', '--log_interval=1']


def fails(p, *needles):
    """Exit status non-zero, exactly one stderr line, starting with 'error: ' and containing the needles."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode not in (0, None), p.stdout[-2000:]
    assert 'Traceback' not in p.stderr, p.stderr
    assert len(lines) == 1 and lines[0].startswith('error: '), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def ckpt_of(out_dir):
    """The checkpoint a run wrote, as the scripts load it."""
    return checkpoint.load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))


def error_of(run_here, script, *args):
    """The message of the UserError a script raises (in this process) for these arguments."""
    with pytest.raises(common.UserError) as e:
        run_here(script, *args)
    return str(e.value)


def run_script(script, *args):
    """`python <script> <args>` in this process; returns its exit status (a UserError propagates). Like a process
    that ends, it gives back what the run took: its out_dir locks, signal handlers and excepthook. Unlike
    script_here it starts with no out_dir locks of its own, so that a lock the test holds (held) is another
    process's to it, and it runs in the working directory, its output left to capsys."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sys, 'argv', [script, *args])
        m.setattr(sys, 'excepthook', sys.excepthook)
        m.setattr(checkpoint, '_locks', {})
        try:
            runpy.run_path(os.path.join(REPO, script), run_name='__main__')
        except SystemExit as e:
            return e.code
        finally:
            for fd in checkpoint._locks.values():
                os.close(fd)
            for s, h in handlers.items():
                signal.signal(s, h)
    return 0


def train(data_dir, out_dir, *args):
    """train.py with TINY_RUN's options in this process (run_script): its exit status."""
    return run_script('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out_dir}', *args)


def files(out_dir):
    """The bytes of a run's checkpoint and log: what must survive anything that goes wrong."""
    return {f: open(os.path.join(out_dir, f), 'rb').read() for f in ('ckpt.pt', 'log.jsonl')}


def log_iters(out_dir):
    """The iterations the records of a run's log.jsonl are of, in order."""
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line)['iter'] for line in f]


@pytest.fixture(scope='session')
def short_run(data_dir, tmp_path_factory):
    """A run of 4 iterations (checkpoints at 2 and 4), made once: tests read it, or change a copy (run_copy)."""
    out = str(tmp_path_factory.mktemp('trained') / 'out')
    assert train(data_dir, out, '--max_iters=4', '--eval_interval=2') == 0
    return out


@pytest.fixture
def run_copy(short_run, tmp_path):
    out = str(tmp_path / 'run')
    shutil.copytree(short_run, out)
    return out


@pytest.fixture
def held(monkeypatch):
    """lock_dir as another process would hold it (here: this one), released at the end of the test."""
    monkeypatch.setattr(checkpoint, '_locks', {})
    yield checkpoint.lock_dir
    for fd in checkpoint._locks.values():
        os.close(fd)


# ----------------------------------------------------------------------------- no test's patch outlives it
# What a test may change only while it runs (by monkeypatch, or by a script it runs in this process): the
# functions and classes of the namespaces the tests patch (not dunders: importing torch._dynamo wraps
# Module.__init__), and the process-wide settings the scripts read or set.
ENV = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'NANOLIME_DEBUG',
       'HF_ENDPOINT', 'HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')
SCRIPTS = ('nanolime.common', 'nanolime.checkpoint', 'nanolime.data', 'model', 'prepare', 'study.arithmetic', 'train',
           'sample', 'bench', 'sweep', 'study.analyze', 'integrations.eval')


def _settable(obj, name):
    return lambda v: setattr(obj, name, v)


def _env(k):
    return lambda v: os.environ.__setitem__(k, v) if v is not None else os.environ.pop(k, None)


def _module(name):
    return lambda v: sys.modules.__setitem__(name, v) if v is not None else sys.modules.pop(name, None)


def process_state():
    """{name: (value, how to set it back)} of everything a test must leave as it found it."""
    state = {}
    for name, space in [('torch.cuda', torch.cuda), ('torch.distributed', torch.distributed),
                        ('torch.nn.Module', torch.nn.Module), ('torch.nn.functional', torch.nn.functional),
                        ('os', os), ('common', common), ('checkpoint', checkpoint), ('data', data),
                        ('model', model), ('model.GPT', model.GPT),
                        ('model.Router', model.Router)]:
        state.update({f'{name}.{k}': (v, _settable(space, k)) for k, v in vars(space).items()
                      if callable(v) and not k.startswith('__')})
    matmul = torch.backends.cuda.matmul
    state.update({'torch.save': (torch.save, _settable(torch, 'save')),
                  'sys.excepthook': (sys.excepthook, _settable(sys, 'excepthook')),
                  'sys.argv': (list(sys.argv), _settable(sys, 'argv')),
                  'the working directory': (os.getcwd(), os.chdir),
                  'torch.backends.cuda.matmul': (matmul, _settable(torch.backends.cuda, 'matmul')),
                  'torch.backends.cuda.matmul.allow_tf32': (matmul.allow_tf32, _settable(matmul, 'allow_tf32')),
                  'torch.get_num_threads()': (torch.get_num_threads(), torch.set_num_threads)})
    state.update({f'the {signal.Signals(s).name} handler': (signal.getsignal(s), lambda v, s=s: signal.signal(s, v))
                  for s in (signal.SIGINT, signal.SIGTERM)})
    state.update({f'${k}': (os.environ.get(k), _env(k)) for k in ENV})
    state.update({f'sys.modules[{m!r}]': (sys.modules[m], _module(m)) for m in SCRIPTS if m in sys.modules})
    return state


def starts_python(args):
    """Whether a command (Popen's first argument) starts a Python or torchrun: what the slow marker is for."""
    first = args if isinstance(args, (str, bytes, os.PathLike)) else (list(args) or [''])[0]
    first = os.fsdecode(first).split()[0] if isinstance(args, (str, bytes)) else os.fsdecode(first)
    name = os.path.basename(first)
    return first == sys.executable or name.startswith('python') or name == 'torchrun'


@contextlib.contextmanager
def processes_started():
    """A list of the Python processes (the start of each command) and torch.compile calls begun in the block."""
    started = []

    class Watched(subprocess.Popen):
        def __init__(self, args, *a, **kw):
            if starts_python(args):
                command = [args] if isinstance(args, (str, bytes)) else args
                started.append(' '.join(map(os.fsdecode, command))[:120])
            super().__init__(args, *a, **kw)

    compile_ = torch.compile

    def compile(*a, **kw):
        started.append('torch.compile')
        return compile_(*a, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess, 'Popen', Watched)
        mp.setattr(torch, 'compile', compile)
        yield started


@pytest.fixture(autouse=True)
def slow_is_marked(request):
    """A test that starts a Python process (a script, DDP ranks, a sweep's runs) or calls torch.compile is
    marked slow, so that `python -m pytest -m "not slow"` is the quick loop it says: a test without the
    marker that does either errs, naming what it started."""
    if request.node.get_closest_marker('slow'):
        yield
        return
    with processes_started() as started:
        yield
    if started:
        more = f' and {len(started) - 1} more' if len(started) > 1 else ''
        pytest.fail(f"this test starts {started[0]!r}{more}: mark it @pytest.mark.slow (pytest.ini), so that "
                    "-m 'not slow' leaves it out")


@pytest.fixture(autouse=True)
def nothing_leaks():
    """After each test (after monkeypatch's undoing, which stops at its first step that fails), everything in
    process_state() is as before it; what is not is set back, so that no later test runs with it, and the test
    errs naming it."""
    before = process_state()
    yield
    after = process_state()
    gone = (object(), None)
    leaked = [k for k, (v, _) in before.items() if not (after.get(k, gone)[0] is v or after.get(k, gone)[0] == v)]
    for k in leaked:
        value, set_back = before[k]
        set_back(value)
    if leaked:
        pytest.fail(f"left changed by this test: {', '.join(leaked)}; patch with monkeypatch or set back in a "
                    "finally (an attribute that delattr cannot remove: patch the object that holds it)")
