"""
A GPU's first ten minutes: the acceptance of the CUDA path in one command that fits a short loan of a GPU,
ordered by what each stage tells us and cut to fit. The total (--minutes, default 9) is split over the
stages; each stage runs within its budget plus whatever the stages before it left unused, is stopped
(with its children) when that is spent, and a stage whose time is gone is skipped with a line in the
report. The shares are set from its first run, on an H200 (docs/performance.md, "GPU: the first run").

$ python dev/gpu_check.py --minutes=9                       # on the GPU machine: every stage, then the report
$ python dev/gpu_check.py --minutes=9 --dry_run             # anywhere, in seconds: the stages, budgets, commands
$ python dev/gpu_check.py --minutes=5 --stages=table9,ddp   # a rerun of some stages in the time left

The stages, in order (stage_list below), each one or more commands run as subprocesses:
  1 cuda-tests  python -m pytest -m cuda: tests/test_cuda.py
  2 train       prepare.py shakespeare (GPT-2 BPE, offline), then sweep.py config/train_gpu_check.py:
                a small LIMe model and its baseline, one at a time (compiled, bf16, 200 iterations):
                tokens/s and MFU; the LIMe run stopped at 100 and resumed (a sweep to 100, then to
                200), against the run straight through (an exact resume); sample.py on the GPU, and
                the checkpoint loaded and sampled on the CPU
  3 table9      bench.py at the paper's 1B shape (config/bench_1b.py), GQA then MHA: baseline and LIMe
                step time and peak memory beside the paper's Table 9; eager unless the stage has the
                minutes to compile four 1B models (bench_1b_mode)
  4 ddp         torchrun --standalone --nproc_per_node=1 train.py: DDP over NCCL, a tiny model
  5 depth       bench.py config/bench_depth_gpu.py: baseline and LIMe at 32, 64 and 128 layers x 512, compiled,
                bf16: step time and peak memory against depth (bench_depth.json)
  6 grads       dev/grad_check.py: LIMe 8 x 1024, T 1024, bf16, every parameter's gradient compiled against
                eager within a stated tolerance (TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 the workaround if not)
Stages 5 and 6 run only when named (--stages=depth,grads --minutes=N): compiling 128 layers alone takes
minutes, so they do not fit a 9-minute check of all; 'all' is stages 1 to 4.
Into out_dir: gpu_report.md (device, driver, torch, date, every stage's result and minutes),
gpu_report.json (the same, with every number), the benchmarks' JSON and every command's output in logs/.
Both reports are rewritten after each stage, so a check cut short leaves what it got; a rerun of some
stages (--stages) replaces theirs in the report in out_dir and keeps the others. Checkpoints and prepared
data go to work_dir, a temporary directory removed at the end unless named.
"""
import datetime
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


STAGE_NEEDS = ('torch', 'numpy', 'scipy', 'tiktoken', 'tqdm', 'pytest', 'xdist')  # what the stages import (not datasets nor matplotlib)


def missing_requirements():
    """The packages the stages import that this Python lacks (a fresh GPU machine often has torch and little else)."""
    import importlib.util
    return [{'xdist': 'pytest-xdist'}.get(n, n) for n in STAGE_NEEDS if importlib.util.find_spec(n) is None]


def dry_run_asked(argv):
    """--dry_run (or its old spelling --dry-run) asked for: a plan needs torch only, not the stages' packages."""
    return any(a in ('--dry-run', '--dry_run') or a.lower() in ('--dry_run=true', '--dry_run=1') for a in argv)


if __name__ == '__main__' and not dry_run_asked(sys.argv[1:]) and missing_requirements():
    sys.exit(f"error: dev/gpu_check.py needs {', '.join(missing_requirements())}, not installed here: "
             "pip install -r requirements.txt")
from nanolime.common import UserError, configure, device_peak_flops  # noqa: E402
from nanolime.checkpoint import atomic_write, lock_dir, read_log, writable_dir  # noqa: E402

# ----------------------------------------------------------------------------- config
out_dir = 'gpu-check'     # the reports, the benchmarks' JSON, logs/
work_dir = ''             # checkpoints and prepared data; '' = a temporary directory, removed at the end
minutes = 9.0             # the whole check's time: split over the stages run
stages = 'all'            # 'all', or stage names or numbers, comma-separated: train,ddp or 2,4
dry_run = False           # print the stages, their budgets and commands, and exit
bench_1b_mode = 'auto'    # the 1B stage: 'eager', 'compiled', or 'auto' (compiled if its budget allows)
# -----------------------------------------------------------------------------
RESERVE_S = 30            # of the total, kept for starting up, the reports and stopping an overrunning command
KILL_GRACE_S = 15         # an overrunning command gets SIGTERM (train.py saves and exits), then SIGKILL
MIN_STAGE_S = 10          # a stage with less time left than this is skipped
# each stage's share of the total (less RESERVE_S), from the first run (an H200, torch 2.11, cold compile
# caches): the CUDA tests took 164 s on 12 processes (the slowest test 85 s); the training stage's commands
# about 225 s (LIMe's first step compiles for 25 s); the 1B stage, eager, 48 s; DDP 24 s
SHARES = {'cuda-tests': 0.35, 'train': 0.45, 'table9': 0.12, 'ddp': 0.08,
          'depth': 0.6, 'grads': 0.4}  # the last two only when named: shares between themselves
