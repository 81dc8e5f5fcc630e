"""
Arithmetic Expression Task (AET) -- paper Sec. 5.3.2 and App. B
(after Arefin et al. 2024 / Feng et al. 2023): data generator, dataset
writer and greedy-decoding evaluator.

One example per line, characters ``0-9+-*/()=`` only, no spaces:

    (7+5)/(6+4*3-2*7)=12/(6+4*3-2*7)=12/(6+12-2*7)=12/(18-2*7)=12/(18-14)=12/4=3

i.e. ``expression=step=...=result``. Decisions (also in the README):

* **Tier = number of operators.** The paper's App. B example, which we take
  as an instance of the hardest (6) tier, has 7 numbers and 6 operators, so
  "N operands" is read as N binary operations: tier N has N operators and
  N+1 numbers, and its solution has exactly N steps.
* **Values.** Numbers written in the expression (leaves) are integers in
  [1, MAX_LEAF] = [1, 9] (single digits, as in the paper's example). Every
  intermediate value, and the result, is an exact non-negative integer in
  [0, BOUND] = [0, 999] (at most three digits), so no unary minus is ever
  needed. Division appears only when it is exact, and the generator never
  divides by 0 or by 1 (a third of all divisions were trivial ``x/1``).
* **One operation per step, standard precedence.** Each step evaluates the
  *leftmost operation whose two operands are both plain numbers and bind to
  it* under the usual rules (parentheses first, ``* /`` bind tighter than
  ``+ -``, left-associative). Equivalently: the leftmost node of the parse
  tree whose two children are numbers. This reproduces the paper's example
  step for step (note it does ``6+12`` before ``2*7``: ``* /`` precede
  ``+ -`` only where they compete for the same operand). When a
  parenthesised group becomes a single number its parentheses are dropped in
  the same step.
* Expressions are rendered with the minimal parentheses that preserve the
  generated tree (left operand parenthesised iff its operator binds more
  loosely; right operand iff it binds more loosely or equally), so the
  string's own parse is exactly the generated tree.

Usage
    python prepare.py arithmetic [--samples=50000]          # writes data/arithmetic
    python -m study.arithmetic --out_dir=out-arithmetic [--split=test] [--max_examples=N]
                               [--device=cpu] [--batch_size=256] [--data_dir=...]
"""

import json
import os
import pickle
import random
import re
import time

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from nanolime.common import UserError, configure, resolve_device
from nanolime.checkpoint import atomic_write, load_model, writable_dir
from nanolime.data import ARITHMETIC_TIERS, DATA_DIR, arithmetic_tiers, dataset_dir, load_codec, prepare_hint
import numpy as np
import torch
from tqdm import tqdm

# config of the evaluator (python -m study.arithmetic --key=value); generation and prepare() take arguments
out_dir = 'out-arithmetic'  # the run to evaluate: <out_dir>/ckpt.pt
split = 'test'              # 'test' or 'val': reads <data_dir>/<split>.txt
data_dir = ''               # the dataset's folder; '' = <ckpt config data_dir or data/>/<ckpt config dataset>
max_examples = 0            # per tier; 0 = all
batch_size = 256
device = 'cpu'
seed = 1337

MAX_LEAF = 9        # leaves are integers in [1, MAX_LEAF]
BOUND = 999         # every intermediate value is an integer in [0, BOUND]
TIERS = ARITHMETIC_TIERS  # number of operators per expression: (4, 5, 6), the paper's
N_VAL = 1000        # per tier
N_TEST = 1000       # per tier

OPS = '+-*/'
PREC = {'+': 1, '-': 1, '*': 2, '/': 2}
CHARS = '\n()*+-/0123456789='
_TOKEN_RE = re.compile(r'\d+|[()+\-*/]')
_ALLOWED_LINE_RE = re.compile(r'^[0-9()+\-*/=]+$')

# --------------------------------------------------------------------------
# generation


