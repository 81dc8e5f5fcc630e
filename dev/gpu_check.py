"""
A GPU's first hour, stage by stage: the acceptance of the CUDA path, unattended, each stage within its own
budget (at most STAGE_MINUTES, so that any one stage runs alone inside a 10-minute command on a lent GPU),
leaving a report to paste. It has not yet run on a GPU.

$ python dev/gpu_check.py --out_dir=gpu-check      # on the GPU machine: every stage, then the report
$ python dev/gpu_check.py --dry-run                # anywhere: the stages, their commands and budgets
$ python dev/gpu_check.py --stages=2               # one stage alone (names or numbers, comma-separated)

The stages, in order (stage_list below), each one or more commands run as subprocesses within the stage's
time budget; a command that fails or runs over is recorded (and, run over, stopped with its children),
and the next one runs:
  1 cuda-tests  python -m pytest -m cuda: tests/test_cuda.py
  2 table9      bench.py at the paper's 1B shapes (config/bench_1b.py; compiled, bf16), GQA then MHA:
                baseline / LIMe / HC step time and peak memory, beside the paper's Table 9
  3 depth       bench.py at 32 layers x 512 (config/bench_depth_gpu.py; T 1024, bf16, compiled): LIMe's
                cost beside its FLOP ratio
  4 train       prepare.py shakespeare (GPT-2 BPE, offline), then train.py config/train_gpu_check.py
                (~124M parameters, compile, bf16, 300 iterations): tokens/s and MFU; sample.py on the
                GPU, and the checkpoint loaded and sampled on the CPU
  5 ddp         torchrun --standalone --nproc_per_node=1 train.py: DDP over NCCL, a small model
  6 depth-64    the same as 3 at 64 layers (two compiles of several minutes each: a stage of its own)
Into out_dir: gpu_report.md (device, driver, torch, date, every stage's result and minutes),
gpu_report.json (the same, with every number), the benchmarks' JSON and every command's output in
logs/. Both reports are rewritten after each stage, so a check cut short leaves what it got; a stage run
alone adds to the report in out_dir. Checkpoints and prepared data go to work_dir, a temporary directory
removed at the end unless named (name one to run stage 5 alone after stage 4 in another command).
The budgets come from compile times measured on a 2-core CPU (torch 2.13, train step forward and backward,
per variant: 51-90 s at 32 layers x 64, 170-250 s at 64 layers); a GPU machine's compiler usually has more
cores. The report's minutes are what to set them from (--budget_scale=2 doubles every one).
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


def missing_requirements():
    """The packages of requirements.txt that this Python cannot import (a fresh GPU machine often has torch
    and nothing else)."""
    import importlib.util
    with open(os.path.join(REPO, 'requirements.txt')) as f:
        names = [re.split(r'[=<>!~\[; ]', line.strip())[0] for line in f if line.strip() and line[0] != '#']
    return [n for n in names if importlib.util.find_spec({'pytest-xdist': 'xdist'}.get(n, n)) is None]


if __name__ == '__main__' and missing_requirements():
    sys.exit(f"error: dev/gpu_check.py needs {', '.join(missing_requirements())}, not installed here: "
             "pip install -r requirements.txt")
from nanolime.common import UserError, configure, peak_flops  # noqa: E402
from nanolime.checkpoint import atomic_write, lock_dir, read_log, writable_dir  # noqa: E402

# ----------------------------------------------------------------------------- config
out_dir = 'gpu-check'     # the reports, the benchmarks' JSON, logs/
work_dir = ''             # checkpoints and prepared data; '' = a temporary directory, removed at the end
stages = 'all'            # 'all', or stage names or numbers, comma-separated: table9,train or 2,4
dry_run = False           # print the stages, their commands and budgets, and exit (also --dry-run)
budget_scale = 1.0        # multiplies every budget
# -----------------------------------------------------------------------------
STAGE_MINUTES = 9.5       # what one stage's budgets may add up to (at budget_scale 1): alone in 10 minutes
KILL_GRACE_S = 15         # an overrunning command gets SIGTERM (train.py saves and exits), then SIGKILL
# the paper's Table 9 (App. F; H100, PyTorch Inductor, default mode): step ms, train peak memory GB
PAPER_TABLE9 = {'gqa': {'baseline': (66.404, 20.489), 'lime': (67.449, 20.490), 'hc': (83.265, 21.693)},
                'mha': {'baseline': (70.258, 22.364), 'lime': (77.607, 22.367), 'hc': (86.314, 23.007)}}


def depth_stage(name, layers, minutes, out):
    return dict(name=name, title=f"LIMe's cost at {layers} layers x 512 (config/bench_depth_gpu.py)",
                summary=lambda out, work: summarize_depth(out, work, (layers,)),
                steps=[(f'L{layers}', [sys.executable, 'bench.py', 'config/bench_depth_gpu.py', f'--depths={layers}',
                                       f"--json={os.path.join(out, f'bench_depth_L{layers}.json')}"], minutes)])


def stage_list(out, work):
    """The stages: name, title, steps [(label, command, budget in minutes)], summary(out, work) ->
    (numbers, markdown lines, problems). Commands run from the repository; out and work are absolute."""
    py, data = sys.executable, os.path.join(work, 'data')
    run_ck, ddp_ck = os.path.join(work, 'train'), os.path.join(work, 'ddp')
    prepare = [py, 'prepare.py', 'shakespeare', f'--data_dir={data}']
    defs = [
        dict(name='cuda-tests', title='CUDA tests: python -m pytest -m cuda', summary=summarize_tests,
             steps=[('pytest', [py, '-m', 'pytest', '-m', 'cuda', '-n0', '-rfEs'], 5.0)]),
        dict(name='table9', title="The paper's 1B shapes (config/bench_1b.py) beside its Table 9",
             summary=summarize_table9,
             steps=[(attn, [py, 'bench.py', 'config/bench_1b.py', f'--settings={attn}-compiled', '--warmup=3',
                            '--iters=10', f"--json={os.path.join(out, f'bench_1b_{attn}.json')}"], 4.5)
                    for attn in ('gqa', 'mha')]),
        depth_stage('depth', 32, 3.5, out),  # two compiles of 51-90 s each, 10 timed steps
        dict(name='train', title='A ~124M-parameter run (config/train_gpu_check.py), sampled on GPU and CPU',
             summary=summarize_train,
             steps=[('prepare', prepare, 0.4),
                    ('train', [py, 'train.py', 'config/train_gpu_check.py', f'--data_dir={data}',
                               f'--out_dir={run_ck}'], 3.0),  # one compile of 12 layers, 300 steps
                    *[(f'sample-{d}', [py, 'sample.py', f'--out_dir={run_ck}', f'--device={d}', '--num_samples=1',
                                       '--max_new_tokens=100', '--start=ROMEO:'], 0.3) for d in ('cuda', 'cpu')]]),
        dict(name='ddp', title='DDP over NCCL: torchrun --standalone --nproc_per_node=1 train.py',
             summary=summarize_ddp,
             steps=[('prepare', prepare, 0.2),  # made by stage 4 already, unless it is run alone
                    ('torchrun', [py, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1',
                                  'train.py', 'config/train_gpu_check.py', f'--data_dir={data}', f'--out_dir={ddp_ck}',
                                  '--n_layer=4', '--n_head=4', '--n_embd=256', '--max_iters=30',
                                  '--lr_decay_iters=30', '--warmup_iters=5', '--eval_interval=30',
                                  '--log_interval=5'], 1.8)]),
        depth_stage('depth-64', 64, 9.0, out),  # two compiles of 170-250 s each
    ]
    return [dict(d, number=k) for k, d in enumerate(defs, 1)]


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


def run_stage(stage, out, work, scale=1.0):
    """Every step of a stage, each with its own budget plus whatever the steps before it left unused of
    theirs, then the stage's summary: its record (status 'ok', 'failed' or 'overran')."""
    budgets = [minutes * 60 * scale for _, _, minutes in stage['steps']]
    start = time.time()
    deadline, steps = start + sum(budgets), []
    os.makedirs(os.path.join(out, 'logs'), exist_ok=True)
    for i, (label, cmd, _) in enumerate(stage['steps']):
        log = os.path.join(out, 'logs', f"{stage['name']}-{label}.log")
        status, code, seconds = run_step(cmd, log, deadline - sum(budgets[i + 1:]) - time.time())
        steps.append(dict(label=label, command=shown(cmd), status=status, returncode=code,
                          minutes=round(seconds / 60, 2), budget_min=round(budgets[i] / 60, 2),
                          log=os.path.relpath(log, out), tail=tail(log) if status != 'ok' else None))
    record = dict(number=stage.get('number'), name=stage['name'], title=stage['title'], steps=steps,
                  budget_min=round(sum(budgets) / 60, 2), minutes=round((time.time() - start) / 60, 2),
                  results=None, lines=[], problems=[])
    try:
        record['results'], record['lines'], record['problems'] = stage['summary'](out, work)
    except Exception as e:  # a summary that cannot read what a failed step left: noted, the check goes on
        record['problems'] = [f"no summary: {type(e).__name__}: {e}"]
    statuses = {s['status'] for s in steps}
    record['status'] = 'overran' if 'overran' in statuses else 'failed' if 'failed' in statuses or \
        record['problems'] else 'ok'
    return record


