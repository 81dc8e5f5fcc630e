"""nanolime/checkpoint.py: what a checkpoint records about the code that trained it; loading one (refused in one
line when it is foreign, damaged, non-finite or of another model; older model options loaded as what they were; a
GPU's on a CPU); one run per out_dir (its lock) and a trained model replaced only when asked; writes that are atomic
(a killed save, a full disk, two writers) and leave the previous checkpoint and log whole."""
import errno
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess

import pytest
import torch

from nanolime import checkpoint
from nanolime import common
import prepare
from nanolime.common import UserError
from conftest import REPO, TINY_RUN, ckpt_of, error_of, files, log_iters, patched, run, run_script, train
from model import GPT, GPTConfig
from relatives import RelativesConfig, build_model  # noqa: E402


def test_git_commit_of_a_checkout_and_none_elsewhere(tmp_path, monkeypatch):
    head = subprocess.run(['git', '-C', REPO, 'rev-parse', 'HEAD'], capture_output=True, text=True)
    if head.returncode == 0:
        assert checkpoint.git_commit().split('+')[0] == head.stdout.strip()
    # a copy outside any git checkout
    monkeypatch.setattr(checkpoint, '__file__', str(tmp_path / 'nanolime' / 'checkpoint.py'))
    assert checkpoint.git_commit() is None
    monkeypatch.setenv('PATH', str(tmp_path))  # no git at all
    assert checkpoint.git_commit() is None


def test_trained_with_names_torch_and_commit_or_says_not_recorded():
    assert checkpoint.trained_with({'iter_num': 3, 'torch_version': '2.13.0', 'git_commit': 'abc'}) == \
        "iter 3, torch 2.13.0, commit abc"
    assert checkpoint.trained_with({'iter_num': 3}) == "iter 3, torch not recorded, commit not recorded"


# ---------------------------------------------------------------------------- loading: what a checkpoint holds, checked
# one layer, 4 x 16 tokens per step: a checkpoint for every loader to read
TINY = ['--device=cpu', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4',
        '--total_batch_size=64', '--eval_iters=1', '--warmup_iters=1', '--log_interval=1', '--compile=False']


@pytest.mark.slow
def test_every_loader_refuses_non_finite_weights(data_dir, tmp_path, run_here):
    """A checkpoint whose weights hold a NaN (damaged outside train.py, which stops at a non-finite loss before
    saving) is refused in one line naming the file and the tensor, by every script that loads one."""
    good, bad = tmp_path / 'good', tmp_path / 'bad'
    assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={good}', '--max_iters=1',
                    '--decay_lr=False') == 0
    ckpt = torch.load(good / 'ckpt.pt', weights_only=True)
    ckpt['model']['transformer.h.0.mlp.up_proj.weight'][3, 5] = float('nan')
    bad.mkdir()
    torch.save(ckpt, bad / 'ckpt.pt')
    want = (f"{bad}/ckpt.pt holds non-finite weights (NaN or inf) in transformer.h.0.mlp.up_proj.weight; restore it "
            "from a copy, or train again (train.py --overwrite replaces it)")
    for script, *args in [('sample.py', f'--out_dir={bad}', '--max_new_tokens=2'),
                          ('study/analyze.py', str(bad), f'--data_dir={data_dir}'),
                          ('study/analyze.py', str(bad), '--no_model=True'),
                          ('train.py', f'--out_dir={bad}', *TINY, f'--data_dir={data_dir}', '--max_iters=2',
                           '--decay_lr=False', '--init_from=resume')]:
        with pytest.raises(common.UserError) as e:
            run_here(script, *args)
        assert str(e.value) == want, script
    # integrations/eval.py (its optional dependency); a process: it sets HF_* variables
    if importlib.util.find_spec('lm_eval'):
        p = run('integrations.eval', f'--out_dir={bad}', '--tasks=arc_easy', '--device=cpu')
        assert p.returncode == 1 and p.stderr.strip().splitlines() == [f"error: {want}"]


