"""bench.py and dev/bench_detail.py on tiny shapes: records, table, ratios, errors, the one init, the
memory measures. Nothing here asserts a timing: these check what is reported, not how fast.

The compiled setting runs with the aot_eager backend: inductor itself is tested in test_compile.py."""
import json
import os
import re
import runpy
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench  # noqa: E402
from conftest import Terminal  # noqa: E402
from nanolime.common import UserError  # noqa: E402

TINY = ['--n_layer=2', '--n_embd=32', '--n_head=4', '--vocab_size=64', '--block_size=16', '--batch_size=2',
        '--warmup=1', '--iters=2', '--threads=1', '--device=cpu']
SHAPE = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, mlp_hidden=None)
FIELDS = ['setting', 'variant', 'n_layer', 'first_step_s', 'n_kv_head', 'compile', 'params', 'flops_per_token', 'step_ms', 'step_ms_samples',
          'tok_s', 'mfu', 'mem_bytes', 'mem_method', 'loss_last', 'step_ratio', 'step_ratio_paired', 'mem_ratio',
          'aten_ops', 'ops_ratio', 'ops_added_per_layer']


def run(*args, script='bench.py', code=None):
    """The script in a subprocess (or `code` through python -c, for tests that patch something first)."""
    cmd = [sys.executable, '-c', code, *args] if code else [sys.executable, os.path.join(ROOT, script), *args]
    return subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS='1'), capture_output=True,
                          text=True, timeout=900)


def rows(stdout, setting, n_layer=2):
    """Table rows of one depth and setting: {variant: the row's fields after the variant}."""
    return {p[2]: p[3:] for p in (line.split() for line in stdout.splitlines()) if p[:2] == [str(n_layer), setting]}


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_json_table_and_ratios(tmp_path):
    out = tmp_path / 'bench.json'
    p = run(*TINY, '--variants=baseline,lime,lime:last-2,hc', '--settings=mha-eager,gqa-eager', f'--json={out}',
            '--depths=1,2')
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())['records']
    assert [(r['n_layer'], r['setting'], r['variant']) for r in recs] == [
        (L, s, v) for L in (1, 2) for s in ('mha-eager', 'gqa-eager') for v in ('baseline', 'lime', 'lime:last-2', 'hc')]
    assert recs[0]['params'] < recs[-1]['params']  # each depth is built: 1 layer, then 2
    recs = [r for r in recs if r['n_layer'] == 2]
    for r in recs:
        assert r['first_step_s'] > 0
        assert all(f in r for f in FIELDS), [f for f in FIELDS if f not in r]
        assert r['step_ms'] > 0 and r['tok_s'] > 0 and r['mem_bytes'] > 0 and len(r['step_ms_samples']) == 2
        assert r['mfu'] is None and r['mem_method'] == 'saved_for_backward'  # CPU, no --peak_flops
        assert r['n_kv_head'] == (4 if r['setting'] == 'mha-eager' else 1)
        base = next(b for b in recs if b['setting'] == r['setting'] and b['variant'] == 'baseline')
        assert r['step_ratio'] == pytest.approx(r['step_ms'] / base['step_ms'])
        assert r['mem_ratio'] == pytest.approx(r['mem_bytes'] / base['mem_bytes'])
    by = {(r['setting'], r['variant']): r for r in recs}
    assert by[('mha-eager', 'hc')]['mem_ratio'] > 1.2  # 4 residual streams: clearly more activations
    assert by[('mha-eager', 'lime')]['params'] > by[('mha-eager', 'baseline')]['params']  # the routers
    table = rows(p.stdout, 'mha-eager')
    assert list(table) == ['baseline', 'lime', 'lime:last-2', 'hc']
    assert table['baseline'][2] == '1.000' and table['baseline'][-2] == '1.000'  # x base columns
    assert float(table['hc'][-2]) == pytest.approx(by[('mha-eager', 'hc')]['mem_ratio'], abs=1e-3)
    assert float(table['lime'][-1]) == pytest.approx(by[('mha-eager', 'lime')]['first_step_s'], abs=0.06)
    for variant, fields in table.items():  # the op count and what it adds per layer, after the MFU column
        r = by[('mha-eager', variant)]
        assert fields[5:7] == [str(r['aten_ops']), f"{r['ops_added_per_layer']:.1f}"]
        assert r['ops_added_per_layer'] == (0 if variant == 'baseline' else pytest.approx(
            (r['aten_ops'] - by[('mha-eager', 'baseline')]['aten_ops']) / 2))
    assert by[('mha-eager', 'hc')]['ops_added_per_layer'] > by[('mha-eager', 'lime')]['ops_added_per_layer'] > 0
    assert 'ops: aten ops in one train step' in p.stdout
    assert 'mem: bytes saved for backward' in p.stdout and f'wrote {out}' in p.stdout


