"""dev/gpu_check.py on the CPU: its plan (--dry-run), its config files, and how it runs stages and reports,
with stand-in stages of plain python commands: a stage that fails or runs over is recorded (one that runs
over is stopped, children and all) and the next one runs. The real stages need a GPU: tests/test_cuda.py,
and the check itself."""
import json
import os
import re
import shlex
import sys
import tempfile
import time

import pytest
import torch

from conftest import REPO, run, script_here
from nanolime import common
from nanolime import checkpoint, data
import prepare
from model import GPT, GPTConfig

sys.path.insert(0, os.path.join(REPO, 'dev'))
import gpu_check  # noqa: E402


def test_dry_run_lists_the_stages_each_within_its_budget():
    """Every stage fits alone in a 10-minute command on a lent GPU (STAGE_MINUTES)."""
    code, out, err = script_here('dev/gpu_check.py', '--dry-run')
    assert code == 0 and not err
    stages = re.findall(r'^(\d) (\S+)  ([\d.]+) min  ', out, re.M)
    assert [s[:2] for s in stages] == [('1', 'cuda-tests'), ('2', 'table9'), ('3', 'depth'), ('4', 'train'),
                                       ('5', 'ddp'), ('6', 'depth-64')]
    assert all(float(minutes) <= gpu_check.STAGE_MINUTES < 10 for *_, minutes in stages), stages
    total = sum(float(minutes) for *_, minutes in stages)
    assert f"{total:.1f} minutes budgeted" in out
    # each stage's steps, their budgets adding up to the stage's, each a command of this repository
    blocks = re.split(r'^\d \S+  ', out, flags=re.M)[1:]
    for (_, name, minutes), block in zip(stages, blocks):
        steps = re.findall(r'^    \[(\S+), ([\d.]+) min\] (python .*)$', block, re.M)
        assert steps and sum(float(m) for _, m, _ in steps) == pytest.approx(float(minutes), abs=0.01), name
        for *_, cmd in steps:
            assert all(os.path.isfile(os.path.join(REPO, w)) for w in cmd.split() if w.endswith('.py')), cmd
    assert 'python -m pytest -m cuda' in blocks[0]
    assert all(f'config/bench_1b.py --settings={a}-compiled' in blocks[1] for a in ('gqa', 'mha'))
    assert 'config/bench_depth_gpu.py --depths=32 ' in blocks[2] and 'config/bench_depth_gpu.py --depths=64 ' in blocks[5]
    work = os.path.join(tempfile.gettempdir(), 'gpu-check-XXXX')  # where a temporary work_dir goes
    assert all(f'sample.py --out_dir={work}/train --device={d} ' in blocks[3] for d in ('cuda', 'cpu'))
    assert 'torch.distributed.run --standalone --nproc_per_node=1 train.py' in blocks[4]
    code, out, err = script_here('dev/gpu_check.py', '--dry-run', '--stages=6')  # one stage alone
    assert code == 0 and re.findall(r'^(\d) (\S+)  ', out, re.M) == [('6', 'depth-64')]


def test_a_machine_with_torch_alone_is_told_what_to_install():
    """A fresh GPU machine often has torch and nothing else: one line naming what is missing and the command."""
    hide = ("import runpy, sys\nsys.modules['numpy'] = sys.modules['tiktoken'] = None  # not installed\n"
            "sys.argv = ['dev/gpu_check.py', '--dry-run']\nrunpy.run_path('dev/gpu_check.py', run_name='__main__')\n")
    p = run([sys.executable, '-c', hide])
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: dev/gpu_check.py needs numpy, tiktoken, not installed here: pip install -r requirements.txt"]


def test_bad_options_and_no_gpu_stop_before_any_work(tmp_path):
    for args, message in [(['--stages=2,train,x'], "stages='2,train,x': unknown x; use 'all' or names or numbers"),
                          (['--budget_scale=0.0'], "budget_scale=0.0 must be a number > 0")]:
        with pytest.raises(common.UserError) as e:
            script_here('dev/gpu_check.py', '--dry-run', *args)
        assert str(e.value).startswith(message)
    if not torch.cuda.is_available():
        with pytest.raises(common.UserError, match=r"no CUDA GPU here .*--dry-run lists its stages"):
            script_here('dev/gpu_check.py', f"--out_dir={tmp_path / 'out'}")
        assert not (tmp_path / 'out').exists()


