"""
Sample from a trained nanoLIMe model (out_dir/ckpt.pt), with the KV cache.

$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=2 --max_new_tokens=300
$ python sample.py --start=FILE:prompt.txt --temperature=0.7 --top_k=50

Same --key=value style as train.py (a config file also works). The prompt is encoded with the
training data's vocabulary (kept in the checkpoint); checkpoints made on a GPU load on a CPU.
"""
import os
from contextlib import nullcontext

from train import UserError, load_checkpoint, parse_config, resolve_device, resolve_dtype, run_main, \
    clean_state_dict, CKPT_NAME

# -----------------------------------------------------------------------------
out_dir = 'out-shakespeare-char'  # where ckpt.pt is
start = '\n'               # the prompt, or FILE:path to read it from a file
num_samples = 3
max_new_tokens = 500
temperature = 0.8          # 1.0: the model's distribution; lower: more conservative; 0.0: greedy
top_k = 200                # sample among the top_k most likely tokens only; None: all
seed = 1337
device = 'auto'            # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'             # 'auto' (bfloat16 on CUDA if supported, else float16; float32 elsewhere)
use_cache = True           # KV cache: same samples, faster
debug = False
# -----------------------------------------------------------------------------
DEFAULTS = {k: v for k, v in dict(globals()).items() if k in (
    'out_dir', 'start', 'num_samples', 'max_new_tokens', 'temperature', 'top_k', 'seed', 'device', 'dtype',
    'use_cache', 'debug')}


def main(argv):
    cfg = parse_config(DEFAULTS, argv, nullable={'top_k'}, tristate=())
    if cfg['max_new_tokens'] < 1:
        raise UserError(f"max_new_tokens={cfg['max_new_tokens']} must be >= 1")
    if cfg['num_samples'] < 1:
        raise UserError(f"num_samples={cfg['num_samples']} must be >= 1")
    if cfg['temperature'] < 0:
        raise UserError(f"temperature={cfg['temperature']} must be >= 0 (0: greedy)")
    if cfg['top_k'] is not None and cfg['top_k'] < 1:
        raise UserError(f"top_k={cfg['top_k']} must be >= 1, or None for no limit")
    prompt = cfg['start']
    if prompt.startswith('FILE:'):
        path = prompt[len('FILE:'):]
        if not os.path.isfile(path):
            raise UserError(f"--start=FILE:{path}: no such file")
        with open(path, encoding='utf-8') as f:
            prompt = f.read()
    import torch
    device = resolve_device(cfg['device'])
    device_type = device.split(':')[0]
    dtype = resolve_dtype(cfg['dtype'], device_type)

    ckpt_path = os.path.join(cfg['out_dir'], CKPT_NAME)
    if not os.path.exists(ckpt_path):
        raise UserError(f"no checkpoint at {ckpt_path}; train one first (python train.py --out_dir={cfg['out_dir']}) "
                        "or point --out_dir at the directory holding ckpt.pt")
    ckpt = load_checkpoint(ckpt_path)

    # the vocabulary: kept in the checkpoint; older ones: the dataset's meta.pkl
    import prepare
    meta = ckpt.get('meta')
    if meta is None:
        import pickle
        dcfg = ckpt['config']
        meta_path = os.path.join(prepare.dataset_dir(dcfg.get('dataset', ''), dcfg.get('data_dir') or None), 'meta.pkl')
        if not os.path.isfile(meta_path):
            raise UserError(f"{ckpt_path} has no vocabulary and {meta_path} is missing; "
                            f"run: python prepare.py {dcfg.get('dataset', '')}")
        with open(meta_path, 'rb') as f:
            meta = pickle.load(f)
    try:
        encode, decode = prepare.load_codec(meta)
        ids = encode(prompt)
    except ValueError as e:
        raise UserError(f"--start: {e}") from None
    if not ids:
        raise UserError("--start is empty: give at least one character (the default is a newline)")

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(**ckpt['model_args']))
    model.load_state_dict(clean_state_dict(ckpt['model']))
    del ckpt
    model.eval().to(device)

    torch.manual_seed(cfg['seed'])
    if device_type == 'cuda':
        torch.cuda.manual_seed(cfg['seed'])
        torch.backends.cuda.matmul.allow_tf32 = True
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
    ctx = nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=ptdtype)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
    top_k = 1 if cfg['temperature'] == 0 else cfg['top_k']
    with torch.no_grad(), ctx:
        for _ in range(cfg['num_samples']):
            y = model.generate(x, cfg['max_new_tokens'], temperature=cfg['temperature'] or 1.0, top_k=top_k,
                               use_cache=cfg['use_cache'])
            print(decode(y[0].tolist()))
            print('---------------', flush=True)
    return 0


if __name__ == '__main__':
    run_main(main)
