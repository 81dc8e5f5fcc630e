"""experiments/, the studies beside the core: the core never imports them (nor dev/); the two summary figures carry
the numbers of the studies' CSVs, recomputed here with scipy, and docs/results.md quotes the same; the numbers
experiments/summary.py prints are the ones the READMEs quote."""
import ast
import csv
import glob
import json
import math
import os
import re
import sys

import pytest
from PIL import Image
from scipy import stats

from conftest import REPO, script_here

sys.path.insert(0, os.path.join(REPO, 'experiments'))
import summary  # noqa: E402  (experiments/summary.py)

CORE = ['*.py', 'nanolime/*.py', 'relatives/*.py', 'study/*.py', 'integrations/*.py']
OUTSIDE_CORE = re.compile(r'^(dev|experiments)(/|\.|$)')  # a module or path under dev/ or experiments/


def reaches_outside(source):
    """(line, what) for each import of a module of dev/ or experiments/ in a module's source, and each string
    (docstrings aside) that names a path there: what `sys.path.insert` or `runpy` would reach it by."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if OUTSIDE_CORE.match(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and OUTSIDE_CORE.match(node.module or ''):
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and OUTSIDE_CORE.match(node.value)):
            found.append((node.lineno, node.value))
    return sorted(found)


def test_the_check_sees_each_way_in():
    source = ('"""a docstring may name dev/grad_check.py"""\nimport os\nimport experiments.summary\n'
              'from dev import gpu_check\nfrom .dev import x\nsys.path.insert(0, os.path.join(REPO, "dev"))\n'
              'runpy.run_path("experiments/summary.py")\nprint("developer")\n')
    assert reaches_outside(source) == [(3, 'experiments.summary'), (4, 'dev'), (6, 'dev'),
                                       (7, 'experiments/summary.py')]


def test_no_core_module_reaches_experiments_or_dev():
    """One way down: experiments/ and dev/ import the core, never the reverse (either folder can go)."""
    files = sorted(f for pattern in CORE for f in glob.glob(os.path.join(REPO, pattern)))
    assert len(files) > 20
    found = []
    for path in files:
        with open(path, encoding='utf-8') as f:
            found += [f'{os.path.relpath(path, REPO)}:{n}: {what}' for n, what in reaches_outside(f.read())]
    assert not found, 'the core reaches into experiments/ or dev/:\n' + '\n'.join(found)


# ----------------------------------------------------------------------------- the summary figures and their rows
def arm_values(a):
    """{seed: value} of a row's arm, read from its CSV here (not by summary.values)."""
    with open(os.path.join(REPO, 'experiments', a['path']), newline='') as f:
        out = {}
        for r in csv.DictReader(f):
            full = r['iters'] == str(a['iters']) if a['iters'] else not r.get('budget')
            if (r['status'] == 'done' and full and (a['depth'] is None or int(r['depth']) == a['depth'])
                    and a['variant'] in (r['variant'], r['variant'].split('~')[0])):
                out.setdefault(int(r['depth']), {})[int(r['seed'])] = float(r[a['column']]) * a['scale']
    return out


def recompute(row):
    """The row's mean, 95 % half-width, p and n from its CSVs with scipy: a paired t over seeds, or, for an arm
    over depths (no depth given), the least-squares slope of the paired differences on log2(depth)."""
    a, b = arm_values(row['a']), arm_values(row['b'])
    if row['a']['depth'] is not None:
        x, y = a[row['a']['depth']], b[row['b']['depth']]
        d = [x[s] - y[s] for s in sorted(set(x) & set(y))]
        n = len(d)
        sd = stats.tstd(d)
        return sum(d) / n, stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n), stats.ttest_1samp(d, 0.0).pvalue, n
    xs, ys = [], []
    for depth in sorted(set(a) & set(b)):
        seeds = sorted(set(a[depth]) & set(b[depth]))
        xs += [math.log2(depth)] * len(seeds)
        ys += [a[depth][s] - b[depth][s] for s in seeds]
    fit = stats.linregress(xs, ys)
    return fit.slope, stats.t.ppf(0.975, len(xs) - 2) * fit.stderr, fit.pvalue, len(xs)


def holm(ps):
    """Holm's step-down adjustment, written out: the k-th smallest p times (m - k + 1), never below the one before."""
    order = sorted(range(len(ps)), key=ps.__getitem__)
    out, running = [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - k) * ps[i]))
        out[i] = running
    return out


@pytest.fixture(scope='module')
def rows():
    return summary.summary()


def test_every_row_is_its_csvs(rows):
    """Each row of summary.py against its CSVs: mean, interval (its t quantiles to 3 digits), p, and the Holm p
    over its study's family (the rows of one group)."""
    assert len(rows) == 2 + 25 + 2 + 3 + 6 + 6 + 1
    for r in rows:
        mean, half, p, n = recompute(r)
        assert (r['n'], r['mean']) == (n, pytest.approx(mean, abs=1e-12)), r['label']
        assert r['half'] == pytest.approx(half, rel=1e-3) and r['p'] == pytest.approx(p, abs=1e-6), r['label']
    for group in dict.fromkeys(r['group'] for r in rows):
        family = [r for r in rows if r['group'] == group]
        if family[0]['holm'] is not None:
            assert [r['holm'] for r in family] == pytest.approx(holm([r['p'] for r in family]), abs=1e-9), group


