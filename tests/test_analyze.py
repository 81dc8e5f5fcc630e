"""Tests for analyze.py: entropy, router map, linear probe, and an end-to-end run
on tiny checkpoints with a tiny char dataset."""
import importlib.util
import json
import math
import os
import pickle
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import analyze  # noqa: E402
import common  # noqa: E402
from conftest import run  # noqa: E402
import relatives  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


# ----------------------------------------------------------------------------- entropy

@pytest.mark.parametrize('t,d', [(5, 8), (8, 8), (3, 40)])
def test_entropy_orthogonal_rows(t, d):
    g = torch.Generator().manual_seed(t * d)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    Z = 2.5 * Q[:t]  # t orthonormal rows, equal norms
    assert analyze.renyi_entropy(Z) == pytest.approx(math.log(t), abs=1e-9)
    assert analyze.renyi_entropy(Z, order=2.0) == pytest.approx(math.log(t), abs=1e-9)


def test_entropy_rank_one():
    u, v = torch.randn(50, 1), torch.randn(1, 16)
    assert analyze.renyi_entropy(u @ v) == pytest.approx(0.0, abs=1e-8)
    assert analyze.renyi_entropy(np.ones((7, 3))) == pytest.approx(0.0, abs=1e-8)


def test_entropy_is_renyi_of_spectrum():
    # orthogonal rows with squared norms p: the spectrum of K is p itself
    p = np.array([0.5, 0.25, 0.125, 0.125])
    Z = np.diag(np.sqrt(p)) @ np.linalg.qr(np.random.default_rng(0).normal(size=(6, 6)))[0][:4]
    for order in (0.5, 0.99, 2.0):
        want = math.log((p ** order).sum()) / (1 - order)
        assert analyze.renyi_entropy(Z, order) == pytest.approx(want, abs=1e-9)
    assert analyze.renyi_entropy(Z, 0.99) != pytest.approx(math.log(4), abs=1e-3)


@pytest.mark.parametrize('t,d', [(30, 10), (10, 30)])
def test_entropy_matches_direct_gram(t, d):
    Z = np.random.default_rng(1).normal(size=(t, d)) * np.linspace(0.1, 3, d)
    lam = np.clip(np.linalg.eigvalsh(Z @ Z.T), 0, None)  # the t x t Gram matrix, literally
    p = lam / lam.sum()
    p = p[p > 0]
    want = math.log((p ** 0.99).sum()) / 0.01
    assert analyze.renyi_entropy(torch.tensor(Z, dtype=torch.float32)) == pytest.approx(want, rel=1e-4)


# ----------------------------------------------------------------------------- router map

def tiny(lime=True, router='full', n_layer=4, **kw):
    cfg = dict(block_size=64, vocab_size=30, n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=32,
               lime=lime, router=router)
    cfg.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**cfg)), cfg


def test_router_map_rows_sum_to_one():
    model, _ = tiny()
    M = analyze.router_map(model)
    assert M.shape == (4, 4)
    np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-12)
    assert np.all(M[np.triu_indices(4, 1)] == 0)
    np.testing.assert_array_equal(M[0], [1, 0, 0, 0])
    assert np.all(M >= 0)
    assert analyze.router_map(tiny(lime=False)[0]) is None


def test_router_map_known_values():
    model, _ = tiny()
    n_kv = 2
    with torch.no_grad():
        w = model.transformer.h[2].attn.router.weight  # (H_kv, 3 * H_kv), source s = j*H_kv + h'
        w.zero_()
        w[:, 0:n_kv] = -1.0        # layer 0: |.| = 1
        w[:, n_kv:2 * n_kv] = 3.0  # layer 1
        w[0, 2 * n_kv] = 4.0       # layer 2: mean |.| over 4 entries = 1
    M = analyze.router_map(model)
    np.testing.assert_allclose(M[2, :3], [1 / 5, 3 / 5, 1 / 5], atol=1e-12)


def test_router_map_reads_the_routers_matrix():
    # the map is built from attn.router.matrix() (the full router, whatever the variant stores)
    model, _ = tiny()
    known = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0, 0.0, 4.0]])
    model.transformer.h[2].attn.router.matrix = lambda: known
    M = analyze.router_map(model)
    np.testing.assert_allclose(M[2, :3], [0, 2 / 3, 1 / 3], atol=1e-12)


