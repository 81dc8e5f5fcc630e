"""integrations/export.py and train.py --init_from=hf:DIR: our models in transformers and the LIMe authors' layout,
and a Llama back.

Tiny models trained a few steps on the small char dataset, exported, loaded with transformers (offline, fp32): the
same logits (1e-5) and the same greedy tokens as ours. Skipped, with the reason, without requirements-hf.txt.
"""
import json
import math
import os
import re
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, interrupted, run, script_here
from nanolime import checkpoint
from nanolime import data
from nanolime.common import UserError
from model import GPT, GPTConfig

transformers = pytest.importorskip('transformers', reason='needs requirements-hf.txt (transformers)')
safetensors_torch = pytest.importorskip('safetensors.torch', reason='needs requirements-hf.txt (safetensors)')
from integrations import hf  # noqa: E402

TINY = ['--device=cpu', '--n_layer=3', '--n_embd=32', '--block_size=32', '--batch_size=8', '--total_batch_size=256',
        '--eval_iters=1', '--eval_interval=4', '--log_interval=4', '--warmup_iters=1', '--lr_decay_iters=4',
        '--max_iters=4']
MODELS = {  # a few steps each: weights that are not their init (a router away from the identity)
    'baseline-mha': ['--lime=False', '--n_head=2'],
    'baseline-gqa': ['--lime=False', '--n_head=4', '--n_kv_head=2'],
    'lime-mha': ['--lime=True', '--n_head=2'],
    'lime-gqa': ['--lime=True', '--n_head=4', '--n_kv_head=2'],
    'lime-average': ['--lime=True', '--n_head=4', '--n_kv_head=2', '--router=average'],  # a router that is a buffer
    'lime-mhc': ['--lime=True', '--n_head=2', '--hc=2', '--mhc=static'],
    'depthattn-gqa': ['--lime=False', '--n_head=4', '--n_kv_head=2', '--depth_attention=True'],  # a relative in attention
    # CompleteP at 3 layers from a base of 2: remote code carries the multiplier (rebuilt from the saved config)
    'lime-completep': ['--lime=True', '--n_head=2', '--depth_scaling=completep', '--depth_base=2'],
    'baseline-completep': ['--lime=False', '--n_head=2', '--depth_scaling=completep', '--depth_base=2'],
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')


@pytest.fixture(scope='session')
def runs(data_dir, tmp_path_factory):
    """name -> out_dir of a tiny trained run, trained when first asked for."""
    root, done = tmp_path_factory.mktemp('export-runs'), {}

    def get(name):
        if name not in done:
            out = str(root / name)
            code, _, _ = script_here('train.py', *TINY, *MODELS[name], f'--data_dir={data_dir}', f'--out_dir={out}')
            assert code == 0
            done[name] = out
        return done[name]
    return get


def export(out, to, *args):
    code, stdout, _ = script_here('integrations/export.py', f'--out_dir={out}', f'--export_dir={to}', *args)
    assert code == 0
    return stdout


def load_hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()


def prompt(out, n=20):
    model, ckpt = checkpoint.load_model(out)
    encode, _ = data.load_codec(ckpt)
    return model, torch.tensor([encode("ROMEO:\nIs it so?  Then I defy you, stars!")[:n]])


@pytest.mark.parametrize('name', list(MODELS))
def test_export_loads_in_transformers_same_logits_and_greedy_tokens(name, runs, tmp_path):
    out, to = runs(name), str(tmp_path / 'hf')
    printed = export(out, to)
    ours, x = prompt(out)
    theirs = load_hf(to)
    llama = name.startswith('baseline') and 'completep' not in name  # a CompleteP baseline is no plain Llama
    assert type(theirs).__name__ == ('LlamaForCausalLM' if llama else 'NanoLIMeForCausalLM')
    assert ('LlamaForCausalLM' if llama else 'remote code') in printed
    with torch.no_grad():
        logits, _ = ours(x, targets=x)  # every position's logits
        assert (theirs(x).logits - logits).abs().max().item() < 1e-5
    greedy = ours.generate(x, 10, top_k=1)
    assert torch.equal(theirs.generate(x, max_new_tokens=10, do_sample=False), greedy)
    files = set(os.listdir(to))
    assert {'config.json', 'model.safetensors', 'generation_config.json', 'tokenizer.json'} <= files
    with safetensors_torch.safe_open(os.path.join(to, 'model.safetensors'), 'pt') as f:
        keys = set(f.keys())
    assert not any('lm_head' in k for k in keys)  # the tied head is stored once, as the embedding
    config = json.load(open(os.path.join(to, 'config.json')))
    if llama:
        c = ours.config
        assert {k: config[k] for k in ('hidden_size', 'intermediate_size', 'num_attention_heads', 'num_key_value_heads',
                                       'head_dim', 'rms_norm_eps', 'max_position_embeddings', 'tie_word_embeddings',
                                       'vocab_size')} == \
            dict(hidden_size=c.n_embd, intermediate_size=c.mlp_hidden, num_attention_heads=c.n_head,
                 num_key_value_heads=c.n_kv_head, head_dim=c.n_embd // c.n_head, rms_norm_eps=c.norm_eps,
                 max_position_embeddings=c.block_size, tie_word_embeddings=True, vocab_size=c.vocab_size)
        assert not files & {'modeling_nanolime.py', 'model.py'}
    else:
        assert config['auto_map']['AutoModelForCausalLM'] == 'modeling_nanolime.NanoLIMeForCausalLM'
        # model.py and the relatives' package, each file byte for byte, the package flat: relatives/__init__.py
        # as relatives.py, relatives/<name>.py as <name>.py (transformers copies files found by relative import)
        package = sorted(n for n in os.listdir(os.path.join(REPO, 'relatives')) if n.endswith('.py'))
        shipped = {'model.py': 'model.py', 'modeling_nanolime.py': os.path.join('integrations', 'modeling_nanolime.py'),
                   **{'relatives.py' if n == '__init__.py' else n: os.path.join('relatives', n) for n in package}}
        assert {n for n in files if n.endswith('.py')} == set(shipped)  # the wrapper a copy of the repository's
        for name, path in shipped.items():
            with open(os.path.join(to, name), 'rb') as a, open(os.path.join(REPO, path), 'rb') as b:
                assert a.read() == b.read(), name


def test_the_wrapper_is_a_module_of_the_repository_that_imports_where_an_export_puts_it(tmp_path):
    """integrations/modeling_nanolime.py is code (no template): as a module of a package laid out as an export is
    (model.py and the relatives flat beside it), it imports, and builds our model from a config of our options."""
    import importlib
    pkg = tmp_path / 'exported_pkg'
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')
    shutil.copy(os.path.join(REPO, 'model.py'), pkg)
    shutil.copy(hf.MODELING, pkg)
    for path, name in hf.package_files(REPO):
        shutil.copy(os.path.join(REPO, path), pkg / name)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module('exported_pkg.modeling_nanolime')
        config = module.NanoLIMeConfig(nanolime=dict(vocab_size=11, n_layer=2, n_head=2, n_embd=16, block_size=8,
                                                         lime=True))
        model = module.NanoLIMeForCausalLM(config)
        assert type(model.model).__name__ == 'GPT' and model.model.config.lime is True
        assert model(torch.zeros(1, 5, dtype=torch.long)).logits.shape == (1, 5, 11)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith('exported_pkg')]:
            del sys.modules[name]