@pytest.mark.slow
def test_sequential_bfloat16_and_mfu(tmp_path):
    out = tmp_path / 'b.json'
    p = run(*TINY, '--variants=hc:dynamic,baseline', '--interleave=False', '--dtype=bfloat16',
            '--peak_flops=1e12', f'--json={out}')
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    recs = {r['variant']: r for r in data['records']}
    for r in recs.values():  # MFU from model.estimate_mfu: 3 x forward FLOPs per token x tokens/s / peak
        assert r['mfu'] == pytest.approx(3 * r['flops_per_token'] * r['tok_s'] / 1e12)
    hc, base = recs['hc:dynamic'], recs['baseline']
    assert hc['step_ratio'] == pytest.approx(hc['step_ms'] / base['step_ms'])
    assert data['config']['interleave'] is False and data['config']['device'] == 'cpu'


# ----------------------------------------------------------------------------- compiled settings
FAKE_COMPILE = """
import runpy, sys, torch
def fake_compile(model, **kw):  # LIMe 'fails to compile'; others run eagerly
    assert kw.get('fullgraph') is True
    if not getattr(model, 'config', None) or not model.config.lime:  # bench's compiler warm-up, or not LIMe
        return model
    def fail(*a, **k):
        raise RuntimeError("simulated compile failure\\n  with a second line")
    return fail
torch.compile = fake_compile
sys.argv = ['bench.py'] + sys.argv[1:]
runpy.run_path('bench.py', run_name='__main__')
"""


@pytest.mark.slow
def test_a_compile_failure_is_reported_and_the_rest_runs(tmp_path):
    out = tmp_path / 'c.json'
    p = run(*TINY, '--variants=baseline,lime,hc', '--settings=mha-compiled,mha-eager', f'--json={out}',
            code=FAKE_COMPILE)
    assert p.returncode == 0, p.stderr
    recs = {(r['setting'], r['variant']): r for r in json.loads(out.read_text())['records']}
    assert recs[('mha-compiled', 'lime')] == dict(setting='mha-compiled', variant='lime', error=(
        'RuntimeError: simulated compile failure with a second line'))
    assert recs[('mha-compiled', 'hc')]['step_ratio'] > 0 and recs[('mha-compiled', 'hc')]['compile'] == 'default'
    assert recs[('mha-eager', 'lime')]['step_ms'] > 0  # the eager setting is not affected
    assert 'lime  failed: RuntimeError: simulated compile failure' in p.stdout
    assert [v for (s, v) in recs if s == 'mha-compiled'] == ['baseline', 'lime', 'hc']  # in the order asked


# bench.py with LIMe's forward failing eagerly (the others run)
LIME_FAILS = FAKE_COMPILE.replace("torch.compile = fake_compile", """import model
forward = model.GPT.forward
def broken(self, *a, **k):
    if self.config.lime:
        raise RuntimeError('a bug in the model')
    return forward(self, *a, **k)
model.GPT.forward = broken""")


@pytest.mark.slow
def test_an_eager_failure_is_not_swallowed():
    p = run(*TINY, '--variants=baseline,lime', code=LIME_FAILS)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        'error: RuntimeError: a bug in the model (rerun with --debug for the traceback)']