NAMED_ONLY = ('depth', 'grads')  # not in 'all' (a 9-minute check): --stages=depth,grads --minutes=N
COMPILED_1B_S = 480       # bench_1b_mode='auto' compiles at the 1B shape only with this budget or more
TRAIN_ITERS = 200         # the training stage's run; stopped at half and resumed for the exact-resume check
TRAIN_DEPTH = 6           # config/train_gpu_check.py's n_layer: the sweep's --depths
# the paper's Table 9 (App. F; H100, PyTorch Inductor, default mode): step ms, train peak memory GB
PAPER_TABLE9 = {'gqa': {'baseline': (66.404, 20.489), 'lime': (67.449, 20.490), 'hc': (83.265, 21.693)},
                'mha': {'baseline': (70.258, 22.364), 'lime': (77.607, 22.367), 'hc': (86.314, 23.007)}}


def stage_list(out, work, table9_compiled=False):
    """The stages in order: name, title, steps [(label, command, share of the stage's time)], summary(out, work)
    -> (numbers, markdown lines, problems). Commands run from the repository; out and work are absolute."""
    py, data = sys.executable, os.path.join(work, 'data')
    prepare = [py, 'prepare.py', 'shakespeare', f'--data_dir={data}']
    sweep = [py, 'sweep.py', 'config/train_gpu_check.py', f'--data_dir={data}',
             f'--depths={TRAIN_DEPTH}', '--seeds=0', '--plot=False']
    runs, half = os.path.join(work, 'runs'), os.path.join(work, 'half')  # half: stopped at 100, then resumed
    mode, json_1b = 'compiled' if table9_compiled else 'eager', os.path.join(out, 'bench_1b_{}.json')
    bench = [py, 'bench.py', 'config/bench_1b.py', '--variants=baseline,lime', '--warmup=3', '--iters=10']
    defs = [
        dict(name='cuda-tests', title='CUDA tests: python -m pytest -m cuda', summary=summarize_tests,
             steps=[('pytest', [py, '-m', 'pytest', '-m', 'cuda', '-n', '12', '--dist=worksteal', '-rfEs'], 1.0)]),
        dict(name='train', title='A small LIMe model and its baseline (config/train_gpu_check.py): compiled, bf16; '
                                 'an exact resume; sampled on the GPU and the CPU',
             summary=summarize_train,
             steps=[('prepare', prepare, 0.04),
                    ('sweep', [*sweep, '--variants=lime,baseline', f'--out_dir={runs}'], 0.52),
                    ('lime-half', [*sweep, '--variants=lime', f'--out_dir={half}',
                                   f'--max_iters={TRAIN_ITERS // 2}'], 0.15),
                    ('lime-resume', [*sweep, '--variants=lime', f'--out_dir={half}'], 0.15),
                    *[(f'sample-{d}', [py, 'sample.py', f"--out_dir={run_dir(work, 'runs', 'lime')}",
                                       f'--device={d}', '--num_samples=1', '--max_new_tokens=100',
                                       '--start=ROMEO:'], 0.07)
                      for d in ('cuda', 'cpu')]]),
        dict(name='table9', title=f"The paper's 1B shape (config/bench_1b.py), {mode}, beside its Table 9",
             summary=summarize_table9,
             steps=[(attn, [*bench, f'--settings={attn}-{mode}', f'--json={json_1b.format(attn)}'], 0.5)
                    for attn in ('gqa', 'mha')]),
        dict(name='ddp', title='DDP over NCCL: torchrun --standalone --nproc_per_node=1 train.py',
             summary=summarize_ddp,
             steps=[('prepare', prepare, 0.15),  # made by the training stage already, unless it is run alone
                    ('torchrun', [py, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1',
                                  'train.py', 'config/train_gpu_check.py', f'--data_dir={data}',
                                  f"--out_dir={os.path.join(work, 'ddp')}", '--compile=False', '--n_layer=2',
                                  '--n_head=4', '--n_embd=128', '--max_iters=30', '--lr_decay_iters=30',
                                  '--warmup_iters=5', '--eval_interval=30', '--log_interval=5'], 0.85)]),
        dict(name='depth', title='Cost against depth (config/bench_depth_gpu.py): 32, 64, 128 layers x 512, '
                                 'compiled, bf16', summary=summarize_depth,
             steps=[('bench', [py, 'bench.py', 'config/bench_depth_gpu.py',
                               f"--json={os.path.join(out, 'bench_depth.json')}"], 1.0)]),
        dict(name='grads', title='Compiled against eager gradients: LIMe 8 x 1024, T 1024, bf16 (dev/grad_check.py)',
             summary=summarize_grads, steps=[('grad-check', [py, 'dev/grad_check.py'], 1.0)]),
    ]
    return [dict(d, number=k) for k, d in enumerate(defs, 1)]


