"""bench.py: end to end on a tiny config (subprocess), JSON records, summary line, memory helper.

No timed assertions: these only check that the benchmark runs and reports what it should.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench  # noqa: E402

TINY = ['--n_layer=2', '--n_embd=32', '--n_head=4', '--vocab_size=64', '--block_size=16', '--batch_size=2',
        '--warmup=1', '--iters=2', '--decode_tokens=8', '--threads=1']
FIELDS = ['setting', 'variant', 'n_kv_head', 'compile', 'params', 'step_ms', 'tok_s', 'mfu', 'train_tflops',
          'mem_bytes', 'decode_tok_s_cache', 'decode_tok_s_nocache', 'step_ratio', 'mem_ratio', 'loss_last']


def run_bench(*args, tmp_path=None):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    return subprocess.run([sys.executable, os.path.join(ROOT, 'bench.py'), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_end_to_end_json_and_summary(tmp_path):
    out = tmp_path / 'bench.json'
    p = run_bench(*TINY, '--variants=baseline,lime,lime-last-2,hc', '--settings=mha-eager,gqa-eager',
                  f'--json={out}')
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())['records']
    assert len(recs) == 4 * 2  # one per variant x setting
    assert {(r['setting'], r['variant']) for r in recs} == {
        (s, v) for s in ('mha-eager', 'gqa-eager') for v in ('baseline', 'lime', 'lime-last-2', 'hc')}
    for r in recs:
        for f in FIELDS:
            assert f in r, f
        assert r['step_ms'] > 0 and r['tok_s'] > 0 and r['mem_bytes'] > 0
        assert r['decode_tok_s_cache'] > 0 and r['decode_tok_s_nocache'] > 0
        assert r['mfu'] is None  # CPU, no --peak_flops
        assert r['n_kv_head'] == (4 if r['setting'] == 'mha-eager' else 1)
    by = {(r['setting'], r['variant']): r for r in recs}
    assert by[('mha-eager', 'lime')]['router'] == 'full' and by[('mha-eager', 'lime-last-2')]['router'] == 'last-2'
    assert by[('mha-eager', 'hc')]['hc'] == 4 and by[('mha-eager', 'baseline')]['step_ratio'] == 1.0
    lines = p.stdout.strip().splitlines()
    assert lines[-1].startswith('summary:')
    assert 'lime/baseline step' in lines[-1] and 'hc/baseline step' in lines[-1] and 'mem' in lines[-1]
    # the table lists HC when requested
    assert any(line.split()[:2] == ['mha-eager', 'hc'] for line in lines)


def test_sequential_bf16_profile_and_peak_flops(tmp_path):
    out = tmp_path / 'b.json'
    p = run_bench(*TINY, '--variants=baseline,lime,hc-dynamic', '--decode=False', '--peak_flops=1e12',
                  '--interleave=False', '--dtype=bfloat16', '--profile=True', '--profile_steps=1', f'--json={out}')
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())['records']
    assert [r['variant'] for r in recs] == ['baseline', 'lime', 'hc-dynamic']
    assert all(r['mfu'] is not None and r['mfu'] > 0 for r in recs)
    assert 'decode_tok_s_cache' not in recs[0]
    assert recs[0]['mem_method'] == 'saved_tensors+params+optimizer'
    assert 'route bwd' in p.stdout and 'lime minus baseline' in p.stdout


def fails_with(argv, capsys):
    """In-process: argument errors exit before the benchmark touches any global torch state."""
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error:'), err
    return err[0]


@pytest.mark.parametrize('arg, word', [('--n_layers=3', "did you mean 'n_layer'"),
                                        ('--variants=baseline,limo', 'unknown variant'),
                                        ('--variants=lime-bogus', 'unknown router'),
                                        ('--settings=mha-eagr', "did you mean 'eager'"),
                                        ('--settings=kv3', 'divisible'),
                                        ('--iters=yes', 'expects int'),
                                        ('--dtype=bf16', "did you mean 'bfloat16'")])
def test_bad_arguments_fail_in_one_line(arg, word, capsys):
    assert word in fails_with(TINY + [arg], capsys)


def test_config_file_and_unknown_key_in_it(tmp_path, capsys):
    bad = tmp_path / 'bad.py'
    bad.write_text("batchsize = 4\n")
    assert "'batch_size'" in fails_with([str(bad)], capsys)
    good = tmp_path / 'good.py'
    good.write_text("n_layer = 2\nn_embd = 32\nvariants = 'baseline'\ndecode = False\n")
    p = run_bench(str(good), *TINY[2:], '--n_head=2')
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith('summary:')


# ----------------------------------------------------------------------------- memory helper
def test_saved_tensor_bytes_counts_a_known_tensor():
    x = torch.randn(1000, requires_grad=True)
    out, n = bench.saved_tensor_bytes(lambda: x.exp())  # exp saves its result: 1000 floats
    assert n == 4000
    out.sum().backward()  # still differentiable


def test_saved_tensor_bytes_dedups_shared_storage():
    a = torch.randn(100, requires_grad=True)
    # sin and cos both save `a`, and a view of `a` saves its whole base storage: one storage, 400 bytes
    _, n = bench.saved_tensor_bytes(lambda: a.sin() + a.cos() + a[:10].sin().sum())
    assert n == 400
    # excluded storages (e.g. parameters) are not counted
    _, n = bench.saved_tensor_bytes(lambda: a.sin(), exclude={bench.storage_key(a)})
    assert n == 0
    # two distinct saved storages add up
    b = torch.randn(50, dtype=torch.float64, requires_grad=True)
    _, n = bench.saved_tensor_bytes(lambda: a.sin().sum() + b.sin().sum())
    assert n == 400 + 400


def test_model_and_optimizer_bytes():
    lin = torch.nn.Linear(10, 5, bias=False)
    assert bench.model_bytes(lin) == 200
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.randn(3, 10)).sum().backward()
    opt.step()
    assert bench.optim_bytes(opt) >= 2 * 200  # exp_avg, exp_avg_sq (+ step)


# ----------------------------------------------------------------------------- naming
def test_variant_and_setting_names():
    assert bench.variant_overrides('baseline') == dict(lime=False, hc=0)
    assert bench.variant_overrides('lime') == dict(lime=True, router='full')
    assert bench.variant_overrides('lime-first-4') == dict(lime=True, router='first-4')
    assert bench.variant_overrides('hc') == dict(hc=4, hc_dynamic=False)
    assert bench.variant_overrides('hc2-dynamic') == dict(hc=2, hc_dynamic=True)
    with pytest.raises(ValueError):
        bench.variant_overrides('hcx')
    cfg = dict(n_head=8, n_kv_head=None, gqa_kv_head=None, compile=False, settings='mha-eager,gqa-compiled,kv4-ro')
    assert bench.parse_settings(cfg) == [('mha-eager', 8, None), ('gqa-compiled', 2, 'default'),
                                         ('kv4-ro', 4, 'reduce-overhead')]
    cfg.update(settings='', n_kv_head=2, compile=True)
    assert bench.parse_settings(cfg) == [('gqa-compiled', 2, 'default')]
