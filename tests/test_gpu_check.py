"""dev/gpu_check.py on the CPU: its plan (--dry_run), the split of --minutes over the stages and the skip of a
stage whose time is gone (with a fake clock), its config file, and how it runs stages and reports, with
stand-in stages of plain python commands: a stage that fails or runs over is recorded (one that runs over is
stopped, children and all) and the next one runs. The real stages need a GPU: tests/test_cuda.py, and the
check itself."""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from conftest import REPO, run, script_here
from nanolime import common
from nanolime import data
import prepare
from model import GPT, GPTConfig

sys.path.insert(0, os.path.join(REPO, 'dev'))
import gpu_check  # noqa: E402

STAGES = ['cuda-tests', 'train', 'table9', 'ddp']


def dry_run(*args):
    """The plan printed by --dry_run: its text, and [(number, name, seconds, [(label, seconds, command)])]."""
    code, out, err = script_here('dev/gpu_check.py', '--dry_run', *args)
    assert code == 0 and not err
    blocks = re.split(r'^(\d) (\S+)  (\d+) s  .*$', out, flags=re.M)[1:]
    return out, [(int(n), name, int(s), [(label, int(t), cmd) for label, t, cmd in
                                         re.findall(r'^    \[(\S+), (\d+) s\] (python .*)$', block, re.M)])
                 for n, name, s, block in zip(*[iter(blocks)] * 4)]


def test_dry_run_lists_the_stages_with_budgets_within_the_total(monkeypatch):
    """--minutes=9 --dry_run: the four stages in order, their budgets adding up to at most 9 minutes, each
    command one of this repository; in seconds, running nothing and leaving CUDA alone."""
    def nothing(*args, **kwargs):
        raise AssertionError(f"the dry run ran {args}")
    monkeypatch.setattr(subprocess, 'Popen', nothing)
    t0 = time.monotonic()
    out, stages = dry_run("--minutes=9")
    assert time.monotonic() - t0 < 10 and not torch.cuda.is_initialized()
    assert [(n, name) for n, name, *_ in stages] == list(enumerate(STAGES, 1))
    assert sum(s for _, _, s, _ in stages) <= 9 * 60 - gpu_check.RESERVE_S
    assert '4 stage(s) in 9 minutes: 510 s budgeted, 30 s kept' in out
    for _, name, seconds, steps in stages:  # each stage's steps, their budgets adding up to the stage's
        assert steps and abs(sum(t for _, t, _ in steps) - seconds) <= len(steps), name
        for *_, cmd in steps:
            assert all(os.path.isfile(os.path.join(REPO, w)) for w in cmd.split() if w.endswith('.py')), cmd
    cmds = {name: [cmd for *_, cmd in steps] for _, name, _, steps in stages}
    assert cmds['cuda-tests'][0].startswith('python -m pytest -m cuda ')
    work = os.path.join(tempfile.gettempdir(), 'gpu-check-XXXX')  # where a temporary work_dir goes
    sweeps = [c for c in cmds['train'] if c.startswith('python sweep.py config/train_gpu_check.py ')]
    assert [c.split(' --plot=False ')[1] for c in sweeps] == [  # LIMe and the baseline; LIMe to 100, then resumed
        f'--variants=lime,baseline --out_dir={work}/runs', f'--variants=lime --out_dir={work}/half --max_iters=100',
        f'--variants=lime --out_dir={work}/half']
    assert all(f'sample.py --out_dir={work}/runs/lime-L6-s0 --device={d} ' in ' '.join(cmds['train'])
               for d in ('cuda', 'cpu'))
    assert [c.split('--settings=')[1].split()[0] for c in cmds['table9']] == ['gqa-eager', 'mha-eager']
    assert 'torch.distributed.run --standalone --nproc_per_node=1 train.py' in cmds['ddp'][1]


