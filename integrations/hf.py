"""
Our models in the layouts of other code, and a Llama back into ours: integrations/export.py and train.py's
--init_from=hf:DIR.

A baseline is a plain Llama: transformers' LlamaForCausalLM computes the same function from the same weights (the same
pre-norm blocks, SwiGLU, GQA, RMSNorm, and RoPE in its half-split convention), once our fused kv_proj is split: its
rows are [k heads...; v heads...] (Attention.forward views them as (2, H_kv, d_h)). LIMe and the other variants are
not Llamas: they ship as remote code, model.py itself beside a thin transformers wrapper (MODELING). The authors'
LIMe (corl-team/lime) keeps a Llama config and names of its own: per layer self_attn.kv_proj_weight, its rows in the
order (2 * d_h, H_kv) with the head fastest, and self_attn.lime_router.static_weights, our router matrix as it is
(both order sources layer-major: source j * H_kv + h). transformers and safetensors are needed here only.
"""
import dataclasses
import json
import os

import torch

from nanolime.common import UserError, check_ranges, check_value
from relatives import RelativesConfig

LLAMA = ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden', 'dropout',
         'tie_embeddings', 'rope_theta', 'norm_eps')  # the model options a Llama has too
SIBLINGS = ('model.py',)  # the files of our model an export copies as they are (if present)
PACKAGE = 'relatives'  # and the relatives' package, its files copied as they are but flat (package_files)


def package_files(root):
    """(path under root, name in an export) of each file of the relatives' package under root (none if it has no
    such package). transformers copies only the files a remote-code module imports relatively, found by name
    (`from .relatives import` -> relatives.py), so the export holds the package flat beside model.py:
    relatives/__init__.py as relatives.py, relatives/<name>.py as <name>.py; the package's files import each
    other relatively (from .base import ...), which holds in both layouts."""
    folder = os.path.join(root, PACKAGE)
    names = sorted(n for n in os.listdir(folder) if n.endswith('.py')) if os.path.isdir(folder) else []
    return [(os.path.join(PACKAGE, n), f'{PACKAGE}.py' if n == '__init__.py' else n) for n in names]


def _blocks(cfg):
    return [(f"model.layers.{i}.", f"transformer.h.{i}.") for i in range(cfg['n_layer'])]


def variants(cfg):
    """The options of a model config (GPTConfig's fields) that turn on something beyond a Llama with LIMe."""
    defaults = {f.name: f.default for f in dataclasses.fields(RelativesConfig)}
    return [k for k in cfg if k not in LLAMA + ('lime', 'router', 'router_init') and cfg[k] != defaults[k]]


def is_llama(cfg):
    """Whether a model config is a plain Llama: no LIMe nor any other variant."""
    return not cfg['lime'] and not variants(cfg)


def llama_config(cfg, torch_dtype='float32'):
    """config.json of transformers' LlamaConfig for our model config `cfg`."""
    hd = cfg['n_embd'] // cfg['n_head']
    return dict(architectures=['LlamaForCausalLM'], model_type='llama', hidden_size=cfg['n_embd'],
                intermediate_size=cfg['mlp_hidden'], num_hidden_layers=cfg['n_layer'],
                num_attention_heads=cfg['n_head'], num_key_value_heads=cfg['n_kv_head'], head_dim=hd,
                hidden_act='silu', rms_norm_eps=cfg['norm_eps'], rope_theta=cfg['rope_theta'],
                rope_parameters=dict(rope_type='default', rope_theta=cfg['rope_theta']),
                max_position_embeddings=cfg['block_size'], vocab_size=cfg['vocab_size'],
                tie_word_embeddings=cfg['tie_embeddings'], attention_bias=False, mlp_bias=False,
                attention_dropout=0.0, initializer_range=0.02, torch_dtype=torch_dtype, dtype=torch_dtype)