def write_ckpt(path, **model_args):
    args = dict(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)
    model = build_model(RelativesConfig(**args))
    torch.save({checkpoint.CKPT_MARKER: 1, 'model': model.state_dict(), 'model_args': {**args, **model_args},
                'iter_num': 0, 'config': {}}, path)


def test_old_model_options_load_as_what_they_were(tmp_path):
    """mhc was a flag (True: today's mhc='static'); value_residual, now removed, loads when off and is one
    error line when on, saying what to do."""
    write_ckpt(tmp_path / 'off.pt', mhc=False, value_residual=False)
    args = checkpoint.load_checkpoint(str(tmp_path / 'off.pt'))['model_args']
    assert args['mhc'] == '' and 'value_residual' not in args
    RelativesConfig(**args)
    write_ckpt(tmp_path / 'static.pt', mhc=True, hc=2)
    assert checkpoint.load_checkpoint(str(tmp_path / 'static.pt'))['model_args']['mhc'] == 'static'
    write_ckpt(tmp_path / 'vr.pt', value_residual=True)
    with pytest.raises(common.UserError, match="uses value_residual, which this version no longer has"):
        checkpoint.load_checkpoint(str(tmp_path / 'vr.pt'))


def test_checkpoint_without_the_newer_model_options_resumes(short_run, data_dir, tmp_path, run_here, capsys):
    """A checkpoint written before denseformer existed: it was off. One written when value_residual (off)
    existed and mhc was a flag (False: off): they load as off."""
    ck = torch.load(os.path.join(short_run, 'ckpt.pt'), map_location='cpu', weights_only=True)
    del ck['model_args']['denseformer']
    ck['model_args'].update(value_residual=False, mhc=False)
    torch.save(ck, tmp_path / 'ckpt.pt')
    assert run_here('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--init_from=resume',
                    '--max_iters=6', '--eval_interval=2') == 0
    assert 'at iter 5' in capsys.readouterr().out and ckpt_of(str(tmp_path))['iter_num'] == 6


def test_resume_from_a_foreign_checkpoint_is_refused(data_dir, tmp_path, run_here):
    torch.save({'model': {}, 'model_args': {}, 'iter_num': 3}, tmp_path / 'ckpt.pt')  # e.g. nanoGPT's
    assert 'is not a nanoLIMe checkpoint' in error_of(run_here, 'train.py', *TINY_RUN, f'--data_dir={data_dir}',
                                                      f'--out_dir={tmp_path}', '--init_from=resume')


def test_resume_with_another_model_shape_is_refused(short_run, data_dir, run_here):
    line = error_of(run_here, 'train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={short_run}',
                    '--init_from=resume', '--n_layer=3', '--n_embd=64', '--max_iters=8')
    assert 'cannot resume from' in line and 'the model differs' in line
    assert 'n_layer: 2 in the checkpoint, 3 now' in line and 'n_embd: 32 in the checkpoint, 64 now' in line
    assert 'mlp_hidden' in line  # derived from n_embd: also named
    assert ckpt_of(short_run)['iter_num'] == 4  # untouched


def test_resuming_on_another_vocabulary_of_the_same_size_is_refused(run_copy, data_dir, tmp_path):
    """Another dataset with as many characters, other ones: the model's ids would mean other characters."""
    text = prepare.read_shakespeare()[:200_000]
    chars = sorted(set(text))
    assert len(chars) == 75  # the trained model's dataset: the same text
    shifted = text.translate({ord(c): ord(c) + 1000 for c in chars})
    prepare.prepare_char(shifted, str(tmp_path / 'other' / 'mine'))
    before = files(run_copy)
    with pytest.raises(UserError) as e:
        train(tmp_path / 'other', run_copy, '--dataset=mine', '--init_from=resume', '--max_iters=6')
    assert str(e.value) == (f"cannot resume from {run_copy}/ckpt.pt: it was trained on dataset 'shakespeare_char', "
                            f"whose vocabulary differs from that of {tmp_path}/other/mine/meta.pkl (same size, other "
                            "tokens); resume on the checkpoint's dataset and data_dir, or train into another out_dir")
    assert files(run_copy) == before
    shutil.copytree(os.path.join(data_dir, 'shakespeare_char'), tmp_path / 'same' / 'mine')  # same vocabulary
    assert train(tmp_path / 'same', run_copy, '--dataset=mine', '--init_from=resume', '--max_iters=5') == 0


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


