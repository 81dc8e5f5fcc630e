"""Bad input, crashes and interruptions: each one ends with a non-zero exit status and ONE line
'error: ...' on stderr (no traceback), and never costs a good checkpoint.

All runs are subprocesses of the real scripts. Faults are injected from outside: a `python -c`
that patches torch or the model (a NaN loss, a SIGKILL half-way through a checkpoint write, weights
gone non-finite on one DDP rank), then runs train.py with runpy.
"""
import glob
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO
import common

TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--total_batch_size=128', '--eval_iters=2', '--warmup_iters=2', '--lr_decay_iters=50', '--log_interval=1']


def env(**extra):
    e = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    for k in ('NANOLIME_DEBUG', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE'):
        e.pop(k, None)
    e.update(extra)
    return e


def run(script, *args, extra_env=None, timeout=300):
    return subprocess.run([sys.executable, script, *args], cwd=REPO, env=env(**(extra_env or {})),
                          capture_output=True, text=True, timeout=timeout)


def patched(patch):
    """The command line of train.py with `patch` (Python source) run first in the same process."""
    code = f"{patch}\nimport runpy, sys\nsys.argv[0] = 'train.py'\nrunpy.run_path('train.py', run_name='__main__')\n"
    return [sys.executable, '-c', code]


def run_patched(patch, *args, timeout=300):
    return subprocess.run([*patched(patch), *args], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def fails(p, *needles):
    """Exit status non-zero, exactly one stderr line, starting with 'error: ' and containing the needles."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode not in (0, None), p.stdout[-2000:]
    assert 'Traceback' not in p.stderr, p.stderr
    assert len(lines) == 1 and lines[0].startswith('error: '), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    assert 'Traceback' not in p.stderr
    return p


def ckpt_of(out_dir):
    return common.load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))


@pytest.fixture(scope='session')
def trained(data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('trained') / 'out')
    ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=4', '--eval_interval=2'))
    return out


# ----------------------------------------------------------------------------- train.py: bad config
@pytest.mark.parametrize('args, needles', [
    (['--n_layers=2'], ["unknown config key 'n_layers'", "did you mean 'n_layer'?"]),
    (['--learnig_rate=1e-3'], ["did you mean 'learning_rate'?"]),
    (['--batch_size=abc'], ["batch_size='abc': expected int, got str"]),
    (['--batch_size=2.5'], ['expected int, got float']),
    (['--lime=yes'], ["lime='yes': expected bool, got str"]),
    (['--compile=sometimes'], ["expected 'auto', True or False"]),
    (['--max_iters'], ['expected --key=value']),
    (['config/no_such_config.py'], ['no such config file: config/no_such_config.py']),
    (['--n_embd=30', '--n_head=4'], ['invalid model config', 'n_embd=30 must be divisible by n_head=4']),
    (['--n_head=4', '--n_kv_head=3'], ['n_head=4 must be divisible by n_kv_head=3']),
    (['--n_embd=12', '--n_head=4'], ['must be even for RoPE']),
    (['--router=last-x'], ["unknown router 'last-x'", 'first-<j>']),
    (['--batch_size=0'], ['batch_size=0 must be >= 1']),
    (['--total_batch_size=0'], ['total_batch_size=0 must be >= 1']),
    (['--batch_size=8', '--block_size=32', '--total_batch_size=1000'],
     ['total_batch_size=1000 is not a multiple of batch_size * block_size * world_size = 8 * 32 * 1 = 256',
      'set it to a multiple of 256']),
    (['--init_from=gpt2'], ["init_from='gpt2': expected 'scratch' or 'resume'"]),
    (['--dtype=float16', '--device=cpu'], ["dtype='float16' needs CUDA"]),
    (['--device=tpu'], ["device='tpu'"]),
    (['--dataset=shakespear_char'], ["unknown dataset 'shakespear_char'", "did you mean 'shakespeare_char'?"]),
])
def test_bad_config(args, needles, data_dir):
    fails(run('train.py', f'--data_dir={data_dir}', '--out_dir=/nonexistent/never-written', *args), *needles)


def test_cuda_requested_without_cuda(data_dir):
    if torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    fails(run('train.py', f'--data_dir={data_dir}', '--device=cuda'), "device='cuda' but CUDA is not available")


def test_bad_config_file(tmp_path, data_dir):
    f = tmp_path / 'bad.py'
    f.write_text("n_layer = 2\nn_heads = 4\n")
    fails(run('train.py', str(f), f'--data_dir={data_dir}'), "unknown config key 'n_heads'", str(f),
          "did you mean 'n_head'?")
    f.write_text("n_layer = 2\nbatch_size = = 3\n")
    fails(run('train.py', str(f)), f'{f}, line 2: SyntaxError')
    f.write_text("import os\n_w = int(os.environ['NOPE_NOT_SET'])\n")
    fails(run('train.py', str(f)), f'{f}, line 2: KeyError')


def test_missing_data_names_the_prepare_command(tmp_path):
    fails(run('train.py', f'--data_dir={tmp_path}'), "dataset 'shakespeare_char' is not prepared",
          f'run: python prepare.py shakespeare_char --data_dir={tmp_path}')
    fails(run('train.py', '--dataset=fineweb_edu', f'--data_dir={tmp_path}'),
          'run: python prepare.py fineweb_edu')


def test_block_size_larger_than_data(tiny_data_dir):
    fails(run('train.py', *TINY, f'--data_dir={tiny_data_dir}', '--block_size=256', '--total_batch_size=1024'),
          "block_size=256 is too large for dataset 'shakespeare_char'", 'val split has only 200 tokens')


def test_total_batch_size_per_number_of_ranks(data_dir):
    """The 1B config's 2M-token batch divides among 8 GPUs, not among 3: the error says so before any work."""
    fails(run('train.py', 'config/train_fineweb_edu_1b.py', f'--data_dir={data_dir}', extra_env={'WORLD_SIZE': '3'}),
          'total_batch_size=2097152 is not a multiple of batch_size * block_size * world_size = 8 * 2048 * 3')


def test_debug_shows_the_traceback(data_dir):
    for flag in ('--debug', '--debug=True'):
        p = run('train.py', f'--data_dir={data_dir}', '--n_layers=2', flag)
        assert p.returncode != 0 and 'Traceback' in p.stderr and 'UserError' in p.stderr
    p = run('train.py', f'--data_dir={data_dir}', '--n_layers=2', extra_env={'NANOLIME_DEBUG': '1'})
    assert p.returncode != 0 and 'Traceback' in p.stderr


# ----------------------------------------------------------------------------- resume
def test_resume_without_checkpoint(data_dir, tmp_path):
    fails(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--init_from=resume'),
          "no checkpoint to resume from (init_from='resume') at")


def test_resume_with_another_model_shape_is_refused(trained, data_dir):
    line = fails(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={trained}', '--init_from=resume',
                     '--n_layer=3', '--n_embd=64', '--max_iters=8'), 'cannot resume from', 'the model differs')
    assert 'n_layer: 2 in the checkpoint, 3 now' in line and 'n_embd: 32 in the checkpoint, 64 now' in line
    assert 'mlp_hidden' in line  # derived from n_embd: also named
    assert ckpt_of(trained)['iter_num'] == 4  # untouched


def test_resume_from_a_foreign_checkpoint_is_refused(data_dir, tmp_path):
    torch.save({'model': {}, 'model_args': {}, 'iter_num': 3}, tmp_path / 'ckpt.pt')  # e.g. nanoGPT's
    fails(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--init_from=resume'),
          'is not a nanoLIMe checkpoint')


def _as_if_saved_on_gpu(src, dst):
    """Re-save a checkpoint with every tensor tagged 'cuda:0', as torch.save does on a GPU."""
    ck = torch.load(src, map_location='cpu', weights_only=True)
    entry = (-100, lambda storage: 'cuda:0', lambda storage, location: None)
    torch.serialization._package_registry.append(entry)
    torch.serialization._package_registry.sort(key=lambda e: e[0])
    try:
        torch.save(ck, dst)
    finally:
        torch.serialization._package_registry.remove(entry)


def test_gpu_checkpoint_resumes_and_samples_on_cpu(trained, data_dir, tmp_path):
    if torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    out = tmp_path / 'gpu'
    out.mkdir()
    _as_if_saved_on_gpu(os.path.join(trained, 'ckpt.pt'), out / 'ckpt.pt')
    with pytest.raises(RuntimeError, match='CUDA'):  # the simulation is faithful: a plain load fails here
        torch.load(out / 'ckpt.pt', weights_only=True)
    ok(run('sample.py', f'--out_dir={out}', '--max_new_tokens=5', '--num_samples=1', '--device=cpu'))
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--init_from=resume',
               '--max_iters=6', '--eval_interval=2'))
    assert 'at iter 5' in p.stdout and ckpt_of(str(out))['iter_num'] == 6