def run_dir(work, sweep, variant):
    """The directory sweep.py trains a run of the training stage in."""
    return os.path.join(work, sweep, f'{variant}-L{TRAIN_DEPTH}-s0')


def plan(names, total_minutes):
    """{stage name: budget in seconds}: the total less RESERVE_S, split over the named stages by SHARES."""
    if not math.isfinite(total_minutes):
        raise UserError(f"minutes={total_minutes} is not a number of minutes: give the time the GPU is lent for, "
                        "e.g. --minutes=9")
    usable = total_minutes * 60 - RESERVE_S
    if usable < MIN_STAGE_S * len(names):
        raise UserError(f"minutes={total_minutes} is too little: {len(names)} stage(s) need at least "
                        f"{(RESERVE_S + MIN_STAGE_S * len(names)) / 60:.2f} minutes")
    weight = sum(SHARES[n] for n in names)
    return {n: usable * SHARES[n] / weight for n in names}


# ----------------------------------------------------------------------------- running
def shown(cmd):
    """A command as a user would type it, `python` for this interpreter."""
    return shlex.join(['python' if a == sys.executable else a for a in cmd])


def stop(p):
    """Stop a command and every process it started (its session's process group: pytest's and torchrun's
    children, the compiler's workers): SIGTERM, then SIGKILL to what is left after KILL_GRACE_S."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=KILL_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the leader may be gone while its children are not
    except ProcessLookupError:
        pass
    p.wait()


def run_step(cmd, log_path, timeout):
    """Run cmd from the repository, its output into log_path, for at most `timeout` seconds:
    ('ok' | 'failed' | 'overran', exit status or None, seconds)."""
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE')}
    t0 = time.time()
    with open(log_path, 'w') as log:
        print(f"$ {shown(cmd)}", file=log, flush=True)
        p = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(env, PYTHONUNBUFFERED='1'))
        try:
            code = p.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            stop(p)
            return 'overran', None, time.time() - t0
        except BaseException:  # Ctrl-C: the command is in its own session and did not get it
            stop(p)
            raise
    return 'ok' if code == 0 else 'failed', code, time.time() - t0


def tail(path, lines=15):
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-lines:])
    except OSError:
        return ''


def run_stage(stage, budget, out, work):
    """Every step of a stage within the stage's budget (seconds): each step gets its share plus whatever the
    steps before it left unused of theirs; then the stage's summary. Its record (status 'ok', 'failed' or
    'overran')."""
    start = time.time()
    total_share, done_share, steps = sum(s for *_, s in stage['steps']), 0.0, []
    os.makedirs(os.path.join(out, 'logs'), exist_ok=True)
    for label, cmd, share in stage['steps']:
        done_share += share
        log = os.path.join(out, 'logs', f"{stage['name']}-{label}.log")
        status, code, seconds = run_step(cmd, log, start + budget * done_share / total_share - time.time())
        steps.append(dict(label=label, command=shown(cmd), status=status, returncode=code,
                          minutes=round(seconds / 60, 2), budget_min=round(budget * share / total_share / 60, 2),
                          log=os.path.relpath(log, out), tail=tail(log) if status != 'ok' else None))
    record = dict(number=stage.get('number'), name=stage['name'], title=stage['title'], steps=steps,
                  budget_min=round(budget / 60, 2), minutes=round((time.time() - start) / 60, 2),
                  results=None, lines=[], problems=[])
    try:
        record['results'], record['lines'], record['problems'] = stage['summary'](out, work)
    except Exception as e:  # a summary that cannot read what a failed step left: noted, the check goes on
        record['problems'] = [f"no summary: {type(e).__name__}: {e}"]
    statuses = {s['status'] for s in steps}
    record['status'] = 'overran' if 'overran' in statuses else 'failed' if 'failed' in statuses or \
        record['problems'] else 'ok'
    return record


def skipped(stage, budget, left):
    return dict(number=stage.get('number'), name=stage['name'], title=stage['title'], steps=[], status='skipped',
                budget_min=round(budget / 60, 2), minutes=0.0, results=None, problems=[],
                lines=[f"- skipped: the time was gone ({max(left, 0):.0f} s left of its {budget:.0f} s, fewer than "
                       f"{MIN_STAGE_S}); rerun it alone: `python dev/gpu_check.py --stages={stage['name']}`"])


def run_all(stage_defs, budgets, out, work, info, earlier=(), clock=time.monotonic, runner=run_stage):
    """Run the stages in order, stage k until the sum of the budgets (seconds, by name) of stages 1..k has
    passed since the start, so that time one leaves unused goes to the next and one that overran takes it
    from the next; a stage with under MIN_STAGE_S left is skipped. The reports are rewritten after each
    stage; `earlier`: the records of stages not run this time, kept in the report. Returns the report."""
    report = dict(info, stages=list(earlier), budget_min=round(sum(budgets.values()) / 60, 2), minutes=0.0)
    start, until = clock(), 0.0
    for k, stage in enumerate(stage_defs, 1):
        until += budgets[stage['name']]
        left = start + until - clock()
        print(f"[{time.strftime('%H:%M:%S')}] stage {stage.get('number', k)} ({k} of {len(stage_defs)}) "
              f"{stage['name']}, {max(left, 0):.0f} s: {stage['title']}", flush=True)
        record = runner(stage, left, out, work) if left >= MIN_STAGE_S else skipped(stage, budgets[stage['name']], left)
        record.setdefault('date', info.get('date'))
        report['stages'] = sorted([s for s in report['stages'] if s['name'] != stage['name']] + [record],
                                  key=lambda s: s.get('number') or 0)  # stable: stand-ins keep their order
        report['minutes'] = round((clock() - start) / 60, 2)
        write_report(report, out)
        print(f"  {record['status']} in {record['minutes']:.1f} of {record['budget_min']:.1f} min"
              + ''.join(f"\n  problem: {p}" for p in record['problems'])
              + ''.join(f"\n  {line[2:]}" for line in record['lines'] if record['status'] == 'skipped'), flush=True)
    return report


# ----------------------------------------------------------------------------- what each stage found
def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt(x, spec='.3f'):
    return '-' if x is None else format(x, spec)


def summarize_tests(out, work):
    """pytest's counts (its last line: '20 passed, 2 skipped, 300 deselected in 95.1s') and the tests it
    listed as failed or skipped; on a GPU, a skipped CUDA test is a problem too."""
    text = tail(os.path.join(out, 'logs', 'cuda-tests-pytest.log'), 300)
    counts = {}
    for line in text.splitlines():
        if re.search(r'\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s', line):
            counts = {k.rstrip('s'): int(n) for n, k in
                      re.findall(r'(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)', line)}
    listed = [line for line in text.splitlines() if line.startswith(('FAILED ', 'ERROR ', 'SKIPPED '))]
    problems = [f"{counts[k]} {k}" for k in ('failed', 'error', 'skipped') if counts.get(k)]
    if not counts.get('passed'):
        problems.append("no CUDA test passed")
    lines = [', '.join(f"{n} {k}" for k, n in counts.items()) or 'no pytest summary line in the log'] + \
        [f"- `{line}`" for line in listed]
    return counts, lines, problems


def summarize_table9(out, work):
    """bench.py's records at the 1B shapes, each beside the paper's Table 9 row."""
    rows, problems, shape, modes = [], [], '', set()
    lines = ["| setting | variant | step ms | × baseline | paper ms | paper × baseline | peak GB | × baseline | "
             "paper GB | paper × baseline | MFU | 1st step s |", "|" + "---|" * 12]
    for attn in ('gqa', 'mha'):
        data = read_json(os.path.join(out, f'bench_1b_{attn}.json'))
        if data is None:
            problems.append(f"{attn}: no results (bench_1b_{attn}.json was not written)")
            continue
        modes.add(data['config'].get('settings', '?').partition('-')[2])
        paper, shape = PAPER_TABLE9[attn], f"{data['config']['batch_size']} x {data['config']['block_size']}"
        for r in data['records']:
            p_ms, p_gb = paper.get(r['variant'], (None, None))
            row = dict(setting=attn, variant=r['variant'], paper_step_ms=p_ms, paper_mem_gb=p_gb,
                       paper_step_ratio=p_ms and p_ms / paper['baseline'][0],
                       paper_mem_ratio=p_gb and p_gb / paper['baseline'][1])
            rows.append(row)
            if 'error' in r:
                problems.append(f"{attn} {r['variant']}: {r['error']}")
                row['error'] = r['error']
                lines.append(f"| {attn} | {r['variant']} | failed: {r['error'][:120]} |")
                continue
            row.update(step_ms=r['step_ms'], step_ratio=r.get('step_ratio'), mem_gb=r['mem_bytes'] / 1e9,
                       mem_ratio=r.get('mem_ratio'), mfu=r['mfu'], first_step_s=r['first_step_s'], params=r['params'])
            mfu = '-' if row['mfu'] is None else f"{100 * row['mfu']:.1f} %"
            lines.append(f"| {attn} | {r['variant']} | {row['step_ms']:.2f} | {fmt(row['step_ratio'])} | {fmt(p_ms)} | "
                         f"{fmt(row['paper_step_ratio'])} | {row['mem_gb']:.2f} | {fmt(row['mem_ratio'])} | "
                         f"{fmt(p_gb)} | {fmt(row['paper_mem_ratio'])} | {mfu} | {row['first_step_s']:.0f} |")
    if modes - {'compiled'}:
        lines += ["", f"Run {'/'.join(sorted(modes))}, not compiled: the paper's Table 9 is torch.compile'd (default "
                  "mode), so the paper's columns are for orientation only; compiled: `python dev/gpu_check.py "
                  f"--stages=table9 --minutes={math.ceil((COMPILED_1B_S + RESERVE_S) / 60)}`."]
    lines += ["", f"Batch {shape or '?'} tokens (the paper does not give its batch: compare the ratios); peak GB: "
              "torch.cuda.max_memory_allocated over one train step, 1e9 bytes; 1st step: compiling included. The "
              "paper's reduce-overhead rows: `python bench.py config/bench_1b.py --settings=gqa-ro,mha-ro`."]
    return rows, lines, problems


def summarize_depth(out, work):
    """bench.py's records against depth: step time and peak memory, each beside the baseline's."""
    data = read_json(os.path.join(out, 'bench_depth.json'))
    if data is None:
        return None, [], ["no results (bench_depth.json was not written)"]
    lines, problems = ["| layers | variant | step ms | × baseline | peak GB | × baseline |", "|" + "---|" * 6], []
    for r in data['records']:
        if 'error' in r:
            problems.append(f"{r.get('n_layer', '?')} layers {r['variant']}: {r['error']}")
            continue
        lines.append(f"| {r['n_layer']} | {r['variant']} | {r['step_ms']:.2f} | {fmt(r.get('step_ratio'))} | "
                     f"{r['mem_bytes'] / 1e9:.2f} | {fmt(r.get('mem_ratio'))} |")
    return data['records'], lines, problems


def summarize_grads(out, work):
    """dev/grad_check.py's verdict: its last lines (the worst errors, the parameters over the tolerance)."""
    text = tail(os.path.join(out, 'logs', 'grads-grad-check.log'), 400)
    over = re.search(r'^error: .*$', text, re.M)
    ok = re.search(r'^ok: .*$', text, re.M)
    problems = [over.group(0)[len('error: '):]] if over else [] if ok else ["dev/grad_check.py printed no verdict"]
    head = re.search(r'^LIMe .*$', text, re.M)
    return dict(ok=bool(ok)), [f"- {line}" for line in (head and head.group(0), ok and ok.group(0)) if line], problems