def test_the_minutes_are_split_over_the_stages_by_their_shares():
    for minutes in (5, 8, 10, 30):
        budgets = gpu_check.plan(STAGES, minutes)
        assert list(budgets) == STAGES
        assert sum(budgets.values()) == pytest.approx(minutes * 60 - gpu_check.RESERVE_S)
        assert all(budgets[n] / budgets['train'] == pytest.approx(gpu_check.SHARES[n] / gpu_check.SHARES['train'])
                   for n in STAGES)
    assert gpu_check.plan(['ddp', 'table9'], 8) == pytest.approx(  # a rerun of some: the minutes are theirs
        {'ddp': 450 * 0.08 / 0.20, 'table9': 450 * 0.12 / 0.20})
    for bad in (float('inf'), float('nan')):  # not "too little"
        with pytest.raises(common.UserError, match=rf"^minutes={bad} is not a number of minutes: give the time"):
            gpu_check.plan(STAGES, bad)
    with pytest.raises(common.UserError, match=r"minutes=0.5 is too little: 4 stage\(s\) need at least 1.17"):
        gpu_check.plan(STAGES, 0.5)
    # the 1B stage compiles where its budget allows four compiles of a 1B model, and runs eager otherwise
    _, stages = dry_run('--minutes=9', '--stages=table9')
    assert [c.split('--settings=')[1].split()[0] for *_, c in stages[0][3]] == ['gqa-compiled', 'mha-compiled']
    _, stages = dry_run('--minutes=8', '--stages=3', '--bench_1b_mode=compiled')
    assert stages[0][1] == 'table9' and 'mha-compiled' in stages[0][3][1][2]


@pytest.mark.slow
def test_stages_selects_some_and_names_the_valid_ones_when_wrong():
    _, stages = dry_run('--minutes=4', '--stages=ddp,2')
    assert [(n, name) for n, name, *_ in stages] == [(2, 'train'), (4, 'ddp')]  # in the check's order
    assert sum(s for _, _, s, _ in stages) <= 4 * 60
    p = run('dev/gpu_check.py', '--dry_run', '--stages=train,x')
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: stages='train,x': unknown x; use 'all' or names or numbers from: 1 cuda-tests, 2 train, 3 table9, "
        "4 ddp, 5 depth, 6 grads"]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_stage_whose_time_is_gone_is_skipped_and_the_report_is_written_after_each(tmp_path):
    """With a fake clock and stand-in stages: a stage runs until the budgets of it and the stages before it
    have passed (what one leaves goes to the next; what one overruns, the next loses); one with less than
    MIN_STAGE_S left is skipped with a line; gpu_report.json and .md are rewritten after every stage."""
    out, clock, seen = str(tmp_path), FakeClock(), []

    def runner(stage, budget, out, work):
        written = gpu_check.read_json(os.path.join(out, 'gpu_report.json'))
        done = written and [s['name'] for s in written['stages']]
        seen.append((stage['name'], budget, done))
        clock.now += stage['takes']
        return dict(number=stage['number'], name=stage['name'], title='', steps=[], status='ok', minutes=0.0,
                    budget_min=round(budget / 60, 2), results=None, lines=[], problems=[])
    stages = [dict(name=n, number=k, title=n, takes=t) for k, (n, t) in enumerate(
        [('early', 20), ('overruns', 400), ('starved', 0), ('gets-the-rest', 15), ('last', 0)], 1)]
    budgets = {'early': 100, 'overruns': 100, 'starved': 100, 'gets-the-rest': 100 + 5 + 30, 'last': 5}
    earlier = [dict(number=9, name='from-before', title='', steps=[], status='failed', minutes=1.0, budget_min=1.0,
                    results=None, lines=[], problems=[], date='yesterday')]  # a rerun keeps the stages not rerun
    report = gpu_check.run_all(stages, budgets, out, str(tmp_path), dict(device='Stand-in GPU', date='today'), earlier,
                               clock, runner)
    assert seen == [('early', 100, None), ('overruns', 180, ['early', 'from-before']),
                    ('gets-the-rest', 15, ['early', 'overruns', 'starved', 'from-before'])]
    assert [(s['name'], s['status']) for s in report['stages']] == [
        ('early', 'ok'), ('overruns', 'ok'), ('starved', 'skipped'), ('gets-the-rest', 'ok'), ('last', 'skipped'),
        ('from-before', 'failed')]
    with open(os.path.join(out, 'gpu_report.json')) as f:
        assert json.load(f) == json.loads(json.dumps(report))
    assert report['minutes'] == pytest.approx(435 / 60, abs=0.01)
    with open(os.path.join(out, 'gpu_report.md')) as f:
        md = f.read()
    assert re.search(r'^\| 3 \| starved \| skipped \| 0.0 \| 1.7 \|$', md, re.M)
    assert ("- skipped: the time was gone (0 s left of its 100 s, fewer than 10); rerun it alone: "
            "`python dev/gpu_check.py --stages=starved`") in md
    assert "(5 s left of its 5 s" in md  # the last: its own 5 s, of which nothing was taken
    assert re.search(r'^## 9\. from-before: failed \(1.0 of 1.0 min\) \(from the check of yesterday\)$', md, re.M)
    assert re.search(r'^## 1\. early: ok \([\d.]+ of 1.7 min\)$', md, re.M)