def test_the_flag_s_earlier_name_is_gone(runs, tmp_path):
    """--to (export_dir's earlier name, which read like a format) is an unknown key: beside --export_dir it is not
    left unread."""
    with pytest.raises(UserError, match=r"unknown config key 'to' \(--to="):
        script_here('integrations/export.py', f'--out_dir={runs("baseline-mha")}', f'--export_dir={tmp_path}/x',
                    f'--to={tmp_path}/y')
    assert not os.path.exists(tmp_path / 'x') and not os.path.exists(tmp_path / 'y')


def test_pipeline_generates_with_remote_code(runs, tmp_path):
    out, to = runs('lime-gqa'), str(tmp_path / 'hf')
    export(out, to)
    ours, x = prompt(out, 10)
    _, decode = data.load_codec(checkpoint.load_model(out)[1])
    pipe = transformers.pipeline('text-generation', model=to, trust_remote_code=True, device='cpu')
    text = pipe(decode(x[0].tolist()), max_new_tokens=8, do_sample=False)[0]['generated_text']
    assert text == decode(ours.generate(x, 8, top_k=1)[0].tolist())


def test_rope_is_transformers_half_split():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    c = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, rope_theta=500.0)
    ours = GPT(c).rope
    theirs = LlamaRotaryEmbedding(transformers.LlamaConfig(**{k: v for k, v in hf.llama_config(
        {**vars(c)}).items() if k not in ('architectures', 'torch_dtype', 'dtype')}))
    q, k = torch.randn(2, 2, 16, 16), torch.randn(2, 2, 16, 16)
    cos, sin = theirs(q, torch.arange(16)[None])
    q2, k2 = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q, ours_k = (ours(x.transpose(1, 2), 0).transpose(1, 2) for x in (q, k))  # ours takes (B, T, heads, d)
    assert torch.allclose(ours_q, q2, atol=1e-6) and torch.allclose(ours_k, k2, atol=1e-6)