def training_numbers(run_dir, warm):
    """From a train.py run's log: tokens/s and MFU (medians over the iterations logged after `warm`, so
    without compiling and warming up), the first and last logged loss, and the evaluations."""
    log = read_log(run_dir)
    steps = [r for r in log if 'loss' in r]
    later = [r for r in steps if r['iter'] > warm] or steps
    mfus = [r['mfu'] for r in later if r.get('mfu') is not None]
    return dict(iters=steps[-1]['iter'] if steps else 0,
                tokens_per_s=statistics.median(r['tokens_per_s'] for r in later) if later else None,
                mfu=statistics.median(mfus) if mfus else None,
                first_loss=steps[0]['loss'] if steps else None, last_loss=steps[-1]['loss'] if steps else None,
                val_loss=[(r['iter'], r['val_loss']) for r in log if 'val_loss' in r])


def sample_text(out, label):
    """What sample.py printed (its first sample, without the line naming the checkpoint), from its log; ''
    if it did not end with a sample."""
    text = tail(os.path.join(out, 'logs', f'train-{label}.log'), 200).split('\n', 1)
    if len(text) < 2 or not text[0].startswith('$') or '---------------' not in text[1]:
        return ''
    return re.sub(r'\A\S+: iter \d+, .*\n', '', text[1].split('---------------')[0]).strip()


