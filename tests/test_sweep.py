"""sweep.py end to end on the CPU: tiny models, a few iterations, every run a real train.py subprocess.

The statistics and the compute multiplier, pure functions, are tested in test_sweep_stats.py and
test_sweep_report.py. A failure a test needs is caused by patching train.py's model from outside (a sitecustomize
module on PYTHONPATH), never by how a machine rounds or overflows. Where what is tested is the sweep's logic, not
its process, the sweep runs in this process (conftest's run_here; it then keeps a lock on its out_dir while the
tests run, so each such sweep gets an out_dir of its own).
"""
import csv
import fcntl
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
import torch

from conftest import REPO, child_env, ok, run, script_here
from nanolime import common
from nanolime import sweep_multipliers
from nanolime import sweep_runs
from nanolime import variants

TINY = ['--device=cpu', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4', '--total_batch_size=64',
        '--eval_iters=2', '--warmup_iters=1', '--log_interval=1', '--compile=False', '--dtype=float32']
COLUMNS = ['depth', 'variant', 'seed', 'budget', 'status', 'iters', 'max_iters', 'lr_decay_iters', 'warmup_iters',
           'data', 'tokens', 'train_flops', 'learning_rate', 'non_embedding_params', 'tokens_per_param', 'val_loss',
           'compute_multiplier', 'multiplier_note', 'time_multiplier', 'wall_time_s', 'options', 'out_dir']


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def read_log(run_dir):
    with open(os.path.join(run_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def swept(data_dir, tmp_path_factory):
    """Baseline and LIMe at depth 2, seeds 0 and 1, 3 iterations each, two at a time; stdout to a pipe,
    stderr to a terminal (100 columns): (root, args, stdout, what the terminal got)."""
    root = str(tmp_path_factory.mktemp('sweep') / 'root')
    args = ['--depths=2', '--variants=baseline,lime', '--seeds=0,1', '--jobs=2', *TINY, f'--data_dir={data_dir}',
            f'--out_dir={root}', '--max_iters=3', '--lr_decay_iters=3', '--eval_interval=1']
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 100, 0, 0))
    try:
        p = ok(run('sweep.py', *args, stdout=subprocess.PIPE, stderr=slave))  # a few kB: fits the pty's buffer
        os.close(slave)
        tty = b''
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            tty += chunk
    finally:
        os.close(master)
    return root, args, p.stdout, tty.decode()


@pytest.mark.slow
def test_end_to_end_csv_table_multiplier_bar_plot(swept):
    root, _, stdout, tty = swept
    rows = read_csv(os.path.join(root, 'sweep.csv'))
    assert list(rows[0]) == COLUMNS + ['best_of_arm']
    by = {(r['variant'], int(r['seed'])): r for r in rows}
    assert sorted(by) == [('baseline', 0), ('baseline', 1), ('lime', 0), ('lime', 1)]
    for (v, s), r in by.items():
        assert r['status'] == 'done' and r['depth'] == '2' and float(r['wall_time_s']) > 0, r
        assert r['out_dir'] == f"{v}-L2-s{s}"  # relative to the sweep's out_dir: the same on every machine
        assert not {'overwrite', 'check_only', 'eval_only'} & set(json.loads(r['options']))  # no experiment's
        log = read_log(os.path.join(root, r['out_dir']))
        assert float(r['val_loss']) == log[-1]['val_loss'] and log[-1]['iter'] == int(r['iters']) == 3
        assert int(r['tokens']) == 3 * 64 == log[-1]['tokens'] and int(r['train_flops']) == log[-1]['flops']
        # the multiplier: on the control run of the same depth and seed; none for the control itself
        if v == 'baseline':
            assert r['compute_multiplier'] == r['multiplier_note'] == '' == r['budget']
        else:
            curve = [(x['flops'], x['val_loss']) for x in read_log(os.path.join(root, by['baseline', s]['out_dir']))
                     if 'val_loss' in x]
            want = sweep_multipliers.compute_multiplier(curve, float(r['val_loss']), int(r['train_flops']))
            mult, bound = want
            assert float(r['compute_multiplier']) == pytest.approx(mult)
            assert r['multiplier_note'] == ('lower bound' if bound else 'control curve')
            ref = by['baseline', s]  # per CPU-second: the control's seconds for the FLOPs it needs over the run's
            assert float(r['time_multiplier']) == pytest.approx(mult * int(r['train_flops']) / int(ref['train_flops'])
                                                                * float(ref['wall_time_s']) / float(r['wall_time_s']))
    assert int(by['lime', 0]['train_flops']) > int(by['baseline', 0]['train_flops'])  # the routers' FLOPs
    # tokens per non-embedding parameter: the model each run trained, less its (tied) embedding
    from model import GPT, GPTConfig
    vocab = torch.load(os.path.join(root, 'lime-L2-s0', 'ckpt.pt'), weights_only=True)['model_args']['vocab_size']
    for v in ('baseline', 'lime'):
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=vocab, lime=v == 'lime'))
        want = model.get_num_params() - vocab * 16
        assert [int(by[v, s]['non_embedding_params']) for s in (0, 1)] == [want, want]
        assert float(by[v, 0]['tokens_per_param']) == round(3 * 64 / want, 3)
        assert float(by[v, 1]['learning_rate']) == 2e-3  # train.py's default: the sweep sets none
        assert re.match(rf"\s*2\s+{v}\s+2\s+{3 * 64 / want:.2f}\s", next(
            l for l in stdout.splitlines() if re.match(rf'\s*2\s+{v}\s+2\s', l)))
    # the table: each variant's mean, the lime - baseline difference paired by seed, its interval (t, 1 df)
    line = next(l for l in stdout.splitlines() if re.match(r'\s*2\s+lime\s+2\s', l))
    diffs = [float(by['lime', s]['val_loss']) - float(by['baseline', s]['val_loss']) for s in (0, 1)]
    assert f"{sum(diffs) / 2:+.4f} ± {12.706 * abs(diffs[0] - diffs[1]) / 2:.4f}" in line
    assert re.search(r'inside seed noise|better|worse', line)
    mults = [float(by['lime', s]['compute_multiplier']) for s in (0, 1)]
    bound = '>' if any(by['lime', s]['multiplier_note'] == 'lower bound' for s in (0, 1)) else ''
    assert line.split()[-7] == f"{bound}{sum(mults) / 2:.3f}", line
    times = [float(by['lime', s]['time_multiplier']) for s in (0, 1)]
    assert line.split()[-4:-2] == ['|', f"{bound}{sum(times) / 2:.3f}"], line
    # one line per finished run; on the terminal a progress bar, drawn and redrawn
    assert len([l for l in stdout.splitlines() if l.startswith('done ')]) == 4
    assert '\r' in tty and '4/4' in tty
    cores = len(os.sched_getaffinity(0))
    assert f"2 at a time, {max(1, cores // 2)} threads each" in stdout
    assert os.path.getsize(os.path.join(root, 'sweep.png')) > 0


def data_rng_states(run_dir):
    """The numpy bit-generator state in a run's checkpoint: the training-data sampler's RNG."""
    ckpt = torch.load(os.path.join(run_dir, 'ckpt.pt'), map_location='cpu', weights_only=True)
    return json.dumps([r['data'] for r in ckpt['rng']], sort_keys=True, default=str)


@pytest.mark.slow
def test_same_seed_same_data_order(swept):
    """train.py's data sampler is seeded by the seed alone: after the same number of batches its RNG is
    in the same state in both variants with that seed (so they drew the same batches: the generator's
    step is a bijection), and in a different one for the other seed."""
    states = {(v, s): data_rng_states(os.path.join(swept[0], f"{v}-L2-s{s}")) for v in ('baseline', 'lime')
              for s in (0, 1)}
    assert states['baseline', 0] == states['lime', 0] and states['baseline', 1] == states['lime', 1]
    assert states['lime', 0] != states['lime', 1]


@pytest.mark.slow
def test_one_sweep_per_out_dir_and_report_only_alongside(swept, run_here, capsys):
    """While another process holds the sweep's directory (an exclusive flock on <out_dir>/.lock holding its
    pid), a second sweep stops at once with one line naming both; report_only still reads."""
    root, args, _, _ = swept
    rows = read_csv(os.path.join(root, 'sweep.csv'))
    with open(os.path.join(root, '.lock'), 'a+') as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        p = run('sweep.py', *args)
        assert p.returncode == 1 and p.stdout == ''
        assert p.stderr == f"error: out_dir {root} is in use by another process (pid {os.getpid()}); wait for it to end, " \
                           "or use another out_dir\n"
        os.remove(os.path.join(root, 'sweep.csv'))
        assert run_here('sweep.py', *args, '--report_only=True') == 0
        assert 'already done' not in capsys.readouterr().out and read_csv(os.path.join(root, 'sweep.csv')) == rows