def test_the_figures_carry_the_rows(rows):
    """Each PNG's metadata holds the rows it plots: those of summary.py now, so a figure not redrawn after a CSV
    changed fails here ('python experiments/summary.py' redraws both)."""
    for name, path in summary.FIGURES.items():
        shown = json.loads(Image.open(path).text['rows'])
        assert shown == close([r for r in rows if r['figure'] == name and r['shown']]), \
            f'{os.path.relpath(path, REPO)} is not what its CSVs give now: run python experiments/summary.py'
    assert sum(r['shown'] for r in rows) == 13 + 13


def close(x):
    """`x` with each float replaced by pytest.approx of it: scipy and numpy releases differ in the last digit."""
    if isinstance(x, float):
        return pytest.approx(x, rel=1e-9)
    if isinstance(x, dict):
        return {k: close(v) for k, v in x.items()}
    return [close(v) for v in x] if isinstance(x, list) else x


def signed(x, digits):
    return f'{x:+.{digits}f}'.replace('-', '−')


def table(rows, figure):
    """docs/results.md's table of a figure's rows, as this test writes it."""
    lines, group = ['| result | n | difference, 95 % interval | p | Holm p |', '|---|---|---|---|---|'], None
    digits = 1 if figure == 'arithmetic' else 3
    for r in (r for r in rows if r['figure'] == figure and r['shown']):
        if r['group'] != group:
            group = r['group']
            lines.append(f'| **{group}** | | | | |')
        holm_p = '' if r['holm'] is None else f"{r['holm']:.3f}"
        lines.append(f"| {r['label']} | {r['n']} | {signed(r['mean'], digits)} ± {r['half']:.{digits}f} | "
                     f"{r['p']:.3f} | {holm_p} |")
    return '\n'.join(lines)


def test_results_page_quotes_the_rows(rows):
    """docs/results.md: both tables are the figures' rows, and the answers at its top quote them."""
    with open(os.path.join(REPO, 'docs', 'results.md'), encoding='utf-8') as f:
        page = f.read()
    for figure in summary.FIGURES:
        assert table(rows, figure) in page, figure
    top = page.split('![', 1)[0]  # the answers, before the figures
    by = {(r['group'].split(',')[0].split(':')[0], r['label']): r for r in rows}
    arith = by['Every arm at lr 2e-3', '8 layers, LIMe']
    adamw = by['The default model', 'LIMe, AdamW']
    slope = by['The depth curve', 'LIMe']
    s4, s8, s16 = (by['LIMe at L − the baseline at 2L', f'L = {L}'] for L in (4, 8, 16))
    tuned = [r for r in rows if r['group'].startswith('The tuned comparison')]
    for quote in (f"{signed(arith['mean'], 1)} ± {arith['half']:.1f}\n   points", f"(Holm {arith['holm']:.3f})",
                  f"the smallest Holm p {min(r['holm'] for r in tuned):.3f}",
                  f"LIMe ends {signed(adamw['mean'], 3)} ± {adamw['half']:.3f} behind", f"(Holm {adamw['holm']:.3f})",
                  f"per doubling {signed(slope['mean'], 3)} ± {slope['half']:.3f}",
                  f"(Holm {s4['holm']:.3f}, {s16['holm']:.3f}), not shown at 8 ({s8['holm']:.3f})"):
        assert quote in top, quote
    assert arith['holm'] < 0.05 < min(r['holm'] for r in tuned) and adamw['holm'] < 0.05
    assert s4['holm'] < 0.05 < s8['holm'] and s16['holm'] < 0.05 and slope['holm'] > 0.05


def test_summary_prints_the_numbers_the_readmes_quote():
    """experiments/summary.py's printed numbers, each with the words README, docs/results.md or a study's README
    quotes it in."""
    code, stdout, _ = script_here('experiments/summary.py', '--plot=False')
    assert code == 0
    docs = ''
    for path in ['README.md', 'docs/results.md'] + sorted(glob.glob(os.path.join(REPO, 'experiments', '*', '*.md'))):
        with open(os.path.join(REPO, path), encoding='utf-8') as f:
            docs += f.read()
    for printed, quoted in (('LIMe, AdamW: +0.0108 ± 0.0075 over 5, p_t 0.016, Holm 0.016', '0.011 ± 0.008 behind'),
                            ('LIMe needs 16.5% more FLOPs', 'about 17 % more FLOPs'),
                            ('baseline, standard, 32 layers: best lr 0.004',
                             'the best lr at 32 layers is the best at 4, 4e-3'),
                            ('at 4e-3 − at 2e-3: -12.9667 ± 11.8269 over 3', '13.0 ± 11.8 points below'),
                            ('MUDDFormer (2e-3): +8.9000 ± 8.8639 over 3', '**+8.90 ± 8.86**'),
                            ('= 0.152 per doubling', 'a slope of 0.152 per doubling')):
        assert printed in stdout and quoted in docs, (printed, quoted)


def test_no_csv_names_a_path_of_the_machine_it_ran_on():
    """A shipped CSV's run folders are relative to their sweep (the folder's name, as sweep.py reads them), and no
    field holds an absolute path."""
    paths = sorted(glob.glob(os.path.join(REPO, 'experiments', '**', '*.csv'), recursive=True)
                   + glob.glob(os.path.join(REPO, 'assets', '*.csv')))
    assert len(paths) > 30
    found = []
    for path in paths:
        with open(path, newline='', encoding='utf-8') as f:
            for n, r in enumerate(csv.DictReader(f), 2):
                found += [f'{os.path.relpath(path, REPO)}:{n}: {k} {v}' for k, v in r.items()
                          if v and (v.startswith('/') or (k == 'out_dir' and '/' in v))]
    assert not found, 'CSV fields with paths of a machine or a folder above the run:\n' + '\n'.join(found[:10])
