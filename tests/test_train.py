"""train.py / sample.py end to end on the CPU: tiny models, a small char dataset in a temp dir.

Every run is a subprocess of the real script (OMP_NUM_THREADS=1, seeded, fp32), so what is
tested is what a user runs. The slowest parts: DDP (torchrun, 2 gloo ranks) and torch.compile.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import prepare  # noqa: E402
import train  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=8',
        '--eval_iters=4', '--warmup_iters=5', '--log_interval=1', '--learning_rate=3e-3', '--min_lr=3e-4']


def env(**extra):
    e = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    e.pop('NANOLIME_FAULT', None)
    e.pop('NANOLIME_DEBUG', None)
    e.update(extra)
    return e


def run(script, *args, timeout=300, extra_env=None, cmd=None):
    p = subprocess.run((cmd or [sys.executable, script]) + list(args), cwd=REPO, env=env(**(extra_env or {})),
                       capture_output=True, text=True, timeout=timeout)
    return p


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert 'Traceback' not in p.stderr
    return p


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def load(out_dir):
    return torch.load(os.path.join(out_dir, 'ckpt.pt'), map_location='cpu', weights_only=True)


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    """<tmp>/shakespeare_char: the first 200k characters of the corpus, prepared by prepare.py's writer."""
    root = tmp_path_factory.mktemp('data')
    prepare.prepare_char(prepare.read_shakespeare()[:200_000], str(root / 'shakespeare_char'))
    return str(root)


@pytest.fixture(scope='session')
def trained(data_dir, tmp_path_factory):
    """One 30-iteration run, shared by the tests that only read its outputs."""
    out = str(tmp_path_factory.mktemp('run') / 'out')
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=30',
               '--lr_decay_iters=40', '--eval_interval=15'))
    return out, p


def test_end_to_end_loss_falls_checkpoint_resume_sample(trained, data_dir, tmp_path):
    out = str(tmp_path / 'out')
    shutil.copytree(trained[0], out)  # the shared run stays as it was for the other tests
    log = read_log(out)
    evals = [r for r in log if 'val_loss' in r]
    assert [r['iter'] for r in evals] == [0, 15, 30]
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 0.5  # ln(vocab) ~ 4.2 at init
    losses = [r['loss'] for r in log if 'loss' in r]
    assert sum(losses[-5:]) < sum(losses[:5]) - 2.0
    ck = load(out)
    assert ck['nanolime'] == 1 and ck['iter_num'] == 30
    assert not any(k.startswith(('_orig_mod.', 'module.')) for k in ck['model'])
    assert ck['config']['dataset'] == 'shakespeare_char' and ck['config']['data_dir'] == data_dir
    assert ck['model_args']['lime'] is True and ck['best_val_loss'] == pytest.approx(evals[-1]['val_loss'])
    assert {'optimizer', 'rng', 'meta', 'tokens', 'flops'} <= set(ck)
    # the router group follows the same schedule shape at its own peak
    last_lr = log[-1]['lr']
    for g in ck['optimizer']['param_groups']:
        assert g['lr'] == pytest.approx(g['peak_lr'] * last_lr / 3e-3)
    assert {g['name'] for g in ck['optimizer']['param_groups']} == {'decay', 'no_decay', 'router'}

    # resume: continues at iter 31, keeps the earlier log lines
    p2 = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=40',
                '--lr_decay_iters=40', '--eval_interval=15', '--init_from=resume'))
    assert 'resuming from' in p2.stdout and 'at iter 31' in p2.stdout
    log2 = read_log(out)
    iters = [r['iter'] for r in log2 if 'loss' in r]
    assert iters == list(range(1, 41))
    assert load(out)['iter_num'] == 40

    # sample with the KV cache: starts with the prompt, then new text
    s = ok(run('sample.py', f'--out_dir={out}', '--start=ROMEO:', '--num_samples=2', '--max_new_tokens=40',
               '--device=cpu'))
    samples = [x.strip('\n') for x in s.stdout.split('---------------') if x.strip()]
    assert len(samples) == 2 and all(x.startswith('ROMEO:') and len(x) >= 40 for x in samples)