def test_bare_debug_flag_trains(data_dir, tmp_path):
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--max_iters=2', '--debug'))
    assert ckpt_of(str(tmp_path))['config']['debug'] is True and 'done: 2 iters' in p.stdout


def test_checkpoint_without_the_newer_model_options_resumes(trained, data_dir, tmp_path):
    """A checkpoint written before value_residual and denseformer existed: they were off."""
    ck = torch.load(os.path.join(trained, 'ckpt.pt'), map_location='cpu', weights_only=True)
    del ck['model_args']['value_residual'], ck['model_args']['denseformer']
    torch.save(ck, tmp_path / 'ckpt.pt')
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--init_from=resume',
               '--max_iters=6', '--eval_interval=2'))
    assert 'at iter 5' in p.stdout and ckpt_of(str(tmp_path))['iter_num'] == 6


# ----------------------------------------------------------------------------- crashes and signals
NAN_AT_ITER_8 = """
import model
_forward, _calls = model.GPT.forward, [0]
def forward(self, *args, **kwargs):
    logits, loss = _forward(self, *args, **kwargs)
    if self.training:
        _calls[0] += 1
        if _calls[0] == 8:
            loss = loss * float('nan')
    return logits, loss
model.GPT.forward = forward
"""


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
    out = str(tmp_path)
    line = fails(run_patched(NAN_AT_ITER_8, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=20',
                             '--eval_interval=5'),
                 'loss is nan at iter 8: training stopped', 'the last good checkpoint', 'iter 5) is kept')
    assert out in line
    ck = ckpt_of(out)
    assert ck['iter_num'] == 5
    assert all(torch.isfinite(v).all() for v in ck['model'].values())
    assert not glob.glob(os.path.join(out, '*.tmp'))


