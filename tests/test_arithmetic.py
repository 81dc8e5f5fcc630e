"""Tests for the Arithmetic Expression Task (study/arithmetic.py); its evaluation's errors leave an earlier result as it
was.

The step checker here is independent of the generator: it parses both sides
with Python's own parser (ast) and evaluates with fractions.Fraction.
"""
import ast
import contextlib
import os
import pickle
import random
import re
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from study import arithmetic as A  # noqa: E402
from nanolime import checkpoint  # noqa: E402
from nanolime import common  # noqa: E402
from nanolime import data  # noqa: E402
import model  # noqa: E402
from nanolime.common import UserError  # noqa: E402
from conftest import Terminal, run_script  # noqa: E402

PAPER = '(7+5)/(6+4*3-2*7)=12/(6+4*3-2*7)=12/(6+12-2*7)=12/(18-2*7)=12/(18-14)=12/4=3'
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


def parse(s):
    node = ast.parse(s, mode='eval').body
    return node


def frac_eval(node, record=None):
    """Exact value of an ast expression; `record` collects every node's value."""
    if isinstance(node, ast.Constant):
        v = Fraction(node.value)
    elif isinstance(node, ast.BinOp):
        v = _BINOPS[type(node.op)](frac_eval(node.left, record), frac_eval(node.right, record))
    else:
        raise AssertionError(f'unexpected node {ast.dump(node)}')
    if record is not None:
        record.append(v)
    return v


def leaf_ops(node, out=None):
    """BinOp nodes whose two children are numbers (the reducible operations)."""
    out = [] if out is None else out
    if isinstance(node, ast.BinOp):
        if isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant):
            out.append(node)
        leaf_ops(node.left, out)
        leaf_ops(node.right, out)
    return out


def replace(node, target, value):
    if node is target:
        return ast.Constant(value)
    if isinstance(node, ast.BinOp):
        return ast.BinOp(replace(node.left, target, value), node.op, replace(node.right, target, value))
    return node


def check_step(prev, nxt):
    """nxt must be prev with exactly one operation (the leftmost reducible one)
    evaluated; returns the value it produced."""
    p, n = parse(prev), parse(nxt)
    want = ast.dump(n)
    cands = leaf_ops(p)
    assert cands, prev
    matches = []
    for c in cands:
        v = frac_eval(c)
        if v.denominator == 1 and ast.dump(replace(p, c, int(v))) == want:
            matches.append(c)
    assert len(matches) == 1, (prev, nxt)
    leftmost = min(cands, key=lambda c: c.col_offset)
    assert matches[0] is leftmost, f'{prev} -> {nxt}: not the leftmost ready operation'
    return frac_eval(matches[0])


def paren_pairs(s):
    stack, pairs = [], []
    for i, ch in enumerate(s):
        if ch == '(':
            stack.append(i)
        elif ch == ')':
            pairs.append((stack.pop(), i))
    assert not stack
    return pairs


def check_line(line, n_ops):
    assert re.fullmatch(r'[0-9()+\-*/=]+', line), line
    parts = line.split('=')
    assert len(parts) == n_ops + 1, line           # one step per operator
    expr = parts[0]
    assert sum(expr.count(c) for c in '+-*/') == n_ops
    nums = [int(x) for x in re.findall(r'\d+', expr)]
    assert len(nums) == n_ops + 1 and all(1 <= x <= A.MAX_LEAF for x in nums)
    values = []
    exact = frac_eval(parse(expr), values)
    assert all(v.denominator == 1 and 0 <= v <= A.BOUND for v in values), line
    for prev, nxt in zip(parts[:-1], parts[1:]):
        v = check_step(prev, nxt)
        assert v.denominator == 1 and 0 <= v <= A.BOUND
        assert not re.search(r'\(\d+\)', nxt), f'parentheses around a number: {nxt}'
        for i, j in paren_pairs(nxt):  # every remaining pair is necessary
            stripped = nxt[:i] + nxt[i + 1:j] + nxt[j + 1:]
            assert ast.dump(parse(stripped)) != ast.dump(parse(nxt)), f'redundant parens in {nxt}'
        for x in re.findall(r'\d+', nxt):
            assert 0 <= int(x) <= A.BOUND and (x == '0' or x[0] != '0')
    assert re.fullmatch(r'\d+', parts[-1])
    assert Fraction(int(parts[-1])) == exact, line
    return exact