def test_log_fields_and_flop_accounting(trained):
    out, p = trained
    log = read_log(out)
    ck = load(out)
    fpt = GPT(GPTConfig(**ck['model_args'])).flops_per_token(ck['model_args']['block_size'])
    tokens_per_iter = 8 * 32 * 1 * 1
    assert f'= {tokens_per_iter:,} tokens/iter' in p.stdout
    for r in log:
        assert r['tokens'] == r['iter'] * tokens_per_iter
        assert r['flops'] == 3 * fpt * r['tokens']
        if 'loss' in r:
            assert {'iter', 'tokens', 'flops', 'loss', 'lr', 'dt_ms', 'tokens_per_s', 'mfu'} <= set(r)
            assert r['mfu'] is None  # no peak known on a CPU
            assert r['tokens_per_s'] == pytest.approx(tokens_per_iter / (r['dt_ms'] / 1000))
    assert ck['flops'] == 3 * fpt * 30 * tokens_per_iter and ck['tokens'] == 30 * tokens_per_iter


def test_mfu_with_peak_flops(data_dir, tmp_path):
    out = str(tmp_path / 'o')
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=3',
               '--lr_decay_iters=10', '--eval_interval=100', '--peak_flops=1e11', '--lime=False'))
    rows = [r for r in read_log(out) if 'loss' in r]
    assert all(r['mfu'] == pytest.approx(r['flops'] / r['iter'] / (r['dt_ms'] / 1000) / 1e11) for r in rows)
    assert 'mfu ' in p.stdout


def test_resume_is_exact(data_dir, tmp_path):
    """N iterations in one run == N/2, then a resumed N/2: same losses, bit-identical weights and optimizer."""
    common = [*TINY, f'--data_dir={data_dir}', '--lr_decay_iters=20', '--eval_interval=5', '--dropout=0.1']
    full, half = str(tmp_path / 'full'), str(tmp_path / 'half')
    ok(run('train.py', *common, f'--out_dir={full}', '--max_iters=20'))
    ok(run('train.py', *common, f'--out_dir={half}', '--max_iters=10'))
    ok(run('train.py', *common, f'--out_dir={half}', '--max_iters=20', '--init_from=resume'))
    la = [(r['iter'], r['loss'], r['lr']) for r in read_log(full) if 'loss' in r]
    lb = [(r['iter'], r['loss'], r['lr']) for r in read_log(half) if 'loss' in r]
    assert [i for i, _, _ in la] == list(range(1, 21))
    assert la == lb
    a, b = load(full), load(half)
    assert a['iter_num'] == b['iter_num'] == 20
    assert a['model'].keys() == b['model'].keys()
    for k in a['model']:
        assert torch.equal(a['model'][k], b['model'][k]), k
    for sa, sb in zip(a['optimizer']['state'].values(), b['optimizer']['state'].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_ddp_cpu_two_ranks(data_dir, tmp_path):
    """torchrun, 2 gloo ranks, gradient accumulation: both ranks end with identical weights."""
    out = str(tmp_path / 'ddp')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py']
    p = ok(run(None, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=6',
               '--lr_decay_iters=10', '--eval_interval=3', '--gradient_accumulation_steps=2', cmd=cmd))
    tokens_per_iter = 8 * 32 * 2 * 2  # batch x block x accumulation x world
    assert f'x 2 ranks = {tokens_per_iter:,} tokens/iter' in p.stdout
    assert 'ddp: weights identical on all 2 ranks' in p.stdout
    log = read_log(out)
    assert [r['tokens'] for r in log if 'loss' in r] == [i * tokens_per_iter for i in range(1, 7)]
    ck = load(out)
    assert ck['world_size'] == 2 and len(ck['rng']) == 2 and ck['iter_num'] == 6
    assert ck['rng'][0]['data'] != ck['rng'][1]['data']  # each rank draws its own batches
    # an exact resume of both ranks' data streams, as a single DDP run of 6 would not tell: resume to 8
    p2 = ok(run(None, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=8',
                '--lr_decay_iters=10', '--eval_interval=3', '--gradient_accumulation_steps=2',
                '--init_from=resume', cmd=cmd))
    assert 'at iter 7' in p2.stdout and 'weights identical on all 2 ranks' in p2.stdout


def test_compile_smoke_cpu(data_dir, tmp_path):
    """LIMe trains under torch.compile (inductor, CPU) and matches eager at the first step."""
    out = str(tmp_path / 'c')
    p = ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=3',
               '--lr_decay_iters=10', '--eval_interval=100', '--compile=True', '--n_layer=3', timeout=600))
    assert 'compile True' in p.stdout
    eager = str(tmp_path / 'e')
    ok(run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={eager}', '--max_iters=3',
           '--lr_decay_iters=10', '--eval_interval=100', '--compile=False', '--n_layer=3'))
    lc = [r['loss'] for r in read_log(out) if 'loss' in r]
    le = [r['loss'] for r in read_log(eager) if 'loss' in r]
    assert len(lc) == 3 and lc == pytest.approx(le, rel=1e-4)
    assert not any(k.startswith('_orig_mod.') for k in load(out)['model'])