# the second torch.save writes half of its bytes, then the process dies as by `kill -9`
KILL_IN_SECOND_SAVE = """
import io, os, signal, torch
_save, _calls = torch.save, [0]
def save(obj, f, *args, **kwargs):
    _calls[0] += 1
    if _calls[0] < 2:
        return _save(obj, f, *args, **kwargs)
    buf = io.BytesIO()
    _save(obj, buf, *args, **kwargs)
    f.write(buf.getvalue()[:len(buf.getvalue()) // 2])
    f.flush()
    os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = save
"""


def test_kill_during_save_leaves_the_previous_checkpoint(data_dir, tmp_path):
    out = str(tmp_path)
    p = run_patched(KILL_IN_SECOND_SAVE, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=20',
                    '--eval_interval=5')
    assert p.returncode == -signal.SIGKILL
    assert 'saved checkpoint' in p.stdout and '(iter 5)' in p.stdout and '(iter 10)' not in p.stdout
    tmp, = glob.glob(os.path.join(out, 'ckpt.pt.*.tmp'))  # the half-written file
    assert os.path.getsize(tmp) > 0
    with pytest.raises(common.UserError, match='truncated or not a checkpoint'):
        common.load_checkpoint(tmp)
    assert ckpt_of(out)['iter_num'] == 5
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=7', '--eval_interval=5',
               '--init_from=resume'))
    assert 'at iter 6' in p.stdout and ckpt_of(out)['iter_num'] == 7


# on rank 1 only, the 4th optimizer step leaves a weight infinite (after that iteration's loss was computed)
INF_WEIGHT_ON_RANK_1 = """
import os, torch
_step, _calls = torch.optim.AdamW.step, [0]
def step(self, *args, **kwargs):
    out = _step(self, *args, **kwargs)
    _calls[0] += 1
    if os.environ['RANK'] == '1' and _calls[0] == 4:
        with torch.no_grad():
            self.param_groups[0]['params'][0].view(-1)[0] = float('inf')
    return out
torch.optim.AdamW.step = step
"""