def to_llama(sd, cfg, authors=False):
    """Our state dict -> LlamaForCausalLM's (authors=True: the authors' LIMe's). A tied head is stored once."""
    H, hd = cfg['n_kv_head'], cfg['n_embd'] // cfg['n_head']
    out = {'model.embed_tokens.weight': sd['transformer.wte.weight'],
           'model.norm.weight': sd['transformer.ln_f.weight']}
    if not cfg['tie_embeddings']:
        out['lm_head.weight'] = sd['lm_head.weight']
    for i, (theirs, ours) in enumerate(_blocks(cfg)):
        for a, b in (('self_attn.q_proj', 'attn.q_proj'), ('self_attn.o_proj', 'attn.o_proj'), ('mlp.gate_proj',
                     'mlp.gate_proj'), ('mlp.up_proj', 'mlp.up_proj'), ('mlp.down_proj', 'mlp.down_proj'),
                     ('input_layernorm', 'ln_1'), ('post_attention_layernorm', 'ln_2')):
            out[f"{theirs}{a}.weight"] = sd[f"{ours}{b}.weight"]
        kv = sd[f"{ours}attn.kv_proj.weight"]  # rows (2, H_kv, d_h): [k heads...; v heads...]
        if authors:  # their rows: (2 * d_h, H_kv), head fastest ('(kv h)' with kv = [k dims; v dims])
            out[f"{theirs}self_attn.kv_proj_weight"] = kv.view(2, H, hd, -1).permute(0, 2, 1, 3).reshape(kv.shape)
            if i > 0:
                out[f"{theirs}self_attn.lime_router.static_weights"] = sd[f"{ours}attn.router.weight"]
        else:
            out[f"{theirs}self_attn.k_proj.weight"], out[f"{theirs}self_attn.v_proj.weight"] = kv.chunk(2)
    return {k: v.detach().contiguous() for k, v in out.items()}


def from_llama(sd, cfg):
    """LlamaForCausalLM's state dict -> ours (baseline keys only); UserError naming a missing tensor."""
    out = {}

    def get(key):
        if key not in sd:
            raise UserError(f"the Llama weights have no {key}: not a LlamaForCausalLM of this config")
        return sd[key]
    out['transformer.wte.weight'] = get('model.embed_tokens.weight')
    out['transformer.ln_f.weight'] = get('model.norm.weight')
    # untied (tie_word_embeddings false, or absent: LlamaConfig's default): the head is a tensor of its own
    if not cfg['tie_embeddings'] and 'lm_head.weight' not in sd:
        raise UserError("the Llama weights have no lm_head.weight, which its untied head (tie_word_embeddings false "
                        "or absent in config.json) needs; if its head is the embedding, set tie_word_embeddings: true")
    out['lm_head.weight'] = sd['lm_head.weight'] if not cfg['tie_embeddings'] else out['transformer.wte.weight']
    for theirs, ours in _blocks(cfg):
        for a, b in (('self_attn.q_proj', 'attn.q_proj'), ('self_attn.o_proj', 'attn.o_proj'), ('mlp.gate_proj',
                     'mlp.gate_proj'), ('mlp.up_proj', 'mlp.up_proj'), ('mlp.down_proj', 'mlp.down_proj'),
                     ('input_layernorm', 'ln_1'), ('post_attention_layernorm', 'ln_2')):
            out[f"{ours}{b}.weight"] = get(f"{theirs}{a}.weight")
        out[f"{ours}attn.kv_proj.weight"] = torch.cat([get(f"{theirs}self_attn.k_proj.weight"),
                                                       get(f"{theirs}self_attn.v_proj.weight")])
    return out


# ----------------------------------------------------------------------------- import: train.py --init_from=hf:DIR
# the model options an import takes from the Llama (beside vocab_size, which must be its dataset's)
LLAMA_SHAPE = ('n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden', 'norm_eps', 'rope_theta', 'tie_embeddings')