# ----------------------------------------------------------------------------- in-process units
def test_config_parsing_types_and_files(tmp_path):
    d = train.config_defaults(vars(train))
    c = train.parse_config(d, ['--learning_rate=1', '--compile=False', '--n_kv_head=2', '--out_dir=2024',
                               '--router=first-2'])
    assert c['learning_rate'] == 1.0 and type(c['learning_rate']) is float
    assert c['compile'] is False and c['n_kv_head'] == 2 and c['out_dir'] == '2024' and c['router'] == 'first-2'
    f = tmp_path / 'cfg.py'
    f.write_text("import math\n_helper = 3\nn_layer = _helper * 2\nbatch_size = 4\n")
    c = train.parse_config(d, [str(f), '--batch_size=8'])
    assert c['n_layer'] == 6 and c['batch_size'] == 8  # the command line wins over the file
    for bad, msg in [(['--lime=1'], 'expected bool, got int'), (['--batch_size=2.5'], 'expected int, got float'),
                     (['--n_layers=3'], "did you mean 'n_layer'"), (['--compile=maybe'], "expected 'auto'"),
                     (['--batch_size'], 'expected --key=value')]:
        with pytest.raises(train.UserError, match=msg):
            train.parse_config(d, bad)


def test_cosine_schedule():
    lr = lambda it: train.cosine_lr(it, 1e-3, 10, 110, 1e-5)  # noqa: E731
    assert lr(1) == pytest.approx(1e-4) and lr(10) == pytest.approx(1e-3)
    assert lr(60) == pytest.approx((1e-3 + 1e-5) / 2) and lr(110) == lr(500) == 1e-5
    assert all(lr(i) >= lr(i + 1) for i in range(10, 120))


def test_configs(monkeypatch):
    """The default config file restates train.py's defaults; the 1B config is the paper's (Tables 2, 3, 8)."""
    d = train.config_defaults(vars(train))
    assert train.parse_config(d, ['config/train_shakespeare_char.py']) == d
    monkeypatch.setenv('WORLD_SIZE', '8')
    c = train.parse_config(d, ['config/train_fineweb_edu_1b.py'])
    assert c['batch_size'] * c['gradient_accumulation_steps'] * 8 == 1024 and c['block_size'] == 2048
    assert (c['learning_rate'], c['router_lr'], c['weight_decay'], c['beta1'], c['beta2'], c['warmup_iters'],
            c['min_lr'], c['grad_clip'], c['max_iters'], c['dtype']) == (1e-3, 1e-2, 0.1, 0.9, 0.95, 200, 1e-6, 1.0,
                                                                          20000, 'bfloat16')
    args = {k: c[k] for k in ('block_size', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden', 'lime')}
    with torch.device('meta'):
        assert round(GPT(GPTConfig(vocab_size=50257, **args)).get_num_params() / 1e9, 5) == 1.17687  # LIMe-MHA
        args['n_kv_head'] = 8
        assert round(GPT(GPTConfig(vocab_size=50257, **args)).get_num_params() / 1e9, 5) == 1.07608  # LIMe-GQA
    c = train.parse_config(d, ['config/train_deep_narrow.py', '--n_layer=128'])
    assert c['n_layer'] == 128 and c['n_head'] == 8 and c['batch_size'] * c['gradient_accumulation_steps'] * 8 == 256
    monkeypatch.setenv('WORLD_SIZE', '3')
    with pytest.raises(train.UserError, match='global batch of 1024'):
        train.parse_config(d, ['config/train_fineweb_edu_1b.py'])