def test_paper_example():
    expr = PAPER.split('=')[0]
    assert '='.join(A.solve(expr)) == PAPER
    check_line(PAPER, 6)  # the independent checker agrees with the paper too


def test_checker_rejects_wrong_order_and_wrong_value():
    # the paper does 6+12 before 2*7; the "all */ first" order must be rejected
    with pytest.raises(AssertionError):
        check_step('12/(6+12-2*7)', '12/(6+12-14)')
    with pytest.raises(AssertionError):
        check_step('2+3*4', '2+13')
    with pytest.raises(AssertionError):
        check_step('2+3*4', '14')  # two operations at once


def test_generator_invariants():
    rng = random.Random(1234)
    seen = set()
    for n_ops in A.TIERS:
        lines = A.generate(700, n_ops, rng, seen)
        assert len(lines) == 700
        for line in lines:
            check_line(line, n_ops)
    assert len(seen) == 700 * len(A.TIERS)
    ops = ''.join(seen)
    counts = {op: ops.count(op) for op in '+-*/'}
    assert min(counts.values()) > 0.15 * sum(counts.values()), counts  # all operators used
    assert '(' in ops


def test_reduction_rules():
    with pytest.raises(ValueError):
        A.solve('2-3+4')  # negative intermediate
    with pytest.raises(ValueError):
        A.solve('7/2')  # inexact division
    with pytest.raises(ValueError):
        A.solve('9/(3-3)')
    with pytest.raises(ValueError):
        A.solve('999+1')  # outside the bound
    assert A.solve('8-3-2') == ['8-3-2', '5-2', '3']
    assert A.solve('8-(3-2)') == ['8-(3-2)', '8-1', '7']
    assert A.solve('8/2*3') == ['8/2*3', '4*3', '12']
    assert A.solve('2*3+4*5') == ['2*3+4*5', '6+4*5', '6+20', '26']
    assert A.solve('(2+3)*(4-1)') == ['(2+3)*(4-1)', '5*(4-1)', '5*3', '15']


def test_score():
    assert A.score('1+2*3=1+6=7', 7)
    assert A.score('1+6=7\n', '7')
    assert not A.score('1+2*3=1+6=8', 7)
    assert not A.score('1+2*3=1+6=', 7)
    assert not A.score('1+2*3=1+6=07', 7)
    assert not A.score('1+2*3=1+6=7+0', 7)
    assert not A.score('', 0)
    assert A.score('0', 0)


def test_prepare_small(tmp_path):
    d1, d2 = tmp_path / 'a', tmp_path / 'b'
    A.prepare(str(d1), samples=200, seed=7, n_val=30, n_test=40)
    A.prepare(str(d2), samples=200, seed=7, n_val=30, n_test=40)
    for f in ['train.bin', 'val.bin', 'meta.pkl', 'train.txt', 'val.txt', 'test.txt',
              'test_4.txt', 'test_5.txt', 'test_6.txt', 'val_6.txt']:
        assert (d1 / f).read_bytes() == (d2 / f).read_bytes(), f  # deterministic
    meta = pickle.load(open(d1 / 'meta.pkl', 'rb'))
    assert meta['kind'] == 'char' and meta['vocab_size'] == 18
    assert ''.join(meta['itos'][i] for i in range(18)) == '\n()*+-/0123456789='
    for split in ('train', 'val'):
        ids = np.fromfile(d1 / f'{split}.bin', dtype=np.uint16)
        text = (d1 / f'{split}.txt').read_text()
        assert ''.join(meta['itos'][int(i)] for i in ids) == text and text.endswith('\n')
    exprs = {}
    for split in ('train', 'val', 'test'):
        lines = (d1 / f'{split}.txt').read_text().splitlines()
        assert len(lines) == {'train': 200, 'val': 30, 'test': 40}[split] * 3
        exprs[split] = {l.split('=')[0] for l in lines}
        assert len(exprs[split]) == len(lines)
    assert not exprs['train'] & exprs['val'] and not exprs['train'] & exprs['test']
    assert not exprs['val'] & exprs['test']
    for n in A.TIERS:
        for l in (d1 / f'test_{n}.txt').read_text().splitlines():
            assert A.count_ops(l.split('=')[0]) == n
    # the held-out sets do not depend on the number of training samples
    d3 = tmp_path / 'c'
    A.prepare(str(d3), samples=50, seed=7, n_val=30, n_test=40)
    assert (d3 / 'test.txt').read_bytes() == (d1 / 'test.txt').read_bytes()
    # no regeneration without force
    before = (d3 / 'train.bin').stat().st_mtime_ns
    A.prepare(str(d3), samples=60, seed=7, n_val=30, n_test=40)
    assert (d3 / 'train.bin').stat().st_mtime_ns == before


