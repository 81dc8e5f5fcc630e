"""
Where LIMe's time and memory go, next to the baseline: a developer's companion to bench.py. It takes
bench.py's config keys and files (config/bench_*.py) and builds the variants from one init the same way.

$ python dev/bench_detail.py config/bench_cpu_16x128.py                     # every section
$ python dev/bench_detail.py config/bench_cpu_16x128.py --sections=profile  # top ops, LIMe minus baseline
$ python dev/bench_detail.py --sections=memory --depths=4,8,16 --settings=mha-eager,mha-compiled
$ python dev/bench_detail.py config/bench_depth_cpu.py --sections=ops --depths=16,64 --settings=mha-eager

profile  torch.profiler over profile_steps train steps per variant, interleaved: the top ops by self
         time (device time on CUDA), then each variant's per-op difference to the baseline.
decode   generate() tokens/s with and without the KV cache (greedy), each variant; eager settings only.
ops      aten ops in one train step's forward and backward (torch.profiler), at each of `depths`: each
         variant's count per layer, what it adds to the baseline's per layer, and the ops that add most.
         A count, not a time: measured alike on a loaded machine.
memory   bytes saved for backward (CPU) or the step's peak allocation (CUDA), as bench.py measures it,
         at each of `depths`, each variant over the baseline: LIMe's ratio should stay flat in depth.
Not for timing comparisons: the profiler's own overhead differs between ops; bench.py measures those.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
import bench  # noqa: E402
from bench import build_model, count_step_ops, measure_memory, parse_settings, train_step  # noqa: E402
from nanolime.common import UserError, autocast, configure, resolve_device, resolve_dtype  # noqa: E402

# ----------------------------------------------------------------------------- config
# bench.py's keys and defaults (model shape, variants, settings, device, ...), so its config files work here
globals().update({k: v for k, v in vars(bench).items()
                  if not k.startswith('_') and (v is None or isinstance(v, (bool, int, float, str)))})
sections = 'profile,decode,memory'  # and ops
profile_steps = 3         # profiled train steps per variant (after `warmup` unprofiled ones)
profile_top = 15          # ops listed per variant and in each difference
decode_tokens = 256       # new tokens per generate() call
decode_prompt = 1         # prompt length
decode_batch = 1
decode_iters = 3          # timed rounds (interleaved over variants and cache on/off); medians
depths = ''               # memory: comma list of n_layer values; '' = n_layer/4, n_layer/2, n_layer
# -----------------------------------------------------------------------------


def variant_models(shape, **kw):
    """{variant: model}, all from one seeded init, as in bench.py."""
    shape = dict(shape, **kw)
    state = {k: v.cpu() for k, v in build_model('baseline', shape, seed, dev).state_dict().items()}
    return {name: build_model(name, shape, seed, dev, state) for name in names}


def runner(model, mode):
    fwd = torch.compile(model, fullgraph=True, mode=mode) if mode else model
    return dict(model=model, fwd=fwd, opt=model.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.95), dev.type))


def batch(i):
    g = torch.Generator().manual_seed(seed + 1 + i)
    return tuple(torch.randint(vocab_size, (batch_size, block_size), generator=g).to(dev) for _ in 'xy')


def sync():
    if dev.type == 'cuda':
        torch.cuda.synchronize(dev)


MATMULS = ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm')
COPIES = ('aten::copy_', 'aten::cat', 'aten::stack', 'aten::clone', 'aten::zero_', 'aten::fill_')


def phase(event):
    """'backward' for an op autograd's engine ran, 'optimizer' for the optimizer's step, else 'forward'."""
    while event is not None:
        if event.name.startswith('autograd::engine::evaluate_function'):
            return 'backward'
        if event.name.startswith('Optimizer.'):
            return 'optimizer'
        event = event.cpu_parent
    return 'forward'


def profile_ops(r, mode, x, y):
    """One train step under torch.profiler -> ({op: self ms}, {(phase, kind): self CPU ms}); kind: matmul,
    copy (copies, concatenations, fills) or other."""
    cuda = dev.type == 'cuda'
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        train_step(r, x, y, ctx, mode)
        sync()
    ops, kinds = {}, {}
    for e in prof.key_averages():
        ms = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e3
        if ms > 0:
            ops[e.key] = ops.get(e.key, 0.0) + ms
    for e in prof.events():
        kind = 'matmul' if e.name in MATMULS else 'copy' if e.name in COPIES else 'other'
        key = (phase(e), kind)
        kinds[key] = kinds.get(key, 0.0) + e.self_cpu_time_total / 1e3
    return ops, kinds


def profile_section(sname, n_kv, mode):
    runners = {name: runner(m, mode) for name, m in variant_models(shape, n_kv_head=n_kv).items()}
    for i in range(warmup):
        for r in runners.values():
            train_step(r, *batch(i), ctx, mode)
    acc, by_kind = {name: {} for name in runners}, {name: {} for name in runners}
    for i in range(profile_steps):  # interleaved, like bench.py's timing
        for name, r in runners.items():
            ops, kinds = profile_ops(r, mode, *batch(warmup + i))
            for op, ms in ops.items():
                acc[name][op] = acc[name].get(op, 0.0) + ms / profile_steps
            for key, ms in kinds.items():
                by_kind[name][key] = by_kind[name].get(key, 0.0) + ms / profile_steps
    for name, ops in acc.items():
        total = sum(ops.values())
        print(f"\n[{sname}] {name}: self {'device' if dev.type == 'cuda' else 'CPU'} time per step {total:.2f} ms")
        for op, ms in sorted(ops.items(), key=lambda item: -item[1])[:profile_top]:
            print(f"  {op[:70]:70s} {ms:9.2f}  {100 * ms / max(total, 1e-9):5.1f}%")
    base = acc.get('baseline')
    for name, ops in acc.items():
        if base is None or name == 'baseline':
            continue
        diff = {op: ops.get(op, 0.0) - base.get(op, 0.0) for op in set(ops) | set(base)}
        print(f"\n[{sname}] {name} minus baseline, self ms per step: {sum(ops.values()):.2f} vs "
              f"{sum(base.values()):.2f} ({sum(diff.values()):+.2f})")
        for op, d in sorted(diff.items(), key=lambda item: -abs(item[1]))[:profile_top]:
            print(f"  {op[:70]:70s} {d:+9.2f}   ({ops.get(op, 0.0):.2f} vs {base.get(op, 0.0):.2f})")
        mine, theirs = by_kind[name], by_kind['baseline']
        extra = sum(mine.values()) - sum(theirs.values())
        print(f"[{sname}] {name} minus baseline by phase and kind, self CPU ms per step (share of the extra "
              f"{extra:+.2f} ms; total {sum(mine.values()) / sum(theirs.values()):.3f}x the baseline's):")
        for key in sorted(set(mine) | set(theirs)):
            d = mine.get(key, 0.0) - theirs.get(key, 0.0)
            print(f"  {key[0]:>9} {key[1]:>6} {d:+9.2f} ({100 * d / extra:+5.1f}%)   "
                  f"({mine.get(key, 0.0):.2f} vs {theirs.get(key, 0.0):.2f})")


def decode_section(sname, n_kv):
    """Eager generate(); the decode models' block_size fits prompt + new tokens, so the cache never slides."""
    models = variant_models(shape, n_kv_head=n_kv, block_size=max(block_size, decode_prompt + decode_tokens))
    for m in models.values():
        m.eval()
    g = torch.Generator().manual_seed(seed + 2)
    prompt = torch.randint(vocab_size, (decode_batch, decode_prompt), generator=g).to(dev)
    times = {(name, c): [] for name in models for c in (True, False)}
    with torch.no_grad(), ctx:
        for rnd in range(decode_iters + 1):  # round 0 warms up
            for (name, cache), ts in times.items():
                sync()
                t0 = time.perf_counter()
                models[name].generate(prompt, decode_tokens if rnd else 8, top_k=1, use_cache=cache)
                sync()
                if rnd:
                    ts.append(time.perf_counter() - t0)
    print(f"\n[{sname}] decode: {decode_tokens} new tokens, batch {decode_batch}, prompt {decode_prompt}, greedy")
    print(f"{'variant':>16} {'tok/s cache':>12} {'tok/s no cache':>15} {'speedup':>8}")
    for name in models:
        cached, plain = (decode_batch * decode_tokens / statistics.median(times[(name, c)]) for c in (True, False))
        print(f"{name:>16} {cached:>12,.0f} {plain:>15,.0f} {cached / plain:>7.2f}x")


