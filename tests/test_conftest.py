"""The test setup itself: what every test relies on, checked on a CPU; and the layout of tests/ (one test file
per module, sharing helpers only through conftest.py)."""
import ast
import glob
import os
import subprocess
import sys
import types

import pytest
import torch

import conftest
from conftest import REPO


def test_full_float32_turns_tf32_off_and_back(full_float32):
    """The CUDA tests' fixture, on a CPU: TF32 off inside the test; set back after it is checked by conftest's
    nothing_leaks (a fixture built on monkeypatch errs at teardown from pytest 9.2 on)."""
    assert torch.backends.cuda.matmul.allow_tf32 is False


def test_the_cuda_tests_use_it():
    """test_cuda.py turns TF32 off through the fixture only (it skips on a CPU, so read it)."""
    with open(f'{REPO}/tests/test_cuda.py') as f:
        text = f.read()
    assert "pytest.mark.usefixtures('full_float32')" in text and 'allow_tf32' not in text


@pytest.mark.slow
def test_plain_pytest_without_xdist():
    """Without pytest-xdist the suite runs in one process: no '-n' that pytest would not know."""
    p = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:xdist', '--collect-only', 'tests/test_conftest.py'],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize('plugin, given, dist, worker, want', [
    (True, None, 'no', False, ('auto', 'worksteal')), (True, None, 'loadfile', False, ('auto', 'loadfile')),
    (True, 0, 'no', False, (0, 'no')), (True, 3, 'no', False, (3, 'no')), (False, None, 'no', False, (None, 'no')),
    (True, None, 'no', True, (None, 'no'))])
def test_every_core_when_xdist_is_there(plugin, given, dist, worker, want):
    """-n auto, work stealing, where the plugin is installed and no -n was given; a given -n or --dist is kept
    (xdist itself turns a given -n's 'no' into its default 'load'); an xdist worker is left as it is."""
    option = types.SimpleNamespace(numprocesses=given, dist=dist)
    config = types.SimpleNamespace(option=option, pluginmanager=types.SimpleNamespace(hasplugin=lambda name: plugin),
                                   getoption=lambda name, default=None: getattr(option, name, default))
    if worker:
        config.workerinput = {'workerid': 'gw0'}
    conftest.pytest_cmdline_main(config)
    assert (option.numprocesses, option.dist) == want


@pytest.mark.slow
def test_a_plain_pytest_run_is_spread_over_every_core():
    """The hook above takes effect in a real run: xdist reads -n before collecting, so conftest's hook must run
    before xdist's (an xdist whose hook ran first quietly left the suite in one process)."""
    pytest.importorskip('xdist')
    probe = ("import os, sys, pytest\n"
             "class Probe:\n"
             "    @pytest.hookimpl(trylast=True)\n"
             "    def pytest_configure(self, config):\n"
             "        print('PROBE', config.option.numprocesses, config.option.dist, len(config.option.tx or []))\n"
             "sys.exit(pytest.main(['--collect-only', '-qq', '-p', 'no:cacheprovider', 'tests/test_conftest.py'],"
             " plugins=[Probe()]))\n")
    p = subprocess.run([sys.executable, '-c', probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    line = next((l for l in p.stdout.splitlines() if l.startswith('PROBE')), p.stdout + p.stderr)
    workers, dist, tx = line.split()[1:]  # workers: xdist's count of this machine's cores (an int by now)
    assert workers.isdigit() and int(workers) >= 1 and tx == workers and dist == 'worksteal', line


def test_the_installed_xdist_steals_work():
    """requirements.txt's pytest-xdist has --dist worksteal (3.2 and newer), which conftest asks for."""
    xdist = pytest.importorskip('xdist')
    import xdist.scheduler
    assert hasattr(xdist.scheduler, 'WorkStealingScheduling'), f"pytest-xdist {xdist.__version__}: no worksteal"


def test_no_test_file_imports_another():
    """What several test files share lives in conftest.py (`from conftest import build`), not in one of them: no
    test file imports another (`from test_model import build`, `import tests.test_model`)."""
    found = []
    for path in sorted(glob.glob(f'{REPO}/tests/*.py')):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
            found += [f'{os.path.basename(path)}:{node.lineno} imports {name}' for name in names
                      if any(part.startswith('test_') for part in name.split('.'))]
    assert found == [], 'move what they share into tests/conftest.py:\n' + '\n'.join(found)


def test_starts_python_tells_python_and_torchrun_from_other_programs():
    assert conftest.starts_python([sys.executable, 'train.py']) and conftest.starts_python(['python3', '-c', 'pass'])
    assert conftest.starts_python(['/usr/bin/torchrun', '--standalone']) and conftest.starts_python('python x.py')
    assert not conftest.starts_python(['git', 'rev-parse', 'HEAD']) and not conftest.starts_python('true')


@pytest.mark.slow  # it starts a Python: unmarked, the watch around every test would fail it
def test_the_processes_a_test_starts_are_seen():
    """What processes_started sees, as the fixture that fails an unmarked test sees it: a Python started through
    subprocess (run uses Popen), torch.compile; not other programs. Afterwards Popen and compile are torch's."""
    popen, compile_ = subprocess.Popen, torch.compile
    with conftest.processes_started() as started:
        subprocess.run(['true'], check=True)
        assert started == []
        subprocess.run([sys.executable, '-c', 'pass'], check=True)
        torch.compile(lambda x: x)
    assert started == [f'{sys.executable} -c pass', 'torch.compile']
    assert subprocess.Popen is popen and torch.compile is compile_