AOT_EAGER = """
import functools, runpy, sys, torch, torch._inductor.utils as utils
torch.compile = functools.partial(torch.compile, backend='aot_eager')  # no C++ kernels to build: seconds
fresh, caches = getattr(utils, 'fresh_cache', None) or utils.fresh_inductor_cache, []  # older torch: its old name
utils.fresh_cache = lambda: caches.append(1) or fresh()
sys.argv = ['bench.py'] + sys.argv[1:]
runpy.run_path('bench.py', run_name='__main__')
print('fresh caches:', len(caches))
"""


@pytest.mark.slow
def test_compiled_setting(tmp_path):
    """bench.py's compiled setting: torch.compile(fullgraph=True), each variant's first step in an empty cache."""
    out = tmp_path / 'c.json'
    p = run(*TINY, '--variants=baseline,lime', '--settings=kv2-compiled', '--warmup=1', '--iters=1',
            f'--json={out}', code=AOT_EAGER)
    assert p.returncode == 0, p.stderr
    recs = json.loads(out.read_text())['records']
    assert [r['variant'] for r in recs] == ['baseline', 'lime'] and all(r['compile'] == 'default' for r in recs)
    assert all(r['mem_bytes'] > 0 and r['first_step_s'] > 0 and r['step_ms'] > 0 for r in recs)
    assert p.stdout.splitlines()[-1] == 'fresh caches: 3'  # the compiler's warm-up, then each variant's compile


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize('arg, words', [
    ('--n_layers=3', "did you mean 'n_layer'"),
    ('--variants=baseline,limo', "unknown variant 'limo'"),
    ('--variants=lime:bogus', "unknown router 'bogus'"),
    ('--variants=hc+denseformer', "variant 'hc+denseformer'"),
    ('--settings=mha-eagr', "bad setting 'mha-eagr'"),
    ('--settings=kv3-eager', 'dividing n_head=4'),
    ('--iters=yes', 'expected int'),
    ('--warmup=0', 'must be >= 1'),
    ('--variants=lime,lime', 'distinct'),
])
def test_bad_arguments_are_user_errors_before_any_work(arg, words, monkeypatch, capsys):
    """In-process (fast): bench.py's own checks raise UserError, which nanolime/common.py prints as one line."""
    monkeypatch.setattr(sys, 'argv', ['bench.py', *TINY, arg])
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)  # configure() installs its own: restore it after
    with pytest.raises(UserError) as e:
        runpy.run_path(os.path.join(ROOT, 'bench.py'), run_name='__main__')
    assert words in str(e.value) and '\n' not in str(e.value)
    assert capsys.readouterr().out == ''  # nothing ran


def test_an_existing_json_is_replaced_saying_so(tmp_path, monkeypatch, capsys):
    out = tmp_path / 'b.json'
    out.write_text('an earlier benchmark')
    monkeypatch.setattr(sys, 'argv', ['bench.py', *TINY, '--variants=baseline', '--settings=mha-eager', f'--json={out}'])
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
    runpy.run_path(os.path.join(ROOT, 'bench.py'), run_name='__main__')
    assert capsys.readouterr().out.startswith(f"note: json={out} exists: this benchmark's records replace it\n")
    assert [r['variant'] for r in json.loads(out.read_text())['records']] == ['baseline']


@pytest.mark.slow
def test_a_bad_argument_prints_one_error_line():
    p = run(*TINY, '--settings=mha-eagr')
    assert p.returncode == 1 and p.stdout == '' and p.stderr.splitlines() == [
        "error: bad setting 'mha-eagr': use <mha|gqa|kv<N>>-<eager|compiled|ro> with N dividing n_head=4, "
        "e.g. --settings=mha-eager,gqa-compiled"]