def _gen(rng, n_ops, max_leaf, bound):
    """Random expression tree with n_ops binary operators.

    Returns (node, value); a node is an int (leaf) or a tuple (op, left, right).
    Every node's value is an integer in [0, bound] (exact division only, never
    by 0 or 1). The operator is drawn uniformly, then operands are redrawn
    until they fit it (for '/' the divisor is drawn first and the dividend
    redrawn), so all four operators are about equally frequent.
    """
    rand = rng.random
    if n_ops == 0:
        v = 1 + int(rand() * max_leaf)
        return v, v
    while True:
        op = OPS[int(rand() * 4)]
        n_left = int(rand() * n_ops)
        n_right = n_ops - 1 - n_left
        for _ in range(8):
            R, rv = _gen(rng, n_right, max_leaf, bound)
            if op == '/' and rv <= 1:
                continue
            for _ in range(8 if op == '/' else 1):
                L, lv = _gen(rng, n_left, max_leaf, bound)
                if op == '+':
                    v = lv + rv
                elif op == '-':
                    if lv < rv:  # keep it non-negative: swap the operands
                        return ('-', R, L), rv - lv
                    v = lv - rv
                elif op == '*':
                    v = lv * rv
                elif lv % rv:
                    continue
                else:
                    v = lv // rv
                if v <= bound:
                    return (op, L, R), v


def render(node):
    """Tree -> string with the minimal parentheses that keep the tree."""
    if isinstance(node, int):
        return str(node)
    op, L, R = node
    ls, rs = render(L), render(R)
    if not isinstance(L, int) and PREC[L[0]] < PREC[op]:
        ls = '(' + ls + ')'
    if not isinstance(R, int) and PREC[R[0]] <= PREC[op]:
        rs = '(' + rs + ')'
    return ls + op + rs


def tokenize(expr):
    toks = _TOKEN_RE.findall(expr)
    if ''.join(toks) != expr:
        raise ValueError(f'bad characters in expression {expr!r}')
    return [int(t) if t.isdigit() else t for t in toks]


def _apply(op, a, b, bound):
    if op == '+':
        v = a + b
    elif op == '-':
        v = a - b
    elif op == '*':
        v = a * b
    else:
        if b == 0 or a % b:
            raise ValueError(f'inexact division {a}/{b}')
        v = a // b
    if not 0 <= v <= bound:
        raise ValueError(f'intermediate value {v} outside [0, {bound}]')
    return v


def reduce_once(toks, bound=BOUND):
    """Evaluate the leftmost ready operation of a token list (see module doc)."""
    n = len(toks)
    for i in range(1, n - 1):
        op = toks[i]
        if not (isinstance(op, str) and op in PREC):
            continue
        if not (isinstance(toks[i - 1], int) and isinstance(toks[i + 1], int)):
            continue
        left = toks[i - 2] if i >= 2 else None
        right = toks[i + 2] if i + 2 < n else None
        if isinstance(left, str) and left in PREC and PREC[left] >= PREC[op]:
            continue  # the left operand belongs to the operator before (left assoc.)
        if isinstance(right, str) and right in PREC and PREC[right] > PREC[op]:
            continue  # the right operand binds tighter to the operator after
        v = _apply(op, toks[i - 1], toks[i + 1], bound)
        new = toks[:i - 1] + [v] + toks[i + 2:]
        j = i - 1
        if 0 < j < len(new) - 1 and new[j - 1] == '(' and new[j + 1] == ')':
            new = new[:j - 1] + [v] + new[j + 2:]  # drop the group's parentheses
        return new
    raise ValueError(f'no reducible operation in {toks!r}')


def detok(toks):
    return ''.join(str(t) for t in toks)


def solve(expr, bound=BOUND):
    """Return the chain [expr, step1, ..., result] (strings)."""
    toks = tokenize(expr)
    chain = [expr]
    while len(toks) > 1:
        toks = reduce_once(toks, bound)
        chain.append(detok(toks))
    if not isinstance(toks[0], int):
        raise ValueError(f'malformed expression {expr!r}')
    return chain


def make_example(rng, n_ops, max_leaf=MAX_LEAF, bound=BOUND):
    """One random example: (expression, full line without newline, result)."""
    node, value = _gen(rng, n_ops, max_leaf, bound)
    expr = render(node)
    chain = solve(expr, bound)
    assert int(chain[-1]) == value and len(chain) == n_ops + 1
    return expr, '='.join(chain), value