def summarize_train(out, work):
    """LIMe's and the baseline's tokens/s and MFU, the loss, the resume against the run straight through
    (logged losses and learning rates, then every weight), the samples."""
    runs = {name: training_numbers(run_dir(work, 'runs', name), warm=20)
            for name in ('lime', 'baseline')}
    lime_log = os.path.join(run_dir(work, 'runs', 'lime'), 'train.log')  # train.py's output
    params = re.search(r'model: ([\d.]+)M parameters', tail(lime_log, 400))
    nums = dict(runs, params_m=params and float(params.group(1)), resume=resume_numbers(work),
                samples={d: sample_text(out, f'sample-{d}')[:400] for d in ('cuda', 'cpu')})
    problems, lines = [], [f"- LIMe: {nums['params_m']}M parameters, compiled, bf16"]
    for name, r in runs.items():
        if not r['iters']:
            problems.append(f"{name}: no training iteration was logged")
        elif not r['last_loss'] < r['first_loss'] - 1.0:
            problems.append(f"{name}: the loss did not fall: {r['first_loss']:.3f} at iteration 1, "
                            f"{r['last_loss']:.3f} at the last")
        mfu = "n/a (the GPU's name is not in common.PEAK_FLOPS)" if r['mfu'] is None else f"{100 * r['mfu']:.1f} %"
        lines.append(f"- {name}: {r['iters']} iterations; tokens/s {fmt(r['tokens_per_s'], ',.0f')}, MFU {mfu} "
                     f"(medians after iteration 20); loss {fmt(r['first_loss'])} → {fmt(r['last_loss'])}; val loss "
                     + ', '.join(f"{v:.3f} at {it}" for it, v in r['val_loss']))
    if runs['lime']['tokens_per_s'] and runs['baseline']['tokens_per_s']:
        ratio = runs['lime']['tokens_per_s'] / runs['baseline']['tokens_per_s']
        lines.append(f"- LIMe / baseline tokens/s: {ratio:.3f}")
    res = nums['resume']
    if res is None:
        problems.append("the exact-resume check has no runs to compare (a step before it failed)")
    elif res['fresh_loss_diff'] is None:
        problems += res['problems']
    else:
        problems += res['problems']
        lines.append(f"- resumed at {TRAIN_ITERS // 2} against straight through: "
                     + ('bit-identical (losses, learning rates, every weight)' if res['identical'] else
                        f"max |Δ loss| {res['resumed_loss_diff']:.2e}, max |Δ weight| {res['weight_diff']:.2e}")
                     + f"; two fresh runs to {TRAIN_ITERS // 2}: max |Δ loss| {res['fresh_loss_diff']:.2e} "
                       "(the GPU's run-to-run noise)")
    problems += [f"sample.py on {d} printed nothing" for d, text in nums['samples'].items() if not text]
    lines += [f"- sample on {d}: `{' '.join(text.split())[:200]}`" for d, text in nums['samples'].items()]
    return nums, lines, problems