def test_router_map_variants():
    M = analyze.router_map(tiny(router='average')[0])
    for layer in range(4):
        np.testing.assert_allclose(M[layer, :layer + 1], 1 / (layer + 1), atol=1e-12)
    M = analyze.router_map(tiny(router='last-2', n_layer=5)[0])
    np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-12)
    assert M[4, 0] == 0 and M[4, 1] == 0 and M[4, 2] == 0 and M[4, 3] > 0
    M = analyze.router_map(tiny(router='first-1', n_layer=5)[0])
    assert M[4, 1] == 0 and M[4, 2] == 0 and M[4, 0] > 0 and M[4, 4] > 0


# ----------------------------------------------------------------------------- probe

def test_probe_accuracy():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 60)
    centers = rng.normal(size=(4, 16)) * 3
    X = centers[y] + rng.normal(size=(240, 16))
    m, s = analyze.probe_accuracy(X, y, folds=5)
    assert m > 0.95 and 0 <= s < 0.1
    m_rand, _ = analyze.probe_accuracy(rng.normal(size=(240, 16)), y, folds=5)
    assert m_rand < 0.45
    # string labels work too, and the result is deterministic
    words = np.array(['is', 'are', 'was', 'were'])[y]
    assert analyze.probe_accuracy(X, words) == analyze.probe_accuracy(X, words)


# ----------------------------------------------------------------------------- end to end

WORDS = ['is', 'are', 'was', 'were']


@pytest.fixture
def analyze_here(run_here, capsys):
    """analyze.py run in this process (as `python analyze.py <args>` from another directory): its stdout."""
    def run(*args):
        capsys.readouterr()
        assert run_here('analyze.py', *args) == 0
        return capsys.readouterr().out
    return run


def make_dataset(root, name='tiny_char', n_sent=1500):
    rng = np.random.default_rng(0)
    subj = ['the cat', 'dogs', 'it', 'they', 'he', 'we', 'this island', 'wares']
    rest = ['here', 'there', 'good', 'bad', 'isolated', 'away']
    text = ' '.join(f'{subj[rng.integers(8)]} {WORDS[rng.integers(4)]} {rest[rng.integers(6)]}.'
                    for _ in range(n_sent)) + '\n'
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = {i: c for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    d = root / name
    d.mkdir(parents=True)
    n = int(0.8 * len(ids))
    ids[:n].tofile(d / 'train.bin')
    ids[n:].tofile(d / 'val.bin')
    meta = {'vocab_size': len(chars), 'kind': 'char', 'stoi': stoi, 'itos': itos}
    with open(d / 'meta.pkl', 'wb') as f:
        pickle.dump(meta, f)
    return meta


def save_run(out_dir, model_args, dataset, compiled_prefix, n_log=5, seed=0, meta=None):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**model_args))
    sd = model.state_dict()
    if compiled_prefix:
        sd = {'_orig_mod.' + k: v for k, v in sd.items()}
    out_dir.mkdir()
    ckpt = {'nanolime': 1, 'model_args': model_args, 'model': sd, 'config': {'dataset': dataset},
            'iter_num': 10, 'best_val_loss': 3.0}
    if meta is not None:  # the vocabulary, as train.py saves it (older checkpoints have none)
        ckpt['meta'] = meta
    torch.save(ckpt, out_dir / 'ckpt.pt')
    with open(out_dir / 'log.jsonl', 'w') as f:
        for i in range(n_log):
            row = {'iter': 10 * i, 'tokens': 1000 * (i + 1), 'flops': 1e9 * (i + 1),
                   'loss': 3.0 - 0.1 * i - 0.05 * model_args['lime'], 'lr': 1e-3, 'dt_ms': 1.0, 'mfu': 0.0}
            if i % 2 == 0:
                row['val_loss'] = 3.1 - 0.1 * i
            f.write(json.dumps(row) + '\n')
        f.write('not json\n')  # a torn last line must not break the reader
    return model


def test_recorder_captures_w_v_and_block_outputs():
    model, cfg = tiny(n_layer=2)
    idx = torch.randint(0, 30, (2, 10))
    rec = analyze.Recorder(model)
    reps = rec.run(idx)
    rec.close()
    with torch.no_grad():
        x = model.transformer.wte(idx)
        h0 = model.transformer.h[0]
        kv = h0.attn.kv_proj(h0.ln_1(x)).view(2, 10, 2, -1)
        want_v = kv[:, :, 1].reshape(20, -1)
        want_h = h0(x, model.rope, [])
    torch.testing.assert_close(reps['values'][0], want_v)
    torch.testing.assert_close(reps['hidden'][0], want_h.reshape(20, -1))
    assert len(reps['values']) == 2 and reps['values'][1].shape == (20, 2 * 8)
    assert not model.transformer.h[0]._forward_hooks  # hooks removed