def test_gpu_checkpoint_resumes_and_samples_on_cpu(short_run, data_dir, tmp_path, run_here, capsys):
    if torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    out = tmp_path / 'gpu'
    out.mkdir()
    _as_if_saved_on_gpu(os.path.join(short_run, 'ckpt.pt'), out / 'ckpt.pt')
    with pytest.raises(RuntimeError, match='CUDA'):  # the simulation is faithful: a plain load fails here
        torch.load(out / 'ckpt.pt', weights_only=True)
    assert run_here('sample.py', f'--out_dir={out}', '--max_new_tokens=5', '--num_samples=1', '--device=cpu') == 0
    assert run_here('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--init_from=resume',
                    '--max_iters=6', '--eval_interval=2') == 0
    assert 'at iter 5' in capsys.readouterr().out and ckpt_of(str(out))['iter_num'] == 6


def test_a_log_line_that_is_not_a_record_is_named(run_copy):
    with open(os.path.join(run_copy, 'log.jsonl'), 'a') as f:
        f.write('[1, 2]\n')  # after the records of iterations 0 to 4
    with pytest.raises(UserError) as e:
        checkpoint.read_log(run_copy)
    assert str(e.value) == (f"{run_copy}/log.jsonl, line 6: not a record of train.py ('[1, 2]'; each line is a JSON "
                            "object with its 'iter'): delete that line, or restore the file")


# -------------------------------------------------------- one run per out_dir; a trained model replaced only when asked
def test_a_second_run_into_a_busy_out_dir_stops_at_once(run_copy, data_dir, held, capsys):
    before = files(run_copy)
    held(run_copy, 'out_dir')
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--max_iters=8')
    assert str(e.value) == (f"out_dir {run_copy} is in use by another process (pid {os.getpid()}); "
                            "wait for it to end, or use another out_dir")
    assert capsys.readouterr().out == '' and files(run_copy) == before  # stopped before any work


def test_a_scratch_run_does_not_replace_a_trained_model(run_copy, data_dir):
    before = files(run_copy)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--max_iters=2')
    assert str(e.value) == (f"{run_copy}/ckpt.pt holds a trained model: continue it with --init_from=resume, "
                            "train into another --out_dir, or replace it with --overwrite")
    assert files(run_copy) == before
    # asked to, it does (at its first checkpoint), and the old log goes with the old model
    assert train(data_dir, run_copy, '--max_iters=2', '--eval_interval=2', '--overwrite') == 0
    assert log_iters(run_copy) == [0, 1, 2] and torch.load(os.path.join(run_copy, 'ckpt.pt'))['iter_num'] == 2


@pytest.mark.parametrize('arg', ['--max_iters=0', '--eval_only'])
def test_overwrite_that_would_train_nothing_is_refused(arg, run_copy, data_dir, capsys):
    """--overwrite with nothing to train would write no checkpoint, only a log of an untrained model beside the
    trained one: refused before any work, both files as they were."""
    before = files(run_copy)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--overwrite', arg)
    assert str(e.value) == (f"{run_copy}/ckpt.pt holds a trained model, and --overwrite with this run would only "
                            "evaluate an untrained one (eval_only=True or max_iters=0): nothing was done, the model "
                            "and its log are intact; to evaluate it use --init_from=resume --eval_only=True, to "
                            "replace it train (--max_iters >= 1)")
    assert files(run_copy) == before and 'iter 0' not in capsys.readouterr().out