def resume_numbers(work):
    """The run stopped at half and resumed against the one straight through: their logs' iterations and
    learning rates must be the same, the losses and weights equal up to the GPU's run-to-run noise (the two
    runs' first halves measure it: with deterministic kernels it is 0, and the resume must be bit-identical).
    None if a run is missing."""
    import torch
    full, half = run_dir(work, 'runs', 'lime'), run_dir(work, 'half', 'lime')
    if not all(os.path.exists(os.path.join(d, 'ckpt.pt')) for d in (full, half)):
        return None
    a, b = (torch.load(os.path.join(d, 'ckpt.pt'), map_location='cpu', weights_only=True) for d in (full, half))
    if a['iter_num'] != TRAIN_ITERS or b['iter_num'] != TRAIN_ITERS:
        return dict(fresh_loss_diff=None, resumed_loss_diff=None, weight_diff=None, identical=False,
                    problems=[f"no exact-resume check: the runs stopped at iterations {a['iter_num']} (straight "
                              f"through) and {b['iter_num']} (resumed), not both at {TRAIN_ITERS}"])
    la, lb = ({r['iter']: (r['lr'], r['loss']) for r in read_log(d) if 'loss' in r} for d in (full, half))
    cut = TRAIN_ITERS // 2

    def diff(first, last):
        return max((abs(la[i][1] - lb[i][1]) for i in la.keys() & lb.keys() if first <= i <= last), default=math.inf)
    fresh, resumed = diff(1, cut), diff(cut + 1, TRAIN_ITERS)
    weights = max((0.0 if torch.equal(a['model'][k], b['model'][k]) else
                   (a['model'][k].float() - b['model'][k].float()).abs().max().item() for k in a['model']),
                  default=math.inf) if a['model'].keys() == b['model'].keys() else math.inf
    problems = []
    if la.keys() != lb.keys() or [la[i][0] for i in sorted(la)] != [lb[i][0] for i in sorted(lb)]:
        problems.append("the resumed run's logged iterations or learning rates differ from the run straight through")
    if fresh == 0 and (resumed != 0 or weights != 0):
        problems.append(f"not an exact resume: the kernels were deterministic (two fresh runs identical) but "
                        f"the resumed run differs: max |Δ loss| {resumed:.2e}, max |Δ weight| {weights:.2e}")
    elif resumed > max(0.05, 10 * fresh):
        problems.append(f"the resumed run's losses differ from the run straight through by {resumed:.3f}, far "
                        f"above the GPU's run-to-run noise ({fresh:.2e})")
    return dict(fresh_loss_diff=fresh, resumed_loss_diff=resumed, weight_diff=weights,
                identical=resumed == 0 and weights == 0, problems=problems)


