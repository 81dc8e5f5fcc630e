"""Tests for prepare.py: char / BPE / fineweb_edu-from-local-files preparation, codecs, errors."""
import ast
import errno
import gzip
import hashlib
import json
import os
import pickle
import random
import subprocess
import sys
import time
import types

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import study  # noqa: E402
from study import arithmetic  # noqa: E402
from nanolime import common  # noqa: E402
from nanolime import data  # noqa: E402
import prepare  # noqa: E402

EOT = 50256
# the shipped files' own hashes, not prepare.py's: the corpus's from its provenance (docs/study-tools.md, "Shipped
# data"), the ranks' the one tiktoken itself expects for r50k_base
CORPUS_SHA256 = '04decea0dd965df5e6cfc4a538b0c62623aaa3bfd848ac7fad6734e59c96624d'
GPT2_RANKS_SHA256 = '306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930'

# GPT-2 ids from independent sources: tiktoken's own tests (tests/test_encoding.py: "hello world", the
# runs of zeros, "hello <|endoftext|>"), the Hugging Face GPT-2 docs example ("Hello, my dog is cute"),
# and goldens produced by Hugging Face's GPT-2 tokenizer (whitespace runs, unicode, code, tabs).
KNOWN_IDS = [
    ("hello world", [31373, 995]),
    ("Hello world", [15496, 995]),
    ("hello <|endoftext|>", [31373, 220, 50256]),
    ("0", [15]), ("0000", [2388]), ("000000000", [10535, 830]), ("0000000000000000", [25645]),
    ("00000000000000000", [8269, 10535, 830]),
    ("Hello, my dog is cute", [15496, 11, 616, 3290, 318, 13779]),
    ("The quick brown fox jumps over the lazy dog.", [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]),
    ("Hello<|endoftext|>world", [15496, 50256, 6894]),
    ("isnt it", [271, 429, 340]),
    ("  double space", [220, 4274, 2272]),
    ("trailing   ", [9535, 4386, 220, 220, 220]),
    ("abc123def", [39305, 10163, 4299]),
    ("\u4F60\u597D\uFF0C\u4E16\u754C", [19526, 254, 25001, 121, 171, 120, 234, 10310, 244, 45911, 234]),
    ("caf\u00E9 na\u00EFve", [66, 1878, 2634, 41492]),
    ("\U0001F600 emoji", [47249, 222, 44805]),
    ("def f(x):\n    return x+1", [4299, 277, 7, 87, 2599, 198, 220, 220, 220, 1441, 2124, 10, 16]),
    ("1,000.50", [16, 11, 830, 13, 1120]),
    ("a\tb", [64, 197, 65]),
]


def run_prepare(*args, env=None):
    # from another cwd, to check that paths are relative to the script, not to the cwd
    return subprocess.run([sys.executable, os.path.join(ROOT, 'prepare.py'), *args], cwd='/',
                          capture_output=True, text=True, timeout=300, env=env)


def load(out_dir):
    with open(os.path.join(out_dir, 'meta.pkl'), 'rb') as f:
        meta = pickle.load(f)
    train = np.memmap(os.path.join(out_dir, 'train.bin'), dtype=np.uint16, mode='r')
    val = np.memmap(os.path.join(out_dir, 'val.bin'), dtype=np.uint16, mode='r')
    return meta, train, val


# ---------------------------------------------------------------------------- shipped files

def test_shipped_corpus_matches_readme():
    with gzip.open(os.path.join(ROOT, 'data', 'shakespeare.txt.gz'), 'rb') as f:
        raw = f.read()
    assert hashlib.sha256(raw).hexdigest() == CORPUS_SHA256
    assert len(raw) == 5_057_321
    assert len(set(raw)) == 84 and max(raw) < 128  # ASCII


def test_shipped_gpt2_ranks_match_tiktoken_hash():
    with open(os.path.join(ROOT, 'data', 'gpt2.tiktoken'), 'rb') as f:
        assert hashlib.sha256(f.read()).hexdigest() == GPT2_RANKS_SHA256