@pytest.mark.slow
def test_config_files(tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text("batchsize = 4\n")
    p = run(str(bad))
    assert p.returncode == 1 and "unknown config key 'batchsize'" in p.stderr and "'batch_size'" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    good = tmp_path / 'good.py'
    good.write_text("n_layer = 3\nvariants = 'baseline'\n")
    p = run(str(good), *TINY[1:], '--n_head=2')
    assert p.returncode == 0, p.stderr
    assert 'L=3 ' in p.stdout and 'H=2 ' in p.stdout and list(rows(p.stdout, 'mha-eager', 3)) == ['baseline']


@pytest.mark.parametrize('name', ['bench_cpu_4x128', 'bench_cpu_16x128', 'bench_cpu_8x256_gqa', 'bench_1b',
                                  'bench_depth_cpu', 'bench_depth_gpu'])
def test_shipped_configs_load(name):
    """Every key of the shipped configs is one bench.py knows (and dev/bench_detail.py, which shares them)."""
    scope = {}
    exec(open(os.path.join(ROOT, 'config', f'{name}.py')).read(), scope)
    keys = {k for k in scope if not k.startswith('_')}
    assert keys and keys <= set(vars(bench)), keys - set(vars(bench))
    bench.parse_settings(scope['settings'], scope['n_head'], scope['n_kv_head'], scope.get('gqa_kv_head'))
    shape = {k: scope.get(k, getattr(bench, k)) for k in SHAPE}
    for v in scope['variants'].split(','):
        bench.variant_config(v, shape)


# ----------------------------------------------------------------------------- variants, settings, one init
def test_variant_table():
    """bench.py reads nanolime/variants.py's grammar (its tests: tests/test_variants.py) into a GPTConfig."""
    c = bench.variant_config
    assert not c('baseline', SHAPE).lime and c('baseline', SHAPE).hc == 0
    assert c('lime', SHAPE).lime and c('lime', SHAPE).router == 'full'
    assert c('lime:last-2', SHAPE).router == 'last-2' and c('lime:dynamic', SHAPE).router == 'dynamic'
    assert (c('hc', SHAPE).hc, c('hc', SHAPE).hc_dynamic) == (4, False) and c('hc:dynamic', SHAPE).hc_dynamic
    assert (c('mhc', SHAPE).hc, c('mhc', SHAPE).mhc, c('mhc:static', SHAPE).mhc) == (4, 'dynamic', 'static')
    assert c('lime+attnres:block-4', SHAPE).attnres == 'block-4' and c('lime+attnres:block-4', SHAPE).lime
    assert c('lime~router_init=identity', SHAPE).router_init == 'identity'
    completep = c('lime~depth_scaling=completep~depth_base=2', SHAPE)  # an int after '~', as train.py reads it
    assert (completep.depth_scaling, completep.depth_base) == ('completep', 2)
    with pytest.raises(UserError, match="variant 'attnres:blocks': unknown attnres"):
        c('attnres:blocks', SHAPE)
    with pytest.raises(UserError, match="unknown variant 'hcx'"):
        c('hcx', SHAPE)
    with pytest.raises(UserError, match="variant 'lime~max_iters=3': max_iters is a training option; bench.py "
                                        "measures the model"):
        c('lime~max_iters=3', SHAPE)  # a training option: the model has no such field


def test_settings():
    assert bench.parse_settings('mha-eager,gqa-compiled,kv4-ro', 8, None, None) == [
        ('mha-eager', 8, None), ('gqa-compiled', 2, 'default'), ('kv4-ro', 4, 'reduce-overhead')]
    assert bench.parse_settings('gqa-eager', 8, 4, None) == [('gqa-eager', 4, None)]  # the config's GQA
    assert bench.parse_settings('gqa-eager', 8, None, 1) == [('gqa-eager', 1, None)]  # gqa_kv_head
    for bad in ('', 'mha', 'mha-fast', 'xyz-eager', 'kv3-eager', 'kv-eager'):
        with pytest.raises(UserError, match='bad setting'):
            bench.parse_settings(bad, 8, None, None)


@pytest.mark.parametrize('variant', ['lime', 'hc', 'lime:dynamic', 'denseformer', 'mhc', 'mhc:static',
                                     'attnres:block', 'mudd', 'moda'])
def test_every_variant_starts_from_the_baseline_init(variant):
    state = bench.build_model('baseline', SHAPE, 8, 'cpu').state_dict()  # another seed: copied, not re-drawn
    own = bench.build_model(variant, SHAPE, 7, 'cpu', state).state_dict()
    assert set(state) <= set(own)
    for k, v in state.items():
        assert torch.equal(own[k], v), k


# ----------------------------------------------------------------------------- op counts
def test_the_rounds_show_a_bar_on_a_terminal(monkeypatch):
    """Warm-up and timed rounds each a progress bar on a terminal, cleared when done."""
    import contextlib
    for name, value in dict(warmup=1, iters=2, count_ops=False, block_size=16, batch_size=2).items():
        monkeypatch.setattr(bench, name, value)
    x = torch.randint(64, (2, 16))
    with contextlib.redirect_stderr(Terminal()) as terminal:
        records = bench.run_setting('mha-eager', 4, None, ['baseline'], SHAPE, [(x, x)] * 4, torch.device('cpu'),
                                    contextlib.nullcontext(), None)
    assert len(records) == 1 and len(records[0]['step_ms_samples']) == 2
    assert 'mha-eager: warm-up:   0%|          | 0/1' in terminal.getvalue()  # drawn; cleared at the end
    assert 'mha-eager: timed:   0%|          | 0/2' in terminal.getvalue()


def test_aten_ops_counts_every_call():
    x = torch.ones(3)
    for n in (1, 3):
        out, counts = bench.aten_ops(lambda: [x.add(1) for _ in range(n)])
        assert len(out) == n and counts['aten::add'] == n
    _, counts = bench.aten_ops(lambda: torch.ones(2, 3) @ torch.ones(3, 4))
    assert counts['aten::matmul'] == 1 and counts['aten::mm'] == 1  # nested calls count too


def test_step_op_count_follows_the_model():
    """One train step's forward and backward: the same count twice (a count, not a time), more with a layer
    more, more with LIMe's routers; the weights are left as they were (no optimizer step)."""
    x = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(0))
    counts = {}
    for variant, L in (('baseline', 2), ('baseline', 3), ('lime', 3)):
        m = bench.build_model(variant, dict(SHAPE, n_layer=L), 0, 'cpu')
        r = dict(model=m, fwd=m, opt=m.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.95), 'cpu'))
        before = {k: v.clone() for k, v in m.state_dict().items()}
        counts[variant, L] = [sum(bench.count_step_ops(r, x, x, torch.autocast('cpu', enabled=False), None).values())
                              for _ in range(2)]
        assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
        assert all(p.grad is None for p in m.parameters())
    assert all(a == b for a, b in counts.values()), counts
    assert counts['baseline', 2][0] < counts['baseline', 3][0] < counts['lime', 3][0], counts


