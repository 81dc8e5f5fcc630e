"""Shared by the tests: the repo on sys.path, small prepared datasets, and the scripts run as a user runs
them (a subprocess, DDP ranks) or, cheaper, in this process."""
import contextlib
import io
import os
import runpy
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

import common  # noqa: E402
import prepare  # noqa: E402


def child_env(**extra):
    """A script's environment as a subprocess: one torch thread, unbuffered output, no debug or DDP variables."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    for k in ('NANOLIME_DEBUG', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE'):
        env.pop(k, None)
    return {**env, **{k: str(v) for k, v in extra.items()}}


def run(cmd, *args, env=None, timeout=600, **popen):
    """A script of the repository (or a command, as a list) run as a subprocess from the repository: its
    CompletedProcess, its output decoded as written (a text-mode pipe would turn '\r' into '\n')."""
    cmd = [sys.executable, cmd] if isinstance(cmd, str) else cmd
    p = subprocess.run([*cmd, *args], cwd=REPO, env=child_env(**(env or {})), timeout=timeout,
                       **(popen or {'capture_output': True}))
    p.stdout, p.stderr = (x.decode() if isinstance(x, bytes) else x for x in (p.stdout, p.stderr))
    return p


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr}"
    assert 'Traceback' not in (p.stderr or '')
    return p


def patched(patch):
    """The command of train.py with `patch` (Python source) run first in the same process."""
    code = f"{patch}\nimport runpy, sys\nsys.argv[0] = 'train.py'\nrunpy.run_path('train.py', run_name='__main__')\n"
    return [sys.executable, '-c', code]


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
    """The script run in this process as `python <script> <args>` runs it from another directory, without
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
            for fd in common._locks.values():  # the directories the script locked: free, as at a process's end
                os.close(fd)
            common._locks.clear()
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def run_here():
    """run_here('prepare.py', *args): script_here for a test, its output left to capsys: the exit status."""
    return lambda script, *args: script_here(script, *args, capture=False)[0]