# ---------------------------------------------------------------------------- char

def test_char_prep_small_text(tmp_path):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 7
    prepare.prepare_char(text, str(tmp_path))
    meta, train, val = load(tmp_path)
    chars = sorted(set(text))
    assert meta['kind'] == 'char' and meta['vocab_size'] == len(chars)
    assert [meta['itos'][i] for i in range(len(chars))] == chars  # sorted char vocabulary
    assert all(meta['stoi'][c] == i for i, c in enumerate(chars))
    assert len(train) == int(0.9 * len(text)) and len(train) + len(val) == len(text)  # first 90% / last 10%
    encode, decode = data.codec(meta)
    assert decode(train) == text[:len(train)] and decode(val) == text[len(train):]
    assert encode(text) == list(train) + list(val)


def test_char_codec_names_unknown_chars():
    meta = {'vocab_size': 3, 'kind': 'char', 'stoi': {'a': 0, 'b': 1, ' ': 2}, 'itos': {0: 'a', 1: 'b', 2: ' '}}
    encode, decode = data.codec(meta)
    assert encode('ab ba') == [0, 1, 2, 1, 0] and decode([1, 0]) == 'ba'
    with pytest.raises(ValueError) as e:
        encode('abz Q')
    assert 'z' in str(e.value) and 'Q' in str(e.value)


def test_full_corpus_char_prep_skip_and_force(tmp_path, run_here, capsys):
    t0 = time.time()
    assert run_here('prepare.py', f'--data_dir={tmp_path}') == 0  # default dataset: shakespeare_char
    assert time.time() - t0 < 30  # seconds, not minutes (generous: shared CPU)
    out = tmp_path / 'shakespeare_char'
    meta, train, val = load(out)
    assert meta['vocab_size'] == 84 and len(train) + len(val) == 5_057_321
    assert len(train) == int(0.9 * 5_057_321)
    _, decode = data.codec(meta)
    assert decode(train[:14]) == prepare.read_shakespeare()[:14]
    good = (out / 'val.bin').read_bytes()
    (out / 'val.bin').write_bytes(b'junk')
    capsys.readouterr()
    assert run_here('prepare.py', 'shakespeare_char', f'--data_dir={tmp_path}') == 0  # outputs exist: skipped
    assert (out / 'val.bin').read_bytes() == b'junk' and 'skipping' in capsys.readouterr().out
    assert run_here('prepare.py', 'shakespeare_char', f'--data_dir={tmp_path}', '--force=True') == 0  # redone
    assert (out / 'val.bin').read_bytes() == good


# ---------------------------------------------------------------------------- BPE

def test_gpt2_pattern_is_tiktokens():
    from tiktoken_ext.openai_public import r50k_pat_str  # importing it needs no network
    assert data.GPT2_PAT_STR == r50k_pat_str


@pytest.mark.parametrize('text,ids', KNOWN_IDS)
def test_bpe_ids_match_gpt2(text, ids):
    enc = data.get_gpt2_encoding()
    assert enc.encode(text, allowed_special='all') == ids
    assert enc.decode(ids) == text
    encode, decode = data.codec({'vocab_size': 50257, 'kind': 'bpe', 'encoding': 'gpt2'})
    assert encode(text) == ids and decode(ids) == text  # load_codec allows <|endoftext|>


def test_bpe_matches_tiktoken_gpt2_when_cached():
    # tiktoken.get_encoding('gpt2') needs the network unless its two files are already cached
    import tempfile
    cache = os.environ.get('TIKTOKEN_CACHE_DIR') or os.environ.get('DATA_GYM_CACHE_DIR') \
        or os.path.join(tempfile.gettempdir(), 'data-gym-cache')
    urls = ['https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe',
            'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json']
    if not all(os.path.exists(os.path.join(cache, hashlib.sha1(u.encode()).hexdigest())) for u in urls):
        pytest.skip('tiktoken gpt2 files not cached (no network here)')
    import tiktoken
    ref, enc = tiktoken.get_encoding('gpt2'), data.get_gpt2_encoding()
    text = prepare.read_shakespeare()[:200_000]
    assert enc.encode_ordinary(text) == ref.encode_ordinary(text)


