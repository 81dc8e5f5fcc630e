"""README's commands run in the order a reader meets them, in a fresh copy of the repository: each must work
after the ones before it, as it does for a newcomer who types them one after another (two examples training into
one out_dir, or a resume with nothing to resume, fail here though each works alone). Training is shortened
(SHORTER); the lines a CPU test cannot run (pip, a GPU, the network) are skipped, each named in SKIPPED with why."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, child_env

README = os.path.join(REPO, 'README.md')

# (what the command contains, why the test does not run it): every entry must match a command
SKIPPED = [
    ('pip install ', "installs packages: CI installs them before the tests"),
    ('python -m pytest', "the tests themselves"),
    ('torchrun ', "several processes on GPUs or machines (DDP on a CPU: tests/test_train.py)"),
    ('python -m integrations.eval', "lm-eval and its tasks from the Hugging Face hub (the network)"),
    ('prepare.py fineweb_edu', "downloads FineWeb-Edu from the Hugging Face hub (the network)"),
    ('config/train_gpu_check.py', "made for one CUDA GPU: on a CPU its 30M parameters in bf16 take minutes"),
    ('lime:<yours>', "the router the reader writes"),
]


def shorter_iters(value):
    """A training of `value` iterations (None: the 2,500 of the default run) shortened 500-fold, at least 1: the
    runs keep their order (a run stopped at 1,000 and resumed to 2,500: 2, then 5)."""
    return max(1, (2500 if value is None else int(value)) // 500)


# per script: {option: its value in the test, or a function of the value the command gives (None: not given)}
SHORTER = {
    'train.py': {'max_iters': shorter_iters, 'eval_iters': 2, 'device': 'cpu', 'compile': False},
    'sample.py': {'num_samples': 1, 'max_new_tokens': 20, 'device': 'cpu'},
    'sweep.py': {'depths': 2, 'seeds': 0, 'max_iters': 2, 'eval_iters': 1, 'plot': False},
    'bench.py': {'depths': 2, 'settings': 'mha-eager', 'warmup': 1, 'iters': 1},
}


def commands(text):
    """Each command of README's ```sh blocks, in order, as its words: lines split at '&&', comments dropped."""
    found, fence = [], None
    for line in text.splitlines():
        if line.lstrip().startswith('```'):
            fence = line.strip()[3:] if fence is None else None
            continue
        if fence == 'sh' and line.strip():
            found += [shlex.split(part, comments=True) for part in re.split(r'\s&&\s', line)]
    return [words for words in found if words]


def skipped(words):
    """Why README's command is not run here, or None."""
    line = ' '.join(words)
    return next((why for what, why in SKIPPED if what in line), None)


def script_of(words):
    """'train.py' for `python train.py ...`, 'integrations.export' for `python -m integrations.export ...`."""
    return words[2] if words[1] == '-m' else words[1]


def shortened(words):
    """The command as the test runs it: this Python, SHORTER's options in place of the command's or after them."""
    assert words[0] == 'python', f"README's command {' '.join(words)!r} is neither run here nor in SKIPPED"
    start = 3 if words[1] == '-m' else 2
    args, options = words[start:], SHORTER.get(script_of(words), {})
    given = {a[2:].split('=', 1)[0]: a.split('=', 1)[1] for a in args if a.startswith('--') and '=' in a}
    args = [a for a in args if not (a.startswith('--') and a[2:].split('=', 1)[0] in options)]
    args += [f'--{k}={v(given.get(k)) if callable(v) else v}' for k, v in options.items()]
    return [sys.executable, *words[1:start], *args]


def global_of(path, name):
    """The value a nanoGPT-style script or config file gives `name` (`name = 'value'` at the start of a line)."""
    with open(path) as f:
        m = re.search(rf"^{name} = '([^']*)'", f.read(), re.M)
    return m and m.group(1)


def out_dir_of(words):
    """Where a `python train.py ...` command of README trains: its --out_dir, else its config file's, else the
    default's."""
    out = global_of(os.path.join(REPO, 'train.py'), 'out_dir')
    for a in words[2:]:
        if a.endswith('.py') and not a.startswith('--'):
            out = global_of(os.path.join(REPO, a), 'out_dir') or out
        elif a.startswith('--out_dir='):
            out = a.split('=', 1)[1]
    return out


def readme_commands():
    with open(README, encoding='utf-8') as f:
        return commands(f.read())