def ops_section(sname, n_kv, mode):
    print(f"\n[{sname}] aten ops per train step (forward and backward), per layer")
    for L in layer_counts:
        torch._dynamo.reset()
        counts = {}
        for name, model in variant_models(shape, n_kv_head=n_kv, n_layer=L).items():
            r = runner(model, mode)
            train_step(r, *batch(0), ctx, mode)  # the first step (compiles): not counted
            counts[name] = count_step_ops(r, *batch(1), ctx, mode)
        base = counts.get('baseline', {})
        for name, ops in counts.items():
            added = {op: (n - base.get(op, 0)) / L for op, n in ops.items()}
            top = sorted(((n, op) for op, n in added.items() if n), reverse=True)[:profile_top] if base else []
            print(f"{L:>4} layers {name:>16}: {sum(ops.values()) / L:8.1f} per layer" + (
                f", {(sum(ops.values()) - sum(base.values())) / L:+.1f} over the baseline: "
                + ' '.join(f"{op[6:]} {n:+.1f}" for n, op in top) if base and name != 'baseline' else ''))


def memory_section(sname, n_kv, mode):
    what = 'peak MiB in one step' if dev.type == 'cuda' else 'MiB saved for backward'
    print(f"\n[{sname}] memory ({what}; x = over the baseline at the same depth)")
    print(f"{'n_layer':>8} " + ' '.join(f"{name:>24}" for name in names))
    ratios = {name: [] for name in names}
    for L in layer_counts:
        torch._dynamo.reset()  # a fresh compile per depth: no recompile limits across depths
        cells, mem = [], {}
        for name, model in variant_models(shape, n_kv_head=n_kv, n_layer=L).items():
            r = runner(model, mode)
            try:
                train_step(r, *batch(0), ctx, mode)  # compiles here
                mem[name] = measure_memory(r, *batch(1), dev, ctx, mode)
            except Exception as e:
                if not mode:
                    raise
                cells.append(f"{'failed: ' + type(e).__name__:>24}")
                continue
            x = mem[name] / mem['baseline'] if 'baseline' in mem else float('nan')
            ratios[name].append(x)
            cells.append(f"{mem[name] / 2**20:>14.2f} ({x:.3f}x)")
        print(f"{L:>8} " + ' '.join(cells))
    for name, xs in ratios.items():
        if name != 'baseline' and len(xs) > 1:
            print(f"  {name}: ratio {xs[0]:.3f}x at {layer_counts[0]} layers -> {xs[-1]:.3f}x at "
                  f"{layer_counts[-1]} ({xs[-1] - xs[0]:+.3f})")