def test_bpe_shakespeare_prep(tmp_path):
    text = "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n" * 5
    prepare.prepare_bpe(text, str(tmp_path))
    meta, train, val = load(tmp_path)
    assert meta == {'vocab_size': 50257, 'kind': 'bpe', 'encoding': 'gpt2'}
    _, decode = data.codec(meta)
    n = int(0.9 * len(text))
    assert decode(train) == text[:n] and decode(val) == text[n:]


# ---------------------------------------------------------------------------- fineweb_edu from local files

def test_fineweb_local_files(tmp_path, run_here):
    import pandas as pd
    docs = [f"Doc {i}: naïve café, the {i}th line.\nSecond line of doc {i}." for i in range(12)]
    with open(tmp_path / 'a.jsonl', 'w') as f:
        for d in docs[:6]:
            f.write(json.dumps({'text': d, 'id': 'x'}) + '\n')
    pd.DataFrame({'text': docs[6:9]}).to_parquet(tmp_path / 'b.parquet')
    (tmp_path / 'c.txt').write_text('\n\n'.join(d.replace('\n', ' ') for d in docs[9:]))  # .txt: paragraphs
    expect = docs[:9] + [d.replace('\n', ' ') for d in docs[9:]]
    files = ','.join(str(tmp_path / n) for n in ('a.jsonl', 'b.parquet', 'c.txt'))
    # two tokenizer processes (forked from this one): prepare.py's functions, as its command line calls them
    prepare.prepare_docs(prepare.open_local(files.split(',')), str(tmp_path / 'o1' / 'fineweb_edu'), 10_000_000, 2)
    meta, train, val = load(tmp_path / 'o1' / 'fineweb_edu')
    assert meta == {'vocab_size': 50257, 'kind': 'bpe', 'encoding': 'gpt2'}
    assert len(train) > 0 and len(val) > 0
    assert train[0] == EOT and val[0] == EOT  # eot before each document
    assert (train == EOT).sum() + (val == EOT).sum() == len(expect)
    _, decode = data.codec(meta)
    assert decode(val).split('<|endoftext|>')[1:] == expect[:1]  # doc 0 (every 200th) -> val
    assert decode(train).split('<|endoftext|>')[1:] == expect[1:]  # order kept across processes
    # the command line, with a token cap: the same stream, cut; a single process gives the same ids
    assert run_here('prepare.py', 'fineweb_edu', f'--files={files}', f'--data_dir={tmp_path / "o2"}',
                    '--num_proc=1', '--num_tokens=60') == 0
    _, train2, val2 = load(tmp_path / 'o2' / 'fineweb_edu')
    assert len(train2) + len(val2) == 60
    assert list(val2) == list(val) and list(train2) == list(train[:60 - len(val)])


def test_fineweb_file_without_text_column(tmp_path, run_here):
    (tmp_path / 'bad.jsonl').write_text(json.dumps({'content': 'hi'}) + '\n')
    with pytest.raises(common.UserError, match="no 'text' column"):
        run_here('prepare.py', 'fineweb_edu', f'--files={tmp_path / "bad.jsonl"}', f'--data_dir={tmp_path}')


# ---------------------------------------------------------------------------- errors and helpers

def one_line_error(r):
    assert r.returncode != 0 and r.stdout == ''
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), r.stderr
    return lines[0]


@pytest.mark.slow
def test_unknown_dataset_one_line_error():
    r = run_prepare('tinystories')  # a real process: what the user sees
    line = one_line_error(r)
    assert r.returncode == 1
    assert "unknown dataset 'tinystories'" in line and all(name in line for name in data.DATASETS)


def test_two_datasets_at_once_are_refused(tmp_path, run_here):
    """Only the last would be prepared: one line instead, nothing written."""
    assert error_of(run_here, 'shakespeare_char', 'shakespeare', f'--data_dir={tmp_path}') == \
        "one dataset at a time: got 'shakespeare_char' and 'shakespeare'; run once for each"
    assert os.listdir(tmp_path) == []