def test_an_out_dir_that_cannot_be_written_is_refused_before_training(data_dir, tmp_path, capsys):
    (tmp_path / 'f').write_text('a file')
    with pytest.raises(UserError) as e:
        train(data_dir, tmp_path / 'f' / 'out')
    assert str(e.value) == f"cannot write into out_dir={tmp_path}/f/out: not a directory; choose another --out_dir"
    with pytest.raises(UserError, match='it is a file, not a directory'):
        train(data_dir, tmp_path / 'f')
    assert capsys.readouterr().out == ''


def test_bench_checks_its_output_before_the_benchmark(tmp_path, capsys):
    (tmp_path / 'f').write_text('a file')
    with pytest.raises(UserError, match=f'cannot write into json={tmp_path}/f: it is a file'):
        run_script('bench.py', '--json=' + str(tmp_path / 'f' / 'b.json'))
    assert capsys.readouterr().out == ''


# ----------------------------------------------------------------------------- atomic writes
def test_two_processes_writing_one_file_do_not_share_a_temp_file(tmp_path, monkeypatch):
    """While this process writes `path`, another one writes it too: each has its own temp file, so both writes
    complete and the last one to finish is what `path` holds, whole."""
    path = str(tmp_path / 'ckpt.pt')

    def write(f):
        f.write(b'A' * 10)
        with monkeypatch.context() as m:
            m.setattr(os, 'getpid', lambda: 4_000_000)  # the other process
            checkpoint.atomic_write(path, lambda g: g.write(b'B'))
        f.write(b'A' * 10)
    checkpoint.atomic_write(path, write)
    assert open(path, 'rb').read() == b'A' * 20 and os.listdir(tmp_path) == ['ckpt.pt']


def test_what_a_killed_run_was_writing_is_cleaned_up_by_the_next(run_copy, data_dir):
    stale = os.path.join(run_copy, 'ckpt.pt.4000000.tmp')  # a run killed during a save leaves its temp file
    open(stale, 'wb').write(b'half a checkpoint')
    assert train(data_dir, run_copy, '--init_from=resume', '--max_iters=4') == 0  # nothing to train
    assert not os.path.exists(stale)


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


@pytest.mark.slow
def test_kill_during_save_leaves_the_previous_checkpoint(data_dir, tmp_path, run_here, capsys):
    out = str(tmp_path)
    p = run(patched(KILL_IN_SECOND_SAVE), *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=20',
                    '--eval_interval=5')
    assert p.returncode == -signal.SIGKILL
    assert 'saved checkpoint' in p.stdout and '(iter 5)' in p.stdout and '(iter 10)' not in p.stdout
    tmp, = glob.glob(os.path.join(out, 'ckpt.pt.*.tmp'))  # the half-written file
    assert os.path.getsize(tmp) > 0
    with pytest.raises(common.UserError, match='truncated or not a checkpoint'):
        checkpoint.load_checkpoint(tmp)
    assert ckpt_of(out)['iter_num'] == 5
    assert run_here('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=7',
                    '--eval_interval=5', '--init_from=resume') == 0
    assert 'at iter 6' in capsys.readouterr().out and ckpt_of(out)['iter_num'] == 7


