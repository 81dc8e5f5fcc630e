"""
sweep.csv: its text from sweep.py's rows and its rows from the text (numbers typed, None where empty), the rows an
earlier command wrote into the same out_dir, the arithmetic task's columns, and each arm's best variant. A row is a
dict of the columns (nanolime/sweep_report.py prints its tables).
"""
import csv
import io
import os
import sys

from nanolime.sweep_multipliers import MULTIPLIERS

def add_tier_columns(rows):
    """On the arithmetic task, each row's study/arithmetic.py scores (row['tiers']: its per_tier, removed) as columns
    acc_<n> and majority_<n> per tier, n operators per expression (None where a run has no score); the tiers'
    n, sorted."""
    tiers = sorted({int(n) for row in rows for n in row.get('tiers', {})})
    for row in rows:
        scored = row.pop('tiers', {})
        for n in tiers:
            tier = scored.get(str(n), {})  # majority_baseline: the name study/arithmetic.py first wrote it under
            row[f'acc_{n}'], row[f'majority_{n}'] = tier.get('accuracy'), tier.get('majority_answer',
                                                                                   tier.get('majority_baseline'))
    return tiers

def run_kind(row):
    """(max_iters, data) of a row: how long its run trained, and the identity of its data (None where not
    recorded); only runs of one kind are averaged or compared without a mark."""
    return row.get('max_iters'), row.get('data')

def best_of_arms(rows):
    """Each arm's best variant at each depth among runs of one length and data, {(depth, arm, max_iters, data):
    (variant, mean final val loss, seeds)}. An arm is a variant name without its '~' options (lime~learning_rate=4e-3
    is arm lime at another lr); its best, the variant with the lowest mean final val loss over its finished seeds
    (ties: the first in rows). Runs of another max_iters or data are another comparison, with a best of its own."""
    losses = {}
    for row in rows:
        if row['status'] == 'done' and row['budget'] is None:
            losses.setdefault((row['depth'], row['variant'], *run_kind(row)), []).append(row['val_loss'])
    best = {}
    for (depth, variant, *kind), xs in losses.items():
        key, mean = (depth, variant.split('~')[0], *kind), sum(xs) / len(xs)
        if key not in best or mean < best[key][1]:
            best[key] = (variant, mean, len(xs))
    return best

class WrittenRow(dict):
    """A row of an earlier sweep.csv with a cell that is not what its column holds: kept as written (text), in no
    comparison (earlier_rows)."""

def csv_text(rows):
    """sweep.csv's text: a header of the first row's keys and best_of_arm (whether the row's variant is its
    arm's best at its depth: best_of_arms; empty for a budget run or an unfinished one), then a line per row,
    its out_dir the run's folder relative to the sweep's (its name: the CSV reads the same anywhere)."""
    best = best_of_arms([row for row in rows if not isinstance(row, WrittenRow)])
    rows = [row if isinstance(row, WrittenRow) else
            {**row, 'best_of_arm': best[row['depth'], row['variant'].split('~')[0], *run_kind(row)][0] == row['variant']
             if row['status'] == 'done' and row['budget'] is None else None} for row in rows]
    rows = [{**row, 'out_dir': os.path.basename(row['out_dir'])} if row.get('out_dir') else row
            for row in rows]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()

CSV_NUMBERS = dict(depth=int, seed=int, budget=int, iters=int, max_iters=int, lr_decay_iters=int, warmup_iters=int,
                   tokens=int, train_flops=int, learning_rate=float, non_embedding_params=int, tokens_per_param=float,
                   val_loss=float, compute_multiplier=float, time_multiplier=float, wall_time_s=float)

def parse_row(r):
    """A row read from sweep.csv with its numbers as sweep.py has them (None where empty; acc_<N> and
    majority_<N> floats; best_of_arm, which csv_text derives, dropped). ValueError naming the first cell that
    is not what its column holds."""
    if None in r or None in r.values():  # csv.DictReader's extra cells, or missing ones
        raise ValueError(f"{'more' if None in r else 'fewer'} cells than the header has")
    out = {}
    for k, v in r.items():
        kind = CSV_NUMBERS.get(k, float if k.startswith(('acc_', 'majority_')) else str)
        try:
            out[k] = None if v == '' else kind(v)
        except ValueError:
            raise ValueError(f"its {k} is {v!r}, not {'an integer' if kind is int else 'a number'}") from None
    if not isinstance(out.get('status'), str) or not isinstance(out.get('variant'), str) or out.get('depth') is None:
        raise ValueError("its depth, variant or status is missing")
    out.pop('best_of_arm', None)
    return out

def earlier_rows(path, rows):
    """The rows an earlier command wrote into the sweep.csv at path for runs that rows do not have (another
    command's variants, depths or seeds in the same out_dir) and whose directories are still there, typed as
    rows are, their multipliers as that command computed them (against its control): a sweep run in parts
    keeps every run in its CSV, and best_of_arm spans them all. [] without a readable file. A row with a cell
    that is not what its column holds is said in a warning naming the file, line and column, and kept as
    written (a WrittenRow: in no comparison); the file's other rows are read as they are."""
    root, names, earlier = os.path.dirname(path), {os.path.basename(r['out_dir']) for r in rows}, []
    try:
        with open(path, newline='') as f:
            reader = csv.DictReader(f)
            for r in reader:
                try:
                    earlier.append(parse_row(r))
                except ValueError as e:
                    print(f"warning: {path}, line {reader.line_num}: {e}: that row is kept as written, in no "
                          "comparison; correct it, or delete the line", file=sys.stderr)
                    earlier.append(WrittenRow({k: '' if v is None else v for k, v in r.items()
                                               if k not in (None, 'best_of_arm')}))
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        if os.path.exists(path):
            print(f"warning: {path} could not be read whole ({e}): only its first {len(earlier)} rows are kept",
                  file=sys.stderr)
    return [type(r)({**r, 'out_dir': os.path.join(root, name)}) for r in earlier
            if (name := os.path.basename(r.get('out_dir') or '')) and name not in names
            and os.path.isdir(os.path.join(root, name))]  # a name, or (earlier versions) a path

def read_rows(*paths):
    """The finished runs of one or more sweep.csv files as sweep.py's rows (numbers, None where empty,
    out_dir a path: the file's folder joined with the run's name), the multipliers empty
    (add_compute_multipliers fills them); a run (depth, variant, seed, budget) in more than one file is
    taken from the first. For a table over several sweeps (the control: the first variant), with
    sweep_multipliers' fit_power_law, control_ends, add_compute_multipliers and sweep_report's print_table:
        rows = read_rows('out-a/sweep.csv', 'out-b/sweep.csv'); ctrl = rows[0]['variant']
        fits = {16: fit_power_law(control_ends(rows, ctrl, 16))}; add_compute_multipliers(rows, {}, fits, ctrl)
        print_table(rows, [16], list(dict.fromkeys(r['variant'] for r in rows)), 'val_loss', 'final val loss', 3)"""
    rows, seen = [], set()
    for path in paths:
        with open(path, newline='') as f:
            reader = csv.DictReader(f)
            for r in reader:
                try:
                    r = parse_row(r)
                except ValueError as e:
                    raise ValueError(f"{path}, line {reader.line_num}: {e}") from None
                key = (r['depth'], r['variant'], r['seed'], r['budget'])
                if r['status'] == 'done' and key not in seen:
                    seen.add(key)
                    name = os.path.basename(r.get('out_dir') or '')
                    where = os.path.join(os.path.dirname(path), name) if name else None
                    rows.append({**r, **dict.fromkeys(MULTIPLIERS), 'out_dir': where})
    return rows
