"""
Datasets: their directories (<data_dir>/<name>/{train,val}.bin + meta.pkl, written by prepare.py), the
tokenizers (codecs) their meta.pkl names, read as plain data, and the batches train.py draws from them.
"""
import os
import difflib
import functools
import json
import pickle
import re

from nanolime.common import UserError
import numpy as np
import torch

# a dataset is <data_dir>/<name>/{train,val}.bin (uint16 token ids) + meta.pkl, written by prepare.py
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data')  # <repo>/data
DATASETS = ('shakespeare_char', 'shakespeare', 'fineweb_edu', 'arithmetic')
ARITHMETIC_TIERS = (4, 5, 6)  # the paper's: operators per expression
GPT2_PATH = os.path.join(DATA_DIR, 'gpt2.tiktoken')
GPT2_SHA256 = '306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930'  # the hash tiktoken expects for r50k_base
# copied verbatim from tiktoken_ext/openai_public.py (r50k_pat_str, used by "gpt2"); equivalent to GPT-2's original regex
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT = 50256  # <|endoftext|>


def dataset_dir(name, data_dir=None):
    return os.path.join(data_dir or DATA_DIR, name)


def arithmetic_tiers(name):
    """The tiers (operators per expression) an arithmetic dataset name asks for, else None:
    'arithmetic' -> the paper's (4, 5, 6); 'arithmetic-2-3' -> (2, 3)."""
    if name == 'arithmetic':
        return ARITHMETIC_TIERS
    m = re.fullmatch(r'arithmetic((?:-\d+)+)', name)
    tiers = tuple(int(t) for t in m.group(1)[1:].split('-')) if m else ()
    return tiers if tiers and all(t >= 1 for t in tiers) and len(set(tiers)) == len(tiers) else None


@functools.lru_cache(maxsize=None)
def get_gpt2_encoding():
    """GPT-2 BPE built offline from data/gpt2.tiktoken; ids identical to tiktoken.get_encoding('gpt2')."""
    import tiktoken
    import tiktoken.load
    ranks = tiktoken.load.load_tiktoken_bpe(GPT2_PATH, expected_hash=GPT2_SHA256)  # raises on a corrupted file
    return tiktoken.Encoding(name='gpt2', pat_str=GPT2_PAT_STR, mergeable_ranks=ranks,
                             special_tokens={'<|endoftext|>': EOT})


def codec(meta):
    """meta (the dict in meta.pkl) -> (encode, decode); encode(str) -> list[int], decode(list[int]) -> str."""
    if meta.get('kind') == 'bpe':
        if meta.get('encoding', 'gpt2') != 'gpt2':
            raise ValueError(f"unsupported BPE encoding {meta['encoding']!r} (only 'gpt2')")
        enc = get_gpt2_encoding()
        return lambda s: enc.encode(s, allowed_special={'<|endoftext|>'}), lambda ids: enc.decode(list(ids))
    if 'stoi' in meta and 'itos' in meta:  # 'char' (and any other char-level vocab, e.g. arithmetic)
        stoi, itos = meta['stoi'], meta['itos']

        def encode(s):
            bad = sorted(set(c for c in s if c not in stoi))
            if bad:
                raise ValueError(f"characters not in the vocabulary: {''.join(bad)!r} (vocab has {len(stoi)} chars)")
            return [stoi[c] for c in s]
        return encode, lambda ids: ''.join(itos[int(i)] for i in ids)
    raise ValueError(f"meta.pkl of unknown kind {meta.get('kind')!r}")


def prepare_hint(dataset, data_dir='', force=False):
    """What makes (force: makes again) dataset `dataset` under data_dir: the prepare.py command, or, for a dataset
    prepare.py does not know, where its files go."""
    ddir = dataset_dir(dataset, data_dir)
    if dataset not in DATASETS and not arithmetic_tiers(dataset):
        return (f"prepare.py does not make '{dataset}': put train.bin, val.bin and meta.pkl in {ddir} "
                "(the format prepare.py writes), or choose another dataset")
    cmd = f"python prepare.py {dataset}{' --force' if force else ''}{f' --data_dir={data_dir}' if data_dir else ''}"
    if force and arithmetic_tiers(dataset):  # the same examples again: the size and seed it was made with
        try:
            with open(os.path.join(ddir, 'info.json')) as f:
                info = json.load(f)
            cmd += f" --samples={info['sizes']['train_lines'] // len(info['tiers'])} --seed={info['seed']}"
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            pass
    elif force and dataset == 'fineweb_edu':
        cmd += " (with the --files, --hf_config and --num_tokens it was made with)"
    return f"rebuild it: {cmd}" if force else f"run: {cmd}"