def save_into_a_full_disk(save):
    """torch.save as on a full disk: its bytes go to /dev/full (ENOSPC), and torch raises its own RuntimeError
    ('unexpected pos ...', with the OSError as its context)."""
    def full(obj, f, *args, **kwargs):
        f.write(b'the start of a checkpoint')
        dev = open('/dev/full', 'wb')
        try:
            save(obj, dev, *args, **kwargs)
        finally:
            try:
                dev.close()
            except OSError:  # what is left in its buffer cannot be written either
                pass
    return full


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
def test_a_full_disk_is_the_documented_error_and_leaves_no_temp_file(run_copy, data_dir, monkeypatch, tmp_path):
    """torch.save reports a write that fails as a RuntimeError of its own ('unexpected pos ...'), not an OSError."""
    with pytest.raises(RuntimeError, match='unexpected pos'):  # the fake is faithful
        save_into_a_full_disk(torch.save)({'x': torch.zeros(100_000)}, open(os.devnull, 'wb'))
    (tmp_path / 'disk').mkdir()
    path = str(tmp_path / 'disk' / 'ckpt.pt')
    with pytest.raises(UserError) as e:  # larger than the file's buffer
        checkpoint.atomic_write(path, lambda f: save_into_a_full_disk(torch.save)({'x': torch.zeros(100_000)}, f),
                                then='retry')
    assert str(e.value) == (f"cannot write {path}: no space left on device; the file there, if any, is unchanged: "
                            "free some space (or fix the permissions), then retry")
    assert os.listdir(tmp_path / 'disk') == []
    before = files(run_copy)
    monkeypatch.setattr(torch, 'save', save_into_a_full_disk(torch.save))
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', '--eval_interval=2')
    assert str(e.value) == (f"training stopped at iter 6: cannot write {run_copy}/ckpt.pt: no space left on device; "
                            "the file there, if any, is unchanged: free some space (or fix the permissions), then "
                            "continue with --init_from=resume")
    assert files(run_copy) == before and sorted(os.listdir(run_copy)) == ['.lock', 'ckpt.pt', 'log.jsonl']


@pytest.mark.parametrize('name', ['lime', 'lime_hc', 'attnres'])
def test_a_checkpoint_from_before_the_relatives_moved_out_of_model_py_loads_and_samples_the_same(name):
    """tests/fixtures/<name>.pt was saved by the code before relatives.py extended model.py from outside (when
    GPTConfig held every relative's option and model.py had its own RMSNorm), with expected.json: the logits
    and the greedy continuation that code gave. Today's code loads it into the same function and samples the
    same tokens (the logits up to float rounding: the norms are torch's now). (Dynamic mHC is not among them: its
    Sinkhorn was corrected since, so its old checkpoints load into the corrected function.)"""
    expected = json.load(open(os.path.join(REPO, 'tests', 'fixtures', 'expected.json')))[name]
    model, _ = checkpoint.load_model(os.path.join(REPO, 'tests', 'fixtures', f'{name}.pt'))
    idx = torch.tensor([[1, 2, 3, 4]])
    logits, _ = model(idx, idx)
    torch.testing.assert_close(logits[0], torch.tensor(expected['logits']), atol=1e-5, rtol=1e-5)
    assert model.generate(idx, 8, top_k=1)[0].tolist() == expected['greedy']
    assert type(model).__name__ == ('GPT' if name == 'lime' else 'RelativesGPT')


def test_resume_refuses_non_finite_optimizer_state(run_copy, data_dir):
    """NaN only in the optimizer's state (its moments): a resumed run would turn the weights NaN at its first step;
    refused in one line, the checkpoint left as it is."""
    ckpt = torch.load(f'{run_copy}/ckpt.pt', weights_only=True)
    state = ckpt['optimizer'][0]['state']
    first = next(iter(state.values()))
    first['exp_avg_sq'].view(-1)[0] = float('nan')
    torch.save(ckpt, f'{run_copy}/ckpt.pt')
    before = files(run_copy)
    with pytest.raises(UserError, match=r"ckpt.pt holds non-finite optimizer state \(NaN or inf\) in exp_avg_sq of "
                                        r"optimizer 1; restore it from a copy, or train again"):
        train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', '--eval_interval=2')
    assert files(run_copy) == before