@pytest.mark.slow
def test_a_machine_with_torch_alone_is_told_what_to_install():
    """A fresh GPU machine often has torch and nothing else: one line naming what is missing and the command. The
    plan (--dry_run, either spelling) needs torch alone."""
    hide = ("import runpy, sys\nsys.modules['numpy'] = sys.modules['tiktoken'] = sys.modules['xdist'] = None\n"
            "sys.argv = ['dev/gpu_check.py', *sys.argv[1:]]\nrunpy.run_path('dev/gpu_check.py', run_name='__main__')\n")
    p = run([sys.executable, '-c', hide, '--minutes=9'])
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: dev/gpu_check.py needs numpy, tiktoken, pytest-xdist, not installed here: "
        "pip install -r requirements.txt"]
    for flag in ('--dry_run', '--dry-run'):
        p = run([sys.executable, '-c', hide, flag])
        assert p.returncode == 0 and '1 cuda-tests' in p.stdout, p.stderr


def test_bad_options_and_no_gpu_stop_before_any_work(tmp_path):
    for args, message in [(['--stages=2,train,x'], "stages='2,train,x': unknown x; use 'all' or names or numbers"),
                          (['--minutes=0.1'], "minutes=0.1 is too little"),
                          (['--minutes=1e999'], "minutes=inf is not a number of minutes: give the time the GPU is "
                                                "lent for, e.g. --minutes=9"),
                          (['--bench_1b_mode=fast'], "bench_1b_mode='fast': use 'auto', 'eager' or 'compiled'")]:
        with pytest.raises(common.UserError) as e:
            script_here('dev/gpu_check.py', '--dry_run', *args)
        assert str(e.value).startswith(message)
    if not torch.cuda.is_available():
        with pytest.raises(common.UserError, match=r"no CUDA GPU here .*--dry_run lists its stages"):
            script_here('dev/gpu_check.py', f"--out_dir={tmp_path / 'out'}")
        assert not (tmp_path / 'out').exists()


def test_the_old_spelling_of_dry_run_still_works_with_a_notice():
    code, out, err = script_here('dev/gpu_check.py', '--dry-run', '--minutes=9')
    assert code == 0 and out == dry_run('--minutes=9')[0]
    assert err.splitlines() == ["note: --dry-run is the old spelling of --dry_run (every option is --key=value); "
                                "it still works"]


