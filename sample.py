"""
Sample from a trained nanoLIMe model (out_dir/ckpt.pt), with the KV cache.

$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=2 --max_new_tokens=300
$ python sample.py --start=FILE:prompt.txt --temperature=0.7 --top_k=50 --top_p=0.9

Same --key=value style as train.py (a config file also works). The prompt is encoded with the
training data's vocabulary (kept in the checkpoint); checkpoints made on a GPU load on a CPU.
"""
import os
import sys
import math

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from nanolime.common import UserError, configure, resolve_device, resolve_dtype, autocast
from nanolime.checkpoint import load_model, trained_with
from nanolime.data import load_codec
import torch

# -----------------------------------------------------------------------------
out_dir = 'out-shakespeare-char'  # where ckpt.pt is
start = '\n'               # the prompt, or FILE:path to read it from a file
num_samples = 3
max_new_tokens = 500
temperature = 0.8          # 1.0: the model's distribution; lower: more conservative; 0.0: greedy
top_k = 200                # sample among the top_k most likely tokens only; None: all
top_p = 1.0                # nucleus sampling: among the most likely tokens whose probabilities sum to top_p; 1.0: all
seed = 1337
device = 'auto'            # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'             # 'auto' (bfloat16 on CUDA if supported, else float16; float32 elsewhere)
use_cache = True           # KV cache: same samples, faster
# -----------------------------------------------------------------------------
configure(globals(), nullable=('top_k',))  # top_k's default is a count, yet None (no limit) is allowed too

if max_new_tokens < 1:
    raise UserError(f"max_new_tokens={max_new_tokens} must be >= 1")
if num_samples < 1:
    raise UserError(f"num_samples={num_samples} must be >= 1")
if not (math.isfinite(temperature) and temperature >= 0):
    raise UserError(f"temperature={temperature} must be a finite number >= 0 (0: greedy)")
if top_k is not None and top_k < 1:
    raise UserError(f"top_k={top_k} must be >= 1, or None for no limit")
if not 0.0 < top_p <= 1.0:
    raise UserError(f"top_p={top_p} must be in (0, 1] (1.0: no nucleus cut)")
prompt = start
if prompt.startswith('FILE:'):
    path = prompt[len('FILE:'):]
    if not os.path.isfile(path):
        raise UserError(f"--start=FILE:{path}: {'a directory, not a file' if os.path.isdir(path) else 'no such file'}")
    try:
        with open(path, encoding='utf-8') as f:
            prompt = f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"--start=FILE:{path} is not UTF-8 text ({e.reason} at byte {e.start}); "
                        "save it as UTF-8") from None
device = resolve_device(device)
ptdtype = resolve_dtype(dtype, device)

model, ckpt = load_model(out_dir, device)
encode, decode = load_codec(ckpt)
print(f"{out_dir}: {trained_with(ckpt)}", file=sys.stderr)
del ckpt
try:
    ids = encode(prompt)
except ValueError as e:
    raise UserError(f"--start: {e}; write the prompt in the characters the model was trained on") from None
if not ids:
    raise UserError("--start is empty: give at least one character (the default is a newline)")

torch.manual_seed(seed)
if device.startswith('cuda'):
    torch.backends.cuda.matmul.allow_tf32 = True
x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
with torch.no_grad(), autocast(device, ptdtype):
    for _ in range(num_samples):
        y = model.generate(x, max_new_tokens, temperature=temperature or 1.0,
                           top_k=1 if temperature == 0 else top_k, use_cache=use_cache, top_p=top_p)
        print(decode(y[0].tolist()))
        print('---------------', flush=True)