def test_a_checkpoint_missing_a_tensor_is_named_damaged(run_copy, data_dir, run_here):
    """A tensor gone from the checkpoint's weights: one line naming it, the same for a resume and for sample.py, not
    a stack of torch's messages nor 'another version of model.py' alone."""
    ckpt = torch.load(f'{run_copy}/ckpt.pt', weights_only=True)
    del ckpt['model']['transformer.h.1.attn.q_proj.weight']
    torch.save(ckpt, f'{run_copy}/ckpt.pt')
    want = (f"{run_copy}/ckpt.pt lacks the tensor transformer.h.1.attn.q_proj.weight of its model: it is damaged, or "
            "was written by a version of model.py without it")
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', '--eval_interval=2')
    assert str(e.value).startswith(want) and '\n' not in str(e.value)
    assert error_of(run_here, 'sample.py', f'--out_dir={run_copy}', '--max_new_tokens=2').startswith(want)


# ----------------------------------------------------------------------------- nothing outside out_dir is written
@pytest.mark.parametrize('name, target', [('.lock', 'precious'), ('.lock', 'nowhere'), ('log.jsonl', 'precious'),
                                          ('ckpt.pt', 'copy')])
def test_a_run_file_that_is_a_link_is_refused_and_nothing_outside_out_dir_is_written(name, target, run_copy,
                                                                                      data_dir, tmp_path):
    """out_dir/.lock, log.jsonl or ckpt.pt a symbolic link to a file elsewhere (or to none: it would be created):
    refused in one line before anything is written; the file it points to is as it was (or still absent)."""
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (elsewhere / 'precious').write_text('precious data')
    shutil.copy(os.path.join(run_copy, 'ckpt.pt'), elsewhere / 'copy')  # a checkpoint that would load
    path = os.path.join(run_copy, name)
    if os.path.exists(path):
        os.remove(path)
    os.symlink(elsewhere / target, path)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--eval_only=True')
    assert str(e.value) == (f"{path} is a symbolic link (to {elsewhere / target}), where a plain file belongs: "
                            f"nothing was read or written through it; move it out of {run_copy}, or use another "
                            "directory")
    assert (elsewhere / 'precious').read_text() == 'precious data' and sorted(os.listdir(elsewhere)) == [
        'copy', 'precious']


@pytest.mark.parametrize('name, kind', [('.lock', 'named pipe'), ('log.jsonl', 'named pipe'),
                                        ('ckpt.pt', 'directory')])
def test_a_run_file_that_is_a_pipe_or_a_directory_is_refused_at_once(name, kind, run_copy, data_dir):
    """Not a plain file where train.py writes one: refused in one line, at once (a named pipe is not opened to wait
    for a writer); a directory named ckpt.pt is not said to hold a trained model."""
    path = os.path.join(run_copy, name)
    os.remove(path) if os.path.exists(path) else None
    os.mkfifo(path) if kind == 'named pipe' else os.mkdir(path)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--max_iters=2', '--overwrite' if name == 'ckpt.pt' else '--init_from=resume')
    assert str(e.value) == (f"{path} is a {kind}, where a plain file belongs: nothing was read or written through "
                            f"it; move it out of {run_copy}, or use another directory")


def test_a_checkpoint_that_is_a_named_pipe_is_refused_without_waiting(tmp_path, data_dir, run_here):
    os.mkfifo(tmp_path / 'ckpt.pt')
    for args in (['sample.py'], ['train.py', *TINY_RUN, f'--data_dir={data_dir}', '--init_from=resume']):
        with pytest.raises(UserError) as e:
            run_here(*args, f'--out_dir={tmp_path}', '--device=cpu')
        assert str(e.value) == (f"{tmp_path}/ckpt.pt is a named pipe or a device, not a checkpoint file; point at "
                                "the checkpoint itself")