def alive(pid):
    """Whether process pid runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rpartition(')')[2].split()[0] not in ('Z', 'X')
    except OSError:
        return False


@pytest.mark.slow
def test_failures_and_overruns_are_recorded_and_the_next_stage_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, 'MIN_STAGE_S', 1)  # a stage of 3 s runs
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
    stages = [  # the slow one first: time the others leave unused would go to it
        dict(name='slow', title='runs over its 3 seconds', summary=broken, steps=[('sleeps', py(sleeper), 1)]),
        dict(name='good', title='prints hello', summary=summary(1), steps=[('a', py("print('hello')"), 1)]),
        dict(name='bad', title='a failing step, then one that passes', summary=summary(2),
             steps=[('fails', py("import sys; print('boom'); sys.exit(3)"), 1), ('passes', py('pass'), 1)]),
        dict(name='problem', title='exits 0, its summary finds a problem', summary=report_so_far,
             steps=[('a', py('pass'), 1)]),
    ]
    budgets = {'slow': 3, 'good': 30, 'bad': 60, 'problem': 30}
    info = dict(device='Stand-in GPU', memory_gib=80.0, capability='9.0', gpus=1, driver='1.0', cuda='12.0',
                torch=torch.__version__, python='3', cpus=2, peak_flops=989e12, date='today', commit='abc',
                command='python dev/gpu_check.py')
    t0 = time.time()
    report = gpu_check.run_all(stages, budgets, out, str(tmp_path / 'work'), info)
    assert time.time() - t0 < 20  # the sleeper stopped at its budget, not after its 60 s
    with open(os.path.join(out, 'gpu_report.json')) as f:
        saved = json.load(f)
    assert saved == json.loads(json.dumps(report)) and saved['budget_min'] == 2.05
    assert [s['status'] for s in saved['stages']] == ['overran', 'ok', 'failed', 'failed']
    slow, good, bad, problem = saved['stages']
    assert bad['steps'][0]['budget_min'] == bad['steps'][1]['budget_min'] == 0.75  # halves of 60 s and good's 30 unused
    assert good['results'] == 1 and good['steps'][0]['returncode'] == 0 and good['minutes'] < good['budget_min']
    with open(os.path.join(out, good['steps'][0]['log'])) as f:
        assert f.read() == f"$ python -c {shlex.quote(stages[1]['steps'][0][1][2])}\nhello\n"
    assert [(s['label'], s['status'], s['returncode']) for s in bad['steps']] == [('fails', 'failed', 3),
                                                                                  ('passes', 'ok', 0)]
    assert 'boom' in bad['steps'][0]['tail']
    assert slow['steps'][0]['status'] == 'overran' and slow['problems'] == ["no summary: KeyError: 'x'"]
    assert 0.05 <= slow['minutes'] < 0.4
    assert not alive(int(pid_file.read_text()))  # the step's own child was stopped too
    assert problem['results'] == ['slow', 'good', 'bad']  # the report was written after each stage
    assert problem['problems'] == ['the loss did not fall']
    with open(os.path.join(out, 'gpu_report.md')) as f:
        md = f.read()
    assert 'Stand-in GPU (80.0 GiB' in md and 'driver 1.0' in md and f'torch {torch.__version__}' in md
    assert 'date: today' in md and 'peak bf16 for MFU: 989 TFLOP/s' in md
    for k, (name, status) in enumerate([('slow', 'overran'), ('good', 'ok'), ('bad', 'failed'),
                                        ('problem', 'failed')], 1):
        assert re.search(rf'^\| {k} \| {name} \| {status} \| [\d.]+ \| [\d.]+ \|$', md, re.M), name
        assert re.search(rf'^## {k}\. {name}: {status} \([\d.]+ of [\d.]+ min\)$', md, re.M), name
    assert '- summary 1' in md and 'boom' in md and '- problem: the loss did not fall' in md
    assert "`sleeps` overran" in md and "`fails` failed with exit status 3" in md


def test_the_training_config_is_a_small_compiled_bf16_lime_run(monkeypatch):
    """config/train_gpu_check.py: a small LIMe model (~30M parameters, most of them the embedding), compiled,
    bf16, on the offline BPE Shakespeare, stopped at half its iterations by the check's resume."""
    train_cfg = common._exec_config_file(os.path.join(REPO, 'config', 'train_gpu_check.py'), {})
    assert (train_cfg['dataset'], train_cfg['device'], train_cfg['dtype'], train_cfg['compile']) == (
        'shakespeare', 'cuda', 'bfloat16', True)
    assert train_cfg['max_iters'] == train_cfg['lr_decay_iters'] == gpu_check.TRAIN_ITERS
    assert train_cfg['n_layer'] == gpu_check.TRAIN_DEPTH  # the sweep's --depths
    assert gpu_check.TRAIN_ITERS // 2 % train_cfg['eval_interval'] == 0  # a checkpoint where the half run stops
    for init in ('normal_', 'kaiming_uniform_'):  # shapes only: the weights stay uninitialised
        monkeypatch.setattr(torch.nn.init, init, lambda t, *args, **kwargs: t)
    model = GPT(GPTConfig(vocab_size=data.EOT + 1, lime=train_cfg['lime'], block_size=train_cfg['block_size'],
                          n_layer=train_cfg['n_layer'], n_head=train_cfg['n_head'], n_embd=train_cfg['n_embd']))
    assert 20e6 <= model.get_num_params() <= 40e6 and model.config.lime