def test_char_tokenizer_is_exact_on_shakespeare(runs, tmp_path, data_dir):
    out, to = runs('baseline-mha'), str(tmp_path / 'hf')
    export(out, to)
    tok = transformers.AutoTokenizer.from_pretrained(to)
    encode, decode = data.load_codec(checkpoint.load_model(out)[1])
    import prepare
    text = prepare.read_shakespeare()[:200_000]
    ids = encode(text)
    assert tok(text)['input_ids'] == ids
    assert tok.decode(ids) == text


def test_gpt2_tokenizer_is_tiktoken(tmp_path):
    hf.gpt2_tokenizer(str(tmp_path))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    enc = data.get_gpt2_encoding()
    for s in ["Hello world! It's 2024.", "  leading spaces\n\n\ttabs  \r\n", "naïve café — 日本語 🤖\u00a0",
              "one<|endoftext|>two", "don't we'll I've 'S", "x" * 300, "ĠĊ 12345 3.14159"]:
        ids = enc.encode(s, allowed_special={'<|endoftext|>'})
        assert tok(s)['input_ids'] == ids, s
        assert tok.decode(ids) == s
    assert tok.eos_token_id == data.EOT


def test_bpe_merges_rebuild_gpt2():
    """The merges recovered from tiktoken's ranks, applied as BPE, give tiktoken's tokens (a plain BPE here)."""
    ranks = data.get_gpt2_encoding()._mergeable_ranks
    merges = {a + b: i for i, (a, b) in enumerate(hf.bpe_merges(ranks))}
    assert len(merges) == len(ranks) - 256
    for word in [b' hello', b' tokenization', b'\xe6\x97\xa5\xe6\x9c\xac', b' 12345']:
        parts = [bytes([b]) for b in word]
        while True:  # the lowest-ranked merge first, as GPT-2's BPE does
            pairs = [(merges.get(parts[i] + parts[i + 1], math.inf), i) for i in range(len(parts) - 1)]
            rank, i = min(pairs, default=(math.inf, 0))
            if rank == math.inf:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert [ranks[p] for p in parts] == data.get_gpt2_encoding().encode(word.decode())