class _NotPlainData(pickle.UnpicklingError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Plain data only. A pickle may name any function to be called while it loads (code of whoever wrote the
    file); meta.pkl is a dict of strings and numbers, which needs none, so any other name refuses the file."""
    PLAIN = {('collections', 'OrderedDict')} | {(module, name) for module in ('builtins', '__builtin__')  # (<= 2)
                                                for name in ('dict', 'list', 'tuple', 'set', 'frozenset', 'str', 'int',
                                                             'float', 'bool')}

    def find_class(self, module, name):
        if (module, name) not in self.PLAIN:
            raise _NotPlainData(f"{module}.{name}")
        return super().find_class(module, name)


def read_meta(ddir, dataset, data_dir=''):
    """The dict in <ddir>/meta.pkl, read as plain data (no code in it runs); UserError naming it corrupt, or not
    plain data, with the command that rebuilds it."""
    path = os.path.join(ddir, 'meta.pkl')
    try:
        with open(path, 'rb') as f:
            meta = _PlainUnpickler(f).load()
        if not 1 <= int(meta['vocab_size']) <= 2 ** 16:  # token ids are stored as uint16
            raise ValueError(f"vocab_size={meta['vocab_size']}")
    except _NotPlainData as e:
        raise UserError(f"{path} is not plain data: reading it would call {e}, so it was not read (it may run its "
                        f"author's code); {prepare_hint(dataset, data_dir, force=True)}, or ask where it came from") \
            from None
    except Exception as e:  # anything unpickling garbage raises
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"{path} is corrupt ({first}); {prepare_hint(dataset, data_dir, force=True)}") from None
    return meta


def data_info(dataset, data_dir='', block_size=None):
    """(directory, meta, {split: tokens}) of a prepared dataset; UserError with the command to prepare it, or if a
    split has no more than `block_size` tokens."""
    if not dataset:
        raise UserError(f"dataset is empty: name one ({', '.join(DATASETS)})")
    ddir = dataset_dir(dataset, data_dir)
    if dataset not in DATASETS and not arithmetic_tiers(dataset) and not os.path.isdir(ddir):
        close = difflib.get_close_matches(dataset, DATASETS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(f"unknown dataset '{dataset}'; {hint}known: {', '.join(DATASETS)}")
    missing = [f for f in ('train.bin', 'val.bin', 'meta.pkl') if not os.path.isfile(os.path.join(ddir, f))]
    if missing:
        raise UserError(f"dataset '{dataset}' is not prepared ({os.path.join(ddir, missing[0])} is missing); "
                        + prepare_hint(dataset, data_dir))
    meta = read_meta(ddir, dataset, data_dir)
    sizes = {}
    for split in ('train', 'val'):
        path, nbytes = os.path.join(ddir, f'{split}.bin'), os.path.getsize(os.path.join(ddir, f'{split}.bin'))
        if nbytes % 2 or nbytes == 0:  # uint16 token ids: an odd size is a file cut short
            what = 'empty' if nbytes == 0 else f'{nbytes} bytes, an odd size: cut short'
            raise UserError(f"{path} is corrupt ({what}); {prepare_hint(dataset, data_dir, force=True)}")
        sizes[split] = nbytes // 2
        if block_size is not None and sizes[split] <= block_size:
            raise UserError(f"block_size={block_size} is too large for dataset '{dataset}': its {split} split "
                            f"has only {sizes[split]} tokens (needs more than block_size)")
    return ddir, meta, sizes


MIB = 2 ** 20
EXACT_BYTES = 64 * MIB  # data_id reads a split of up to this size whole; a larger one at SAMPLES places
SAMPLES, SAMPLE_BYTES = 1024, 4096


def data_id(ddir):
    """A short identity of the prepared dataset in `ddir`, the same wherever it is copied: a hash of its meta.pkl and
    of each split's size, its first and last MiB, and what lies between them: all of it in a split of up to
    EXACT_BYTES, else SAMPLES reads of SAMPLE_BYTES spread evenly over it (the files may be many GB: a few MiB are
    read, and a change anywhere larger than the spacing of the reads changes the identity). A split of 2 MiB or
    less is covered by its ends. None if a file is missing."""
    return _data_hash(ddir, middle=True)


def ends_data_id(ddir):
    """data_id without the middle of the splits (their first and last MiB only): the identity that checkpoints and
    sweep records made by earlier versions hold; the same as data_id for splits of 2 MiB or less."""
    return _data_hash(ddir, middle=False)


def _data_hash(ddir, middle):
    import hashlib
    h = hashlib.sha256()
    try:
        with open(os.path.join(ddir, 'meta.pkl'), 'rb') as f:
            h.update(f.read())
        for split in ('train', 'val'):
            with open(os.path.join(ddir, f'{split}.bin'), 'rb') as f:
                size = os.fstat(f.fileno()).st_size
                h.update(f"{split} {size}".encode())
                h.update(f.read(MIB))
                f.seek(max(0, size - MIB))
                h.update(f.read(MIB))
                between = size - 2 * MIB if middle else 0  # the bytes between the two ends
                if 0 < between <= EXACT_BYTES - 2 * MIB:
                    f.seek(MIB)
                    h.update(f.read(between))
                elif between > 0:
                    for k in range(SAMPLES):  # the first at the middle's start, the last at its end
                        f.seek(MIB + (between - SAMPLE_BYTES) * k // (SAMPLES - 1))
                        h.update(f.read(SAMPLE_BYTES))
    except OSError:
        return None
    return h.hexdigest()[:12]


def get_batch(ddir, split, ix, block_size, device, vocab_size=None):
    """Inputs and targets (len(ix), block_size) starting at token offsets ix of <ddir>/<split>.bin; with vocab_size,
    UserError if a token id is beyond the vocabulary (the data does not match its meta.pkl: corrupt)."""
    data = np.memmap(os.path.join(ddir, f'{split}.bin'), dtype=np.uint16, mode='r')  # re-opened: no leak
    buf = data[np.asarray(ix)[:, None] + np.arange(block_size + 1)]
    if vocab_size is not None and buf.max() >= vocab_size:  # a batch's worth of ids: cheap; the model would crash
        dataset, root = os.path.basename(ddir), os.path.dirname(ddir)
        hint = prepare_hint(dataset, '' if root == DATA_DIR else root, force=True)
        raise UserError(f"{os.path.join(ddir, split + '.bin')} is corrupt: token id {buf.max()} is beyond the "
                        f"vocabulary of its meta.pkl ({vocab_size} ids); {hint}")
    buf = torch.from_numpy(buf.astype(np.int64))
    x, y = buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
    if device.startswith('cuda'):  # pinned, so the copy overlaps with compute
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def load_codec(ckpt):
    """(encode, decode) of the checkpoint's tokenizer: the vocabulary kept in the checkpoint, or for
    older checkpoints the dataset's meta.pkl."""
    meta = ckpt.get('meta')
    if meta is None:
        dataset, data_dir = ckpt['config'].get('dataset', ''), ckpt['config'].get('data_dir', '')
        if not dataset:
            raise UserError("the checkpoint holds no vocabulary and names no dataset: its tokens cannot be read as "
                            "text; use a checkpoint that train.py wrote (it keeps its vocabulary)")
        ddir = dataset_dir(dataset, data_dir)
        if not os.path.isfile(os.path.join(ddir, 'meta.pkl')):
            raise UserError(f"the checkpoint has no vocabulary and {os.path.join(ddir, 'meta.pkl')} is missing; "
                            + prepare_hint(dataset, data_dir))
        meta = read_meta(ddir, dataset, data_dir)
    try:
        return codec(meta)
    except ValueError as e:
        raise UserError(f"the checkpoint's vocabulary: {e}; use the version of prepare.py it was made with") from None