def summarize_ddp(out, work):
    nums = training_numbers(os.path.join(work, 'ddp'), warm=10)
    nums['weights_identical'] = 'ddp: weights identical on all 1 ranks' in tail(
        os.path.join(out, 'logs', 'ddp-torchrun.log'), 50)
    problems = [] if nums['weights_identical'] else ["no 'ddp: weights identical' line: the run did not end well"]
    lines = [f"- {nums['iters']} iterations over NCCL, tokens/s {fmt(nums['tokens_per_s'], ',.0f')}; loss "
             f"{fmt(nums['first_loss'])} → {fmt(nums['last_loss'])}; the end-of-run weight check "
             + ("passed" if nums['weights_identical'] else "did not run")]
    return nums, lines, problems


# ----------------------------------------------------------------------------- the report
def device_info(command):
    """The machine, from a short subprocess (so that this process never holds a CUDA context), nvidia-smi
    and git."""
    code = ("import json, platform, torch\n"
            "i = dict(torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),\n"
            "         gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)\n"
            "if i['gpus']:\n"
            "    p = torch.cuda.get_device_properties(0)\n"
            "    i.update(device=p.name, memory_gib=round(p.total_memory / 2**30, 1),\n"
            "             capability=f'{p.major}.{p.minor}')\n"
            "print(json.dumps(i))")

    def output(cmd):
        try:
            return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ''
    info = json.loads(output([sys.executable, '-c', code]) or '{}')
    driver = output(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader']).splitlines()
    commit = output(['git', 'rev-parse', '--short', 'HEAD'])
    dirty = bool(output(['git', 'status', '--porcelain', '--untracked-files=no']))
    return dict(info, driver=driver[0] if driver else None,
                commit=commit + (' (with uncommitted changes)' if dirty else ''),
                date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'), command=command,
                cpus=os.cpu_count(), peak_flops=info.get('device') and device_peak_flops(info['device']))


def write_report(report, out):
    """gpu_report.json and gpu_report.md, each replaced whole."""
    atomic_write(os.path.join(out, 'gpu_report.json'), lambda f: f.write(json.dumps(report, indent=1).encode()))
    peak = f"{report['peak_flops'] / 1e12:.0f} TFLOP/s" if report.get('peak_flops') else 'unknown (no MFU)'
    md = ["# nanoLIMe GPU check", "",
          f"- device: {report.get('device')} ({report.get('memory_gib')} GiB, compute capability "
          f"{report.get('capability')}), {report.get('gpus')} GPU(s); driver {report.get('driver')}; CUDA "
          f"{report.get('cuda')}; torch {report.get('torch')}; Python {report.get('python')}; "
          f"{report.get('cpus')} CPUs",
          f"- peak bf16 for MFU: {peak}",
          f"- date: {report.get('date')}; commit {report.get('commit')}",
          f"- command: `{report.get('command')}`",
          f"- {report.get('minutes', 0):.1f} minutes of {report['budget_min']:.1f} budgeted", "",
          "| # | stage | status | minutes | budget |", "|---|---|---|---|---|"]
    md += [f"| {s['number'] or k} | {s['name']} | {s['status']} | {s['minutes']:.1f} | {s['budget_min']:.1f} |"
           for k, s in enumerate(report['stages'], 1)]
    for k, s in enumerate(report['stages'], 1):
        earlier = f" (from the check of {s['date']})" if s.get('date', report.get('date')) != report.get('date') else ''
        md += ["", f"## {s['number'] or k}. {s['name']}: {s['status']} ({s['minutes']:.1f} of "
               f"{s['budget_min']:.1f} min){earlier}", "", s['title'], ""]
        md += [f"- problem: {p}" for p in s['problems']] + [""] * bool(s['problems'])
        md += s['lines']
        for step in s['steps']:
            if step['status'] != 'ok':
                what = (f"failed with exit status {step['returncode']}" if step['status'] == 'failed' else
                        "overran: stopped")
                md += ["", f"`{step['label']}` {what} after {step['minutes']:.1f} min (its budget "
                       f"{step['budget_min']:.1f} and what the steps before it left): `{step['command']}`; the end of "
                       f"{step['log']}:", "", "```", step['tail'].rstrip(), "```"]
    atomic_write(os.path.join(out, 'gpu_report.md'), lambda f: f.write(('\n'.join(md) + '\n').encode()))


# -----------------------------------------------------------------------------
def select(defs, spec):
    """The stages named (or numbered, from 1) in spec, in their order; UserError naming the unknown."""
    if spec.strip() == 'all':
        return [d for d in defs if d['name'] not in NAMED_ONLY]
    names = [s.strip() for s in spec.split(',') if s.strip()]
    known = {**{d['name']: d for d in defs}, **{str(k): d for k, d in enumerate(defs, 1)}}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UserError(f"stages={spec!r}: unknown {', '.join(bad) or 'empty'}; use 'all' or names or numbers from: "
                        + ', '.join(f"{k} {d['name']}" for k, d in enumerate(defs, 1)))
    chosen = {known[n]['name'] for n in names}
    return [d for d in defs if d['name'] in chosen]


def main():
    if '--dry-run' in sys.argv[1:]:
        print("note: --dry-run is the old spelling of --dry_run (every option is --key=value); it still works",
              file=sys.stderr)
    argv = ['--dry_run' if a == '--dry-run' else a for a in sys.argv[1:]]
    configure(globals(), argv=argv)
    if bench_1b_mode not in ('auto', 'eager', 'compiled'):
        raise UserError(f"bench_1b_mode={bench_1b_mode!r}: use 'auto', 'eager' or 'compiled'")
    out, work = os.path.abspath(out_dir), os.path.abspath(work_dir) if work_dir else None

    def chosen_stages(work):
        names = [s['name'] for s in select(stage_list(out, work), stages)]
        budgets = plan(names, minutes)
        compiled = bench_1b_mode == 'compiled' or (bench_1b_mode == 'auto' and
                                                   budgets.get('table9', 0) >= COMPILED_1B_S)
        return [s for s in stage_list(out, work, compiled) if s['name'] in names], budgets
    chosen, budgets = chosen_stages(work or os.path.join(tempfile.gettempdir(), 'gpu-check-XXXX'))
    if dry_run:
        print(f"GPU check: {len(chosen)} stage(s) in {minutes:g} minutes: {sum(budgets.values()):.0f} s budgeted, "
              f"{RESERVE_S} s kept for starting up and the reports; report and logs into {out}, checkpoints and "
              f"data into {work or 'a temporary directory'}. A stage gets its budget plus what the stages before "
              f"it left; one with under {MIN_STAGE_S} s left is skipped.")
        for s in chosen:
            print(f"{s['number']} {s['name']}  {budgets[s['name']]:.0f} s  {s['title']}")
            total_share = sum(share for *_, share in s['steps'])
            for label, cmd, share in s['steps']:
                print(f"    [{label}, {budgets[s['name']] * share / total_share:.0f} s] {shown(cmd)}")
        rest = [s for s in stage_list(out, work or os.path.join(tempfile.gettempdir(), 'gpu-check-XXXX'))
                if s['name'] in NAMED_ONLY and s['name'] not in budgets]
        if rest:
            print(f"Only when named (--stages={','.join(s['name'] for s in rest)} --minutes=N), as they do not fit "
                  "a short check of all:")
            for s in rest:
                print(f"{s['number']} {s['name']}  {s['title']}")
                for label, cmd, _ in s['steps']:
                    print(f"    [{label}] {shown(cmd)}")
        return
    import torch
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU here (torch.cuda.is_available() is False): this check runs on a GPU machine; "
                        "--dry_run lists its stages anywhere")
    writable_dir(out, 'out_dir')
    lock_dir(out, 'out_dir')
    work = work or tempfile.mkdtemp(prefix='gpu-check-')
    try:
        chosen, budgets = chosen_stages(work)
        previous = read_json(os.path.join(out, 'gpu_report.json')) if stages.strip() != 'all' else None
        earlier = [s for s in (previous or {}).get('stages', []) if s['name'] not in budgets]
        info = device_info(shown([sys.executable, 'dev/gpu_check.py', *sys.argv[1:]]))
        print(f"GPU check on {info.get('device')}, torch {info.get('torch')}: {len(chosen)} stage(s) in "
              f"{minutes:g} minutes; report: {os.path.join(out, 'gpu_report.md')}", flush=True)
        report = run_all(chosen, budgets, out, work, info, earlier)
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
    bad = [s['name'] for s in report['stages'] if s['status'] != 'ok' and s['name'] in budgets]
    print(f"done in {report.get('minutes', 0):.1f} min: " + (f"{', '.join(bad)} not ok" if bad else "every stage ok")
          + f"; {os.path.join(out, 'gpu_report.md')}" + (f"; rerun: python dev/gpu_check.py --stages={','.join(bad)}"
                                                         if bad else ''))
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
