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


def test_plain_pytest_without_xdist():
    """Without pytest-xdist the suite runs in one process: no '-n' that pytest would not know."""
    p = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:xdist', '--collect-only', 'tests/test_conftest.py'],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize('plugin, given, dist, want', [
    (True, None, 'no', ('auto', 'worksteal')), (True, None, 'loadfile', ('auto', 'loadfile')),
    (True, 0, 'no', (0, 'no')), (True, 3, 'no', (3, 'no')), (False, None, 'no', (None, 'no'))])
def test_every_core_when_xdist_is_there(plugin, given, dist, want):
    """-n auto, work stealing, where the plugin is installed and no -n was given; a given -n or --dist is kept
    (xdist itself turns a given -n's 'no' into its default 'load')."""
    option = types.SimpleNamespace(numprocesses=given, dist=dist)
    config = types.SimpleNamespace(option=option, pluginmanager=types.SimpleNamespace(hasplugin=lambda name: plugin),
                                   getoption=lambda name, default=None: getattr(option, name, default))
    conftest.pytest_cmdline_main(config)
    assert (option.numprocesses, option.dist) == want


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
