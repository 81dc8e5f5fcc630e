"""common.py: the choices it makes for the device a run is on; loading checkpoints written by earlier
versions of the model's options."""
import importlib.util
import re

import pytest
import torch

import checkpoint
import common
from conftest import run
from model import GPT, GPTConfig


@pytest.mark.parametrize('gpu, native, want', [('A100', True, torch.bfloat16), ('V100', False, torch.float16),
                                               ('T4', False, torch.float16)])
def test_auto_dtype_is_bf16_only_where_the_gpu_has_it(gpu, native, want, monkeypatch):
    """dtype='auto' on CUDA: bfloat16 on a GPU that computes in it (Ampere and newer); float16 with the GradScaler
    on one that only emulates it (T4, V100), where torch.cuda.is_bf16_supported() alone answers True. The GPU
    is faked: is_bf16_supported answers as torch does for it, emulation included unless told otherwise."""
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda including_emulation=True: native or including_emulation)
    assert common.resolve_dtype('auto', 'cuda:0') == want
    assert common.resolve_dtype('auto', 'cpu') == torch.float32
    assert common.resolve_dtype('bfloat16', 'cuda:0') == torch.bfloat16  # asked for by name: as asked


TINY = ['--device=cpu', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4',
        '--total_batch_size=64', '--eval_iters=1', '--warmup_iters=1', '--log_interval=1', '--compile=False']


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
                          ('analyze.py', str(bad), f'--data_dir={data_dir}'),
                          ('analyze.py', str(bad), '--no_model=True'),
                          ('train.py', f'--out_dir={bad}', *TINY, f'--data_dir={data_dir}', '--max_iters=2',
                           '--decay_lr=False', '--init_from=resume')]:
        with pytest.raises(common.UserError) as e:
            run_here(script, *args)
        assert str(e.value) == want, script
    if importlib.util.find_spec('lm_eval'):  # eval.py (its optional dependency); a process: it sets HF_* variables
        p = run('eval.py', f'--out_dir={bad}', '--tasks=arc_easy', '--device=cpu')
        assert p.returncode == 1 and p.stderr.strip().splitlines() == [f"error: {want}"]


def write_ckpt(path, **model_args):
    args = dict(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)
    model = GPT(GPTConfig(**args))
    torch.save({checkpoint.CKPT_MARKER: 1, 'model': model.state_dict(), 'model_args': {**args, **model_args},
                'iter_num': 0, 'config': {}}, path)


def test_old_model_options_load_as_what_they_were(tmp_path):
    """mhc was a flag (True: today's mhc='static'); value_residual, now removed, loads when off and is one
    error line when on, saying what to do."""
    write_ckpt(tmp_path / 'off.pt', mhc=False, value_residual=False)
    args = checkpoint.load_checkpoint(str(tmp_path / 'off.pt'))['model_args']
    assert args['mhc'] == '' and 'value_residual' not in args
    GPTConfig(**args)
    write_ckpt(tmp_path / 'static.pt', mhc=True, hc=2)
    assert checkpoint.load_checkpoint(str(tmp_path / 'static.pt'))['model_args']['mhc'] == 'static'
    write_ckpt(tmp_path / 'vr.pt', value_residual=True)
    with pytest.raises(common.UserError, match="uses value_residual, which this version no longer has"):
        checkpoint.load_checkpoint(str(tmp_path / 'vr.pt'))


# ----------------------------------------------------------------------------- variant names
def test_variant_grammar():
    """One name per model variant (bench.py and sweep.py read it): components joined by '+', a mode after ':', the
    router init after '@', options after '~'; every relative's option set, the unnamed ones to the baseline's."""
    parse, plain = common.parse_variant, common.VARIANT_PLAIN
    assert parse('baseline') == (plain, {})
    assert parse('moda') == ({**plain, 'moda': True}, {}) and parse('mudd') == ({**plain, 'mudd': True}, {})
    assert parse('lime+hc')[0] == {**plain, 'lime': True, 'hc': 4} and parse('hc8')[0] == {**plain, 'hc': 8}
    assert parse('hc8:dynamic')[0] == {**plain, 'hc': 8, 'hc_dynamic': True}
    assert parse('mhc')[0] == {**plain, 'hc': 4, 'mhc': 'dynamic'} == parse('mhc:dynamic')[0]
    assert parse('mhc:static')[0] == {**plain, 'hc': 4, 'mhc': 'static'}
    assert parse('attnres')[0] == {**plain, 'attnres': 'full'} and parse('attnres:block')[0]['attnres'] == 'block'
    assert parse('lime:first-2+attnres:block-4')[0] == {**plain, 'lime': True, 'router': 'first-2', 'attnres': 'block-4'}
    assert parse('lime:last-2@identity')[0] == {**plain, 'lime': True, 'router': 'last-2', 'router_init': 'identity'}
    assert parse('lime@identity~router_lr=1e-3~weight_decay=0') == (
        {**plain, 'lime': True, 'router_init': 'identity'}, {'router_lr': '1e-3', 'weight_decay': '0'})
    for bad, message in [('lim', "unknown variant 'lim' in 'lim'; did you mean 'lime'?"),
                         ('hc0', "unknown variant 'hc0'"), ('baseline+xyz', "unknown variant 'xyz'"),
                         ('mudd:x', "'mudd:x' takes no such mode"), ('hc:static', "'hc:static' takes no such mode"),
                         ('lime:', "'lime:' takes no such mode"), ('hc@identity', "needs lime"),
                         ('lime~router_lr', "expected '~key=value'"), ('lime~=3', "expected '~key=value'"),
                         ('lime~a=1~a=2', "a key is given twice after '~'")]:
        with pytest.raises(common.UserError, match=re.escape(message)):
            parse(bad)