def test_a_lock_that_cannot_be_written_leaves_no_empty_lock(tmp_path, monkeypatch, held):
    """A full disk when the run starts: the pid cannot be written into a new .lock; one line that says so, and
    no empty .lock is left behind for the next run to find."""
    write = os.write

    def full(fd, data):
        if os.readlink(f'/proc/self/fd/{fd}').endswith('.lock'):
            raise OSError(errno.ENOSPC, 'No space left on device')
        return write(fd, data)
    monkeypatch.setattr(os, 'write', full)
    with pytest.raises(UserError) as e:
        held(str(tmp_path), 'out_dir')
    assert str(e.value) == (f"cannot write {tmp_path}/.lock: no space left on device; the file there, if any, is "
                            "unchanged: free some space (or fix the permissions), then run again")
    assert os.listdir(tmp_path) == []


def test_a_write_never_goes_through_a_link(tmp_path):
    """A link where atomic_write puts its temp file, or at the file itself, is replaced, never written through."""
    (tmp_path / 'precious').write_text('precious data')
    path = tmp_path / 'out' / 'log.jsonl'
    path.parent.mkdir()
    os.symlink(tmp_path / 'precious', f'{path}.{os.getpid()}.tmp')
    os.symlink(tmp_path / 'precious', path)
    checkpoint.atomic_write(str(path), lambda f: f.write(b'{"iter": 0}\n'))
    assert (tmp_path / 'precious').read_text() == 'precious data' and not path.is_symlink()
    assert path.read_text() == '{"iter": 0}\n' and os.listdir(path.parent) == ['log.jsonl']


def test_a_write_s_error_says_what_to_do_about_its_cause(tmp_path, monkeypatch):
    """The directory gone (deleted while a run went on) is not a full disk; a read-only place is not either."""
    gone = tmp_path / 'gone' / 'ckpt.pt'
    with pytest.raises(UserError) as e:
        checkpoint.atomic_write(str(gone), lambda f: f.write(b'x'), then='continue with --init_from=resume')
    assert str(e.value) == (f"cannot write {gone}: its directory {gone.parent} is gone (deleted or moved while this "
                            "ran); nothing was written: put it back, then continue with --init_from=resume")
    monkeypatch.setattr(os, 'fsync', lambda fd: (_ for _ in ()).throw(OSError(errno.EROFS, 'Read-only file system')))
    with pytest.raises(UserError) as e:
        checkpoint.atomic_write(str(tmp_path / 'f'), lambda f: f.write(b'x'))
    assert str(e.value) == (f"cannot write {tmp_path}/f: read-only file system; the file there, if any, is "
                            "unchanged: make it writable, then run again")