class _Cfg:
    block_size = 128


class OracleModel:
    """Stands in for a GPT: 'generates' the reference solution (or a wrong one)."""

    def __init__(self, lines, stoi, itos, wrong_tier=None):
        self.config = _Cfg()
        self.stoi, self.itos = stoi, itos
        self.ref = {l.split('=', 1)[0]: l.split('=', 1)[1] for l in lines}
        self.wrong_tier = wrong_tier

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, stop_token=None):
        import torch
        assert top_k == 1 and stop_token == self.stoi['\n']  # greedy, stopping at the end of the line
        rows = []
        for row in idx.tolist():
            prompt = ''.join(self.itos[i] for i in row)
            assert prompt.startswith('\n') and prompt.endswith('=')
            expr = prompt[1:-1]
            cont = self.ref[expr] + '\n'
            if A.count_ops(expr) == self.wrong_tier:
                cont = cont[:-1] + '1\n'  # append a digit to the result: wrong
            cont = (cont + '0' * max_new_tokens)[:max_new_tokens]
            rows.append(row + [self.stoi[c] for c in cont])
        return torch.tensor(rows)


def test_evaluate_with_oracle(capsys):
    """Scored against the lines, a progress bar on a terminal (none elsewhere: in a sweep's run log, say)."""
    meta = A._meta()
    encode, decode = data.codec(meta)
    rng = random.Random(3)
    lines = [l for n in A.TIERS for l in A.generate(15, n, rng)]
    with contextlib.redirect_stderr(Terminal()) as terminal:
        res = A.evaluate(OracleModel(lines, meta['stoi'], meta['itos']), lines, encode, decode, batch_size=4)
    assert res['accuracy'] == 1.0 and res['n'] == 45
    assert 'scoring: 100%' in terminal.getvalue() and '45/45' in terminal.getvalue()
    assert all(t['accuracy'] == 1.0 and t['exact_chain'] == 1.0 and t['n'] == 15
               for t in res['per_tier'].values())
    res = A.evaluate(OracleModel(lines, meta['stoi'], meta['itos'], wrong_tier=5), lines, encode, decode,
                     batch_size=4)
    assert res['per_tier']['5']['accuracy'] == 0.0 and res['per_tier']['6']['accuracy'] == 1.0
    assert abs(res['accuracy'] - 2 / 3) < 1e-9
    assert capsys.readouterr().err == ''  # not a terminal: no bar


def run_arithmetic(*args):
    """`python -m study.arithmetic <args>` as a user runs it from another directory: the repository on PYTHONPATH."""
    return subprocess.run([sys.executable, '-m', 'study.arithmetic', *args], cwd='/', capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT))


def tiny_run(out, data_dir, meta=True):
    """A tiny LIMe checkpoint of the AET's vocabulary in `out`, as train.py saves it."""
    import torch
    from model import GPT, GPTConfig
    args = dict(block_size=128, vocab_size=18, n_layer=2, n_head=2, n_kv_head=1, n_embd=16, lime=True)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**args))
    sd = {'_orig_mod.' + k: v for k, v in model.state_dict().items()}  # as saved from torch.compile
    out.mkdir()
    ckpt = {'nanolime': 1, 'model_args': args, 'model': sd, 'iter_num': 0,
            'config': {'dataset': os.path.basename(data_dir), 'data_dir': os.path.dirname(data_dir)}}
    if meta:
        ckpt['meta'] = A._meta()
    torch.save(ckpt, out / 'ckpt.pt')
    return out


