"""common.py: the choices it makes for the device a run is on; loading checkpoints written by earlier
versions of the model's options; what each option takes, as its default says (configuration)."""
import ast
import importlib.util
import os
import re
import sys

import pytest
import torch

import checkpoint
import common
from conftest import REPO, run, script_here
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


# ----------------------------------------------------------------------------- configuration
@pytest.mark.parametrize('default, value, want', [
    (None, 3, 3), (None, None, None),  # None: an optional count
    ('auto', 'auto', 'auto'), ('auto', True, True), ('auto', False, False), ('auto', 'cuda:1', 'cuda:1'),
    (1.0, 2, 2.0), (2, 3, 3), ('out', 'x', 'x'), (False, True, True)])  # anything else: the default's type
def test_the_default_says_what_an_option_takes(default, value, want):
    got = common.check_value('key', value, default)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize('default, value, message', [
    (None, 'abc', "key='abc': expected int or None, got str"),
    (None, 2.5, "key=2.5: expected int or None, got float"),
    (None, True, "key=True: expected int or None, got bool"),
    ('auto', 1, "key=1: expected 'auto', a bool or a string, got int"),
    ('auto', None, "key=None: expected 'auto', a bool or a string, got None"),
    (200, None, "key=None: expected int, got None"),
    ('cpu', True, "key=True: expected str, got bool"),
    (False, 'auto', "key='auto': expected bool, got str")])
def test_what_the_default_refuses(default, value, message):
    with pytest.raises(common.UserError) as e:
        common.check_value('key', value, default)
    assert str(e.value) == message


def test_nullable_is_for_a_count_that_also_takes_none():
    """sample.py's top_k: 200 by default, None for no limit; nothing else changes."""
    assert common.check_value('top_k', None, 200, nullable=('top_k',)) is None
    assert common.check_value('top_k', 50, 200, nullable=('top_k',)) == 50
    with pytest.raises(common.UserError, match="top_k='all': expected int or None, got str"):
        common.check_value('top_k', 'all', 200, nullable=('top_k',))


def script_defaults(script):
    """A script's options as configure() finds them: its top-level NAME = <constant>."""
    tree = ast.parse(open(os.path.join(REPO, script)).read())
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) for t in node.targets if isinstance(t, ast.Name)}


@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'eval.py', 'prepare.py', 'analyze.py', 'bench.py',
                                    'arithmetic.py', 'sweep.py', 'export.py', 'dev/bench_detail.py'])
def test_every_script_configures_without_lists(script, monkeypatch):
    """What each script's None and 'auto' options take, from the command line and from a config file, with
    configure(globals()) and nothing more: None or a count; 'auto', True, False or a name."""
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)  # configure() installs its own
    defaults = script_defaults(script)
    optional = [k for k, v in defaults.items() if v is None]
    auto = [k for k, v in defaults.items() if v == 'auto']
    assert script not in ('train.py', 'eval.py', 'bench.py') or (optional and auto), defaults
    for key in optional:
        assert common.configure(dict(defaults), [f'--{key}=4'])[key] == 4
        assert common.configure(dict(defaults), [f'--{key}=4', f'--{key}=None'])[key] is None  # later wins
        with pytest.raises(common.UserError, match=rf"^{key}='abc': expected int or None, got str \(--{key}=abc\)$"):
            common.configure(dict(defaults), [f'--{key}=abc'])
    for key in auto:
        for raw, want in (('True', True), ('False', False), ('auto', 'auto'), ('cpu', 'cpu')):
            got = common.configure(dict(defaults), [f'--{key}={raw}'])[key]
            assert got == want and type(got) is type(want)


def test_a_config_file_sets_none_and_auto_options(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
    f = tmp_path / 'cfg.py'
    f.write_text("n_kv_head = 2\nmlp_hidden = None\ncompile = False\n")
    c = common.configure(script_defaults('train.py'), [str(f)])
    assert (c['n_kv_head'], c['mlp_hidden'], c['compile']) == (2, None, False)
    f.write_text("compile = 1\n")
    with pytest.raises(common.UserError, match=rf"^compile=1: expected 'auto', a bool or a string, got int \({f}\)$"):
        common.configure(script_defaults('train.py'), [str(f)])


@pytest.mark.parametrize('script, args, message', [
    ('train.py', ['--compile=maybe'], "compile='maybe': expected 'auto', True or False"),
    ('train.py', ['--compile=None'], "compile='None': expected 'auto', True or False"),
    ('sample.py', ['--device=True'], "device=True: expected 'auto', 'cpu', 'cuda', 'cuda:<n>' or 'mps'"),
    ('sample.py', ['--dtype=False'], "dtype=False: expected 'auto', 'float32', 'bfloat16' or 'float16'")])
def test_the_script_checks_its_auto_options(script, args, message, tmp_path):
    """An 'auto' option takes any bool or name from configure(); the script refuses the ones it has no use for."""
    with pytest.raises(common.UserError) as e:
        script_here(script, f'--out_dir={tmp_path}', *args)
    assert str(e.value) == message


@pytest.mark.parametrize('arg, message', [('--renyi_order=0', 'renyi_order=0.0 must be a finite number > 0'),
                                          ('--renyi_order=1e999', 'renyi_order=inf must be a finite number > 0')])
def test_the_renyi_order_is_named_as_what_it_is(arg, message, tmp_path):
    """analyze.py's order of the Renyi entropy (the paper's alpha, Sec. 5.2) is renyi_order: alpha is HC's."""
    with pytest.raises(common.UserError) as e:
        script_here('analyze.py', str(tmp_path), arg)
    assert str(e.value) == message
    with pytest.raises(common.UserError, match="^unknown config key 'alpha'"):
        script_here('analyze.py', str(tmp_path), '--alpha=2')


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