def test_a_resume_in_a_read_only_out_dir_is_told_to_make_it_writable(run_copy, data_dir, monkeypatch):
    """Choosing another out_dir would not continue the run, which is in this one."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, 'Read-only file system')
    monkeypatch.setattr(checkpoint.tempfile, 'TemporaryFile', read_only)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--eval_only=True')
    assert str(e.value) == (f"cannot write into out_dir={run_copy}: read-only file system; the run to continue is "
                            "there: make it writable, or copy it to a place that is and point --out_dir there")


# ----------------------------------------------------------------------------- damaged checkpoints and logs
def overwrite_a_weight(path):
    """16 bytes of the checkpoint's largest tensor replaced by other finite floats, in place: what torch.load
    loads without a word."""
    import struct
    import zipfile
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if '/data/' in i.filename), key=lambda i: i.file_size)
    with open(path, 'r+b') as f:
        f.seek(info.header_offset + 26)
        name, extra = struct.unpack('<HH', f.read(4))
        f.seek(info.header_offset + 30 + name + extra + 64)
        f.write(struct.pack('<4f', 0.25, -0.5, 0.75, 1.0))
    return info.filename


def test_a_weight_changed_in_place_is_found_by_the_checksums(run_copy, data_dir, run_here):
    path = os.path.join(run_copy, 'ckpt.pt')
    changed = overwrite_a_weight(path)
    torch.load(path, weights_only=True)  # loads
    before = files(run_copy)
    for script, args in (('sample.py', ['--device=cpu']), ('train.py', [*TINY_RUN, f'--data_dir={data_dir}',
                                                                       '--init_from=resume', '--max_iters=6'])):
        with pytest.raises(UserError) as e:
            run_here(script, f'--out_dir={run_copy}', *args)
        assert str(e.value) == (f"{path} is damaged: the bytes of {changed} are not those written (their checksum "
                                "differs); restore it from a copy, or train again (train.py --overwrite replaces it)")
    assert files(run_copy) == before


@pytest.mark.parametrize('field, value', [('model', []), ('rng', {}), ('log', [1]), ('iter_num', '4'),
                                          ('config', None)])
def test_a_checkpoint_field_of_another_type_is_named_damaged(field, value, run_copy, tmp_path):
    ckpt = torch.load(os.path.join(run_copy, 'ckpt.pt'), weights_only=True)
    torch.save({**ckpt, field: value}, tmp_path / 'ckpt.pt')
    with pytest.raises(UserError) as e:
        checkpoint.load_checkpoint(str(tmp_path / 'ckpt.pt'))
    assert str(e.value) == (f"{tmp_path}/ckpt.pt is damaged: its {field} is not what train.py writes there; restore "
                            "it from a copy, or train again (train.py --overwrite replaces it)")


@pytest.mark.parametrize('field, value, message', [
    ('rng', [{'data': 'seven'}], "the checkpoint is damaged: rank 0's random number state is not one; "),
    ('optimizer', [{'state': {}}], "{path} is damaged: its optimizer state is not that of an "
                                     "optimizer; ")])
def test_a_resume_from_damaged_state_is_one_line(field, value, message, run_copy, data_dir):
    path = os.path.join(run_copy, 'ckpt.pt')
    torch.save({**torch.load(path, weights_only=True), field: value}, path)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--max_iters=6')
    assert str(e.value) == message.format(path=path) + ("restore it from a copy, or train again (train.py "
                                                        "--overwrite replaces it)")


def test_text_from_a_checkpoint_is_printed_without_control_characters():
    assert checkpoint.trained_with({'iter_num': 4, 'torch_version': '2.13', 'git_commit': 'abc\x1b[2J\x1b]0;x\x07'}) \
        == 'iter 4, torch 2.13, commit abc\\x1b[2J\\x1b]0;x\\x07'


def test_a_crafted_log_copy_is_not_written_as_it_is(run_copy, data_dir):
    """The log a checkpoint holds is written back (a run killed between its two writes) only as train.py writes
    records: one JSON object of an iteration up to the checkpoint's a line, nothing else of the copy."""
    path = os.path.join(run_copy, 'ckpt.pt')
    ckpt = torch.load(path, weights_only=True)
    records = [json.loads(line) for line in ckpt['log']]
    ckpt['log'] = ['\x1b[2J\x1b]0;owned\x07\n', *ckpt['log'][:2], ' {"iter": 1,   "x": "\\u001b"}\n',
                   '{"iter": 99}\n', '[1]\n', '{"iter": "2"}\n']
    torch.save(ckpt, path)
    os.remove(os.path.join(run_copy, 'log.jsonl'))
    assert train(data_dir, run_copy, '--init_from=resume', '--max_iters=4') == 0  # nothing to train: writes the log
    with open(os.path.join(run_copy, 'log.jsonl'), 'rb') as f:
        assert f.read().decode() == ''.join(json.dumps(r) + '\n' for r in [*records[:2], {'iter': 1, 'x': '\x1b'}])


def test_a_log_of_binary_bytes_is_named_and_made_whole_on_resume(run_copy, data_dir):
    log = os.path.join(run_copy, 'log.jsonl')
    whole = open(log, 'rb').read()
    with open(log, 'wb') as f:
        f.write(bytes(range(256)) * 4)
    with pytest.raises(UserError, match=rf"{log}, line 1: not a record of train.py \("):
        checkpoint.read_log(run_copy)
    assert train(data_dir, run_copy, '--init_from=resume', '--max_iters=4') == 0
    assert open(log, 'rb').read() == whole