# ----------------------------------------------------------------------------- the LIMe authors' layout
def authors_forward(folder, idx):
    """The authors' LIMe (corl-team/lime, src/lm/lime.py) on their state dict, written here from their code's layout:
    kv_proj_weight's rows '(kv h)' with kv = [k dims; v dims] of size 2 * d_h and the head fastest; the buffer of
    every layer's KV heads, layer-major, routed by static_weights (layer 0 takes its own heads); RoPE after routing."""
    c = json.load(open(os.path.join(folder, 'config.json')))
    sd = safetensors_torch.load_file(os.path.join(folder, 'model.safetensors'))
    B, T = idx.shape
    H, Hkv, hd, D = c['num_attention_heads'], c['num_key_value_heads'], c['head_dim'], c['hidden_size']
    inv = 1.0 / c['rope_theta'] ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.outer(torch.arange(T).float(), inv).repeat(1, 2)
    rot = lambda t: t * ang.cos() + torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1) * ang.sin()  # noqa: E731
    norm = lambda t, w: w * t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + c['rms_norm_eps'])  # noqa: E731
    x = sd['model.embed_tokens.weight'][idx]
    buffer = torch.zeros(0, B * T * 2 * hd)
    for i in range(c['num_hidden_layers']):
        p = f'model.layers.{i}.'
        h = norm(x, sd[p + 'input_layernorm.weight'])
        q = (h @ sd[p + 'self_attn.q_proj.weight'].T).view(B, T, H, hd).transpose(1, 2)
        kv = h.reshape(-1, D) @ sd[p + 'self_attn.kv_proj_weight'].T  # (B T, 2 hd Hkv)
        kv = kv.view(B * T, 2 * hd, Hkv).permute(2, 0, 1).reshape(Hkv, B * T * 2 * hd)  # '(bt) (kv h) -> h (bt kv)'
        buffer = torch.cat([buffer, kv])
        routed = sd[p + 'self_attn.lime_router.static_weights'] @ buffer if i else buffer[:Hkv]
        routed = routed.view(Hkv, B, T, 2 * hd).permute(1, 0, 2, 3)
        k, v = rot(routed[..., :hd]), routed[..., hd:]
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        y = F.scaled_dot_product_attention(rot(q), k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        x = x + y @ sd[p + 'self_attn.o_proj.weight'].T
        h = norm(x, sd[p + 'post_attention_layernorm.weight'])
        x = x + (F.silu(h @ sd[p + 'mlp.gate_proj.weight'].T) * (h @ sd[p + 'mlp.up_proj.weight'].T)) \
            @ sd[p + 'mlp.down_proj.weight'].T
    head = sd.get('lm_head.weight', sd['model.embed_tokens.weight'])
    return norm(x, sd['model.norm.weight']) @ head.T


@pytest.mark.parametrize('name', ['lime-mha', 'lime-gqa'])
def test_lime_authors_layout_computes_our_function(name, runs, tmp_path):
    out, to = runs(name), str(tmp_path / 'authors')
    export(out, to, '--format=lime-authors')
    ours, x = prompt(out)
    with torch.no_grad():
        logits, _ = ours(x, targets=x)
    assert (authors_forward(to, x) - logits).abs().max().item() < 1e-5
    with safetensors_torch.safe_open(os.path.join(to, 'model.safetensors'), 'pt') as f:
        keys = set(f.keys())
    assert not any(k.endswith(('.k_proj.weight', '.v_proj.weight')) for k in keys)
    assert 'model.layers.0.self_attn.lime_router.static_weights' not in keys  # their layer 0 has no router weights
    # not a Llama to transformers' Auto classes (which would load it with random k and v, warning only); a
    # LlamaConfig to the authors' code, which reads it with LlamaConfig
    assert json.load(open(os.path.join(to, 'config.json')))['model_type'] == 'lime'
    with pytest.raises((ValueError, KeyError)):
        transformers.AutoModelForCausalLM.from_pretrained(to)
    llama = transformers.LlamaConfig.from_pretrained(to)
    assert (llama.num_hidden_layers, llama.architectures) == (ours.config.n_layer, ['LIMeForCausalLM'])


# ----------------------------------------------------------------------------- import: --init_from=hf:DIR
@pytest.mark.parametrize('name', ['baseline-mha', 'baseline-gqa'])
def test_round_trip_export_import_is_bit_identical_and_lime_identity_is_the_same_function(name, runs, tmp_path):
    out, to = runs(name), str(tmp_path / 'hf')
    export(out, to)
    ours, x = prompt(out)
    args = hf.llama_model_args(to)
    for lime in (False, True):
        model = GPT(GPTConfig(block_size=32, lime=lime, router_init='identity', **args))
        hf.load_llama(model, to)
        mine = model.state_dict()
        for k, v in ours.state_dict().items():
            assert torch.equal(mine[k], v), k
        with torch.no_grad():
            assert torch.equal(model.eval()(x, targets=x)[0], ours(x, targets=x)[0])


def test_train_init_from_hf_starts_from_the_llama(runs, tmp_path, data_dir, capsys):
    """train.py from an exported baseline: as the baseline and as LIMe with identity routers, the same iter-0 losses."""
    to = str(tmp_path / 'hf')
    export(runs('baseline-gqa'), to)
    lines = []
    for i, lime in enumerate(('--lime=False', '--lime=True')):
        code, stdout, _ = script_here('train.py', *TINY, lime, '--router_init=identity', f'--init_from=hf:{to}',
                                      '--eval_only=True', f'--data_dir={data_dir}', f'--out_dir={tmp_path}/o{i}')
        assert code == 0
        lines.append([line for line in stdout.splitlines() if line.startswith('iter 0:')])
    assert lines[0] == lines[1] and len(lines[0]) == 1 and 'val loss' in lines[0][0]


# ----------------------------------------------------------------------------- refusals: one line each
def test_refusals(runs, tmp_path, data_dir):
    lime, base = runs('lime-gqa'), runs('baseline-mha')
    cases = [
        ((base, '--format=lime-authors'), "cannot hold this model (lime=False: a baseline): the authors' code has "
                                          "LIMe's static full router only; export it with --format=hf (a plain "
                                          "LlamaForCausalLM)"),
        ((runs('depthattn-gqa'), '--format=lime-authors'), "cannot hold this model (depth_attention=True)"),
        ((runs('lime-average'), '--format=lime-authors'), "cannot hold this model (router='average')"),
        ((runs('lime-mhc'), '--format=lime-authors'), "cannot hold this model (hc=2)"),
        ((runs('lime-completep'), '--format=lime-authors'), "cannot hold this model (depth_scaling='completep')"),
        ((lime, '--format=onnx'), "format='onnx': expected 'hf' or 'lime-authors'"),
    ]
    for (out, *args), message in cases:
        with pytest.raises(UserError, match=message.replace('(', r'\(').replace(')', r'\)')):
            script_here('integrations/export.py', f'--out_dir={out}', f'--export_dir={tmp_path}/x', *args)
        assert not os.path.exists(f'{tmp_path}/x')
    full = tmp_path / 'full'
    full.mkdir()
    (full / 'keep.txt').write_text('mine')
    with pytest.raises(UserError, match='exists and is not an empty folder'):
        script_here('integrations/export.py', f'--out_dir={lime}', f'--export_dir={full}')
    assert os.listdir(full) == ['keep.txt']
    # import: not a Llama, an unsupported Llama, shapes that differ, another vocabulary
    export(lime, str(tmp_path / 'remote'))
    export(base, str(tmp_path / 'llama'))
    bad = {'attention_bias': True, 'hidden_act': 'gelu'}
    for key, value in bad.items():
        folder = tmp_path / key
        shutil.copytree(tmp_path / 'llama', folder)
        config = json.load(open(folder / 'config.json'))
        json.dump({**config, key: value}, open(folder / 'config.json', 'w'))
    shapes = tmp_path / 'shapes'
    shutil.copytree(tmp_path / 'llama', shapes)
    config = json.load(open(shapes / 'config.json'))
    json.dump({**config, 'intermediate_size': config['intermediate_size'] + 64}, open(shapes / 'config.json', 'w'))
    mistral = tmp_path / 'mistral'  # a config.json of another model_type, its class a Llama's
    shutil.copytree(tmp_path / 'llama', mistral)
    json.dump({**config, 'model_type': 'mistral'}, open(mistral / 'config.json', 'w'))
    vocab = tmp_path / 'vocab'
    shutil.copytree(tmp_path / 'llama', vocab)
    json.dump({**config, 'vocab_size': 100}, open(vocab / 'config.json', 'w'))
    for folder, message in [('remote', "config.json names model_type 'nanolime' and NanoLIMeForCausalLM; only a "
                                       "plain Llama (model_type 'llama', LlamaForCausalLM) can be imported (a "
                                       "nanoLIMe export continues with its run's own --init_from=resume)"),
                            ('mistral', "config.json names model_type 'mistral' and LlamaForCausalLM; only a plain "
                                        "Llama (model_type 'llama', LlamaForCausalLM) can be imported"),
                            ('attention_bias', 'unsupported Llama (attention_bias)'),
                            ('hidden_act', "unsupported Llama (hidden_act='gelu')"),
                            ('shapes', 'mlp.gate_proj.weight has shape (128, 32) there, (192, 32) here'),
                            ('vocab', 'its vocabulary has 100 tokens'),
                            ('nowhere', 'no config.json there')]:
        with pytest.raises(UserError, match=message.replace('(', r'\(').replace(')', r'\)').replace('[', r'\[')):
            script_here('train.py', *TINY, '--lime=False', '--n_head=2', f'--init_from=hf:{tmp_path / folder}',
                        f'--data_dir={data_dir}', f'--out_dir={tmp_path}/o-{folder}')


@pytest.mark.slow
def test_refusal_is_one_line_in_a_process(runs, tmp_path):
    p = run('integrations.export', f'--out_dir={runs("baseline-mha")}', f'--export_dir={tmp_path}/x', '--format=lime-authors')
    assert p.returncode == 1 and p.stderr.startswith('error: ') and p.stderr.count('\n') == 1


def test_no_partial_folder_when_the_export_fails(runs, tmp_path, monkeypatch):
    """A full disk (or a read-only one) is one line that says what to do; neither the folder nor its temp copy stays."""
    def fail(*args):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(hf, 'char_tokenizer', fail)
    with pytest.raises(UserError, match=rf"^cannot write the export to --export_dir={tmp_path}/x: no space left on device; "
                                        r"nothing was left there: free some space \(or fix the permissions\), then "
                                        "run again$"):
        script_here('integrations/export.py', f'--out_dir={runs("lime-gqa")}', f'--export_dir={tmp_path}/x')
    assert os.listdir(tmp_path) == []  # neither the folder nor its temp copy


def test_export_to_a_link_is_refused_and_a_killed_export_s_temp_folder_is_removed(runs, tmp_path):
    (tmp_path / 'target').mkdir()
    os.symlink(tmp_path / 'target', tmp_path / 'link')
    os.symlink(tmp_path / 'nowhere', tmp_path / 'dangling')
    for link in ('link', 'dangling'):
        with pytest.raises(UserError, match=rf"--export_dir={tmp_path}/{link} is a link; name the folder itself"):
            script_here('integrations/export.py', f'--out_dir={runs("baseline-mha")}', f'--export_dir={tmp_path}/{link}')
    # a temp folder of an export killed half-way (its process gone): the next export into that place removes it
    stale = tmp_path / '.x.export-999999999-abcd'
    stale.mkdir()
    (stale / 'model.safetensors').write_bytes(b'half')
    export(runs('baseline-mha'), str(tmp_path / 'x'))
    assert sorted(os.listdir(tmp_path)) == ['dangling', 'link', 'target', 'x']


def test_export_without_transformers_is_one_line(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'transformers', None)  # as if not installed
    with pytest.raises(UserError,
                       match=r"^integrations/export.py needs transformers: pip install -r requirements-hf.txt$"):
        script_here('integrations/export.py', f'--out_dir={runs("lime-gqa")}', f'--export_dir={tmp_path}/x')
    assert not os.path.exists(f'{tmp_path}/x')


# ----------------------------------------------------------------------------- a released Llama's own settings
def make_llama(folder, data_dir, **kw):
    """A tiny LlamaForCausalLM saved by transformers, as most released Llamas are: untied, rms_norm_eps 1e-5,
    rope_theta 5e5 (not our defaults), GQA and an intermediate size of its own; the shape of conftest's TINY_RUN."""
    import pickle
    with open(os.path.join(data_dir, 'shakespeare_char', 'meta.pkl'), 'rb') as f:
        vocab = pickle.load(f)['vocab_size']
    args = dict(vocab_size=vocab, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=5e5, tie_word_embeddings=False,
                max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**args, **kw})).save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_sigterm_after_a_llama_import_prints_a_resume_command_that_works(tmp_path, data_dir, capsys):
    """SIGTERM stops a run imported from a Llama whose settings are not our defaults; the command it prints to go
    on (the same one, --init_from=resume in place of --init_from=hf:DIR) resumes it."""
    from conftest import TINY_RUN, ckpt_of
    import signal
    llama, out = make_llama(tmp_path / 'llama', data_dir), str(tmp_path / 'out')
    args = [*TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--lr_decay_iters=100000',
            '--eval_interval=100000']
    code, stdout, stderr = interrupted([*args, f'--init_from=hf:{llama}', '--max_iters=100000'], signal.SIGTERM,
                                       'iter 2:')
    assert code == 130 and 'Traceback' not in stderr, stdout + stderr
    hint = [line for line in stdout.splitlines() if line.startswith('interrupted at iter')]
    assert len(hint) == 1 and '--init_from=resume' in hint[0], stdout
    ckpt = ckpt_of(out)
    n = ckpt['iter_num']
    assert {k: ckpt['model_args'][k] for k in ('tie_embeddings', 'norm_eps', 'rope_theta', 'n_kv_head',
                                               'mlp_hidden')} == dict(tie_embeddings=False, norm_eps=1e-5,
                                                                      rope_theta=5e5, n_kv_head=1, mlp_hidden=96)
    code, stdout, _ = script_here('train.py', *args, '--init_from=resume', f'--max_iters={n + 2}')
    assert code == 0 and f'resuming from {out}/ckpt.pt at iter {n + 1}' in stdout
    assert ckpt_of(out)['iter_num'] == n + 2 and ckpt_of(out)['model_args'] == ckpt['model_args']