def test_non_finite_weights_on_one_rank_stop_every_rank(data_dir, tmp_path):
    """Two DDP ranks (gloo), as torchrun starts them; one rank's weights go non-finite before a checkpoint:
    every rank reaches the same verdict and exits with the same error, none waits in a collective."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    args = [*TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--max_iters=8', '--eval_interval=4',
            '--total_batch_size=256']  # 4 x 32 tokens x 2 ranks
    procs = [subprocess.Popen([*patched(INF_WEIGHT_ON_RANK_1), *args], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE='2', LOCAL_WORLD_SIZE='2',
                                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port)))
             for r in (0, 1)]
    try:
        results = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = 'the weights are not finite at iter 4: training stopped; no checkpoint was written by this run'
    line0 = fails(subprocess.CompletedProcess([], procs[0].returncode, *results[0]), want)
    line1 = fails(subprocess.CompletedProcess([], procs[1].returncode, *results[1]), want)
    assert line1 == line0.replace('error: ', 'error: [rank 1] ')
    assert not os.path.exists(os.path.join(tmp_path, 'ckpt.pt'))


def test_sigint_saves_a_checkpoint_and_exits(data_dir, tmp_path):
    out = str(tmp_path)
    proc = subprocess.Popen([sys.executable, 'train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                             '--max_iters=100000', '--lr_decay_iters=100000', '--eval_interval=100000'],
                            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.time() + 120
        for line in proc.stdout:
            seen.append(line)
            if line.startswith('iter 3:') or time.time() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout = ''.join(seen) + stdout
    assert proc.returncode == 130, stdout + stderr
    assert 'Traceback' not in stderr and 'SIGINT received' in stderr
    n = ckpt_of(out)['iter_num']
    assert n >= 3 and f'interrupted at iter {n}: checkpoint saved to' in stdout
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', f'--max_iters={n + 2}',
               '--lr_decay_iters=100000', '--eval_interval=100000', '--init_from=resume'))
    assert f'at iter {n + 1}' in p.stdout and ckpt_of(out)['iter_num'] == n + 2


# ----------------------------------------------------------------------------- sample.py
def test_sample_without_checkpoint(tmp_path):
    fails(run('sample.py', f'--out_dir={tmp_path}'), f'no checkpoint at {tmp_path}/ckpt.pt', 'train one first')


def test_sample_foreign_truncated_and_garbage_checkpoints(trained, tmp_path):
    (tmp_path / 'foreign').mkdir()
    torch.save({'model': {}, 'model_args': {}, 'config': {}}, tmp_path / 'foreign' / 'ckpt.pt')
    fails(run('sample.py', f'--out_dir={tmp_path / "foreign"}'), 'is not a nanoLIMe checkpoint')
    (tmp_path / 'cut').mkdir()
    data = open(os.path.join(trained, 'ckpt.pt'), 'rb').read()
    (tmp_path / 'cut' / 'ckpt.pt').write_bytes(data[:len(data) // 2])
    fails(run('sample.py', f'--out_dir={tmp_path / "cut"}'), 'is truncated or not a checkpoint')
    (tmp_path / 'junk').mkdir()
    (tmp_path / 'junk' / 'ckpt.pt').write_text('hello')
    fails(run('sample.py', f'--out_dir={tmp_path / "junk"}'), 'is truncated or not a checkpoint')


def test_sample_prompt_outside_the_vocabulary(trained, tmp_path):
    fails(run('sample.py', f'--out_dir={trained}', '--start=Hello ☃ world€', '--device=cpu'),
          '--start: characters not in the vocabulary', '€☃')
    fails(run('sample.py', f'--out_dir={trained}', f'--start=FILE:{tmp_path}/nope.txt'), 'no such file')
    fails(run('sample.py', f'--out_dir={trained}', '--start='), '--start is empty')


@pytest.mark.parametrize('args, needle', [
    (['--max_new_tokens=0'], 'max_new_tokens=0 must be >= 1'),
    (['--max_new_tokens=-5'], 'max_new_tokens=-5 must be >= 1'),
    (['--num_samples=0'], 'num_samples=0 must be >= 1'),
    (['--temperature=-1.0'], 'temperature=-1.0 must be >= 0'),
    (['--top_k=0'], 'top_k=0 must be >= 1'),
    (['--tempreature=0.5'], "did you mean 'temperature'?"),
])
def test_sample_bad_options(args, needle, trained):
    fails(run('sample.py', f'--out_dir={trained}', *args), needle)