def copy_of(root, tmp_path, name):
    """A copy of a sweep's directory (its runs keep their results; their out_dir moves, which may change)."""
    shutil.copytree(root, tmp_path / name, ignore=shutil.ignore_patterns('.lock'))
    return str(tmp_path / name)


@pytest.mark.slow
def test_rerun_trains_nothing_and_changed_options_are_refused(swept, run_here, capsys, tmp_path):
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    for d in os.listdir(again):  # as the sweep.py before this one wrote it: its runs count as done too
        if '-L' in d:
            state = json.load(open(os.path.join(again, d, 'sweep.json')))
            with open(os.path.join(again, d, 'sweep.json'), 'w') as f:
                json.dump({**state, 'error': None, 'command': 'python train.py ...'}, f, indent=1)
    files = [os.path.join(d, f) for d, _, names in os.walk(again) for f in names if f in ('ckpt.pt', 'log.jsonl')]
    mtimes = {f: os.stat(f).st_mtime_ns for f in files}
    assert run_here('sweep.py', *args, f'--out_dir={again}') == 0
    assert '4 already done, 0 to evaluate, 0 to resume, 0 to start' in capsys.readouterr().out
    assert {f: os.stat(f).st_mtime_ns for f in files} == mtimes
    # another learning rate: no run is skipped as done or resumed with it
    other = copy_of(root, tmp_path, 'other')
    assert run_here('sweep.py', *args, f'--out_dir={other}', '--learning_rate=0.01') == 1
    out, err = capsys.readouterr()
    assert "0 already done, 0 to evaluate, 0 to resume, 0 to start, 4 refused" in out
    assert re.search(r"lime-L2-s1 was trained with other options \(learning_rate=0.002 there, 0.01 now\)", err)
    # the finished runs' rows stay in sweep.csv as they were (only out_dir follows the copy): a refusal loses nothing
    was = {r['variant'] + r['seed']: {**r, 'out_dir': os.path.basename(r['out_dir'])}
           for r in read_csv(os.path.join(root, 'sweep.csv'))}
    now = {r['variant'] + r['seed']: {**r, 'out_dir': os.path.basename(r['out_dir'])}
           for r in read_csv(os.path.join(other, 'sweep.csv'))}
    assert now == was and {r['status'] for r in now.values()} == {'done'}


@pytest.mark.slow
def test_a_second_command_keeps_the_first_ones_rows(swept, run_here, capsys, tmp_path):
    """An arm added to an out_dir by a second command: sweep.csv keeps the first command's rows of the runs it
    does not name (as written, but for best_of_arm), best_of_arm spans both commands' settings of arm lime, and a
    run directory deleted drops its row."""
    root, args, _, _ = swept
    both = copy_of(root, tmp_path, 'both')
    first = {(r['variant'], r['seed']): r for r in read_csv(os.path.join(both, 'sweep.csv'))}
    second = [a for a in args if not a.startswith(('--variants=', '--out_dir='))]
    second += ['--variants=baseline,lime~learning_rate=4e-3', f'--out_dir={both}', '--plot=False']
    assert run_here('sweep.py', *second) == 0
    assert '2 already done, 0 to evaluate, 0 to resume, 2 to start' in capsys.readouterr().out
    by = {(r['variant'], r['seed']): r for r in read_csv(os.path.join(both, 'sweep.csv'))}
    settings = ('lime', 'lime~learning_rate=4e-3')
    assert sorted(by) == sorted((v, s) for v in ('baseline', *settings) for s in '01')
    for s in '01':
        kept, was = by['lime', s], first['lime', s]
        assert {**kept, 'best_of_arm': ''} == {**was, 'best_of_arm': ''} and kept['out_dir'] == f'lime-L2-s{s}'
    best = min(settings, key=lambda v: sum(float(by[v, s]['val_loss']) for s in '01'))
    assert {(v, s): by[v, s]['best_of_arm'] for v in settings for s in '01'} == \
        {(v, s): str(v == best) for v in settings for s in '01'}
    shutil.rmtree(os.path.join(both, 'lime-L2-s1'))
    assert run_here('sweep.py', *second, '--report_only=True') == 0
    assert sorted(r['variant'] + r['seed'] for r in read_csv(os.path.join(both, 'sweep.csv'))) == [
        'baseline0', 'baseline1', 'lime0', 'lime~learning_rate=4e-30', 'lime~learning_rate=4e-31']


@pytest.mark.slow
def test_a_lower_max_iters_over_longer_runs_is_refused(swept, run_here, capsys, tmp_path):
    """Their evaluation at the lower max_iters is mid-schedule: not the result of a run that long."""
    root, args, _, _ = swept
    lower = copy_of(root, tmp_path, 'lower')
    assert run_here('sweep.py', *args, f'--out_dir={lower}', '--max_iters=2', '--lr_decay_iters=2') == 1
    out, err = capsys.readouterr()
    assert "0 already done, 0 to evaluate, 0 to resume, 0 to start, 4 refused" in out
    assert f"{lower}/lime-L2-s1 was trained to iter 3, past max_iters=2: its evaluation at 2 is not that of a " \
           "2-iteration run; rerun with --max_iters=3 or more, or use another out_dir" in err
    assert [r['status'] for r in read_csv(os.path.join(lower, 'sweep.csv'))] == ['done'] * 4  # kept, not replaced


@pytest.mark.slow
def test_a_run_killed_between_its_checkpoint_and_its_log_is_finished_by_a_rerun(swept, run_here, capsys, tmp_path):
    """A kill after the last checkpoint's write, before the log's: the log lacks the final evaluation. The rerun
    resumes the run (nothing to train) and the checkpoint's copy of the log completes it: done, not FAILED."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    run_dir = os.path.join(again, 'lime-L2-s0')
    final = read_log(run_dir)[-1]
    with open(os.path.join(run_dir, 'log.jsonl')) as f:
        lines = f.readlines()
    with open(os.path.join(run_dir, 'log.jsonl'), 'w') as f:
        f.writelines(lines[:-1])  # the log of the checkpoint before
    with open(os.path.join(run_dir, 'sweep.json'), 'w') as f:
        json.dump({'status': 'failed', 'max_iters': 3, 'wall_time_s': 1.0}, f)
    assert run_here('sweep.py', *args, f'--out_dir={again}') == 0
    assert '3 already done, 0 to evaluate, 1 to resume, 0 to start' in capsys.readouterr().out
    row = next(r for r in read_csv(os.path.join(again, 'sweep.csv')) if r['out_dir'] == 'lime-L2-s0')
    assert row['status'] == 'done' and float(row['val_loss']) == final['val_loss'] and read_log(run_dir)[-1] == final


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith('linux'), reason="a run learns of its sweep's death on Linux only")
@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL], ids=['SIGTERM', 'SIGKILL'])
def test_a_stopped_sweep_leaves_no_run_training(sig, data_dir, tmp_path):
    """SIGTERM (as a scheduler sends) is the sweep's Ctrl-C: its runs save and stop, and so does a run whose sweep
    was killed outright (kill -9): none trains on as an orphan."""
    root = tmp_path / 'root'
    run_dir = root / 'baseline-L1-s0'
    sweep = subprocess.Popen([sys.executable, 'sweep.py', '--depths=1', '--variants=baseline', '--seeds=0', *TINY,
                              f'--data_dir={data_dir}', f'--out_dir={root}', '--max_iters=100000',
                              '--lr_decay_iters=100000', '--eval_interval=100000', '--plot=False'],
                             cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and 'iter 2:' not in (read(run_dir / 'train.log') or ''):
            time.sleep(0.2)
        pid = int(read(run_dir / '.lock'))  # the run's train.py holds its out_dir
        sweep.send_signal(sig)
        out, err = sweep.communicate(timeout=120)
        while time.time() < deadline and alive(pid):
            time.sleep(0.2)
        assert not alive(pid), 'the run trains on without its sweep'
    finally:
        if sweep.poll() is None:
            sweep.kill()
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert 'interrupted at iter' in read(run_dir / 'train.log')  # it saved a checkpoint
    if sig == signal.SIGTERM:
        assert sweep.returncode == 130 and 'interrupted: the running runs saved a checkpoint' in err


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def alive(pid):
    """Whether process `pid` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False