def test_llama_settings_are_train_keys(tmp_path, data_dir):
    """tie_embeddings, norm_eps and rope_theta are train.py options (a scratch run's model has them); a resumed
    import may give them too, and one that differs from the checkpoint's is refused."""
    from conftest import TINY_RUN, ckpt_of
    out = str(tmp_path / 'scratch')
    code, _, _ = script_here('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=1',
                             '--tie_embeddings=False', '--norm_eps=1e-5', '--rope_theta=5e5')
    assert code == 0
    args = ckpt_of(out)['model_args']
    assert (args['tie_embeddings'], args['norm_eps'], args['rope_theta']) == (False, 1e-5, 5e5)
    llama, out = make_llama(tmp_path / 'llama', data_dir), str(tmp_path / 'imported')
    common = [*TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}']
    assert script_here('train.py', *common, f'--init_from=hf:{llama}', '--max_iters=1')[0] == 0
    assert script_here('train.py', *common, '--init_from=resume', '--max_iters=2', '--tie_embeddings=False',
                       '--norm_eps=1e-5')[0] == 0
    with pytest.raises(UserError, match=r"the model differs \(rope_theta: 500000.0 in the checkpoint, 250000.0 now"):
        script_here('train.py', *common, '--init_from=resume', '--max_iters=3', '--rope_theta=2.5e5')


