"""Tests for study/analyze.py: end-to-end runs on tiny checkpoints with a tiny char dataset, the runs' names, the
user's errors (the measures themselves: test_representations.py)."""
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
from study import analyze  # noqa: E402
from nanolime import common  # noqa: E402
from conftest import run  # noqa: E402
import relatives  # noqa: E402
from study import representations  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from relatives import RelativesConfig, build_model  # noqa: E402


# ----------------------------------------------------------------------------- end to end

WORDS = ['is', 'are', 'was', 'were']


@pytest.fixture
def analyze_here(run_here, capsys):
    """study/analyze.py run in this process (as `python -m study.analyze <args>` from another directory): its
    stdout."""
    def run(*args):
        capsys.readouterr()
        assert run_here('study/analyze.py', *args) == 0
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
    model = build_model(RelativesConfig(**model_args))
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


def test_analyze_end_to_end(tmp_path, analyze_here, monkeypatch):
    titles = []  # of every panel drawn
    if importlib.util.find_spec('matplotlib') is not None:
        import matplotlib.axes
        set_title = matplotlib.axes.Axes.set_title
        monkeypatch.setattr(matplotlib.axes.Axes, 'set_title', lambda ax, title, *args, **kwargs: (
            titles.append(title), set_title(ax, title, *args, **kwargs))[1])
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
    # the router map names the model it is of, not the folder it was in
    want = 'LIMe, 3 layers x 32\nnormalised mean |router| weight'
    assert [t for t in titles if 'router' in t] == [want] * 2 * have_plt


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
        run_here('study/analyze.py', '--num_tokens=8')


def test_completep_runs_are_a_family_of_their_own():
    """CompleteP's runs are not pooled with the standard model's of the same variant."""
    assert analyze.family({'lime': True, 'depth_scaling': 'completep', 'depth_base': 4}) == 'LIMe (CompleteP, L_base=4)'
    assert analyze.family({'lime': True, 'depth_scaling': 'standard'}) == 'LIMe'


@pytest.mark.parametrize('kw', [dict(attnres='full'), dict(hc=2, mhc='dynamic', lime=True), dict(denseformer=True),
                                dict(mudd=True), dict(moda=True), dict(depth_attention=True)], ids=str)
def test_relatives_runs_are_named_and_analysed_through_their_stream(tmp_path, analyze_here, kw):
    """Runs are named by what they are, and a relative's residual stream after each block (what its stream
    outputs there) is analysed like the baseline's: one hidden state per layer, equal to that output."""
    assert analyze.family({'hc': 4, 'mhc': 'static'}) == 'mHC-static'
    assert analyze.family({'attnres': 'block'}) == 'AttnRes-block' and analyze.family({'moda': True}) == 'MoDA'
    assert analyze.family({'depth_attention': True}) == 'Depth-Attention'
    assert analyze.family({'hc': 4, 'mhc': 'static', 'hc_dynamic': True}) == 'mHC-static-hc_dynamic'
    assert analyze.family({'lime': True, 'hc': 4}) == 'LIMe+HC' and analyze.family({'denseformer': True}) == 'DenseFormer'
    assert analyze.family({'lime': True, 'router': 'first-2', 'hc': 4, 'mhc': 'dynamic'}) == 'LIMe-first-2+mHC-dynamic'
    assert analyze.family({'lime': False}) == 'LLaMA' and analyze.family({'lime': True, 'mudd': True}) == 'LIMe+MUDD'
    assert analyze.family({'mudd': True, 'mudd_prepost': True}) == 'MUDD-PrePostDANorm'
    meta = make_dataset(tmp_path / 'data')
    args = dict(block_size=64, vocab_size=meta['vocab_size'], n_layer=2, n_head=4, n_embd=32, **{'lime': False, **kw})
    save_run(tmp_path / 'out-rel', args, 'tiny_char', compiled_prefix=False, meta=meta)
    analyze_here(str(tmp_path / 'out-rel'), f'--data_dir={tmp_path / "data"}')
    res = json.load(open(tmp_path / 'out-rel' / 'analysis.json'))
    assert res['family'] == analyze.family(args) and 'skipped' not in res
    model = build_model(RelativesConfig(**args))
    rec, x = representations.Recorder(model), torch.randint(0, meta['vocab_size'], (2, 16))
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
    assert model.stream_hooks == [] and not any(b._forward_hooks for b in model.transformer.h)  # closed


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


@pytest.mark.slow
def test_out_of_memory_advice_is_analyze_s(tmp_path):
    """study/analyze.py out of memory: its own knobs, not train.py's batch_size advice (the error faked, by a
    sitecustomize module on PYTHONPATH), run as `python -m study.analyze`."""
    (tmp_path / 'sitecustomize.py').write_text(
        "import numpy\ndef boom(*a, **k):\n    raise MemoryError()\nnumpy.memmap = boom\n")
    meta = make_dataset(tmp_path / 'data')
    save_run(tmp_path / 'out', dict(block_size=64, vocab_size=meta['vocab_size'], n_layer=2, n_head=4, n_embd=32, lime=False),
             'tiny_char', compiled_prefix=False)
    p = run('study.analyze', str(tmp_path / 'out'), f'--data_dir={tmp_path / "data"}',
            env={'PYTHONPATH': str(tmp_path)})
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: out of memory: lower num_tokens, context, max_per_word or batch_size, or analyze on another device "
        "(--device=cpu); nothing was written for the run it was analyzing"]


@pytest.mark.parametrize('arg, message', [('--renyi_order=0', 'renyi_order=0.0 must be a finite number > 0'),
                                          ('--renyi_order=1e999', 'renyi_order=inf must be a finite number > 0')])
def test_the_renyi_order_is_named_as_what_it_is(arg, message, tmp_path, run_here):
    """study/analyze.py's order of the Renyi entropy (the paper's alpha, Sec. 5.2) is renyi_order: alpha is HC's."""
    with pytest.raises(common.UserError) as e:
        run_here('study/analyze.py', str(tmp_path), arg)
    assert str(e.value) == message
    with pytest.raises(common.UserError, match="^unknown config key 'alpha'"):
        run_here('study/analyze.py', str(tmp_path), '--alpha=2')


def test_the_router_map_shows_its_whole_title(tmp_path):
    """A shallow model's map (2 and 4 layers) is drawn on a figure wide enough for its title."""
    plt = pytest.importorskip('matplotlib.pyplot')
    for L in (2, 4):
        path = tmp_path / f'map{L}.png'
        closed = []
        real_close = plt.close
        plt.close = lambda fig: closed.append(fig)  # keep the figure to measure it
        try:
            analyze.plot_router_map(plt, np.tril(np.ones((L, L))) / np.arange(1, L + 1)[:, None],
                                    'LIMe, 4 layers x 128\nnormalised mean |router| weight', path)
        finally:
            plt.close = real_close
        fig = closed[0]
        title = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
        box = fig.bbox
        assert path.exists() and box.x0 <= title.x0 and title.x1 <= box.x1, (L, title, box)
        real_close(fig)