def run_all(stage_defs, out, work, info, scale=1.0):
    """Run the stages in order; the reports are rewritten after each. Returns the report."""
    report = dict(info, stages=[], budget_min=round(sum(m for s in stage_defs for *_, m in s['steps']) * scale, 2))
    for k, stage in enumerate(stage_defs, 1):
        print(f"[{time.strftime('%H:%M:%S')}] stage {stage.get('number', k)} ({k} of {len(stage_defs)}) "
              f"{stage['name']}: {stage['title']}", flush=True)
        record = run_stage(stage, out, work, scale)
        report['stages'].append(record)
        report['minutes'] = round(sum(s['minutes'] for s in report['stages']), 2)
        write_report(report, out)
        print(f"  {record['status']} in {record['minutes']:.1f} of {record['budget_min']:.1f} min"
              + ''.join(f"\n  problem: {p}" for p in record['problems']), flush=True)
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
    rows, problems, shape = [], [], ''
    lines = ["| setting | variant | step ms | × baseline | paper ms | paper × baseline | peak GB | × baseline | "
             "paper GB | paper × baseline | MFU | 1st step s |", "|" + "---|" * 12]
    for attn in ('gqa', 'mha'):
        data = read_json(os.path.join(out, f'bench_1b_{attn}.json'))
        if data is None:
            problems.append(f"{attn}: no results (bench_1b_{attn}.json was not written)")
            continue
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
    lines += ["", f"Batch {shape or '?'} tokens (the paper does not give its batch: compare the ratios); peak GB: "
              "torch.cuda.max_memory_allocated over one train step, 1e9 bytes; 1st step: compiling included. The "
              "paper's reduce-overhead rows: `python bench.py config/bench_1b.py --settings=gqa-ro,mha-ro`."]
    return rows, lines, problems