@pytest.mark.slow
def test_cli_end_to_end_tiny_checkpoint(tmp_path, run_here, capsys):
    import json
    data = tmp_path / 'data' / 'arith_tiny'
    A.prepare(str(data), samples=20, seed=1, n_val=5, n_test=6)
    out = tiny_run(tmp_path / 'out', str(data))
    r = run_arithmetic(f'--out_dir={out}', '--max_examples=3', '--batch_size=2')  # the data dir from the ckpt
    assert r.returncode == 0, r.stderr
    saved = json.load(open(out / 'arith_eval_test.json'))
    assert saved['n'] == 9 and sorted(saved['per_tier']) == ['4', '5', '6']
    assert all(t['n'] == 3 and 0 <= t['accuracy'] <= 1 for t in saved['per_tier'].values())
    assert f"overall accuracy {saved['accuracy']:.4f} on 9 examples" in r.stdout and saved['lime'] is True
    assert saved['data_dir'] == str(data)
    # --data_dir points elsewhere, --split=val; a checkpoint without its vocabulary uses the dataset's
    other = tmp_path / 'other'
    A.prepare(str(other), samples=20, seed=2, n_val=4, n_test=6)
    out = tiny_run(tmp_path / 'out-old', str(data), meta=False)
    assert run_here('study/arithmetic.py', f'--out_dir={out}', f'--data_dir={other}',  # here: cheaper
                    '--split=val') == 0
    saved = json.load(open(out / 'arith_eval_val.json'))
    assert saved['n'] == 12 and saved['data_dir'] == str(other)


def test_cli_errors(tmp_path, run_here):
    """study/arithmetic.py's UserErrors (one 'error:' line each for the user: common.excepthook, tested elsewhere)."""
    def error_of(*args):
        with pytest.raises(common.UserError) as e:
            run_here('study/arithmetic.py', *args)
        return str(e.value)
    data = tmp_path / 'data' / 'arith_tiny'
    out = tiny_run(tmp_path / 'out', str(data))
    line = error_of(f'--out_dir={out}')  # dataset not prepared
    assert str(data / 'test.txt') in line and 'python prepare.py arithmetic' in line
    line = error_of(f'--out_dir={out}', '--split=train')
    assert "split='train'" in line and "'test' or 'val'" in line
    line = error_of('--max_exmaples=3')
    assert "unknown config key 'max_exmaples'" in line and "did you mean 'max_examples'?" in line


def test_evaluate_counts_unfinished_generation_as_wrong():
    # the block ends exactly after the correct result, before the newline: the number
    # might have been cut (12 of 123), so it does not count
    meta = A._meta()
    line = A.generate(1, 4, random.Random(5))[0]
    expr, rest = line.split('=', 1)
    model = OracleModel([line], meta['stoi'], meta['itos'])
    full = len('\n' + expr + '=') + len(rest)
    encode, decode = data.codec(meta)
    res = A.evaluate(model, [line], encode, decode, block_size=full)
    assert res['accuracy'] == 0.0 and res['failures'][0]['finished'] is False
    res = A.evaluate(model, [line], encode, decode, block_size=full + 1)
    assert res['accuracy'] == 1.0


def test_a_result_is_never_replaced_by_the_score_of_nothing(tmp_path):
    data = tmp_path / 'arithmetic'
    A.prepare(str(data), samples=20, seed=1, n_val=5, n_test=6)
    out = tmp_path / 'out'
    out.mkdir()
    args = dict(block_size=64, vocab_size=len(A.CHARS), n_layer=1, n_head=2, n_embd=16)
    checkpoint.atomic_save({'nanolime': 1, 'model': model.GPT(model.GPTConfig(**args)).state_dict(), 'model_args': args,
                        'iter_num': 0, 'meta': A._meta(),
                        'config': {'dataset': 'arithmetic', 'data_dir': str(tmp_path)}}, str(out / 'ckpt.pt'))
    (out / 'arith_eval_test.json').write_text('an earlier result')
    with pytest.raises(UserError, match=r'max_examples=-1 must be >= 0 \(0: all\)'):
        run_script('study/arithmetic.py', f'--out_dir={out}', '--max_examples=-1')
    (data / 'test.txt').write_text('')
    with pytest.raises(UserError) as e:
        run_script('study/arithmetic.py', f'--out_dir={out}')
    assert str(e.value) == (f"{data}/test.txt has no examples; rebuild it: python prepare.py arithmetic --force "
                            f"--data_dir={tmp_path} --samples=20 --seed=1")
    assert (out / 'arith_eval_test.json').read_text() == 'an earlier result'