# LIMe runs of train.py at depth 2 get a NaN loss at their first training step: a deterministic failure
NAN_FOR_DEEP_LIME = """
import sys
if sys.argv[0].endswith('train.py') and '--lime=True' in sys.argv and '--n_layer=2' in sys.argv:
    import model
    _forward = model.GPT.forward
    def forward(self, *args, **kwargs):
        logits, loss = _forward(self, *args, **kwargs)
        return logits, loss * float('nan') if self.training else loss
    model.GPT.forward = forward
"""


@pytest.fixture(scope='module')
def resumed_and_failed(data_dir, tmp_path_factory):
    """Baseline and LIMe at depths 1 and 2, seed 0, 6 iterations, logged to pipes: baseline-L1-s0 was
    interrupted after 3 (a checkpoint at iter 3), and LIMe's loss at depth 2 is NaN from its first step on."""
    tmp = tmp_path_factory.mktemp('sweep')
    (tmp / 'patch').mkdir()
    (tmp / 'patch' / 'sitecustomize.py').write_text(NAN_FOR_DEEP_LIME)
    root = str(tmp / 'root')
    train_args = [*TINY, f'--data_dir={data_dir}', '--lr_decay_iters=6', '--eval_interval=3']
    assert script_here('train.py', *train_args, '--lime=False', '--n_layer=1', '--seed=0', '--max_iters=3',
                       f"--out_dir={os.path.join(root, 'baseline-L1-s0')}")[0] == 0
    before = read_log(os.path.join(root, 'baseline-L1-s0'))
    # the sweep here, its runs (which PYTHONPATH patches) as processes
    p = subprocess.CompletedProcess([], *script_here(
        'sweep.py', '--depths=1,2', '--variants=baseline,lime', '--seeds=0', '--jobs=2', f'--out_dir={root}',
        '--max_iters=6', *train_args, env={'PYTHONPATH': f"{tmp / 'patch'}{os.pathsep}{REPO}"}))
    return root, before, p


@pytest.mark.slow
def test_interrupted_run_is_resumed(resumed_and_failed):
    root, before, p = resumed_and_failed
    assert '0 already done, 0 to evaluate, 1 to resume, 3 to start' in p.stdout
    run_dir = os.path.join(root, 'baseline-L1-s0')
    with open(os.path.join(run_dir, 'train.log')) as f:
        assert 'resuming from' in f.read()
    log = read_log(run_dir)
    assert [r['iter'] for r in log] == [0, 1, 2, 3, 4, 5, 6]
    assert log[:4] == before  # the first three iterations were not trained again
    rows = {os.path.basename(r['out_dir']): r for r in read_csv(os.path.join(root, 'sweep.csv'))}
    row = rows['baseline-L1-s0']
    assert row['status'] == 'done' and float(row['val_loss']) == log[-1]['val_loss']
    assert rows['lime-L1-s0']['compute_multiplier'] != ''  # against the resumed run's whole curve
    # logged to files: no progress bar, one line per run that ended
    assert '\r' not in p.stdout + p.stderr
    assert len(re.findall(r'^(?:done|FAILED) \S+ \(\d/4\)', p.stdout + p.stderr, re.M)) == 4


@pytest.mark.slow
def test_failed_run_is_reported_and_the_others_finish(resumed_and_failed):
    root, _, p = resumed_and_failed
    assert p.returncode == 1 and 'Traceback' not in p.stderr
    # the failure with train.py's error line: once while the sweep runs, once at the end
    lines = [l for l in p.stderr.splitlines() if 'lime-L2-s0' in l and 'error: loss is nan at iter 1' in l]
    assert len(lines) == 2 and lines[-1] == p.stderr.strip().splitlines()[-1], p.stderr
    status = {os.path.basename(r['out_dir']): r['status'] for r in read_csv(os.path.join(root, 'sweep.csv'))}
    assert status == {'baseline-L1-s0': 'done', 'lime-L1-s0': 'done', 'baseline-L2-s0': 'done', 'lime-L2-s0': 'failed'}
    assert re.search(r'2\s+lime\s+0\s+\(no finished runs\)', p.stdout)


# ----------------------------------------------------------------------------- checks before any run
def test_bad_input_is_refused_before_any_run(run_here, data_dir, tmp_path):
    tiny = [*TINY, f'--data_dir={data_dir}', '--variants=baseline']  # one variant: one check by train.py
    for k, (args, message) in enumerate([
        (['--learnig_rate=1e-3'], "unknown config key 'learnig_rate' (--learnig_rate=1e-3); did you mean "
                                  "'learning_rate'?"),  # train.py's check
        (['--dept=2,4'], "unknown config key 'dept' (--dept=2,4); did you mean 'depths'?"),  # the sweep's keys too
        ([f'--data_dir={tmp_path}'], "dataset 'shakespeare_char' is not prepared"),
        (['--variants=baseline,lime:frist-2'], "variant lime:frist-2: invalid model config: unknown router 'frist-2'"),
        (['--variants=baseline,lmie'], "unknown variant 'lmie' in 'lmie'; did you mean 'lime'?"),
        (['--variants=baseline:first-2'], "variant 'baseline:first-2': 'baseline:first-2' takes no such mode"),
        (['--variants=lime,lime'], "variants='lime,lime': expected distinct comma-separated names"),
        (['--depths=2,x'], "depths='2,x': expected distinct comma-separated integers >= 1"),
        (['--depths=0'], "depths='0': expected distinct comma-separated integers >= 1"),
        (['--seeds=0,00'], "seeds='0,00': expected distinct comma-separated integers >= 0"),  # one run dir for two
        (['--jobs=-1'], "out_dir="),
        (['--variants=baseline,lime@'], "variant 'lime@': no router init after '@'"),  # as lime: and lime~ are
        (['--variants=baseline,lime~depths=4'], "variant 'lime~depths=4': depths is the sweep's own option, not "
                                                "train.py's: give it once, to the sweep (--depths=...)"),
        ([f"--variants=baseline,lime~wandb_run_name={'x' * 250}"], f"variant 'lime~wandb_run_name={'x' * 250}': its "
         f"run directory's name (lime_wandb_run_name_{'x' * 250}-L2-s0) would be 276 bytes, over the 255"),
    ]):
        root = tmp_path / f'root{k}'
        with pytest.raises(common.UserError) as e:
            run_here('sweep.py', '--depths=2', f'--out_dir={root}', *tiny, *args)
        assert str(e.value).startswith(message), (args, str(e.value))
        assert args != ['--jobs=-1'] or 'jobs=-1' in str(e.value) and 'jobs >= 0' in str(e.value)
        assert not root.exists()  # no run started, and out_dir not claimed: a refusal leaves nothing behind


def test_variant_names():
    """A variant name (nanolime/variants.py's grammar, tested in tests/test_variants.py) gives train.py's options: the
    model's, then those after '~', which may not be the ones the sweep sets per run or its schedule."""
    options, plain = sweep_runs.variant_options, variants.VARIANT_PLAIN
    assert options('baseline') == plain
    assert options('lime:last-2@identity') == {**plain, 'lime': True, 'router': 'last-2', 'router_init': 'identity'}
    assert options('lime~router_lr=0.002') == {**plain, 'lime': True, 'router_lr': '0.002'}  # as on train.py's line
    assert options('mhc:static+lime') == {**plain, 'hc': 4, 'mhc': 'static', 'lime': True}
    for bad in ('lime~n_layer=8', 'baseline~out_dir=x', 'lime~seed=3'):
        with pytest.raises(common.UserError, match="expected '~key=value' with a train.py option other than"):
            options(bad)
    with pytest.raises(common.UserError, match="'~hc=2' sets hc, which the name sets"):
        options('lime~hc=2')  # a model option of the name's (nanolime/variants.py)
    for key in ('max_iters', 'lr_decay_iters', 'warmup_iters', 'decay_lr'):
        with pytest.raises(common.UserError, match=r"the schedule \(max_iters, lr_decay_iters, warmup_iters, "
                                                   r"decay_lr\) is the sweep's"):
            options(f'lime~{key}=5')