@pytest.mark.parametrize('router', ['full', 'last-2', 'average'])
def test_routed_values_are_what_attention_reads(router):
    # the model's own router output (H_kv, 2, B, T, d_h) = [k~; v~]: its v~ half, position by position
    model, _ = tiny(router=router)
    seen = {}
    for layer, block in enumerate(model.transformer.h[1:], 1):
        block.attn.router.register_forward_hook(lambda m, inp, out, layer=layer: seen.__setitem__(layer, out[:, 1]))
    idx = torch.randint(0, 30, (2, 10))
    rec = analyze.Recorder(model)
    reps = rec.run(idx)
    rec.close()
    assert len(reps['routed_values']) == 4
    torch.testing.assert_close(reps['routed_values'][0], reps['values'][0])  # layer 0 reads its own values
    for layer, v in seen.items():  # (H_kv, B, T, d_h) -> (B * T, H_kv * d_h)
        torch.testing.assert_close(reps['routed_values'][layer], v.permute(1, 2, 0, 3).reshape(20, -1),
                                   atol=1e-5, rtol=1e-5)
    assert not torch.allclose(reps['routed_values'][3], reps['values'][3])


def test_analyze_end_to_end(tmp_path, analyze_here):
    meta = make_dataset(tmp_path / 'data')
    base = dict(block_size=64, vocab_size=meta['vocab_size'], n_layer=3, n_head=4, n_kv_head=2, n_embd=32)
    save_run(tmp_path / 'out-lime', dict(base, lime=True), 'tiny_char', compiled_prefix=True, meta=meta)
    save_run(tmp_path / 'out-base', dict(base, lime=False), 'tiny_char', compiled_prefix=False, seed=1)
    save_run(tmp_path / 'out-base6', dict(base, lime=False, n_layer=4), 'tiny_char', compiled_prefix=False)
    save_dir = tmp_path / 'analysis'
    dirs = [str(tmp_path / d) for d in ('out-lime', 'out-base', 'out-base6')]
    stdout = analyze_here(*dirs, f'--data_dir={tmp_path / "data"}', '--num_tokens=256', '--max_per_word=25',
                          '--probe_context=24', '--probe_iters=30', f'--save_dir={save_dir}')
    assert len(json.load(open(save_dir / 'summary.json'))['results']) == 3
    lime = json.load(open(save_dir / 'out-lime_analysis.json'))
    M = np.array(lime['router_map'])
    assert M.shape == (3, 3)
    np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-9)
    for kind in ('values', 'hidden', 'routed_values'):
        assert len(lime['entropy'][kind]) == 3
        assert all(0 < e <= math.log(256) + 1e-9 for e in lime['entropy'][kind])
    sep = lime['separability']
    assert sep['words'] == WORDS and sep['n_per_word'] == 25
    for kind in ('values', 'hidden', 'routed_values'):
        assert len(sep[kind]) == 3 and all(0 <= m <= 1 for m, _ in sep[kind])
    # layer-0 routed values are the raw values
    assert lime['entropy']['routed_values'][0] == pytest.approx(lime['entropy']['values'][0])
    base = json.load(open(save_dir / 'out-base_analysis.json'))
    assert base['router_map'] is None and 'routed_values' not in base['entropy']
    for f in ('entropy.csv', 'separability.csv', 'curves.csv', 'depth_sweep.csv', 'summary.json',
              'out-lime_router_map.csv'):
        assert (save_dir / f).exists(), f
    pictures = ('entropy.png', 'separability.png', 'loss_vs_flops.png', 'loss_vs_tokens.png', 'depth_sweep.png',
                'out-lime_router_map.png')  # matplotlib is optional: without it, CSV/JSON only
    have_plt = importlib.util.find_spec('matplotlib') is not None
    assert all((save_dir / f).exists() == have_plt for f in pictures)
    assert ('CSV/JSON only' in stdout) != have_plt
    assert not (save_dir / 'out-base_router_map.csv').exists()
    sweep = (save_dir / 'depth_sweep.csv').read_text().splitlines()
    assert sweep[0] == 'run,family,n_layer,final_val_loss,flops'
    assert sweep[1].startswith('out-lime,LIMe,3,2.7') and sweep[3].startswith('out-base6,LLaMA,4,')
    curves = (save_dir / 'curves.csv').read_text().splitlines()
    assert len(curves) == 1 + 3 * 5
    # without --save_dir, per-run files land in each out_dir
    analyze_here(dirs[0], f'--data_dir={tmp_path / "data"}', '--num_tokens=128', '--max_per_word=12',
                 '--probe_context=16', '--probe_iters=20')
    assert (tmp_path / 'out-lime' / 'analysis.json').exists()
    assert (tmp_path / 'out-lime' / 'router_map.csv').exists()