@pytest.mark.parametrize('rope', [
    {'rope_scaling': {'type': 'linear', 'factor': 4.0}, 'rope_theta': 5e5},  # before rope_type: transformers honours it
    {'rope_scaling': {'rope_type': 'yarn', 'factor': 4.0}, 'rope_theta': 5e5},
    {'rope_parameters': {'rope_theta': 5e5, 'type': 'dynamic', 'factor': 2.0}},
    {'rope_parameters': {'rope_theta': 5e5, 'rope_type': 'default'}, 'rope_scaling': {'type': 'linear', 'factor': 4}},
])
def test_scaled_rope_is_refused_in_every_form(rope, tmp_path, data_dir):
    llama = make_llama(tmp_path / 'llama', data_dir)
    config = json.load(open(f'{llama}/config.json'))
    config.pop('rope_parameters')
    json.dump({**config, **rope}, open(f'{llama}/config.json', 'w'))
    with pytest.raises(UserError, match=r"unsupported Llama \(scaled RoPE: rope_(parameters|scaling)="):
        hf.llama_model_args(llama)


def test_plain_rope_in_every_form_is_accepted(tmp_path, data_dir):
    llama = make_llama(tmp_path / 'llama', data_dir)
    config = json.load(open(f'{llama}/config.json'))
    config.pop('rope_parameters')
    for rope in ({'rope_theta': 5e5}, {'rope_theta': 5e5, 'rope_scaling': None},
                 {'rope_scaling': {'type': 'default', 'rope_theta': 5e5}},
                 {'rope_parameters': {'rope_theta': 5e5, 'rope_type': 'default'}, 'rope_scaling': None}):
        json.dump({**config, **rope}, open(f'{llama}/config.json', 'w'))
        assert hf.llama_model_args(llama)['rope_theta'] == 5e5, rope