@pytest.mark.slow
def test_budgets_reuse_finished_runs_and_fit_the_multiplier(swept, run_here, capsys, tmp_path):
    """Rerunning a finished sweep with --budgets trains only the control's new budgets (a complete run each,
    its schedule scaled), reuses every finished run, and fits the multiplier through the control's final
    losses at every budget (here 2 and 3 iterations; 3 is max_iters: the control's own run)."""
    root, args, _, _ = swept
    copy = str(tmp_path / 'root')
    shutil.copytree(root, copy)
    args = [a for a in args if not a.startswith('--out_dir=')] + [f'--out_dir={copy}', '--budgets=2,3', '--plot=False']
    assert run_here('sweep.py', *args) == 0
    out = capsys.readouterr().out
    assert "6 runs in" in out and "4 already done, 0 to evaluate, 0 to resume, 2 to start" in out
    rows = read_csv(os.path.join(copy, 'sweep.csv'))
    budget = {int(r['seed']): r for r in rows if r['budget']}
    assert sorted(budget) == [0, 1] and all(r['budget'] == '2' and r['variant'] == 'baseline' for r in budget.values())
    for s, r in budget.items():
        assert r['out_dir'] == f"baseline-L2-s{s}-i2" and r['status'] == 'done'
        assert read_log(os.path.join(copy, r['out_dir']))[-1]['iter'] == 2
        with open(os.path.join(copy, r['out_dir'], 'train.log')) as f:
            assert '--max_iters=2 --lr_decay_iters=2' in f.readline()  # its own schedule
    main = {(r['variant'], int(r['seed'])): r for r in rows if not r['budget']}
    points = {s: [(int(r['train_flops']), float(r['val_loss'])) for r in (main['baseline', s], budget[s])]
              for s in (0, 1)}
    fit = sweep_multipliers.fit_power_law(points)
    for s in (0, 1):
        r = main['lime', s]
        if fit is None:
            assert r['compute_multiplier'] == ''
            continue
        want = sweep_multipliers.fitted_multiplier(fit, s, float(r['val_loss']), int(r['train_flops']))
        assert float(r['compute_multiplier']) == pytest.approx(want[0], rel=1e-6)
        assert r['multiplier_note'] == ('fitted' if want[1] == 1.0 else f"extrapolated x{want[1]:.2f}")
    assert "compute multiplier (x baseline FLOPs, fitted over 2 budgets)" in out
    # run again: nothing to train
    assert run_here('sweep.py', *args) == 0 and "6 already done" in capsys.readouterr().out

# ----------------------------------------------------------------------------- arithmetic
@pytest.fixture(scope='module')
def arithmetic_swept(tmp_path_factory):
    """One run on the arithmetic task's tiers 2 and 3, scored by study/arithmetic.py after training."""
    from study import arithmetic
    tmp = tmp_path_factory.mktemp('arith')
    arithmetic.prepare(str(tmp / 'data' / 'arithmetic-2-3'), samples=200, n_val=20, n_test=10, tiers=(2, 3))
    args = ['--depths=2', '--variants=baseline', '--seeds=0', '--dataset=arithmetic-2-3', f"--data_dir={tmp / 'data'}",
            *TINY, '--block_size=32', '--total_batch_size=128', '--max_iters=2', '--lr_decay_iters=2',
            '--eval_interval=2']
    root = str(tmp / 'root')
    return root, args, ok(subprocess.CompletedProcess([], *script_here('sweep.py', *args, f'--out_dir={root}')))


@pytest.mark.slow
def test_arithmetic_runs_get_accuracy_per_tier(arithmetic_swept):
    """The accuracy per tier and the majority answer's go into the CSV and a table per tier."""
    root, _, p = arithmetic_swept
    rows = read_csv(os.path.join(root, 'sweep.csv'))
    with open(os.path.join(root, 'baseline-L2-s0', 'arith_eval_test.json')) as f:
        tiers = json.load(f)['per_tier']
    assert len(rows) == 1 and list(rows[0])[len(COLUMNS):] == ['acc_2', 'majority_2', 'acc_3', 'majority_3', 'best_of_arm']
    for n in (2, 3):
        assert float(rows[0][f'acc_{n}']) == tiers[str(n)]['accuracy'] and tiers[str(n)]['n'] == 10
        assert float(rows[0][f'majority_{n}']) == tiers[str(n)]['majority_answer']
        table = p.stdout.split(f'test accuracy, {n} operators')[1]
        line = next(l for l in table.splitlines() if re.match(r'\s*2\s+baseline\s+1\s', l))
        assert f"{tiers[str(n)]['majority_answer']:.4f}: " in line
    assert 'vs majority answer' in p.stdout


@pytest.mark.slow
def test_a_run_without_its_score_is_scored_not_trained_again(arithmetic_swept, run_here, capsys, tmp_path):
    root, args, _ = arithmetic_swept
    again = copy_of(root, tmp_path, 'again')
    os.remove(os.path.join(again, 'baseline-L2-s0', 'arith_eval_test.json'))
    assert run_here('sweep.py', *args, f'--out_dir={again}') == 0
    assert '0 already done, 1 to evaluate, 0 to resume, 0 to start' in capsys.readouterr().out
    assert os.path.exists(os.path.join(again, 'baseline-L2-s0', 'arith_eval_test.json'))
    with open(os.path.join(again, 'baseline-L2-s0', 'train.log')) as f:
        logged = [l.split()[1:] for l in f if l.startswith('$ ')]
    # the script (train.py) or the module (python -m study.arithmetic, the repository on PYTHONPATH) each ran
    assert [os.path.basename(w[1]) for w in logged[:1]] + [w[3] for w in logged[1:]] == \
        ['train.py', 'study.arithmetic', 'study.arithmetic']
    assert all(w[0].startswith(f'PYTHONPATH={REPO}') and w[2] == '-m' for w in logged[1:])


# ----------------------------------------------------------------------------- one run per GPU
# In place of training, each train.py run records the GPU it sees (CUDA_VISIBLE_DEVICES) and holds a marker file
# for that GPU for a second: a run started on a GPU in use finds the marker taken and records that it shares it.
# Then it writes the log of a finished run, as far as the sweep reads it, and exits.
GPU_GUARD = """
import json, os, sys, time
if sys.argv[0].endswith('train.py'):
    gpu, root = os.environ.get('CUDA_VISIBLE_DEVICES', 'none'), os.environ['GPU_GUARD_DIR']
    marker = os.path.join(root, 'busy-' + gpu)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        alone = True
    except FileExistsError:
        alone = False
    with open(os.path.join(root, 'runs'), 'a') as f:
        print(gpu, 'alone' if alone else 'shared', sum(n.startswith('busy-') for n in os.listdir(root)), file=f)
    time.sleep(1.0)  # the other runs start meanwhile
    args = dict(a[2:].split('=', 1) for a in sys.argv[1:] if a.startswith('--') and '=' in a)
    with open(os.path.join(args['out_dir'], 'log.jsonl'), 'w') as f:
        for it in (0, int(args['max_iters'])):
            print(json.dumps({'iter': it, 'tokens': it, 'flops': it, 'val_loss': 1.0}), file=f)
    if alone:
        os.remove(marker)
    os._exit(0)
"""


def two_gpus(tmp_path, monkeypatch, runs):
    """A machine whose torch.cuda reports two GPUs (patched), its train.py runs replaced by `runs` (a
    sitecustomize module), which note what they see in a directory of their own: (that directory, PYTHONPATH)."""
    (tmp_path / 'patch').mkdir()
    (tmp_path / 'patch' / 'sitecustomize.py').write_text(runs)
    (tmp_path / 'guard').mkdir()
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    return tmp_path / 'guard', f"{tmp_path / 'patch'}{os.pathsep}{REPO}"


@pytest.mark.slow
def test_gpus_one_run_per_gpu_at_a_time(data_dir, tmp_path, monkeypatch):
    """--gpus=0,1 on a machine whose torch.cuda reports two GPUs (patched), and whose sweep was itself given
    GPUs 5 and 7 (CUDA_VISIBLE_DEVICES): three runs, two at a time, each on a GPU no other run is using,
    and each seeing only that GPU (GPU_GUARD runs instead of training)."""
    guard, path = two_gpus(tmp_path, monkeypatch, GPU_GUARD)
    root = str(tmp_path / 'root')
    code, stdout, stderr = script_here(
        'sweep.py', '--depths=1', '--variants=baseline', '--seeds=0,1,2', '--gpus=0,1', f'--out_dir={root}', *TINY,
        f'--data_dir={data_dir}', '--max_iters=1', '--decay_lr=False', '--eval_interval=1', '--eval_iters=1',
        '--plot=False', env={'PYTHONPATH': path, 'GPU_GUARD_DIR': guard, 'CUDA_VISIBLE_DEVICES': '5,7'})
    assert code == 0, stderr
    assert '2 at a time' in stdout and 'on GPUs 0,1' in stdout
    runs = [line.split() for line in (guard / 'runs').read_text().splitlines()]
    assert len(runs) == 3 and {gpu for gpu, _, _ in runs} == {'5', '7'}, runs
    assert all(alone == 'alone' for _, alone, _ in runs), runs  # never two runs on one GPU
    assert max(int(n) for _, _, n in runs) == 2, runs  # both GPUs busy at once
    for s in (0, 1, 2):
        with open(os.path.join(root, f'baseline-L1-s{s}', 'train.log')) as f:
            assert re.match(r'\$ CUDA_VISIBLE_DEVICES=[57] ', f.readline())