def summarize_depth(out, work, depths):
    """LIMe / baseline at each depth, beside the FLOP ratio."""
    rows, problems = [], []
    lines = ["| layers | baseline ms | LIMe ms | LIMe / baseline step (paired) | FLOP ratio | peak memory ratio | "
             "LIMe peak GB | compile s, baseline → LIMe |", "|" + "---|" * 8]
    for L in depths:
        data = read_json(os.path.join(out, f'bench_depth_L{L}.json'))
        recs = {r['variant']: r for r in data['records']} if data else {}
        bad = '; '.join(f"{v}: {r['error']}" for v, r in recs.items() if 'error' in r)
        if set(recs) != {'baseline', 'lime'} or bad:
            problems.append(f"{L} layers: {bad or f'no results (bench_depth_L{L}.json was not written)'}")
            lines.append(f"| {L} | {bad[:200] or 'no results'} |")
            continue
        b, m = recs['baseline'], recs['lime']
        row = dict(n_layer=L, baseline_ms=b['step_ms'], lime_ms=m['step_ms'], step_ratio=m['step_ratio'],
                   step_ratio_paired=m['step_ratio_paired'], flop_ratio=m['flops_per_token'] / b['flops_per_token'],
                   mem_ratio=m['mem_ratio'], lime_mem_gb=m['mem_bytes'] / 1e9,
                   compile_s=(b['first_step_s'], m['first_step_s']))
        rows.append(row)
        lines.append(f"| {L} | {row['baseline_ms']:.1f} | {row['lime_ms']:.1f} | {row['step_ratio']:.3f} "
                     f"({row['step_ratio_paired']:.3f}) | {row['flop_ratio']:.3f} | {row['mem_ratio']:.3f} | "
                     f"{row['lime_mem_gb']:.1f} | {b['first_step_s']:.0f} → {m['first_step_s']:.0f} |")
    return rows, lines, problems


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
    """What sample.py printed (its first sample), from its log."""
    text = tail(os.path.join(out, 'logs', f'train-{label}.log'), 200).split('\n', 1)
    return text[1].split('---------------')[0].strip() if len(text) > 1 and text[0].startswith('$') else ''