def llama_options(path, config, given, vocab_size, announce=True):
    """The model options of a run that starts from the LlamaForCausalLM in folder `path` (LLAMA_SHAPE), its
    config.json and weight files checked (before anything is claimed); `announce`: print a note if the model starts
    with more than the Llama (LIMe's routers at the paper's init, another variant's parameters). UserError if the
    Llama's vocabulary is not `vocab_size` (its dataset's), if an option of `config` in `given` (set by a config file
    or --key=value) differs from the Llama's (the Llama's shape is the model's), or for CompleteP from a depth_base
    other than the Llama's depth (it would scale the Llama's blocks)."""
    llama = llama_model_args(path)
    llama_weight_files(path)
    vocab = llama.pop('vocab_size')
    if vocab != vocab_size:
        raise UserError(f"init_from=hf:{path}: its vocabulary has {vocab} tokens, "
                        f"dataset '{config['dataset']}' {vocab_size}; train it on a dataset of its tokenizer")
    clash = [k for k in LLAMA_SHAPE if k in given and config[k] != llama[k]]
    if clash:
        raise UserError(f"init_from=hf:{path} takes the model's shape from the Llama, and "
                        f"{', '.join(f'{k}={config[k]!r} (its {llama[k]!r})' for k in clash)} was given: leave "
                        f"{'it' if len(clash) == 1 else 'them'} out (a config file's too), or give the Llama's")
    depth, base = llama['n_layer'], config['depth_base']
    if config['depth_scaling'] != 'standard' and base not in (None, depth):
        raise UserError(f"init_from=hf:{path} with depth_scaling={config['depth_scaling']!r} and depth_base={base} "
                        f"would scale each block's output of the {depth}-layer Llama by {base}/{depth}: the model "
                        f"would start from another function than the Llama's; use depth_base={depth} (its depth, where "
                        "CompleteP changes nothing) or depth_scaling='standard'")
    # what else the model starts from: LIMe's routers at the paper's init mix layers from step 0; other variants
    # add parameters at their own init
    cfg = {f.name: config[f.name] for f in dataclasses.fields(RelativesConfig) if f.name in config}
    starts = [f"{k}={cfg[k]!r} at its own init" for k in variants(cfg) if k not in ('depth_scaling', 'depth_base')]
    if config['lime'] and config['router_init'] == 'paper':
        starts.insert(0, "LIMe's routers at router_init='paper', not the Llama's function (router_init='identity' "
                         "starts as the Llama)")
    if announce and starts:
        print(f"note: the model starts from the Llama's weights with {'; '.join(starts)}")
    return llama


def resumed_import(ckpt, config, given):
    """The Llama folder the run of checkpoint `ckpt` started from, or None; for such a run, config's LLAMA_SHAPE
    options not in `given` set to the checkpoint's, since an import's shape is the Llama's, not train.py's defaults
    (those given are compared with the checkpoint's, as for any resume)."""
    first = str(ckpt['config'].get('init_from', ''))
    imported_from = ckpt.get('imported_from') or (first[len('hf:'):] if first.startswith('hf:') else None)
    if imported_from is not None:
        config.update({k: ckpt['model_args'][k] for k in LLAMA_SHAPE if k in ckpt['model_args'] and k not in given})
    return imported_from