def test_train_py_accepts_the_checks_training_commands(tmp_path):
    """train.py checks each command of the training and DDP stages (on the CPU) with --check_only=True: the DDP
    stage's prints the run's config and exits before claiming out_dir; each sweep of the training stage has
    train.py check its variants' options and exits before claiming its out_dir."""
    prepare.prepare_bpe(prepare.read_shakespeare()[:100_000], str(tmp_path / 'data' / 'shakespeare'))
    stages = {s['name']: s for s in gpu_check.stage_list(str(tmp_path / 'out'), str(tmp_path))}
    cmds = [cmd for s in ('train', 'ddp') for label, cmd, _ in stages[s]['steps']
            if {'sweep.py', 'train.py'} & set(cmd)]
    assert [os.path.basename(cmd[1]) for cmd in cmds] == ['sweep.py'] * 3 + ['-m']
    for cmd in cmds[:3]:
        code, out, _ = script_here('sweep.py', os.path.join(REPO, cmd[2]), *cmd[3:], '--device=cpu',
                                   '--dtype=float32', '--check_only=True')
        assert code == 0 and out.splitlines()[-1].startswith('checked by train.py: the options of lime'), cmd
        assert not os.path.exists(next(a for a in cmd if a.startswith('--out_dir='))[10:]), cmd  # not claimed
    args = cmds[3][cmds[3].index('train.py') + 1:]
    code, out, _ = script_here('train.py', os.path.join(REPO, args[0]), *args[1:], '--device=cpu',
                               '--dtype=float32', '--check_only=True')
    config = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and not os.path.exists(config['out_dir'])  # stopped before the claim
    assert (config['n_embd'], config['lime'], config['max_iters'], config['compile']) == (128, True, 30, False)


def test_missing_requirements_names_only_what_the_stages_need(monkeypatch):
    """On a GPU machine with torch and little else, the check names the packages its stages import; not
    datasets (FineWeb's prepare only) nor matplotlib (no stage plots), which a lent machine may lack."""
    import importlib.util
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    missing = gpu_check.missing_requirements()
    assert {'numpy', 'scipy', 'tiktoken', 'pytest', 'pytest-xdist'} <= set(missing)
    assert 'datasets' not in missing and 'matplotlib' not in missing


def test_the_named_only_stages_are_listed_with_their_commands_and_planned_when_named():
    """depth and grads: after the four of 'all' in the plain dry run, with their commands, as run only when
    named; named, they get the minutes, split by their shares, each command a file of this repository."""
    out, stages = dry_run("--minutes=9")
    assert [name for _, name, *_ in stages] == STAGES
    rest = out.split('Only when named (--stages=depth,grads --minutes=N)')[1]
    assert re.findall(r'^(\d) (\S+)  ', rest, re.M) == [('5', 'depth'), ('6', 'grads')]
    assert '    [bench] python bench.py config/bench_depth_gpu.py --json=' in rest
    assert '    [grad-check] python dev/grad_check.py\n' in rest
    out, stages = dry_run("--minutes=12", "--stages=grads,depth")
    assert '2 stage(s) in 12 minutes: 690 s budgeted' in out and 'Only when named' not in out
    assert [(n, name, s) for n, name, s, _ in stages] == [(5, 'depth', 414), (6, 'grads', 276)]
    (_, _, cmd), = stages[0][3]
    assert cmd.startswith('python bench.py config/bench_depth_gpu.py --json=') and cmd.endswith('/bench_depth.json')
    assert os.path.isfile(os.path.join(REPO, 'config', 'bench_depth_gpu.py'))
    assert stages[1][3] == [('grad-check', 276, 'python dev/grad_check.py')]


TINY = ['--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=8', '--vocab_size=32', '--batch_size=2',
        '--device=cpu', '--dtype=float32']