def summarize_train(out, work):
    nums = training_numbers(os.path.join(work, 'train'), warm=20)
    params = re.search(r'model: ([\d.]+)M parameters', tail(os.path.join(out, 'logs', 'train-train.log'), 400))
    nums.update(params_m=params and float(params.group(1)),
                samples={d: sample_text(out, f'sample-{d}')[:400] for d in ('cuda', 'cpu')})
    problems = []
    if not nums['iters']:
        problems.append("no training iteration was logged")
    elif not nums['last_loss'] < nums['first_loss'] - 1.0:
        problems.append(f"the loss did not fall: {nums['first_loss']:.3f} at iteration 1, "
                        f"{nums['last_loss']:.3f} at the last")
    problems += [f"sample.py on {d} printed nothing" for d, text in nums['samples'].items() if not text]
    mfu = "n/a (the GPU's name is not in common.PEAK_FLOPS)" if nums['mfu'] is None else f"{100 * nums['mfu']:.1f} %"
    lines = [f"- {nums['params_m']}M parameters, {nums['iters']} iterations; tokens/s "
             f"{fmt(nums['tokens_per_s'], ',.0f')}, MFU {mfu} (medians after iteration 20)",
             f"- loss {fmt(nums['first_loss'])} at iteration 1, {fmt(nums['last_loss'])} at the last; val loss "
             + ', '.join(f"{v:.3f} at {it}" for it, v in nums['val_loss'])]
    lines += [f"- sample on {d}: `{' '.join(text.split())[:200]}`" for d, text in nums['samples'].items()]
    return nums, lines, problems


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
                cpus=os.cpu_count(), peak_flops=info.get('device') and peak_flops(info['device']))


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
        md += ["", f"## {s['number'] or k}. {s['name']}: {s['status']} ({s['minutes']:.1f} of "
               f"{s['budget_min']:.1f} min)", "", s['title'], ""]
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
        return defs
    names = [s.strip() for s in spec.split(',') if s.strip()]
    known = {**{d['name']: d for d in defs}, **{str(k): d for k, d in enumerate(defs, 1)}}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UserError(f"stages={spec!r}: unknown {', '.join(bad) or 'empty'}; use 'all' or names or numbers from: "
                        + ', '.join(f"{k} {d['name']}" for k, d in enumerate(defs, 1)))
    chosen = {known[n]['name'] for n in names}
    return [d for d in defs if d['name'] in chosen]


def main():
    argv = ['--dry_run' if a == '--dry-run' else a for a in sys.argv[1:]]
    configure(globals(), argv=argv)
    if not (math.isfinite(budget_scale) and budget_scale > 0):
        raise UserError(f"budget_scale={budget_scale} must be a number > 0 (2.0 doubles every budget)")
    out, work = os.path.abspath(out_dir), os.path.abspath(work_dir) if work_dir else None
    chosen = select(stage_list(out, work or os.path.join(tempfile.gettempdir(), 'gpu-check-XXXX')), stages)
    total = sum(m for s in chosen for *_, m in s['steps']) * budget_scale
    if dry_run:
        print(f"GPU check: {len(chosen)} stages, {total:.1f} minutes budgeted (at most {STAGE_MINUTES} a stage at "
              f"budget_scale 1); report and logs into {out}, checkpoints and data into {work or 'a temporary directory'}")
        for s in chosen:
            print(f"{s['number']} {s['name']}  {sum(m for *_, m in s['steps']) * budget_scale:.2f} min  {s['title']}")
            for label, cmd, minutes in s['steps']:
                print(f"    [{label}, {minutes * budget_scale:.2f} min] {shown(cmd)}")
        return
    import torch
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU here (torch.cuda.is_available() is False): this check runs on a GPU machine; "
                        "--dry-run lists its stages anywhere")
    writable_dir(out, 'out_dir')
    lock_dir(out, 'out_dir')
    work = work or tempfile.mkdtemp(prefix='gpu-check-')
    try:
        info = device_info(shown([sys.executable, 'dev/gpu_check.py', *sys.argv[1:]]))
        print(f"GPU check on {info.get('device')}, torch {info.get('torch')}: {len(chosen)} stages, {total:.1f} "
              f"minutes budgeted; report: {os.path.join(out, 'gpu_report.md')}", flush=True)
        report = run_all(select(stage_list(out, work), stages), out, work, info, budget_scale)
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
    bad = [s['name'] for s in report['stages'] if s['status'] != 'ok']
    print(f"done in {report.get('minutes', 0):.1f} min: " + (f"{', '.join(bad)} not ok" if bad else "every stage ok")
          + f"; {os.path.join(out, 'gpu_report.md')}")
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