@pytest.mark.parametrize('kw', [dict(hc=2), dict(router='dynamic'), dict(router='first-1'),
                                dict(lime=False, n_kv_head=1)])
def test_recorder_and_router_map_on_variants(kw):
    model, cfg = tiny(n_layer=3, **kw)
    rec = analyze.Recorder(model)
    reps = rec.run(torch.randint(0, 30, (2, 12)), keep=torch.tensor([3, 11]))
    rec.close()
    d_v = cfg['n_kv_head'] * 8 if 'n_kv_head' in kw else 2 * 8
    assert [tuple(z.shape) for z in reps['hidden']] == [(2, 32)] * 3
    assert [tuple(z.shape) for z in reps['values']] == [(2, d_v)] * 3
    M = analyze.router_map(model)
    if cfg['lime']:
        np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-12)
    assert ('routed_values' in reps) == (cfg['lime'] and cfg['router'] != 'dynamic')


def test_analyze_without_data_without_model_and_errors(tmp_path, analyze_here, run_here):
    meta = make_dataset(tmp_path / 'data')
    args = dict(block_size=64, vocab_size=meta['vocab_size'], n_layer=3, n_head=4, n_kv_head=2, n_embd=32, lime=True)
    save_run(tmp_path / 'out-nodata', args, 'not_prepared', compiled_prefix=False, meta=meta)
    (tmp_path / 'out-logonly').mkdir()  # a run without a checkpoint (yet): its curves only
    (tmp_path / 'out-logonly' / 'log.jsonl').write_text(json.dumps({'iter': 0, 'tokens': 10, 'loss': 3.0}) + '\n')
    dirs = [str(tmp_path / 'out-nodata'), str(tmp_path / 'out-logonly')]
    stdout = analyze_here(*dirs, f'--data_dir={tmp_path / "data"}')
    assert 'out-logonly: no ckpt.pt, curves only' in stdout and 'router map only' in stdout
    res = json.load(open(tmp_path / 'out-nodata' / 'analysis.json'))
    assert "unknown dataset 'not_prepared'" in res['skipped'] and len(res['router_map']) == 3
    assert not (tmp_path / 'out-logonly' / 'analysis.json').exists()
    # --no_model: curves and the depth sweep only, n_layer read from the checkpoint
    stdout = analyze_here(*dirs, '--no_model=True', f'--save_dir={tmp_path / "sweep"}')
    assert 'router map only' not in stdout and not (tmp_path / 'sweep' / 'out-nodata_analysis.json').exists()
    sweep = (tmp_path / 'sweep' / 'depth_sweep.csv').read_text().splitlines()
    assert sweep[1].startswith('out-nodata,LIMe,3,') and sweep[2].startswith('out-logonly,unknown,,')
    with pytest.raises(common.UserError, match='^name the runs to analyze'):  # one line for the user
        run_here('analyze.py', '--num_tokens=8')


@pytest.mark.parametrize('kw', [dict(attnres='full'), dict(hc=2, mhc='dynamic', lime=True), dict(denseformer=True),
                                dict(mudd=True), dict(moda=True)], ids=str)