def count_ops(expr):
    return sum(expr.count(c) for c in OPS)


def generate(n, n_ops, rng, exclude=None, max_leaf=MAX_LEAF, bound=BOUND):
    """n distinct examples (lines) of a tier, avoiding expressions in `exclude`
    (a set of expressions, updated in place)."""
    exclude = set() if exclude is None else exclude
    lines = []
    tries = 0
    while len(lines) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise UserError(f'could not find {n} distinct {n_ops}-operator expressions besides the held-out '
                            f'ones: ask for fewer with --samples')
        expr, line, _ = make_example(rng, n_ops, max_leaf, bound)
        if expr in exclude:
            continue
        exclude.add(expr)
        lines.append(line)
    return lines


# --------------------------------------------------------------------------
# dataset


def _meta():
    stoi = {ch: i for i, ch in enumerate(CHARS)}
    itos = {i: ch for i, ch in enumerate(CHARS)}
    return {'vocab_size': len(CHARS), 'kind': 'char', 'stoi': stoi, 'itos': itos}


def _encode_lines(lines, stoi):
    text = ''.join(line + '\n' for line in lines)
    lut = np.zeros(128, dtype=np.uint16)
    for ch, i in stoi.items():
        lut[ord(ch)] = i
    return lut[np.frombuffer(text.encode('ascii'), dtype=np.uint8)]


def _write_lines(path, lines):
    with open(path, 'w') as f:
        f.write(''.join(line + '\n' for line in lines))


def prepare(out_dir, samples=50000, seed=1337, force=False, tiers=TIERS,
            n_val=N_VAL, n_test=N_TEST, max_leaf=MAX_LEAF, bound=BOUND):
    """Write the AET dataset into out_dir.

    train: `samples` examples per tier; val/test: n_val/n_test per tier, all
    expressions distinct across (and within) splits. Files: train.bin,
    val.bin (uint16 char ids, lines newline-terminated, tiers shuffled),
    meta.pkl, train.txt, val.txt, test.txt, {val,test}_<tier>.txt, info.json.
    val/test do not depend on `samples`.
    """
    os.makedirs(out_dir, exist_ok=True)
    needed = ['train.bin', 'val.bin', 'meta.pkl', 'test.txt']
    if not force and all(os.path.exists(os.path.join(out_dir, f)) for f in needed):
        print(f'{out_dir}: AET data already present (use --force=True to regenerate)')
        return
    if os.path.exists(os.path.join(out_dir, 'meta.pkl')):  # redoing: until the end, the old data is not prepared
        os.remove(os.path.join(out_dir, 'meta.pkl'))
    t0 = time.time()
    seen = set()
    rng_eval = random.Random(seed)
    rng_train = random.Random(seed + 1)
    splits = {'test': {}, 'val': {}, 'train': {}}
    for n_ops in tiers:  # held-out sets first, so they do not depend on `samples`
        splits['test'][n_ops] = generate(n_test, n_ops, rng_eval, seen, max_leaf, bound)
        splits['val'][n_ops] = generate(n_val, n_ops, rng_eval, seen, max_leaf, bound)
    for n_ops in tiers:
        splits['train'][n_ops] = generate(samples, n_ops, rng_train, seen, max_leaf, bound)
    meta = _meta()
    info = {'seed': seed, 'tiers': list(tiers), 'tier_counts': 'operators (tier N: N+1 numbers)',
            'max_leaf': max_leaf, 'bound': bound, 'max_line_len': 0, 'sizes': {}}
    for split, per_tier in splits.items():
        lines = [line for n_ops in tiers for line in per_tier[n_ops]]
        if split != 'test':
            random.Random(seed + 2).shuffle(lines)
        _write_lines(os.path.join(out_dir, f'{split}.txt'), lines)
        if split != 'train':
            for n_ops in tiers:
                _write_lines(os.path.join(out_dir, f'{split}_{n_ops}.txt'), per_tier[n_ops])
        if split != 'test':
            ids = _encode_lines(lines, meta['stoi'])
            ids.tofile(os.path.join(out_dir, f'{split}.bin'))
            info['sizes'][split + '_tokens'] = int(len(ids))
        info['sizes'][split + '_lines'] = len(lines)
        info['max_line_len'] = max(info['max_line_len'], max(len(line) for line in lines))
    with open(os.path.join(out_dir, 'meta.pkl'), 'wb') as f:
        pickle.dump(meta, f)
    with open(os.path.join(out_dir, 'info.json'), 'w') as f:
        json.dump(info, f, indent=1)
    print(f'{out_dir}: AET tiers {list(tiers)} (operators), train {samples}/tier, '
          f'val {n_val}/tier, test {n_test}/tier; train {info["sizes"]["train_tokens"]:,} tokens, '
          f'longest line {info["max_line_len"]} chars (+1 newline); {time.time() - t0:.1f}s')