def test_gpus_that_are_not_there_are_refused(data_dir, tmp_path, run_here, monkeypatch):
    tiny = [*TINY, f'--data_dir={data_dir}', '--depths=1', '--variants=baseline']
    for k, (gpus, args, message) in enumerate([
            (0, ['--gpus=0'], "gpus=0: this machine has 0 CUDA GPUs"),
            (2, ['--gpus=0,2'], "gpus=0,2: this machine has 2 CUDA GPUs"),
            (2, ['--gpus=0,0'], "gpus='0,0': expected distinct comma-separated integers >= 0"),
            (2, ['--gpus=0,1', '--device=cuda:1'], "gpus=0,1: each run sees only its own GPU, as cuda: leave "
                                                   "--device=cuda:N out")]):
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: gpus)
        root = tmp_path / f'root{k}'
        with pytest.raises(common.UserError) as e:
            run_here('sweep.py', f'--out_dir={root}', *tiny, *args)
        assert str(e.value).startswith(message), (args, str(e.value))
        assert not root.exists()


def test_torchrun_or_several_ranks_are_refused(data_dir, tmp_path):
    """torchrun (or a job of several ranks) would start a whole sweep on every rank: one line, nothing claimed."""
    root = tmp_path / 'root'
    for job in (dict(TORCHELASTIC_RUN_ID='job', RANK=1, LOCAL_RANK=1, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2,
                     MASTER_ADDR='127.0.0.1', MASTER_PORT=29511),  # torchrun --nproc_per_node=2 sweep.py
                dict(TORCHELASTIC_RUN_ID='job', RANK=0, LOCAL_RANK=0, WORLD_SIZE=1),  # torchrun --nproc_per_node=1
                dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=4)):  # a scheduler's job of four tasks
        with pytest.raises(common.UserError) as e:
            script_here('sweep.py', '--depths=1', '--variants=baseline', f'--out_dir={root}', *TINY,
                        f'--data_dir={data_dir}', env=job)
        assert str(e.value).startswith("sweep.py was started by torchrun or as one rank of several: it is one "
                                       "process that starts its own runs; start it once with python sweep.py")
        assert not root.exists()


@pytest.mark.slow
def test_runs_are_not_ranks_of_the_job_that_started_the_sweep(data_dir, tmp_path):
    """A sweep started as the one process of a scheduler's job (RANK, LOCAL_RANK, WORLD_SIZE=1 set, no MASTER_ADDR)
    trains and checks its runs as single processes: with those variables passed on, a run would look for the rank 0
    it is to meet and refuse to start."""
    root = str(tmp_path / 'root')
    ok(run('sweep.py', '--depths=1', '--variants=baseline', '--seeds=0', f'--out_dir={root}', *TINY,
           f'--data_dir={data_dir}', '--max_iters=1', '--decay_lr=False', '--eval_interval=1', '--plot=False',
           env=dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, GROUP_RANK=0), timeout=300))
    with open(os.path.join(root, 'baseline-L1-s0', 'train.log')) as f:
        assert 'x 1 ranks' in f.read()


@pytest.mark.slow
def test_a_longer_run_keeps_its_schedule_and_another_schedule_is_refused(swept, run_here, capsys, tmp_path):
    """A rerun with max_iters raised alone continues the finished runs on their own lr schedule (past
    lr_decay_iters at min_lr, exactly as a fresh run that long: same loss); sweep.csv records each run's
    schedule. Raised with lr_decay_iters, it would restart the schedule mid-run: refused before any work."""
    root, args, _, _ = swept
    longer = copy_of(root, tmp_path, 'longer')
    assert run_here('sweep.py', *args, f'--out_dir={longer}', '--max_iters=5', '--plot=False') == 0
    assert '0 already done, 0 to evaluate, 4 to resume, 0 to start' in capsys.readouterr().out
    rows = {os.path.basename(r['out_dir']): r for r in read_csv(os.path.join(longer, 'sweep.csv'))}
    assert {(r['max_iters'], r['lr_decay_iters'], r['warmup_iters']) for r in rows.values()} == {('5', '3', '1')}
    fresh = str(tmp_path / 'fresh')
    one = [a for a in args if not a.startswith(('--out_dir', '--variants', '--seeds'))]
    assert run_here('sweep.py', *one, '--variants=lime', '--seeds=1', f'--out_dir={fresh}', '--max_iters=5',
                    '--plot=False') == 0
    capsys.readouterr()
    assert read_csv(os.path.join(fresh, 'sweep.csv'))[0]['val_loss'] == rows['lime-L2-s1']['val_loss']
    other = copy_of(root, tmp_path, 'other')
    assert run_here('sweep.py', *args, f'--out_dir={other}', '--max_iters=5', '--lr_decay_iters=5') == 1
    out, err = capsys.readouterr()
    assert '0 to resume, 0 to start, 4 refused' in out
    assert f"{other}/lime-L2-s1 was trained with another lr schedule (lr_decay_iters=3 there, 5 now): continued, " \
           "its lr would restart mid-run" in err


def test_variants_that_would_share_a_run_directory_are_refused(run_here, data_dir, tmp_path):
    root = tmp_path / 'root'
    with pytest.raises(common.UserError) as e:
        run_here('sweep.py', '--depths=1', f'--out_dir={root}', *TINY, f'--data_dir={data_dir}',
                 '--variants=lime~data_dir=/d/a_b,lime~data_dir=/d/a/b')
    assert str(e.value) == (f"variants 'lime~data_dir=/d/a_b' and 'lime~data_dir=/d/a/b' would share the run "
                            f"directory {root}/lime_data_dir__d_a_b-L1-s0 (characters other than letters, digits and "
                            "+ _ . - become _ in it): make them differ in other characters")
    assert not root.exists()


def test_file_problems_are_one_line(run_here, data_dir, tmp_path):
    """out_dir a file or read-only, sweep.csv a directory, a run directory that is a file, a report of a
    directory that is not there, max_iters=0: each one line saying what to do, nothing trained or created."""
    tiny = ['--depths=1', '--variants=baseline', '--seeds=0', *TINY, f'--data_dir={data_dir}', '--max_iters=1',
            '--decay_lr=False', '--plot=False']
    a_file = tmp_path / 'a_file'
    a_file.write_text('')
    with pytest.raises(common.UserError, match=f"cannot write into out_dir={a_file}: it is a file, not a directory"):
        run_here('sweep.py', f'--out_dir={a_file}', *tiny)
    csv_dir = tmp_path / 'csv_dir'
    (csv_dir / 'sweep.csv').mkdir(parents=True)
    with pytest.raises(common.UserError, match=f"{csv_dir}/sweep.csv is a directory: move it away"):
        run_here('sweep.py', f'--out_dir={csv_dir}', *tiny)
    missing = tmp_path / 'mistyped'
    with pytest.raises(common.UserError, match=f"out_dir {missing} is no directory: nothing to report"):
        run_here('sweep.py', f'--out_dir={missing}', *tiny, '--report_only=True')
    assert not missing.exists()
    with pytest.raises(common.UserError, match="max_iters=0: a sweep compares trained runs; give max_iters >= 1"):
        run_here('sweep.py', f"--out_dir={tmp_path / 'zero'}", *tiny, '--max_iters=0')
    assert not (tmp_path / 'zero').exists()
    run_file = tmp_path / 'run_file'
    run_file.mkdir()
    (run_file / 'baseline-L1-s0').write_text('')
    assert run_here('sweep.py', f'--out_dir={run_file}', *tiny) == 1
    assert read_csv(run_file / 'sweep.csv')[0]['status'] == 'refused'
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / 'ro'
        ro.mkdir(mode=0o500)
        with pytest.raises(common.UserError, match=f"cannot write into out_dir={ro}"):
            run_here('sweep.py', f'--out_dir={ro}', *tiny)