def test_relatives_runs_are_named_and_analysed_through_their_stream(tmp_path, analyze_here, kw):
    """Runs are named by what they are, and a relative's residual stream after each block (what its stream
    outputs there) is analysed like the baseline's: one hidden state per layer, equal to that output."""
    assert analyze.family({'hc': 4, 'mhc': True}) == 'mHC-static' and analyze.family({'attnres': 'block'}) == 'AttnRes-block'
    assert analyze.family({'moda': True}) == 'MoDA'
    assert analyze.family({'lime': True, 'hc': 4}) == 'LIMe+HC' and analyze.family({'denseformer': True}) == 'DenseFormer'
    assert analyze.family({'lime': True, 'router': 'first-2', 'hc': 4, 'mhc': 'dynamic'}) == 'LIMe-first-2+mHC-dynamic'
    assert analyze.family({'lime': False}) == 'LLaMA' and analyze.family({'lime': True, 'mudd': True}) == 'LIMe+MUDD'
    meta = make_dataset(tmp_path / 'data')
    args = dict(block_size=64, vocab_size=meta['vocab_size'], n_layer=2, n_head=4, n_embd=32, **{'lime': False, **kw})
    save_run(tmp_path / 'out-rel', args, 'tiny_char', compiled_prefix=False, meta=meta)
    analyze_here(str(tmp_path / 'out-rel'), f'--data_dir={tmp_path / "data"}')
    res = json.load(open(tmp_path / 'out-rel' / 'analysis.json'))
    assert res['family'] == analyze.family(args) and 'skipped' not in res
    model = GPT(GPTConfig(**args))
    rec, x = analyze.Recorder(model), torch.randint(0, meta['vocab_size'], (2, 16))
    reps = rec.run(x)
    rec.close()
    assert len(reps['hidden']) == 2 and all(h.shape == (32, 32) for h in reps['hidden'])
    assert len(reps['values']) == 2 and all(v.shape == (32, 32) for v in reps['values'])  # MUDD's: from its value input
    seen = []
    stream = relatives.stream
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(relatives, 'stream', lambda m, e: seen.append(stream(m, e)) or seen[-1])
        with torch.no_grad():
            model(x)
    torch.testing.assert_close(reps['hidden'][-1], seen[0].output().flatten(0, 1))
    assert relatives.stream is stream  # closed: streams as they were


def test_a_dataset_of_another_vocabulary_is_named_so(tmp_path, analyze_here):
    """The run's dataset name found prepared with another vocabulary (another --data_dir): said as that, not as
    a corrupt val.bin."""
    meta = make_dataset(tmp_path / 'data')
    args = dict(block_size=64, vocab_size=meta['vocab_size'] + 3, n_layer=2, n_head=4, n_embd=32, lime=False)
    save_run(tmp_path / 'out', args, 'tiny_char', compiled_prefix=False)
    stdout = analyze_here(str(tmp_path / 'out'), f'--data_dir={tmp_path / "data"}')
    skipped = json.load(open(tmp_path / 'out' / 'analysis.json'))['skipped']
    assert skipped == (f"{tmp_path / 'data' / 'tiny_char'} holds another vocabulary ({meta['vocab_size']} ids) than "
                       f"the model's ({meta['vocab_size'] + 3}): pass the --data_dir of the 'tiny_char' it was "
                       "trained on") and skipped in stdout


def test_out_of_memory_advice_is_analyze_s(tmp_path):
    """analyze.py out of memory: its own knobs, not train.py's batch_size advice (the error faked)."""
    code = ("import runpy, sys, torch\nimport analyze_oom_patch\n"
            "sys.argv = ['analyze.py', *sys.argv[1:]]\nrunpy.run_path('analyze.py', run_name='__main__')\n")
    (tmp_path / 'analyze_oom_patch.py').write_text(
        "import numpy\ndef boom(*a, **k):\n    raise MemoryError()\nnumpy.memmap = boom\n")
    meta = make_dataset(tmp_path / 'data')
    save_run(tmp_path / 'out', dict(block_size=64, vocab_size=meta['vocab_size'], n_layer=2, n_head=4, n_embd=32, lime=False),
             'tiny_char', compiled_prefix=False)
    p = run([sys.executable, '-c', code], str(tmp_path / 'out'), f'--data_dir={tmp_path / "data"}',
            env={'PYTHONPATH': str(tmp_path)})
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: out of memory: lower num_tokens, context, max_per_word or batch_size, or analyze on another device "
        "(--device=cpu); nothing was written for the run it was analyzing"]


@pytest.mark.parametrize('arg, message', [('--renyi_order=0', 'renyi_order=0.0 must be a finite number > 0'),
                                          ('--renyi_order=1e999', 'renyi_order=inf must be a finite number > 0')])
def test_the_renyi_order_is_named_as_what_it_is(arg, message, tmp_path, run_here):
    """analyze.py's order of the Renyi entropy (the paper's alpha, Sec. 5.2) is renyi_order: alpha is HC's."""
    with pytest.raises(common.UserError) as e:
        run_here('analyze.py', str(tmp_path), arg)
    assert str(e.value) == message
    with pytest.raises(common.UserError, match="^unknown config key 'alpha'"):
        run_here('analyze.py', str(tmp_path), '--alpha=2')