def test_commands_are_read_in_order_and_split_and_shortened():
    text = ("x\n```sh\npip install -r r.txt && python prepare.py && python train.py   # trains\n```\n"
            "```\npython not-a-shell-block.py\n```\n```sh\npython train.py --max_iters=1000 --start=\"a b\"\n"
            "python -m integrations.export --out_dir=o --to=d\n```\n")
    found = commands(text)
    assert found == [['pip', 'install', '-r', 'r.txt'], ['python', 'prepare.py'], ['python', 'train.py'],
                     ['python', 'train.py', '--max_iters=1000', '--start=a b'],
                     ['python', '-m', 'integrations.export', '--out_dir=o', '--to=d']]
    assert skipped(found[0]) and not skipped(found[1])
    assert shortened(found[2]) == [sys.executable, 'train.py', '--max_iters=5', '--eval_iters=2', '--device=cpu',
                                   '--compile=False']
    assert shortened(found[3])[2:4] == ['--start=a b', '--max_iters=2']
    assert shortened(found[4]) == [sys.executable, '-m', 'integrations.export', '--out_dir=o', '--to=d']
    assert out_dir_of(['python', 'train.py', 'config/train_arithmetic.py']) == global_of(
        os.path.join(REPO, 'config/train_arithmetic.py'), 'out_dir')
    assert out_dir_of(['python', 'train.py', 'config/train_arithmetic.py', '--out_dir=x']) == 'x'


def test_every_skipped_line_is_in_readme():
    """An entry of SKIPPED that matches no command of README is stale: the command it was for is gone."""
    lines = [' '.join(words) for words in readme_commands()]
    stale = [what for what, _ in SKIPPED if not any(what in line for line in lines)]
    assert not stale, f"SKIPPED names commands README no longer has: {stale}"


def test_each_training_example_has_an_out_dir_of_its_own():
    """README's training commands, read without running them: one that trains from scratch names a folder no
    earlier one trained into (else it is refused: nothing trained is overwritten), and a resume continues a run
    an earlier command stopped short of its end. The run below checks the same by running them."""
    seen = {}
    for words in readme_commands():
        if skipped(words) or words[:2] != ['python', 'train.py']:
            continue
        out, line = out_dir_of(words), ' '.join(words)
        if '--init_from=resume' in words:
            assert out in seen, f"{line!r} resumes {out}/, which no earlier command trained"
            assert '--max_iters=' in seen[out], f"{line!r} resumes {out}/, which {seen[out]!r} trained to its end"
        else:
            assert out not in seen, f"{line!r} trains into {out}/, as {seen[out]!r} did before it: give it an --out_dir"
        seen[out] = line


@pytest.mark.slow
def test_readme_commands_work_in_order(tmp_path):
    """Every command of README, in order, in a copy of the repository's files (git ls-files: what a clone has):
    exit 0, no traceback, and no training that has nothing to do."""
    pytest.importorskip('transformers', reason="README's export lines need requirements-hf.txt")
    if not os.path.exists(os.path.join(REPO, '.git')):
        pytest.skip("not a git checkout: what a clone has is read with git ls-files")
    files = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO, capture_output=True, check=True).stdout
    repo = tmp_path / 'nanolime'
    for name in filter(None, files.decode().split('\0')):
        if os.path.isfile(os.path.join(REPO, name)):  # a file deleted but not yet committed is not copied
            os.makedirs(repo / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), repo / name)
    ran = []
    for n, words in enumerate(readme_commands(), 1):
        if skipped(words):
            continue
        cmd = shortened(words)
        p = subprocess.run(cmd, cwd=repo, env=child_env(), capture_output=True, text=True, timeout=600)
        shown = ' '.join(shlex.quote(w) for w in ['python', *cmd[1:]])
        assert p.returncode == 0 and 'Traceback' not in p.stderr, (
            f"README's command {n}, after {len(ran)} before it ({', '.join(ran) or 'none'}), fails: {shown}\n"
            f"exit {p.returncode}\nstdout:\n{p.stdout[-2000:]}\nstderr:\n{p.stderr[-3000:]}")
        assert 'nothing to do' not in p.stdout, f"README's command {n} has nothing to do: {shown}\n{p.stdout[-1000:]}"
        ran.append(script_of(words))
    assert 'train.py' in ran and 'sample.py' in ran