# ----------------------------------------------------------------------------- memory measures
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
    _, n = bench.saved_tensor_bytes(lambda: a.sin(), exclude={bench.storage_key(a)})  # e.g. parameters
    assert n == 0
    b = torch.randn(50, dtype=torch.float64, requires_grad=True)  # two distinct storages add up
    _, n = bench.saved_tensor_bytes(lambda: a.sin().sum() + b.sin().sum())
    assert n == 400 + 400


def test_cuda_memory_measure_uses_the_indexed_device(monkeypatch):
    """No GPU here: torch.cuda's memory calls are replaced by fakes that insist on an indexed device,
    as every CUDA call must get one. The measure is the step's peak less what other variants hold."""
    dev = torch.device('cuda:1')
    calls = []

    def fake(result):
        def f(device):
            assert isinstance(device, torch.device) and device.index == 1, device
            calls.append(device)
            return result
        return f
    monkeypatch.setattr(torch.cuda, 'synchronize', fake(None))
    monkeypatch.setattr(torch.cuda, 'reset_peak_memory_stats', fake(None))
    monkeypatch.setattr(torch.cuda, 'memory_allocated', fake(1000))
    monkeypatch.setattr(torch.cuda, 'max_memory_allocated', fake(1600))
    model = bench.build_model('lime', SHAPE, 0, 'cpu')  # the step itself runs on the CPU
    r = dict(model=model, fwd=model, opt=model.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.95), 'cpu'))
    x = torch.randint(64, (1, 16))
    assert bench.measure_memory(r, x, x, dev, torch.autocast('cpu', enabled=False), None) == 600
    assert len(calls) == 5  # synchronize, memory_allocated, reset, synchronize, max_memory_allocated