def llama_model_args(path):
    """The model options (GPTConfig fields) of the LlamaForCausalLM folder `path`; UserError for anything else."""
    cfg_path = os.path.join(path, 'config.json')
    if not os.path.isfile(cfg_path):
        raise UserError(f"init_from=hf:{path}: no config.json there; point it at a folder saved by transformers")
    try:
        with open(cfg_path) as f:
            c = json.load(f)
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError too
        raise UserError(f"init_from=hf:{path}: config.json is not valid JSON ({str(e)[:200]}); save the model again "
                        "with transformers, or point it at another folder") from None
    if not isinstance(c, dict):
        raise UserError(f"init_from=hf:{path}: config.json is not a model config (a JSON object)")
    if 'model_type' not in c:
        raise UserError(f"init_from=hf:{path}: config.json has no model_type (transformers writes 'llama' for a "
                        "LlamaForCausalLM); save the model again with transformers")
    kind, classes = c['model_type'], c.get('architectures') or ['LlamaForCausalLM']
    if kind != 'llama' or 'LlamaForCausalLM' not in classes:
        ours = " (a nanoLIMe export continues with its run's own --init_from=resume)" if kind in ('nanolime', 'lime') \
            else ''
        raise UserError(f"init_from=hf:{path}: config.json names model_type {kind!r} and {', '.join(map(str, classes))}"
                        f"; only a plain Llama (model_type 'llama', LlamaForCausalLM) can be imported{ours}")
    lacks = [k for k in ('num_attention_heads', 'num_hidden_layers', 'hidden_size', 'intermediate_size', 'vocab_size')
             if c.get(k) is None]
    if lacks:
        raise UserError(f"init_from=hf:{path}: config.json lacks {lacks[0]} (a positive integer); save the model "
                        "again with transformers")
    # RoPE's settings: rope_parameters (transformers 5), or rope_scaling, whose kind is rope_type or, as written
    # before rope_type existed, type (transformers honours both); any kind but the default is scaled RoPE
    ropes = {key: c.get(key) or {} for key in ('rope_parameters', 'rope_scaling')}
    scaled = [f"{key}={{{kind!r}: {rope[kind]!r}}}" for key, rope in ropes.items() if isinstance(rope, dict)
              for kind in ('rope_type', 'type') if rope.get(kind) not in (None, 'default')]
    scaled += [f"{key}={rope!r}" for key, rope in ropes.items() if not isinstance(rope, dict)]
    rope = {**ropes['rope_scaling'], **ropes['rope_parameters']} if not scaled else {}
    # its values, checked as train.py checks the same options (types, then ranges), named by config.json's keys
    heads = c['num_attention_heads']  # and as many KV heads when num_key_value_heads is null (transformers' rule)
    values = {'num_hidden_layers': c['num_hidden_layers'], 'num_attention_heads': heads,
              'num_key_value_heads': heads if c.get('num_key_value_heads') is None else c['num_key_value_heads'],
              'hidden_size': c['hidden_size'], 'intermediate_size': c['intermediate_size'],
              'rms_norm_eps': c.get('rms_norm_eps', 1e-6),
              'rope_theta': rope.get('rope_theta', c.get('rope_theta', 10000.0)),
              'tie_word_embeddings': c.get('tie_word_embeddings', False), 'vocab_size': c['vocab_size'],
              **({'head_dim': c['head_dim']} if c.get('head_dim') is not None else {})}
    floats = {'rms_norm_eps': 1.0, 'rope_theta': 1.0, 'tie_word_embeddings': False}  # defaults of their types
    try:
        values = {key: check_value(key, value, floats.get(key, 1)) for key, value in values.items()}
        check_ranges(values, at_least_1=[k for k, v in values.items() if type(v) is int],
                     positive=('rms_norm_eps', 'rope_theta'))
    except UserError as e:
        raise UserError(f"init_from=hf:{path}: config.json's {e}; save the model again with transformers, or "
                        "correct config.json") from None
    head_dim = values.get('head_dim', values['hidden_size'] // values['num_attention_heads'])
    unsupported = [name for name, bad in (
        ('attention_bias', c.get('attention_bias')), ('mlp_bias', c.get('mlp_bias')),
        (f"hidden_act={c.get('hidden_act')!r}", c.get('hidden_act', 'silu') != 'silu'),
        (f"scaled RoPE: {', '.join(scaled)}", scaled),
        (f"head_dim={head_dim} != hidden_size / num_attention_heads",
         head_dim * values['num_attention_heads'] != values['hidden_size']))
        if bad]
    if unsupported:
        raise UserError(f"init_from=hf:{path}: unsupported Llama ({', '.join(unsupported)}); our model has no biases, "
                        "SwiGLU, plain RoPE and head_dim = hidden_size / num_attention_heads")
    return dict(n_layer=values['num_hidden_layers'], n_head=values['num_attention_heads'],
                n_kv_head=values['num_key_value_heads'], n_embd=values['hidden_size'],
                mlp_hidden=values['intermediate_size'], norm_eps=values['rms_norm_eps'],
                rope_theta=values['rope_theta'], tie_embeddings=values['tie_word_embeddings'],
                vocab_size=values['vocab_size'])


def llama_weight_files(path):
    """The safetensors files of the LlamaForCausalLM folder `path`, each checked readable (its header: cheap);
    UserError if one is missing or damaged."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise UserError("init_from=hf:... needs safetensors: pip install -r requirements-hf.txt") from None
    index = os.path.join(path, 'model.safetensors.index.json')
    if os.path.isfile(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)['weight_map'].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"init_from=hf:{path}: model.safetensors.index.json is damaged (no weight_map); save "
                            "the model again with transformers") from None
    elif os.path.isfile(os.path.join(path, 'model.safetensors')):
        files = ['model.safetensors']
    else:
        raise UserError(f"init_from=hf:{path}: no model.safetensors there (only safetensors weights are read)")
    for name in files:
        try:
            with safe_open(os.path.join(path, name), framework='pt') as f:
                f.keys()
        except Exception as e:  # safetensors' own error types (a Rust panic too), or an OSError
            raise UserError(f"init_from=hf:{path}: {name} is damaged or not safetensors "
                            f"({(str(e).strip().splitlines() or [type(e).__name__])[0][:150]}); save the model "
                            "again with transformers, or download it again") from None
    return files


def load_llama(model, path):
    """Load the LlamaForCausalLM weights in folder `path` into `model` (its other parameters, a LIMe router or
    another variant's, keep their init); UserError if a shape differs or a weight is not finite (NaN or inf: it would
    train to NaN), as our checkpoints' loader refuses them."""
    files = llama_weight_files(path)
    from safetensors.torch import load_file
    sd = {}
    for name in files:
        sd.update(load_file(os.path.join(path, name)))
    bad = [k for k, v in sd.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise UserError(f"init_from=hf:{path}: its weights hold non-finite values (NaN or inf) in {bad[0]}"
                        f"{f' and {len(bad) - 1} more tensors' if len(bad) > 1 else ''}; download or save the model "
                        "again, or import another")
    ours = model.state_dict()
    for k, v in from_llama(sd, dataclasses.asdict(model.config)).items():
        if ours[k].shape != v.shape:
            raise UserError(f"init_from=hf:{path}: {k} has shape {tuple(v.shape)} there, {tuple(ours[k].shape)} here")
        with torch.no_grad():
            ours[k].copy_(v)


# ----------------------------------------------------------------------------- remote code (LIMe and the variants)
# the wrapper transformers runs for them: integrations/modeling_nanolime.py, copied into the export beside model.py
MODELING = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'modeling_nanolime.py')


def remote_config(cfg, torch_dtype='float32'):
    return dict(architectures=['NanoLIMeForCausalLM'], model_type='nanolime', nanolime=cfg,
                auto_map={'AutoConfig': 'modeling_nanolime.NanoLIMeConfig',
                          'AutoModelForCausalLM': 'modeling_nanolime.NanoLIMeForCausalLM'},
                vocab_size=cfg['vocab_size'], hidden_size=cfg['n_embd'], num_hidden_layers=cfg['n_layer'],
                num_attention_heads=cfg['n_head'], max_position_embeddings=cfg['block_size'],
                tie_word_embeddings=cfg['tie_embeddings'], torch_dtype=torch_dtype, dtype=torch_dtype)


# ----------------------------------------------------------------------------- tokenizers
def bpe_merges(ranks):
    """GPT-2's merges from tiktoken's ranks: each token of two or more bytes is the merge of the two parts
    that BPE, using only the merges ranked before it, leaves of its bytes (the ranks are the merge order)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], float('inf')))
            if ranks.get(parts[best] + parts[best + 1], float('inf')) >= rank:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        merges.append(tuple(parts))
    return merges


def _byte_to_unicode():
    """GPT-2's printable stand-ins for the 256 bytes (its vocab.json and merges.txt are written in them)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def gpt2_tokenizer(folder):
    """Write GPT-2's tokenizer (tokenizer.json) into `folder`, built from the shipped data/gpt2.tiktoken:
    AutoTokenizer.from_pretrained(folder) loads it offline."""
    from tokenizers import Tokenizer, AddedToken, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast
    from nanolime.data import get_gpt2_encoding, EOT
    ranks = get_gpt2_encoding()._mergeable_ranks
    b2u = _byte_to_unicode()
    text = lambda b: ''.join(b2u[x] for x in b)  # noqa: E731
    tok = Tokenizer(models.BPE(vocab={text(t): r for t, r in ranks.items()},
                               merges=[(text(a), text(b)) for a, b in bpe_merges(ranks)]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # with GPT-2's regex
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken('<|endoftext|>', special=True)])
    assert tok.token_to_id('<|endoftext|>') == EOT
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<|endoftext|>', eos_token='<|endoftext|>',
                            unk_token='<|endoftext|>', clean_up_tokenization_spaces=False).save_pretrained(folder)


def char_tokenizer(folder, meta):
    """Write a tokenizer of one token per character (meta's stoi) into `folder`."""
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast
    stoi = {c: int(i) for c, i in meta['stoi'].items()}
    tok = Tokenizer(models.WordLevel(vocab=stoi, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior='isolated')  # every character a word
    tok.decoder = decoders.Fuse()  # joined as they are, no spaces between
    PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False).save_pretrained(folder)