@pytest.mark.slow
def test_a_damaged_sweep_json_is_said_and_repaired(swept, run_here, capsys, tmp_path):
    """report_only: the run is 'unknown', with a warning naming the file; a sweep checks the run (train.py has
    nothing left to do) and writes it anew: done, with its result."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    state = os.path.join(again, 'lime-L2-s0', 'sweep.json')
    for damage, what in [('{"status": "do', 'not a JSON object'), ('[1, 2]', 'not a JSON object'),
                         ('{"status": "done", "max_iters": 3, "wall_time_s": "12 s"}', 'its wall_time_s is "12 s", not '
                                                                                       'a number'),
                         ('{"status": ["done"], "max_iters": 3}', 'its status is ["done"], not a string')]:
        with open(state, 'w') as f:
            f.write(damage)
        assert run_here('sweep.py', *args, f'--out_dir={again}', '--report_only=True', '--plot=False') == 0
        out, err = capsys.readouterr()
        assert f"warning: {state} is damaged ({what}): its run is reported as 'unknown'" in err, err
        row = next(r for r in read_csv(os.path.join(again, 'sweep.csv')) if r['out_dir'].endswith('lime-L2-s0'))
        assert row['status'] == 'unknown'
    assert run_here('sweep.py', *args, f'--out_dir={again}', '--plot=False') == 0
    assert '3 already done, 0 to evaluate, 1 to resume' in capsys.readouterr().out
    rows = read_csv(os.path.join(again, 'sweep.csv'))
    assert [r['status'] for r in rows] == ['done'] * 4


DELETES_ITS_RUN = """
import os, shutil, sys
if sys.argv[0].endswith('train.py'):
    shutil.rmtree(next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--out_dir=')))
    sys.exit(1)
"""


@pytest.mark.slow
def test_a_run_directory_deleted_while_the_sweep_runs_is_said_so(data_dir, tmp_path):
    (tmp_path / 'patch').mkdir()
    (tmp_path / 'patch' / 'sitecustomize.py').write_text(DELETES_ITS_RUN)
    root = tmp_path / 'root'
    code, out, err = script_here('sweep.py', '--depths=1', '--variants=baseline', '--seeds=0', f'--out_dir={root}',
                                 *TINY, f'--data_dir={data_dir}', '--max_iters=1', '--decay_lr=False', '--plot=False',
                                 env={'PYTHONPATH': f"{tmp_path / 'patch'}{os.pathsep}{REPO}"})
    assert code == 1 and f"{root}/baseline-L1-s0 was deleted while the sweep ran; rerun the sweep to train it " \
                          "again" in err, err


@pytest.mark.slow
def test_a_completep_variant_reaches_train_py(run_here, data_dir, tmp_path):
    """CompleteP through a variant's '~' options: its runs train with depth_scaling='completep' and its depth_base,
    whatever their depth (the depth sweep it is for)."""
    root = str(tmp_path / 'root')
    variant = 'lime~depth_scaling=completep~depth_base=1~wandb_run_name=my run'  # a space in a value is the value's
    assert run_here('sweep.py', '--depths=2', f'--variants=baseline, {variant}', '--seeds=0', *TINY,
                    f'--data_dir={data_dir}', f'--out_dir={root}', '--max_iters=2', '--lr_decay_iters=2',
                    '--eval_interval=1', '--plot=False') == 0
    rows = {r['variant']: r for r in read_csv(os.path.join(root, 'sweep.csv'))}
    ckpt = torch.load(os.path.join(root, rows[variant]['out_dir'], 'ckpt.pt'), weights_only=True)
    args = ckpt['model_args']
    assert (args['depth_scaling'], args['depth_base'], args['n_layer'], args['lime']) == ('completep', 1, 2, True)
    assert ckpt['config']['wandb_run_name'] == 'my run'
    assert rows[variant]['out_dir'] == 'lime_depth_scaling_completep_depth_base_1_wandb_run_name_my_run-L2-s0'
    assert rows['baseline']['status'] == rows[variant]['status']


@pytest.mark.slow
def test_a_rerun_on_other_data_is_refused_and_rows_carry_the_data(swept, run_here, capsys, tmp_path):
    """The runs' results are those of the data they trained on: a rerun pointed at another dataset does not report
    them as done (nor resume them on it); the same data in another place is the same data. sweep.csv names it."""
    import prepare
    from nanolime import data
    root, args, _, _ = swept
    data_dir = next(a for a in args if a.startswith('--data_dir='))[len('--data_dir='):]
    rows = read_csv(os.path.join(root, 'sweep.csv'))
    ident = data.data_id(os.path.join(data_dir, 'shakespeare_char'))
    assert ident and {r['data'] for r in rows} == {ident}
    moved = str(tmp_path / 'moved')
    shutil.copytree(data_dir, moved)
    same = copy_of(root, tmp_path, 'same')
    assert run_here('sweep.py', *args, f'--out_dir={same}', f'--data_dir={moved}') == 0
    assert '4 already done' in capsys.readouterr().out
    other = str(tmp_path / 'other-data')
    prepare.prepare_char(prepare.read_shakespeare()[:100_000], os.path.join(other, 'shakespeare_char'))
    rerun = copy_of(root, tmp_path, 'rerun')
    assert run_here('sweep.py', *args, f'--out_dir={rerun}', f'--data_dir={other}') == 1
    out, err = capsys.readouterr()
    assert '0 already done, 0 to evaluate, 0 to resume, 0 to start, 4 refused' in out
    assert f"{rerun}/lime-L2-s1 was trained on other data (data {ident}; {other}/shakespeare_char is data " in err
    assert [r['status'] for r in read_csv(os.path.join(rerun, 'sweep.csv'))] == ['done'] * 4  # kept, not replaced


@pytest.mark.slow
def test_each_row_is_its_own_run_and_a_line_of_mixed_options_is_marked(swept, run_here, capsys, tmp_path):
    """A second command into the same out_dir at another learning_rate and width (seed 2): every row's
    learning_rate, options, parameter count and tokens per parameter are its own checkpoint's, in the second
    command's report, a report over both and a rerun that refuses the first command's runs; a table line that
    mixes the two settings is marked '!', names the options that differ and has no paired test."""
    from relatives import RelativesConfig, build_model
    root, args, _, _ = swept
    both = copy_of(root, tmp_path, 'both')
    second = [a for a in args if not a.startswith(('--seeds=', '--out_dir='))]
    second += [f'--out_dir={both}', '--learning_rate=2e-2', '--n_embd=32', '--plot=False']
    assert run_here('sweep.py', *second, '--seeds=2') == 0
    capsys.readouterr()

    def check_rows():
        rows = read_csv(os.path.join(both, 'sweep.csv'))
        assert sorted((r['variant'], r['seed']) for r in rows) == sorted((v, s) for v in ('baseline', 'lime')
                                                                          for s in '012')
        for r in rows:
            ckpt = torch.load(os.path.join(both, r['out_dir'], 'ckpt.pt'), weights_only=True)
            with torch.device('meta'):
                size = build_model(RelativesConfig(**ckpt['model_args'])).get_num_params(non_embedding=True)
            assert float(r['learning_rate']) == ckpt['config']['learning_rate'], r
            assert int(r['non_embedding_params']) == size and float(r['tokens_per_param']) == round(192 / size, 3), r
            options = json.loads(r['options'])
            assert {k: options[k] for k in ('learning_rate', 'n_embd', 'router_lr')} == \
                {k: ckpt['config'][k] for k in ('learning_rate', 'n_embd', 'router_lr')}, r
            assert not {'seed', 'n_layer', 'out_dir', 'max_iters', 'lime', 'router'} & set(options)  # the sweep's,
            # the variant name's and the length's
        return {(r['variant'], r['seed']): r for r in rows}
    by = check_rows()
    assert by['lime', '2']['learning_rate'] == '0.02' and by['lime', '1']['learning_rate'] == '0.002'
    assert by['lime', '2']['non_embedding_params'] != by['lime', '1']['non_embedding_params']
    assert run_here('sweep.py', *second, '--seeds=0,1,2', '--report_only=True') == 0
    out = capsys.readouterr().out
    check_rows()
    line = {v: next(l for l in out.splitlines() if re.match(rf'\s*2!?\s+{v}\s', l)) for v in ('baseline', 'lime')}
    assert line['baseline'].startswith('    2!') and line['lime'].startswith('    2!'), out
    assert not re.search(r'inside seed noise|better|worse|\d\.\d{3}\s+\d\.\d{3}', line['lime']), line['lime']
    marks = [l for l in out.splitlines() if l.startswith('! 2 layers, ')]
    assert len(marks) == 2 and all('learning_rate 0.002, 0.02' in l and 'n_embd 16, 32' in l for l in marks), out
    assert "no row here has two paired seeds of one experiment: no t test" in out  # the one line with pairs is left out
    # a rerun at the second command's options refuses the first command's runs and keeps their rows as they are
    assert run_here('sweep.py', *second, '--seeds=0,1,2') == 1
    assert '2 already done, 0 to evaluate, 0 to resume, 0 to start, 4 refused' in capsys.readouterr().out
    check_rows()


@pytest.mark.slow
def test_a_checkpoint_of_another_model_py_is_a_warning_and_its_row_kept(swept, run_here, capsys, tmp_path):
    """A finished run whose checkpoint has a model option this model.py lacks: the report and a rerun say so in
    a warning naming the file and the option, keep its row (its checkpoint's columns empty) and every other."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    path = os.path.join(again, 'lime-L2-s0', 'ckpt.pt')
    ckpt = torch.load(path, weights_only=True)
    ckpt['model_args']['router_temperature'] = 2.0
    torch.save(ckpt, path)
    for extra in (['--report_only=True'], []):
        assert run_here('sweep.py', *args, f'--out_dir={again}', '--plot=False', *extra) == 0
        out, err = capsys.readouterr()
        assert f"warning: {path}: model option 'router_temperature' is not one of this model.py's" in err, err
        rows = {os.path.basename(r['out_dir']): r for r in read_csv(os.path.join(again, 'sweep.csv'))}
        assert {r['status'] for r in rows.values()} == {'done'} and len(rows) == 4
        assert rows['lime-L2-s0']['learning_rate'] == rows['lime-L2-s0']['non_embedding_params'] == ''
        assert rows['lime-L2-s1']['learning_rate'] == '0.002' and rows['lime-L2-s0']['val_loss'] != ''
        assert '4/4 runs finished' in out


@pytest.mark.slow
def test_a_closed_pipe_ends_the_report_quietly(swept, tmp_path):
    """`sweep.py ... | head -1`: stdout a pipe whose reader is gone; no traceback, no BrokenPipeError line."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = run('sweep.py', *args, f'--out_dir={again}', '--report_only=True', '--plot=False', stdout=write_end,
                stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert p.returncode == 1 and p.stderr == '', p.stderr


@pytest.mark.slow
def test_runs_recorded_with_the_earlier_data_identity_are_this_data_s(swept, run_here, capsys, tmp_path, monkeypatch):
    """A run whose checkpoint and sweep.json hold the identity earlier versions gave the same data (its splits' ends
    only: data.ends_data_id) is done, not refused as other data, and its row carries the current identity: no '!'."""
    from nanolime import data
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    data_dir = next(a for a in args if a.startswith('--data_dir='))[len('--data_dir='):]
    ddir, current = os.path.join(data_dir, 'shakespeare_char'), read_csv(os.path.join(root, 'sweep.csv'))[0]['data']
    from nanolime import sweep_runs
    for module in (data, sweep_runs):  # the identity earlier versions gave a larger file: other than data_id's
        monkeypatch.setattr(module, 'ends_data_id', lambda d: 'e4d5e4d5e4d5' if d == ddir else None)
    run_dir = os.path.join(again, 'lime-L2-s1')
    ckpt = torch.load(os.path.join(run_dir, 'ckpt.pt'), weights_only=True)
    torch.save({**ckpt, 'data_id': 'e4d5e4d5e4d5'}, os.path.join(run_dir, 'ckpt.pt'))
    with open(os.path.join(run_dir, 'sweep.json')) as f:
        state = json.load(f)
    with open(os.path.join(run_dir, 'sweep.json'), 'w') as f:
        json.dump({**state, 'data': 'e4d5e4d5e4d5'}, f)
    assert run_here('sweep.py', *args, f'--out_dir={again}', '--plot=False') == 0
    out = capsys.readouterr().out
    assert '4 already done' in out and '!' not in out, out
    assert {r['data'] for r in read_csv(os.path.join(again, 'sweep.csv'))} == {current}
    torch.save({**ckpt, 'data_id': 'a1b2a1b2a1b2'}, os.path.join(run_dir, 'ckpt.pt'))  # other data stays refused
    assert run_here('sweep.py', *args, f'--out_dir={again}', '--plot=False') == 1
    assert f"{run_dir} was trained on other data (data a1b2a1b2a1b2;" in capsys.readouterr().err


@pytest.mark.slow
def test_a_closed_pipe_ends_a_sweep_quietly(swept, tmp_path):
    """`sweep.py ... | head -1` of a sweep that checks its runs with train.py first (in its own process): no
    'error: BrokenPipeError' from train.py's error hook, which that check installed."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = run('sweep.py', *args, f'--out_dir={again}', '--plot=False', stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert p.returncode == 1 and p.stderr == '', p.stderr


@pytest.mark.slow
def test_a_finished_run_whose_log_lost_its_end_is_said_and_restored(swept, run_here, capsys, tmp_path):
    """A finished run whose log.jsonl lost its last line, or the whole file: the report says so, naming the file;
    the next sweep resumes it (nothing to train) and train.py writes the log anew from its checkpoint's copy: done,
    result and all. A checkpoint without that copy: the run fails with one line naming the log."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    cut, gone = (os.path.join(again, name, 'log.jsonl') for name in ('lime-L2-s0', 'baseline-L2-s1'))
    whole = {path: open(path).read() for path in (cut, gone)}
    with open(cut, 'w') as f:
        f.write(whole[cut][:whole[cut].rstrip('\n').rfind('\n') + 1])
    os.remove(gone)
    assert run_here('sweep.py', *args, f'--out_dir={again}', '--report_only=True', '--plot=False') == 0
    err = capsys.readouterr().err
    for path in (cut, gone):
        assert f"warning: {path} lacks the final evaluation (iter 3) of a run its sweep.json says finished: " \
               "reported without it; rerun the sweep (without --report_only) to restore it" in err
    assert {r['out_dir']: r['status'] for r in read_csv(os.path.join(again, 'sweep.csv'))} == {
        'baseline-L2-s0': 'done', 'lime-L2-s0': 'incomplete', 'baseline-L2-s1': 'not run', 'lime-L2-s1': 'done'}
    assert run_here('sweep.py', *args, f'--out_dir={again}', '--plot=False') == 0
    out, err = capsys.readouterr()
    assert '2 already done, 0 to evaluate, 2 to resume, 0 to start' in out and 'warning' not in err
    assert all(open(path).read() == whole[path] for path in (cut, gone))
    # the same rows as before, wall times too: the resume that restored a log trained nothing
    assert read_csv(os.path.join(again, 'sweep.csv')) == read_csv(os.path.join(root, 'sweep.csv'))
    ckpt_path = os.path.join(again, 'lime-L2-s0', 'ckpt.pt')
    torch.save({**torch.load(ckpt_path, weights_only=True), 'log': None}, ckpt_path)  # as older checkpoints
    os.remove(cut)
    assert run_here('sweep.py', *args, f'--out_dir={again}', '--plot=False') == 1
    out, err = capsys.readouterr()
    assert '3 already done, 0 to evaluate, 1 to resume, 0 to start' in out
    assert f"  lime-L2-s0: exited normally, but {cut} holds no val loss at iter 3" in err.splitlines(), err


def test_check_only_checks_and_eval_only_and_overwrite_are_refused(run_here, data_dir, tmp_path, capsys):
    """--check_only=True: train.py checks every variant's options, nothing is claimed or run. eval_only and overwrite
    would make every run evaluate, or replace, instead of train: one line each, before anything. --skip leaves
    runs out; one that is not the sweep's is refused."""
    root = tmp_path / 'root'
    tiny = ['--depths=1,2', '--variants=baseline,lime', '--seeds=0,1', f'--out_dir={root}', *TINY,
            f'--data_dir={data_dir}', '--plot=False']
    assert run_here('sweep.py', *tiny, '--check_only=True', '--skip=lime-L2') == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        "checked by train.py: the options of baseline, lime; 6 runs, nothing started"
    assert not root.exists()
    for args, message in [(['--eval_only=True'], "eval_only=True: a sweep trains each run once"),
                          (['--overwrite=True'], "overwrite=True: a sweep trains each run once, evaluates it at its "
                                                 "end and never replaces it; to evaluate a run again: python train.py "
                                                 "--init_from=resume --eval_only=True --out_dir=<its directory>; to "
                                                 "train it again, delete its directory"),
                          (['--check_only=maybe'], "check_only='maybe'"),
                          (['--skip=lime-L4'], "skip='lime-L4': 'lime-L4' is no <variant>-L<depth> of this sweep's")]:
        with pytest.raises(common.UserError) as e:
            run_here('sweep.py', *tiny, *args)
        assert str(e.value).startswith(message), (args, str(e.value))
        assert not root.exists()


@pytest.mark.slow
def test_a_run_trained_with_overwrite_by_hand_is_the_same_experiment(swept, run_here, capsys, tmp_path):
    """overwrite and check_only change no experiment: a run whose checkpoint says overwrite=True (trained again by
    hand with --overwrite) is done, and its options column is the others'."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    path = os.path.join(again, 'lime-L2-s0', 'ckpt.pt')
    ckpt = torch.load(path, weights_only=True)
    torch.save({**ckpt, 'config': {**ckpt['config'], 'overwrite': True}}, path)
    assert run_here('sweep.py', *args, f'--out_dir={again}', '--plot=False') == 0
    assert '4 already done' in capsys.readouterr().out
    rows = {r['out_dir']: r for r in read_csv(os.path.join(again, 'sweep.csv'))}
    assert rows['lime-L2-s0']['options'] == rows['lime-L2-s1']['options']


# In place of training, a train.py run waits for SIGTERM (as train.py, which then saves a checkpoint and exits 130),
# noting that it got it
WAITS_FOR_SIGTERM = """
import os, signal, sys, time
if sys.argv[0].endswith('train.py'):
    out = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--out_dir='))
    def stop(signum, frame):
        open(os.path.join(out, 'stopped'), 'w').write(signal.Signals(signum).name)
        os._exit(130)
    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(0.1)
"""


@pytest.mark.slow
def test_a_deadline_stops_the_runs_and_starts_no_more(data_dir, tmp_path):
    """--deadline_s: once that long has passed since the first run started, the running runs get SIGTERM
    (train.py saves a checkpoint and stops), no run starts after it, the report is written and the sweep ends."""
    (tmp_path / 'patch').mkdir()
    (tmp_path / 'patch' / 'sitecustomize.py').write_text(WAITS_FOR_SIGTERM)
    root = tmp_path / 'root'
    code, out, err = script_here('sweep.py', '--depths=1', '--variants=baseline', '--seeds=0,1', '--jobs=1',
                                 f'--out_dir={root}', *TINY, f'--data_dir={data_dir}', '--max_iters=5',
                                 '--deadline_s=10', '--plot=False',
                                 env={'PYTHONPATH': f"{tmp_path / 'patch'}{os.pathsep}{REPO}"})
    assert code == 0, err
    assert "; deadline 10 s" in out and "deadline_s=10 passed: 1 run(s) stopped, 1 not started; rerun the same " \
                                       "command to go on" in out, out
    assert (root / 'baseline-L1-s0' / 'stopped').read_text() == 'SIGTERM'
    assert not (root / 'baseline-L1-s1').exists()
    assert {r['out_dir']: r['status'] for r in read_csv(root / 'sweep.csv')} == {
        'baseline-L1-s0': 'interrupted', 'baseline-L1-s1': 'not run'}


# In place of training, each train.py run marks that it runs on its GPU (CUDA_VISIBLE_DEVICES) and waits until
# GPU_GUARD_RUNS runs are running (30 s at most), notes how many it saw on each GPU, then writes the log of a
# finished run, as far as the sweep reads it
SHARES_GPUS = """
import json, os, sys, time
if sys.argv[0].endswith('train.py'):
    root, want = os.environ['GPU_GUARD_DIR'], int(os.environ['GPU_GUARD_RUNS'])
    open(os.path.join(root, f"busy-{os.environ.get('CUDA_VISIBLE_DEVICES', 'none')}-{os.getpid()}"), 'w').close()
    end = time.time() + 30
    while time.time() < end and len([n for n in os.listdir(root) if n.startswith('busy-')]) < want:
        time.sleep(0.05)
    busy = sorted(n.split('-')[1] for n in os.listdir(root) if n.startswith('busy-'))
    with open(os.path.join(root, 'seen'), 'a') as f:
        print(os.environ.get('CUDA_VISIBLE_DEVICES'), *busy, file=f)
    args = dict(a[2:].split('=', 1) for a in sys.argv[1:] if a.startswith('--') and '=' in a)
    with open(os.path.join(args['out_dir'], 'log.jsonl'), 'w') as f:
        for it in (0, int(args['max_iters'])):
            print(json.dumps({'iter': it, 'tokens': it, 'flops': it, 'val_loss': 1.0}), file=f)
    os._exit(0)
"""


@pytest.mark.slow
def test_jobs_above_the_gpus_put_several_runs_on_each(data_dir, tmp_path, monkeypatch):
    """--gpus=0,1 --jobs=4 (the sweep given GPUs 5 and 7): four runs at once, two on each GPU, each run seeing only
    its own."""
    guard, path = two_gpus(tmp_path, monkeypatch, SHARES_GPUS)
    code, stdout, stderr = script_here(
        'sweep.py', '--depths=1', '--variants=baseline', '--seeds=0,1,2,3', '--gpus=0,1', '--jobs=4',
        f"--out_dir={tmp_path / 'root'}", *TINY, f'--data_dir={data_dir}', '--max_iters=1', '--decay_lr=False',
        '--eval_interval=1', '--eval_iters=1', '--plot=False',
        env={'PYTHONPATH': path, 'GPU_GUARD_DIR': guard, 'GPU_GUARD_RUNS': 4, 'CUDA_VISIBLE_DEVICES': '5,7'})
    assert code == 0, stderr
    assert '4 at a time' in stdout and 'on GPUs 0,1' in stdout
    seen = sorted((guard / 'seen').read_text().splitlines())
    assert seen == ['5 5 5 7 7'] * 2 + ['7 5 5 7 7'] * 2, seen


@pytest.mark.slow
def test_a_sweep_cut_short_keeps_the_rows_of_the_runs_it_finished(data_dir, tmp_path):
    """A row goes to sweep.csv as each run ends: a sweep killed outright (kill -9, a lease's end) after one run
    leaves that run's row."""
    (tmp_path / 'patch').mkdir()
    (tmp_path / 'patch' / 'sitecustomize.py').write_text(  # LIMe's run never ends
        "import os, sys, time\nif sys.argv[0].endswith('train.py') and '--lime=True' in sys.argv:\n"
        "    out = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--out_dir='))\n"
        "    open(os.path.join(out, 'started'), 'w').close()\n    time.sleep(600)\n")
    root = tmp_path / 'root'
    sweep = subprocess.Popen([sys.executable, 'sweep.py', '--depths=1', '--variants=baseline,lime', '--seeds=0',
                              *TINY, f'--data_dir={data_dir}', f'--out_dir={root}', '--max_iters=2',
                              '--lr_decay_iters=2', '--eval_interval=1', '--plot=False'], cwd=REPO,
                             env=child_env(PYTHONPATH=f"{tmp_path / 'patch'}{os.pathsep}{REPO}"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        waited_for = (root / 'sweep.csv', root / 'lime-L1-s0' / 'started')
        while time.time() < deadline and not all(path.exists() for path in waited_for):
            time.sleep(0.2)
    finally:
        sweep.kill()
        sweep.communicate()
    assert (root / 'lime-L1-s0' / 'started').exists()  # the next run was running when the sweep was killed
    rows = read_csv(root / 'sweep.csv')
    assert [(r['out_dir'], r['status']) for r in rows] == [('baseline-L1-s0', 'done')] and float(rows[0]['val_loss'])


@pytest.mark.slow
def test_the_sweep_s_lock_follows_no_symlink(swept, tmp_path):
    """out_dir/.lock a link to a file elsewhere: the sweep refuses it with one line and the file is left as it was."""
    root, args, _, _ = swept
    again = copy_of(root, tmp_path, 'again')
    precious = tmp_path / 'precious'
    precious.write_text('precious data')
    os.symlink(precious, os.path.join(again, '.lock'))
    p = run('sweep.py', *args, f'--out_dir={again}', '--plot=False')
    assert precious.read_text() == 'precious data'
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 1 and p.stderr.startswith('error: '), p.stderr