# ----------------------------------------------------------------------------- dev/bench_detail.py
@pytest.mark.slow
def test_bench_detail_all_sections():
    p = run(*TINY, '--variants=baseline,lime', '--profile_steps=1', '--profile_top=3', '--decode_tokens=4',
            '--decode_iters=1', '--depths=1,2', script='dev/bench_detail.py')
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert '[mha-eager] lime minus baseline, self ms per step' in out
    assert '[mha-eager] decode: 4 new tokens' in out and 'tok/s cache' in out
    assert 'lime: ratio 1.000x at 1 layers -> ' in out  # one layer: LIMe has no router, same memory


@pytest.mark.slow
def test_bench_detail_bad_section():
    p = run('--sections=profil', script='dev/bench_detail.py')
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: --sections='profil': use a comma list of profile, decode, ops and memory"]


@pytest.mark.slow
def test_a_benchmark_cut_short_keeps_what_it_measured(tmp_path):
    """--json is written after every variant: a run stopped later (here by LIMe's failing forward; on a lent GPU by
    its time limit) leaves the variants measured before it."""
    out = tmp_path / 'b.json'
    p = run(*TINY, '--variants=baseline,lime', '--interleave=False', f'--json={out}', code=LIME_FAILS)
    assert p.returncode == 1 and 'a bug in the model' in p.stderr
    assert [r['variant'] for r in json.loads(out.read_text())['records']] == ['baseline']


def test_tilde_values_are_read_as_train_py_reads_them():
    """~key=value of a model option is read as sweep.py's runs read it (train.py's --key=value): typed by the option's
    default, checked; a training option, bench.py's own shape options and an unknown key each say which it is."""
    c = bench.variant_config
    assert c('lime~tie_embeddings=False', SHAPE).tie_embeddings is False
    assert c('lime~tie_embeddings=True', SHAPE).tie_embeddings is True
    assert c('lime~dropout=0.1', SHAPE).dropout == 0.1 and c('lime~rope_theta=5e5', SHAPE).rope_theta == 500000.0
    assert c('lime~rope_theta=10000', SHAPE).rope_theta == 10000.0 and c('lime~router=first-2', SHAPE).router == 'first-2'
    assert c('lime~route_group_size=2', SHAPE).route_group_size == 2
    for name, message in [
            ('lime~tie_embeddings=maybe', "variant 'lime~tie_embeddings=maybe': tie_embeddings='maybe': expected bool"),
            ('lime~router_lr=1e-3', "variant 'lime~router_lr=1e-3': router_lr is a training option; bench.py measures "
                                    "the model: give it model options (GPTConfig's) after '~'"),
            ('lime~n_kv_head=2', "variant 'lime~n_kv_head=2': n_kv_head is bench.py's own option, the same for every "
                                 "variant: --settings=kv<N>-eager"),
            ('lime~n_layer=2', "variant 'lime~n_layer=2': n_layer is bench.py's own option, the same for every "
                               "variant: --n_layer (or --depths)"),
            ('lime~rope_thta=5', "variant 'lime~rope_thta=5': unknown option 'rope_thta'; did you mean 'rope_theta'?")]:
        with pytest.raises(UserError, match=re.escape(message)):
            c(name, SHAPE)