def test_untied_llama_without_its_head_is_refused(tmp_path, data_dir):
    """An untied config whose weights lack lm_head.weight: refused as any other missing tensor, not trained with the
    embedding as its head."""
    llama = make_llama(tmp_path / 'llama', data_dir)
    sd = safetensors_torch.load_file(f'{llama}/model.safetensors')
    del sd['lm_head.weight']
    safetensors_torch.save_file(sd, f'{llama}/model.safetensors', metadata={'format': 'pt'})
    with pytest.raises(UserError, match=r"the Llama weights have no lm_head.weight, which its untied head \(tie_word_embeddings"):
        script_here('train.py', *[a for a in TINY if not a.startswith('--n_layer')], '--lime=False',
                    f'--init_from=hf:{llama}', f'--data_dir={data_dir}', f'--out_dir={tmp_path}/out')


def test_a_damaged_llama_folder_is_one_line_before_out_dir_is_claimed(tmp_path, data_dir):
    """config.json that is no JSON or lacks a size, model.safetensors that is not safetensors: one line each, before
    any work (out_dir is not created)."""
    from conftest import TINY_RUN
    good = make_llama(tmp_path / 'good', data_dir)
    cases = {'json': ('config.json', b'{"model_type": "llama",', "config.json is not valid JSON"),
             'key': ('config.json', None, "config.json lacks num_attention_heads"),
             'weights': ('model.safetensors', b'\x00garbage' * 10, "model.safetensors is damaged or not safetensors")}
    for name, (file, content, message) in cases.items():
        folder = tmp_path / name
        shutil.copytree(good, folder)
        if content is None:
            config = json.load(open(folder / file))
            del config['num_attention_heads']
            json.dump(config, open(folder / file, 'w'))
        else:
            (folder / file).write_bytes(content)
        with pytest.raises(UserError, match=re.escape(f"init_from=hf:{folder}: {message}")):
            script_here('train.py', *TINY_RUN, f'--init_from=hf:{folder}', f'--data_dir={data_dir}',
                        f'--out_dir={tmp_path}/out-{name}')
        assert not os.path.exists(f'{tmp_path}/out-{name}'), name


# ----------------------------------------------------------------------------- an import checked as our own runs are
@pytest.mark.parametrize('key, value, message', [
    ('rope_theta', 0, "config.json's rope_theta=0.0 must be > 0"),
    ('rope_theta', -5e5, "config.json's rope_theta=-500000.0 must be a finite number >= 0"),
    ('rope_theta', 'big', "config.json's rope_theta='big': expected float, got str"),
    ('rope_theta', None, "config.json's rope_theta=None: expected float, got None"),
    ('rms_norm_eps', -1e-5, "config.json's rms_norm_eps=-1e-05 must be a finite number >= 0"),
    ('num_key_value_heads', 2.0, "config.json's num_key_value_heads=2.0: expected int, got float"),
    ('hidden_size', '32', "config.json's hidden_size='32': expected int, got str"),
    ('num_hidden_layers', 0, "config.json's num_hidden_layers=0 must be >= 1"),
    ('model_type', 'absent', "config.json has no model_type (transformers writes 'llama' for a LlamaForCausalLM)"),
], ids=lambda x: str(x)[:20])
def test_a_llama_config_is_checked_as_train_py_checks_its_options(key, value, message, tmp_path, data_dir):
    """config.json's values get train.py's checks (types, ranges) and messages, naming config.json's key: one line,
    before anything is claimed."""
    folder = make_llama(tmp_path / 'llama', data_dir)
    config = json.load(open(f'{folder}/config.json'))
    config.pop('rope_parameters')  # rope_theta read from the top level, as older transformers write it
    if value == 'absent':
        del config[key]
    else:
        config[key] = value
    json.dump(config, open(f'{folder}/config.json', 'w'))
    with pytest.raises(UserError) as e:
        script_here('train.py', '--device=cpu', f'--init_from=hf:{folder}', f'--data_dir={data_dir}',
                    f'--out_dir={tmp_path}/out')
    assert str(e.value).startswith(f"init_from=hf:{folder}: {message}"), str(e.value)
    assert not os.path.exists(f'{tmp_path}/out')