@pytest.mark.slow
def test_grad_check_passes_on_the_cpu_and_fails_naming_a_perturbed_gradient(monkeypatch, capsys):
    """dev/grad_check.py at a tiny shape in float32 (compiled once): every gradient within float32's tolerance,
    exit status 0; the same gradients with one compiled gradient perturbed by 1 % of its max: exit status 1,
    the parameter named and the documented workaround given. The compiler is aot_eager here, to test the
    script's reading in seconds; inductor's gradients against eager are test_compile's."""
    import grad_check
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)  # configure() installs its own
    compile_ = torch.compile
    monkeypatch.setattr(torch, 'compile', lambda model, **kw: compile_(model, backend='aot_eager', **kw))
    for key in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size', 'batch_size', 'device', 'dtype', 'lime'):
        monkeypatch.setattr(grad_check, key, getattr(grad_check, key))  # configure() sets them
    seen = []
    real = grad_check.gradients

    def recorded(*args, compiled):
        seen.append(real(*args, compiled=compiled))
        return seen[-1]
    monkeypatch.setattr(grad_check, 'gradients', recorded)
    assert grad_check.main(TINY) == 0
    out = capsys.readouterr().out
    (eager_loss, eager), (compiled_loss, compiled) = seen
    assert f"  loss: eager {eager_loss:.6f}, compiled {compiled_loss:.6f}" in out
    assert eager.keys() == compiled.keys() and 'transformer.h.1.attn.router.weight' in eager
    assert 'ok: every compiled gradient within 1.00e-04' in out
    assert all(f"  {name}" in out for name in eager)  # every parameter's error printed
    name = 'transformer.h.1.attn.router.weight'
    wrong = dict(compiled, **{name: compiled[name].clone()})
    wrong[name].view(-1)[0] += 0.01 * eager[name].abs().max()
    monkeypatch.setattr(grad_check, 'gradients',
                        lambda *a, compiled: (compiled_loss, wrong) if compiled else (eager_loss, eager))
    assert grad_check.main(TINY) == 1
    cap = capsys.readouterr()
    assert re.search(rf"^error: 1 compiled gradient\(s\) over the tolerance 1.00e-04: {re.escape(name)}\. ",
                     cap.err, re.M)
    assert 'TORCHINDUCTOR_MIX_ORDER_REDUCTION=0' in cap.err and 'pytorch issue' in cap.err and '--lime=False' in cap.err
    assert re.search(rf"^  1\.0\de-02  {re.escape(name)}  OVER$", cap.out, re.M)


def test_the_depth_and_grads_summaries_read_what_their_commands_leave(tmp_path):
    """depth: bench.py's JSON as a table by layers, a failed record a problem; grads: grad_check's verdict,
    its error line the problem; nothing written is a problem, not a crash."""
    (tmp_path / 'logs').mkdir()
    assert gpu_check.summarize_depth(str(tmp_path), '')[2] == ["no results (bench_depth.json was not written)"]
    records = [dict(variant='baseline', n_layer=32, step_ms=10.0, step_ratio=1.0, mem_bytes=2e9, mem_ratio=1.0),
               dict(variant='lime', n_layer=32, step_ms=11.0, step_ratio=1.1, mem_bytes=2.2e9, mem_ratio=1.1),
               dict(variant='lime', n_layer=128, error='OutOfMemoryError')]
    (tmp_path / 'bench_depth.json').write_text(json.dumps(dict(config={}, records=records)))
    rows, lines, problems = gpu_check.summarize_depth(str(tmp_path), '')
    assert rows == records and '| 32 | lime | 11.00 | 1.100 | 2.20 | 1.100 |' in lines
    assert problems == ['128 layers lime: OutOfMemoryError']
    log = tmp_path / 'logs' / 'grads-grad-check.log'
    assert gpu_check.summarize_grads(str(tmp_path), '')[2] == ["dev/grad_check.py printed no verdict"]
    log.write_text("$ python dev/grad_check.py\nLIMe 8 x 1024, T 1024\n  3.1e-01  a.b  OVER\n"
                   "error: 1 compiled gradient(s) over the tolerance 1.95e-02: a.b. The documented workaround\n")
    nums, lines, problems = gpu_check.summarize_grads(str(tmp_path), '')
    assert nums == dict(ok=False) and problems == ['1 compiled gradient(s) over the tolerance 1.95e-02: a.b. '
                                                   'The documented workaround']
    log.write_text("LIMe 8 x 1024, T 1024\nok: every compiled gradient within 1.95e-02 of its max |g|\n")
    assert gpu_check.summarize_grads(str(tmp_path), '') == (
        dict(ok=True), ['- LIMe 8 x 1024, T 1024', '- ok: every compiled gradient within 1.95e-02 of its max |g|'], [])