def alive(pid):
    """Whether process pid runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rpartition(')')[2].split()[0] not in ('Z', 'X')
    except OSError:
        return False


def test_failures_and_overruns_are_recorded_and_the_next_stage_runs(tmp_path):
    out, pid_file = str(tmp_path / 'out'), tmp_path / 'child.pid'
    os.makedirs(out)

    def py(code):
        return [sys.executable, '-c', code]

    def summary(numbers, problems=()):
        return lambda out, work: (numbers, [f"- summary {numbers}"], list(problems))

    def broken(out, work):
        raise KeyError('x')

    def report_so_far(out, work):  # what gpu_report.json holds when this stage ends
        with open(os.path.join(out, 'gpu_report.json')) as f:
            return [s['name'] for s in json.load(f)['stages']], [], ['the loss did not fall']
    sleeper = ("import subprocess, sys, time\n"  # a step that starts a child of its own, and both sleep
               "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
               f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
               "time.sleep(60)")
    stages = [
        dict(name='good', title='prints hello', summary=summary(1), steps=[('a', py("print('hello')"), 0.5)]),
        dict(name='bad', title='a failing step, then one that passes', summary=summary(2),
             steps=[('fails', py("import sys; print('boom'); sys.exit(3)"), 0.5), ('passes', py('pass'), 0.5)]),
        dict(name='slow', title='runs over its 3 seconds', summary=broken, steps=[('sleeps', py(sleeper), 0.05)]),
        dict(name='problem', title='exits 0, its summary finds a problem', summary=report_so_far,
             steps=[('a', py('pass'), 0.5)]),
    ]
    info = dict(device='Stand-in GPU', memory_gib=80.0, capability='9.0', gpus=1, driver='1.0', cuda='12.0',
                torch=torch.__version__, python='3', cpus=2, peak_flops=989e12, date='today', commit='abc',
                command='python dev/gpu_check.py')
    t0 = time.time()
    report = gpu_check.run_all(stages, out, str(tmp_path / 'work'), info)
    assert time.time() - t0 < 20  # the sleeper stopped at its budget, not after its 60 s
    with open(os.path.join(out, 'gpu_report.json')) as f:
        saved = json.load(f)
    assert saved == json.loads(json.dumps(report)) and saved['budget_min'] == 2.05
    assert [s['status'] for s in saved['stages']] == ['ok', 'failed', 'overran', 'failed']
    good, bad, slow, problem = saved['stages']
    assert good['results'] == 1 and good['steps'][0]['returncode'] == 0 and good['minutes'] < good['budget_min']
    with open(os.path.join(out, good['steps'][0]['log'])) as f:
        assert f.read() == f"$ python -c {shlex.quote(stages[0]['steps'][0][1][2])}\nhello\n"
    assert [(s['label'], s['status'], s['returncode']) for s in bad['steps']] == [('fails', 'failed', 3),
                                                                                  ('passes', 'ok', 0)]
    assert 'boom' in bad['steps'][0]['tail']
    assert slow['steps'][0]['status'] == 'overran' and slow['problems'] == ["no summary: KeyError: 'x'"]
    assert 0.05 <= slow['minutes'] < 0.3
    assert not alive(int(pid_file.read_text()))  # the step's own child was stopped too
    assert problem['results'] == ['good', 'bad', 'slow']  # the report was written after each stage
    assert problem['problems'] == ['the loss did not fall']
    with open(os.path.join(out, 'gpu_report.md')) as f:
        md = f.read()
    assert 'Stand-in GPU (80.0 GiB' in md and 'driver 1.0' in md and f'torch {torch.__version__}' in md
    assert 'date: today' in md and 'peak bf16 for MFU: 989 TFLOP/s' in md
    for k, (name, status) in enumerate([('good', 'ok'), ('bad', 'failed'), ('slow', 'overran'),
                                        ('problem', 'failed')], 1):
        assert re.search(rf'^\| {k} \| {name} \| {status} \| [\d.]+ \| [\d.]+ \|$', md, re.M), name
        assert re.search(rf'^## {k}\. {name}: {status} \([\d.]+ of [\d.]+ min\)$', md, re.M), name
    assert '- summary 1' in md and 'boom' in md and '- problem: the loss did not fall' in md
    assert "`sleeps` overran" in md and "`fails` failed with exit status 3" in md


def test_the_training_config_is_a_124m_lime_run(monkeypatch):
    """config/train_gpu_check.py: a GPT-2-small-sized LIMe model (~124M parameters), compiled, bf16, on the
    offline BPE Shakespeare. (config/bench_depth_gpu.py: tests/test_bench.py's test of the shipped configs.)"""
    train_cfg = common._exec_config_file(os.path.join(REPO, 'config', 'train_gpu_check.py'), {})
    assert (train_cfg['dataset'], train_cfg['device'], train_cfg['dtype'], train_cfg['compile']) == (
        'shakespeare', 'cuda', 'bfloat16', True)
    assert 200 <= train_cfg['max_iters'] <= 500
    for init in ('normal_', 'kaiming_uniform_'):  # shapes only: the weights stay uninitialised
        monkeypatch.setattr(torch.nn.init, init, lambda t, *args, **kwargs: t)
    model = GPT(GPTConfig(vocab_size=data.EOT + 1, lime=train_cfg['lime'], block_size=train_cfg['block_size'],
                          n_layer=train_cfg['n_layer'], n_head=train_cfg['n_head'], n_embd=train_cfg['n_embd']))
    assert 100e6 <= model.get_num_params() <= 130e6 and model.config.lime


def test_train_py_accepts_the_training_config(tmp_path, monkeypatch):
    """train.py checks the config and stops where it would claim its out_dir (as sweep.py checks a run)."""
    prepare.prepare_bpe(prepare.read_shakespeare()[:100_000], str(tmp_path / 'shakespeare'))
    seen = {}

    def stop(*args, **kwargs):
        seen.update(sys._getframe(1).f_globals['config'])
        raise SystemExit(0)
    monkeypatch.setattr(checkpoint, 'on_rank_0', stop)
    code, _, _ = script_here('train.py', os.path.join(REPO, 'config', 'train_gpu_check.py'), f'--data_dir={tmp_path}',
                             '--device=cpu', '--dtype=float32')
    assert code == 0 and seen['n_embd'] == 768