configure(globals())
names = [v.strip() for v in variants.split(',') if v.strip()]
chosen = [s.strip() for s in sections.split(',') if s.strip()]
if not chosen or any(s not in ('profile', 'decode', 'ops', 'memory') for s in chosen):
    raise UserError(f"--sections={sections!r}: use a comma list of profile, decode, ops and memory")
if not names:
    raise UserError("--variants is empty (e.g. --variants=baseline,lime)")
if depths and not all(d.strip().isdigit() and int(d) > 0 for d in depths.split(',')):
    raise UserError(f"--depths={depths!r}: use a comma list of layer counts, e.g. --depths=4,8,16")
layer_counts = [int(d) for d in depths.split(',')] if depths else \
    sorted({max(1, n_layer // 4), max(1, n_layer // 2), n_layer})
shape = dict(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
             mlp_hidden=mlp_hidden)
setting_list = parse_settings(settings, n_head, n_kv_head, gqa_kv_head)
for name in names:  # every error before any work
    for _, n_kv, _ in setting_list:
        bench.variant_config(name, dict(shape, n_kv_head=n_kv))
dev = torch.device(resolve_device(device))
ctx = autocast(str(dev), resolve_dtype(dtype, str(dev)))
torch.set_num_threads(threads or torch.get_num_threads())
print(f"bench_detail: {', '.join(names)} | L={n_layer} d={n_embd} H={n_head} V={vocab_size} B={batch_size} "
      f"T={block_size} {dtype} | {dev} threads={torch.get_num_threads()}")
for sname, n_kv, mode in setting_list:
    if 'profile' in chosen:
        profile_section(sname, n_kv, mode)
    if 'decode' in chosen and not mode:  # decoding runs eager
        decode_section(sname, n_kv)
    if 'ops' in chosen:
        ops_section(sname, n_kv, mode)
    if 'memory' in chosen:
        memory_section(sname, n_kv, mode)