def error_of(run_here, *args):
    with pytest.raises(common.UserError) as e:
        run_here('prepare.py', *args)
    return str(e.value)


def test_missing_files_error(tmp_path, run_here):
    assert 'nope.jsonl' in error_of(run_here, 'fineweb_edu', f'--files={tmp_path / "nope.jsonl"}', f'--data_dir={tmp_path}')
    assert not (tmp_path / 'fineweb_edu').exists()
    line = error_of(run_here, 'shakespeare', f'--files={tmp_path / "x.txt"}', f'--data_dir={tmp_path}')
    assert '--files' in line and 'fineweb_edu' in line


def test_hub_unreachable_error(tmp_path, run_here, monkeypatch):
    # .invalid never resolves (RFC 2606), so this is "offline" on any machine, and fast
    for k in [k for k in os.environ if 'proxy' in k.lower() or k == 'HF_HUB_OFFLINE']:
        monkeypatch.delenv(k)
    monkeypatch.setenv('HF_ENDPOINT', 'https://hub.invalid')
    t0 = time.time()
    line = error_of(run_here, 'fineweb_edu', f'--data_dir={tmp_path}')
    assert time.time() - t0 < 60
    assert 'hub' in line and '--files' in line
    assert '(hub.invalid: ' in line  # found out by prepare.py's own look-up, before the hub client's retries


def test_dataset_dir_and_names(tmp_path):
    assert data.dataset_dir('shakespeare', str(tmp_path)) == str(tmp_path / 'shakespeare')
    assert data.dataset_dir('shakespeare_char') == os.path.join(ROOT, 'data', 'shakespeare_char')
    assert set(data.DATASETS) == {'shakespeare_char', 'shakespeare', 'fineweb_edu', 'arithmetic'}


def test_arithmetic_dispatch(tmp_path, run_here, monkeypatch):
    """prepare.py with a stand-in arithmetic module that records what it is asked to do."""
    calls = []
    fake = types.ModuleType('study.arithmetic')
    fake.prepare = lambda out_dir, **kw: calls.append([out_dir, kw])
    monkeypatch.setitem(sys.modules, 'study.arithmetic', fake)
    monkeypatch.setattr(study, 'arithmetic', fake)  # `from study import arithmetic` reads the package's attribute
    for args in (['arithmetic', f'--data_dir={tmp_path}', '--samples=123', '--seed=7', '--force=True'],
                 ['arithmetic', f'--data_dir={tmp_path}'],
                 ['arithmetic-2-3', f'--data_dir={tmp_path}', '--samples=50']):
        assert run_here('prepare.py', *args) == 0
    assert calls == [[str(tmp_path / 'arithmetic'), {'samples': 123, 'seed': 7, 'force': True, 'tiers': (4, 5, 6)}],
                     [str(tmp_path / 'arithmetic'), {'seed': 1337, 'force': False, 'tiers': (4, 5, 6)}],
                     [str(tmp_path / 'arithmetic-2-3'), {'samples': 50, 'seed': 1337, 'force': False, 'tiers': (2, 3)}]]


@pytest.mark.parametrize('name, tiers', [('arithmetic-2-3', (2, 3)), ('arithmetic-5', (5,)),
                                         ('arithmetic-3-3', None), ('arithmetic-0-2', None),
                                         ('arithmetic-', None), ('arithmetic2', None), ('shakespeare', None)])
def test_arithmetic_tiers_from_name(name, tiers):
    assert data.arithmetic_tiers(name) == tiers


def test_arithmetic_tiers_prepared_and_too_many_samples(tmp_path, run_here):
    assert run_here('prepare.py', 'arithmetic-2-3', f'--data_dir={tmp_path}', '--samples=50') == 0
    with open(tmp_path / 'arithmetic-2-3' / 'info.json') as f:
        assert json.load(f)['tiers'] == [2, 3]
    # a tier has only so many distinct expressions (tier 2 about 10k; tier 1, cheaper to exhaust, a few
    # hundred): asking for more is a UserError (one line) naming --samples, not a traceback or an endless loop
    with pytest.raises(common.UserError, match=r"could not find 1000 distinct 1-operator expressions.*--samples"):
        arithmetic.generate(1000, 1, random.Random(0))