# --------------------------------------------------------------------------
# evaluation


def score(prediction_line, expected_result):
    """True iff the text after the last '=' of a generated line is exactly the
    expected integer (no sign, no extra characters; leading zeros rejected)."""
    final = prediction_line.strip().rsplit('=', 1)[-1]
    if not final.isdigit() or (len(final) > 1 and final[0] == '0'):
        return False
    return int(final) == int(expected_result)


def _valid_chain(line, bound=BOUND):
    """Fraction of the generated steps that are the correct next reduction."""
    parts = line.split('=')
    ok = 0
    for a, b in zip(parts[:-1], parts[1:]):
        try:
            if detok(reduce_once(tokenize(a), bound)) == b:
                ok += 1
        except ValueError:
            pass
    return ok, len(parts) - 1


def evaluate(model, lines, encode, decode, device='cpu', batch_size=256, block_size=None, bound=BOUND):
    """Greedy-decode `lines` (full reference lines) with the model's tokenizer (encode, decode), a
    progress bar on a terminal. Returns a results dict with accuracy per tier (= number of operators)
    and overall."""
    block_size = block_size or model.config.block_size
    items = []
    for line in lines:
        expr, rest = line.split('=', 1)
        target = int(line.rsplit('=', 1)[1])
        prompt = '\n' + expr + '='  # training lines are always preceded by '\n'
        items.append((prompt, expr, target, line))
    by_len = {}
    for k, it in enumerate(items):
        by_len.setdefault(len(it[0]), []).append(k)
    preds = [None] * len(items)
    newline = encode('\n')[0]  # a line ends there: decoding stops once every row of a batch has one
    bar = tqdm(total=len(items), desc='scoring', unit='expr', disable=None)  # None: on a terminal only
    for plen, ks in sorted(by_len.items()):
        max_new = block_size - plen
        for b in range(0, len(ks), batch_size):
            chunk = ks[b:b + batch_size]
            idx = torch.tensor([encode(items[k][0]) for k in chunk], dtype=torch.long, device=device)
            out = model.generate(idx, max_new, top_k=1, stop_token=newline).tolist()  # greedy
            for k, row in zip(chunk, out):
                preds[k] = decode(row[plen:])  # may lack the newline if cut at block_size
            bar.update(len(chunk))
    bar.close()
    per_tier = {}
    examples = []
    for (prompt, expr, target, ref), gen in zip(items, preds):
        n_ops = count_ops(expr)
        finished = '\n' in gen
        gen_line = expr + '=' + gen.split('\n', 1)[0]
        ok = finished and score(gen_line, target)
        steps_ok, steps = _valid_chain(gen_line, bound)
        t = per_tier.setdefault(n_ops, {'n': 0, 'correct': 0, 'exact_chain': 0,
                                        'steps_ok': 0, 'steps': 0, 'results': {}})
        t['results'][target] = t['results'].get(target, 0) + 1
        t['n'] += 1
        t['correct'] += int(ok)
        t['exact_chain'] += int(finished and gen_line == ref)
        t['steps_ok'] += steps_ok
        t['steps'] += steps
        if not ok and len(examples) < 20:
            examples.append({'reference': ref, 'generated': gen_line, 'finished': finished})
    res = {'per_tier': {}, 'n': len(items)}
    for n_ops in sorted(per_tier):
        t = per_tier[n_ops]
        res['per_tier'][str(n_ops)] = {
            'n': t['n'], 'accuracy': t['correct'] / t['n'],
            'exact_chain': t['exact_chain'] / t['n'],
            'step_accuracy': t['steps_ok'] / max(1, t['steps']),
            # accuracy of always answering the tier's most frequent result (0 and 1 are common)
            'majority_answer': max(t['results'].values()) / t['n']}
    res['accuracy'] = sum(t['correct'] for t in per_tier.values()) / max(1, len(items))
    res['failures'] = examples
    return res


