"""
Export a trained nanoLIMe model (out_dir/ckpt.pt) to a folder other code loads (needs requirements-hf.txt).

$ python -m integrations.export --out_dir=out-shakespeare-char --export_dir=export-lime
$ python -m integrations.export --out_dir=out-lime --export_dir=export-lime-authors --format=lime-authors

format='hf': a folder transformers loads with AutoModelForCausalLM.from_pretrained(DIR): a baseline as a plain
LlamaForCausalLM, LIMe and the other variants as remote code (trust_remote_code=True: model.py beside a thin
wrapper). With the tokenizer: GPT-2's for the BPE datasets, one token per character for the character ones.
format='lime-authors': the layout of the LIMe authors' code (corl-team/lime), for LIMe with the full router.
The folder (export_dir) is written beside itself under a temporary name and renamed into place when complete; an
existing non-empty one is refused. See docs/export.md.
"""
import os
import re
import json
import shutil
import tempfile
import dataclasses

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from nanolime.common import UserError, configure
from nanolime.checkpoint import load_model
from nanolime.data import EOT

# -----------------------------------------------------------------------------
out_dir = 'out-shakespeare-char'  # where ckpt.pt is
export_dir = ''            # the folder to write (must not exist, or be empty)
format = 'hf'              # 'hf' (transformers) or 'lime-authors' (the LIMe authors' layout)
# -----------------------------------------------------------------------------
configure(globals())

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: model.py and its siblings
if format not in ('hf', 'lime-authors'):
    raise UserError(f"format={format!r}: expected 'hf' or 'lime-authors'")
if not export_dir:
    raise UserError("export_dir is empty: name the folder to write (--export_dir=DIR)")
if os.path.islink(export_dir):  # the folder is renamed into place: onto a link it would fail, or replace the link
    raise UserError(f"--export_dir={export_dir} is a link; name the folder itself (or a new one)")
if os.path.exists(export_dir) and not (os.path.isdir(export_dir) and not os.listdir(export_dir)):
    raise UserError(f"--export_dir={export_dir} exists and is not an empty folder; choose a new one (or remove it)")
try:
    import safetensors.torch
    import transformers  # noqa: F401  (the tokenizer files are written with it)
except ImportError as e:
    raise UserError(f"integrations/export.py needs {e.name}: pip install -r requirements-hf.txt") from None
from integrations import hf

model, ckpt = load_model(out_dir)
cfg = dataclasses.asdict(model.config)
meta = ckpt.get('meta') or {}
sd = model.state_dict()
if format == 'lime-authors':
    others = hf.variants(cfg)
    if not cfg['lime'] or others or cfg['router'] != 'full':
        what = f"{others[0]}={cfg[others[0]]!r}" if others else f"router={cfg['router']!r}" if cfg['lime'] else \
            "lime=False: a baseline"
        how = 'a plain LlamaForCausalLM' if hf.is_llama(cfg) else 'remote code'
        raise UserError(f"format='lime-authors' cannot hold this model ({what}): the authors' code has LIMe's static "
                        f"full router only; export it with --format=hf ({how})")
    # a LlamaConfig, as their code reads it, but not model_type 'llama': transformers' Auto classes would load it as a
    # LlamaForCausalLM with random k and v projections (their kv_proj_weight has no place there), warning only
    config = {**hf.llama_config(cfg), 'architectures': ['LIMeForCausalLM'], 'model_type': 'lime'}
    weights = hf.to_llama(sd, cfg, True)
elif hf.is_llama(cfg):
    config, weights = hf.llama_config(cfg), hf.to_llama(sd, cfg)
else:  # remote code: our state dict as it is, under the wrapper's 'model.'; a tied head stored once
    config = hf.remote_config(cfg)
    weights = {f"model.{k}": v.contiguous() for k, v in sd.items()
               if not (cfg['tie_embeddings'] and k == 'lm_head.weight')}
bpe = meta.get('kind') == 'bpe'
if bpe:
    config.update(bos_token_id=EOT, eos_token_id=EOT)

def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: there
        pass
    return True


parent, base = os.path.dirname(os.path.abspath(export_dir)), os.path.basename(os.path.abspath(export_dir))
tmp = None
try:
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):  # the temp folders of exports here that were killed (their process is gone)
        stale = re.fullmatch(rf"\.{re.escape(base)}\.export-(\d+)-.*", name)
        if stale and not alive(int(stale[1])) and os.path.isdir(os.path.join(parent, name)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{base}.export-{os.getpid()}-", dir=parent)
    with open(os.path.join(tmp, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)
    safetensors.torch.save_file(weights, os.path.join(tmp, 'model.safetensors'), metadata={'format': 'pt'})
    generation = dict(do_sample=True, temperature=0.8, top_k=200, max_length=cfg['block_size'])
    if bpe:
        generation.update(bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT)
    if format == 'hf' and not hf.is_llama(cfg):
        generation['use_cache'] = False  # the wrapper recomputes the sequence at each step
        files = [(n, n) for n in hf.SIBLINGS if os.path.isfile(os.path.join(HERE, n))] + hf.package_files(HERE)
        for path, name in files:
            shutil.copy(os.path.join(HERE, path), os.path.join(tmp, name))
        shutil.copy(hf.MODELING, os.path.join(tmp, 'modeling_nanolime.py'))
    with open(os.path.join(tmp, 'generation_config.json'), 'w') as f:
        json.dump(generation, f, indent=2)
    note = ''
    if bpe:
        hf.gpt2_tokenizer(tmp)
    elif 'stoi' in meta:
        hf.char_tokenizer(tmp, meta)
    else:
        note = "; no tokenizer: the checkpoint has no vocabulary of a kind integrations/export.py knows"
    if os.path.isdir(export_dir):
        os.rmdir(export_dir)  # empty (checked above)
    os.rename(tmp, export_dir)
except BaseException as e:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(e, OSError):  # a full or read-only disk, permissions
        raise UserError(f"cannot write the export to --export_dir={export_dir}: {(e.strerror or str(e)).lower()}; "
                        "nothing was left there: free some space (or fix the permissions), then run again") from None
    raise
kind = 'the authors\' LIMe layout' if format == 'lime-authors' else \
    'LlamaForCausalLM' if hf.is_llama(cfg) else 'remote code (trust_remote_code=True)'
print(f"exported {out_dir} (iter {ckpt['iter_num']}) to {export_dir}: {kind}{note}")