def test_config_errors(tmp_path, run_here):
    line = error_of(run_here, 'shakespeare', '--num_tokenz=5')
    assert "unknown config key 'num_tokenz'" in line and "did you mean 'num_tokens'?" in line
    line = error_of(run_here, 'fineweb_edu', '--num_tokens=many')
    assert 'num_tokens' in line and 'expected int' in line


def test_imports_point_one_way():
    """model.py imports nothing of the repository: it stands alone. relatives/ extends it (imports model.py only).
    The scripts use nanolime/'s common.py, checkpoint.py, data.py and variants.py; common.py imports none of the
    repository's modules, checkpoint.py and data.py only common.py (checkpoint.py the model's files too, to build
    the model), variants.py common.py and the relatives' registry (the components it names), the scripts'
    libraries only those (study/representations.py: the model's files;
    nanolime/sweep_*.py: one another; sweep_stats.py nothing), and no module of the repository imports itself back
    through others."""
    graph = {}
    for folder in ('', 'nanolime', 'study', 'integrations', 'relatives'):
        for name in os.listdir(os.path.join(ROOT, folder)):
            if name.endswith('.py') and (name != '__init__.py' or folder == 'relatives'):  # relatives: a package
                with open(os.path.join(ROOT, folder, name)) as f:
                    tree = ast.parse(f.read())
                deps = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
                deps |= {m for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)  # a module or, from a package,
                         for module in ['.'.join(filter(None, ('relatives' if n.level else '', n.module)))]  # its own
                         for m in (module, *(f'{module}.{a.name}' for a in n.names))}  # (relative: in relatives/)
                graph['.'.join(filter(None, (folder, name[:-3] if name != '__init__.py' else '')))] = deps
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    package = {m for m in graph if m.startswith('relatives.')}  # each relative's file, the plumbing it builds on
    assert graph['model'] == set() and graph['relatives'] - package == {'model'} and graph['nanolime.common'] == set()
    assert package and all(graph[m] <= package | {'model'} for m in package)
    assert graph['nanolime.checkpoint'] <= {'nanolime.common', 'model', 'relatives'}
    assert graph['nanolime.data'] == {'nanolime.common'}
    assert graph['nanolime.variants'] == {'nanolime.common', 'relatives', 'relatives.base'}
    assert graph['study.representations'] <= {'model', 'relatives'} and graph['nanolime.sweep_stats'] == set()
    sweep = {m for m in graph if m.startswith('nanolime.sweep_') and m != 'nanolime.sweep_runs'}  # the report's
    assert len(sweep) == 5 and all(graph[m] <= sweep for m in sweep)

    def reaches(start, target, seen=()):
        return any(d == target or (d not in seen and reaches(d, target, (*seen, d))) for d in graph[start])
    assert not [m for m in graph if reaches(m, m)]


def test_a_full_disk_leaves_no_part_of_a_file(tmp_path, monkeypatch):
    """A write that fails (a full disk: found at the latest when the file is synced) is one line, and each file is
    the old one or none, never part of the new one; meta.pkl, written last, is gone: the data reads as not prepared."""
    out = str(tmp_path / 'd')
    prepare.prepare_char('abcdefgh' * 100, out)
    before = open(os.path.join(out, 'train.bin'), 'rb').read()

    def full(fd):
        raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(os, 'fsync', full)
    with pytest.raises(common.UserError) as e:
        prepare.prepare_char('hgfedcbaxyz' * 300, out)
    assert str(e.value) == (f"cannot write {out}/train.bin: no space left on device; the file there, if any, is "
                            "unchanged: free some space (or fix the permissions), then run again")
    assert open(os.path.join(out, 'train.bin'), 'rb').read() == before
    assert sorted(os.listdir(out)) == ['train.bin', 'val.bin'] and not prepare.is_prepared(out)