def make_hint(folder, force=False):
    """The prepare.py command that makes the arithmetic dataset in `folder` (again), when its name says which."""
    name, root = os.path.basename(os.path.normpath(folder)), os.path.dirname(os.path.normpath(folder))
    if arithmetic_tiers(name):
        return prepare_hint(name, '' if root == DATA_DIR else root, force)
    return (f"{folder} is not named as prepare.py names arithmetic datasets (arithmetic, arithmetic-<tiers>): point "
            "--data_dir at the folder of the arithmetic data the model was trained on (python prepare.py arithmetic "
            "writes data/arithmetic)")


if __name__ == '__main__':
    configure(globals())
    if split not in ('test', 'val'):
        raise UserError(f"split={split!r}: expected 'test' or 'val'")
    if max_examples < 0 or batch_size < 1:
        raise UserError(f"max_examples={max_examples} must be >= 0 (0: all) and batch_size={batch_size} >= 1")
    torch.manual_seed(seed)
    device = resolve_device(device)
    model, ckpt = load_model(out_dir, device)
    encode, decode = load_codec(ckpt)
    cfg = ckpt['config']
    trained_on = cfg.get('dataset') or 'arithmetic'
    try:
        encode(CHARS)
    except ValueError:
        raise UserError(f"{out_dir} was trained on '{trained_on}', whose vocabulary lacks the arithmetic characters "
                        f"{CHARS.strip()!r}; evaluate a model trained on an arithmetic dataset") from None
    run_dir = out_dir if os.path.isdir(out_dir) else os.path.dirname(out_dir) or '.'  # out_dir may name the .pt file
    writable_dir(run_dir, 'out_dir')  # now, not after the evaluation
    data_dir = data_dir or dataset_dir(trained_on, cfg.get('data_dir'))
    path = os.path.join(data_dir, f'{split}.txt')
    if not os.path.isfile(path):
        raise UserError(f"no {path}; {make_hint(data_dir)}")
    with open(path) as f:
        lines = [line for line in f.read().split('\n') if line]
    for i, line in enumerate(lines):
        if not (_ALLOWED_LINE_RE.match(line) and '=' in line and line.rsplit('=', 1)[1].isdigit()):
            raise UserError(f"{path} is corrupt: line {i + 1} ({line[:60]!r}) is not an example expression=...=result; "
                            f"{make_hint(data_dir, force=True)}")
    if max_examples:
        kept, per = [], {}
        for line in lines:
            n_ops = count_ops(line.split('=', 1)[0])
            if per.get(n_ops, 0) < max_examples:
                per[n_ops] = per.get(n_ops, 0) + 1
                kept.append(line)
        lines = kept
    if not lines:  # a result file is never replaced by the score of nothing
        raise UserError(f"{path} has no examples; {make_hint(data_dir, force=True)}")
    t0 = time.time()
    res = evaluate(model, lines, encode, decode, device, batch_size)
    res.update({'out_dir': out_dir, 'split': split, 'data_dir': data_dir,
                'lime': ckpt['model_args'].get('lime'), 'eval_seconds': time.time() - t0})
    for n_ops, t in res['per_tier'].items():
        print(f'{n_ops} operators: accuracy {t["accuracy"]:.4f} (n={t["n"]}), '
              f'exact chain {t["exact_chain"]:.4f}, step accuracy {t["step_accuracy"]:.4f}, '
              f'majority answer {t["majority_answer"]:.4f}')
    print(f'overall accuracy {res["accuracy"]:.4f} on {res["n"]} examples ({res["eval_seconds"]:.1f}s)')
    path = os.path.join(run_dir, f'arith_eval_{split}.json')
    atomic_write(path, lambda f: f.write(json.dumps(res, indent=1).encode()))
    print(f'wrote {path}')