def test_a_llama_with_a_nan_weight_is_refused_before_out_dir_is_claimed(tmp_path, data_dir):
    llama = make_llama(tmp_path / 'llama', data_dir)
    sd = safetensors_torch.load_file(f'{llama}/model.safetensors')
    sd['model.layers.1.mlp.up_proj.weight'][3, 4] = float('nan')
    safetensors_torch.save_file(sd, f'{llama}/model.safetensors', metadata={'format': 'pt'})
    with pytest.raises(UserError, match=re.escape(
            f"init_from=hf:{llama}: its weights hold non-finite values (NaN or inf) in model.layers.1.mlp.up_proj."
            "weight; download or save the model again, or import another")):
        script_here('train.py', '--device=cpu', '--lime=False', f'--init_from=hf:{llama}', f'--data_dir={data_dir}',
                    f'--out_dir={tmp_path}/out')
    assert not os.path.exists(f'{tmp_path}/out')


def test_shape_options_beside_an_import_are_the_llama_s_or_refused(tmp_path, data_dir, capsys):
    """The Llama's shape is the model's: a shape option given otherwise, on the command line or in a config file, is
    refused in one line (the resume that the interrupted run prints would otherwise refuse it); given as the
    Llama's, it is taken."""
    llama = make_llama(tmp_path / 'llama', data_dir)  # 2 layers x 32, 2 heads, 1 KV head
    args = ['--device=cpu', '--lime=False', f'--init_from=hf:{llama}', f'--data_dir={data_dir}',
            f'--out_dir={tmp_path}/out', '--check_only=True']
    with pytest.raises(UserError) as e:
        script_here('train.py', *args, '--n_layer=3', '--n_kv_head=2')
    assert str(e.value) == (f"init_from=hf:{llama} takes the model's shape from the Llama, and n_layer=3 (its 2), "
                            "n_kv_head=2 (its 1) was given: leave them out (a config file's too), or give the Llama's")
    config_file = tmp_path / 'wide.py'
    config_file.write_text("n_embd = 64\n")
    with pytest.raises(UserError, match=r"and n_embd=64 \(its 32\) was given: leave it out \(a config file's too\)"):
        script_here('train.py', str(config_file), *args)
    code, stdout, _ = script_here('train.py', *args, '--n_layer=2', '--n_embd=32', '--norm_eps=1e-5')
    assert code == 0 and json.loads(stdout.splitlines()[-1])['n_kv_head'] == 1
    assert not os.path.exists(f'{tmp_path}/out')


def test_completep_or_the_paper_s_router_init_on_an_import_is_said_or_refused(tmp_path, data_dir):
    """CompleteP from a depth_base other than the Llama's depth would scale its blocks: refused in one line (at its
    depth it changes nothing, and is taken); LIMe's routers at the paper's init, or another variant, start the model
    off the Llama's function: said in one line at the start."""
    llama = make_llama(tmp_path / 'llama', data_dir)
    args = ['--device=cpu', f'--init_from=hf:{llama}', f'--data_dir={data_dir}', f'--out_dir={tmp_path}/out',
            '--check_only=True']
    with pytest.raises(UserError) as e:
        script_here('train.py', *args, '--lime=False', '--depth_scaling=completep', '--depth_base=4')
    assert str(e.value) == (f"init_from=hf:{llama} with depth_scaling='completep' and depth_base=4 would scale each "
                            "block's output of the 2-layer Llama by 4/2: the model would start from another function "
                            "than the Llama's; use depth_base=2 (its depth, where CompleteP changes nothing) or "
                            "depth_scaling='standard'")
    notes = {}
    for name, extra in {'completep': ['--lime=False', '--depth_scaling=completep', '--depth_base=2'],
                        'identity': ['--lime=True', '--router_init=identity'], 'paper': ['--lime=True'],
                        'attnres': ['--lime=False', '--attnres=full']}.items():
        code, stdout, _ = script_here('train.py', *args, *extra)
        assert code == 0, name
        notes[name] = [line for line in stdout.splitlines() if line.startswith('note:')]
    assert notes['completep'] == notes['identity'] == []
    assert notes['paper'] == ["note: the model starts from the Llama's weights with LIMe's routers at "
                              "router_init='paper', not the Llama's function (router_init='identity' starts as the "
                              "Llama)"]
    assert notes['attnres'] == ["note: the model starts from the Llama's weights with attnres='full' at its own init"]
