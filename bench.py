"""
Speed and memory of LIMe next to the baseline and other cross-layer variants. Every variant starts
from one seeded init (weights shared with the baseline are the baseline's), trains on the same batches
and is timed in interleaved rounds (A B C A B C ...), so a busy machine slows all alike. Beside each time, the
number of aten ops one step dispatches (forward and backward): a count, the same on a loaded machine.

$ python bench.py                                  # small CPU config, about a minute on 2 cores
$ python bench.py config/bench_1b.py               # the paper's 1B shapes (Table 9), one 80 GB GPU
$ python bench.py --variants=baseline,lime,lime:dynamic,hc --settings=mha-eager,gqa-compiled --json=b.json
$ python bench.py config/bench_depth_cpu.py         # LIMe's cost against depth: 8 to 64 layers, eager and compiled
$ python bench.py config/bench_depth_cpu.py --variants=baseline,lime,attnres:block,mhc,mudd,moda --settings=mha-eager
$ python bench.py config/bench_depth_cpu.py --settings=mha-eager --depths=16,64 --warmup=1 --iters=1  # op counts

Profiles, decode speed and memory over depth: dev/bench_detail.py.
"""
import contextlib
import dataclasses
import difflib
import gc
import json as jsonlib
import math
import os
import statistics
import time

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from nanolime.common import (UserError, autocast, configure, device_peak_flops, read_value,
                             resolve_device, resolve_dtype, script_options)
from nanolime.checkpoint import atomic_write, writable_dir
from nanolime.variants import VARIANT_PLAIN, parse_variant
import torch
from tqdm import tqdm
import relatives

# ----------------------------------------------------------------------------- config
n_layer = 4
depths = ''               # comma-separated n_layer values, each benchmarked in turn; '' = n_layer
n_head = 4
n_kv_head = None          # None: n_head (MHA)
gqa_kv_head = None        # KV heads in the `gqa` setting; None: n_kv_head if below n_head, else ~n_head/4
n_embd = 64
mlp_hidden = None         # None: the Llama rule
vocab_size = 256
block_size = 128          # sequence length T
batch_size = 8
# what to run
variants = 'baseline,lime,hc'  # comma-separated variant names (nanolime/variants.py): lime:average, mhc:static,
#                                attnres:block, lime+attnres:block, ...
settings = 'mha-eager'    # <mha|gqa|kv<N>>-<eager|compiled|ro>, comma-separated; compiled = torch.compile(
#                           model, fullgraph=True), ro = the same with mode='reduce-overhead' (CUDA graphs)
interleave = True         # False: one variant at a time (build, time, free), for models that do not fit together
warmup = 3                # untimed rounds first (compilation happens here)
iters = 20                # timed rounds; medians are reported
seed = 1337
device = 'auto'           # 'auto', 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'float32'         # 'float32', 'bfloat16', 'float16' (autocast) or 'auto'
threads = 0               # torch.set_num_threads; 0 = PyTorch's default
peak_flops = 0.0          # FLOP/s for MFU; 0 = from the GPU's name (none on CPU)
json = ''                 # also write every record to this file
count_ops = True          # also count the aten ops of one train step (forward + backward) under torch.profiler
# -----------------------------------------------------------------------------

MODES = {'eager': None, 'compiled': 'default', 'ro': 'reduce-overhead'}


OWN = {'n_kv_head': '--settings=kv<N>-eager', 'n_layer': '--n_layer (or --depths)'}  # where bench.py sets a shape


def variant_config(name, shape):
    """GPTConfig of a variant name (nanolime/variants.py's grammar: lime, lime:dynamic, lime+hc, attnres:block, ...) at
    the given shape; options after '~' must be the model's (GPTConfig) other than the shape, e.g.
    lime~tie_embeddings=False, each read as train.py reads its --key=value (so as sweep.py's runs read it)."""
    overrides, extra = parse_variant(name)
    fields = {f.name: f.default for f in dataclasses.fields(relatives.RelativesConfig)}
    own = {*shape, *OWN, 'block_size', 'vocab_size', 'n_head', 'n_embd', 'mlp_hidden'}
    model_keys = ', '.join(k for k in fields if k not in own and k not in VARIANT_PLAIN)
    for key, raw in extra.items():
        if key in own:
            raise UserError(f"variant '{name}': {key} is bench.py's own option, the same for every variant: "
                            f"{OWN.get(key, f'--{key}')}")
        if key not in fields:
            train_keys = script_options(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py'))
            if key in train_keys:
                raise UserError(f"variant '{name}': {key} is a training option; bench.py measures the model: give it "
                                f"model options (GPTConfig's) after '~': {model_keys}")
            close = difflib.get_close_matches(key, model_keys.split(', '), n=1)
            raise UserError(f"variant '{name}': unknown option '{key}'"
                            f"{f'; did you mean {close[0]!r}?' if close else ''} (model options after '~': "
                            f"{model_keys})")
        try:
            extra[key] = read_value(key, raw, fields[key])
        except UserError as e:
            raise UserError(f"variant '{name}': {e}") from None
    try:
        return relatives.RelativesConfig(**shape, **overrides, **extra)
    except TypeError as e:  # a field this model.py does not have
        raise UserError(f"variant '{name}' is not supported by this model.py ({e})") from None
    except ValueError as e:
        raise UserError(f"variant '{name}': {e}") from None


def parse_settings(spec, n_head, n_kv_head, gqa_kv_head):
    """'mha-eager,gqa-compiled' -> [(name, n_kv_head, torch.compile mode or None), ...]"""
    gqa = gqa_kv_head or (n_kv_head if n_kv_head and n_kv_head < n_head else max(1, n_head // 4))
    out = []
    for name in [s.strip() for s in spec.split(',')]:
        attn, _, mode = name.partition('-')
        n_kv = {'mha': n_head, 'gqa': gqa}.get(attn) or int(attn[2:] if attn[:2] == 'kv' and attn[2:].isdigit() else 0)
        if not n_kv or n_head % n_kv or mode not in MODES:
            raise UserError(f"bad setting '{name}': use <mha|gqa|kv<N>>-<eager|compiled|ro> with N dividing "
                            f"n_head={n_head}, e.g. --settings=mha-eager,gqa-compiled")
        out.append((name, n_kv, MODES[mode]))
    return out


def build_model(name, shape, seed, dev, state=None):
    """The variant's model, seeded; every weight it shares with the baseline is copied from `state` (the
    baseline's state dict): so all variants start from one init."""
    torch.manual_seed(seed)
    with torch.device(dev):  # initialised on the device: fast even for 1B models
        model = relatives.build_model(variant_config(name, shape))
    unexpected = model.load_state_dict(state or {}, strict=False).unexpected_keys
    assert not unexpected, f"{name} lacks baseline weights {unexpected}"
    return model


def train_step(r, x, y, ctx, mode):
    if mode == 'reduce-overhead':
        torch.compiler.cudagraph_mark_step_begin()
    with ctx:
        _, loss = r['fwd'](x, y)
    loss.backward()
    r['opt'].step()
    r['opt'].zero_grad(set_to_none=True)
    return loss


def aten_ops(fn):
    """fn() -> (its result, {aten op name: calls}): every aten operator fn dispatches, nested calls
    included (a matmul and the mm it calls count two), as torch.profiler records them. A count, not a
    time: the same on a loaded machine as on an idle one."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    counts = {}
    for event in prof.events():
        if event.name.startswith('aten::'):
            counts[event.name] = counts.get(event.name, 0) + 1
    return out, counts


def count_step_ops(r, x, y, ctx, mode):
    """{aten op: calls} in one training step's forward and backward (the optimizer's step left out, and not
    taken: the weights stay as they are). Compiled settings count the aten calls the compiled code still
    makes (matmuls, attention), not its fused kernels."""
    def step():
        if mode == 'reduce-overhead':
            torch.compiler.cudagraph_mark_step_begin()
        with ctx:
            _, loss = r['fwd'](x, y)
        loss.backward()
    r['opt'].zero_grad(set_to_none=True)
    counts = aten_ops(step)[1]
    r['opt'].zero_grad(set_to_none=True)
    return counts


def storage_key(t):
    s = t.untyped_storage()
    return (s.device.type, s.device.index, s.data_ptr())


def saved_tensor_bytes(fn, exclude=()):
    """fn() -> (its result, bytes of the distinct storages autograd saved for backward, each counted
    whole and once; storages whose storage_key is in `exclude`, e.g. parameters, are skipped)."""
    seen, exclude = {}, set(exclude)

    @torch.compiler.disable  # runs inside compiled code too: never trace the hook itself
    def pack(t):
        k = storage_key(t)
        if k not in exclude and k[2] != 0:
            seen[k] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def measure_memory(r, x, y, dev, ctx, mode):
    """One untimed train step -> bytes. CUDA: the step's peak allocation, less what the other resident
    variants hold (with ro, CUDA-graph pools recorded in warm-up are not counted). CPU: what autograd
    saves for backward (the memory LIMe adds to), parameters excluded."""
    if dev.type == 'cuda':
        torch.cuda.synchronize(dev)
        own = {storage_key(t): t.untyped_storage().nbytes() for t in [*r['model'].parameters(), *r['model'].buffers(),
               *[v for s in r['opt'].state.values() for v in s.values()]] if t.device == dev}
        others = torch.cuda.memory_allocated(dev) - sum(own.values())  # the other resident variants' bytes
        torch.cuda.reset_peak_memory_stats(dev)
        train_step(r, x, y, ctx, mode)
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - others
    params = {storage_key(p) for p in r['model'].parameters()}
    return saved_tensor_bytes(lambda: train_step(r, x, y, ctx, mode), exclude=params)[1]


def fresh_cache():
    """An empty compile cache inside the `with` (private, but what PyTorch's own benchmarks time compiles with;
    named fresh_inductor_cache before torch 2.8)."""
    from torch._inductor import utils
    return (getattr(utils, 'fresh_cache', None) or utils.fresh_inductor_cache)()


def run_setting(sname, n_kv, mode, names, shape, batches, dev, ctx, peak, save=lambda records: None):
    """Every variant in one setting -> records (a variant that fails to compile gets an 'error')."""
    shape = dict(shape, n_kv_head=n_kv)
    state = {k: v.cpu() for k, v in build_model('baseline', shape, seed, dev).state_dict().items()}
    records, runs = [], {}
    for group in ([names] if interleave else [[n] for n in names]):
        live = {}
        for name in group:  # only `live` refers to the models, so dropping them there frees them
            live[name] = r = dict(model=build_model(name, shape, seed, dev, state), times=[])
            r['fwd'] = torch.compile(r['model'], fullgraph=True, mode=mode) if mode else r['model']
            r['opt'] = r['model'].configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.95), dev.type)  # App. A
        rounds = dict(unit='round', leave=False, disable=None)  # a bar on a terminal only
        for i in tqdm(range(warmup), desc=f'{sname}: warm-up', **rounds):  # the first step compiles: a
            # failure is reported, the other variants kept
            for name, r in list(live.items()):
                try:
                    t0 = time.perf_counter()
                    # compiled: every variant compiles from empty caches, reusing no kernel that another
                    # variant (or an earlier run) built, so compile times compare
                    with fresh_cache() if mode and i == 0 else contextlib.nullcontext():
                        train_step(r, *batches[i], ctx, mode).item()
                    if i == 0:  # compiled: the first forward + backward, compilation included
                        r['first_s'] = time.perf_counter() - t0
                except Exception as e:
                    if not (mode or isinstance(e, torch.OutOfMemoryError)):
                        raise
                    error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"  # on one line
                    records.append(dict(setting=sname, variant=name, error=error))
                    del live[name]
                    r.clear()
        for r in live.values():
            r['mem'] = measure_memory(r, *batches[-1], dev, ctx, mode)
            r['ops'] = sum(count_step_ops(r, *batches[-1], ctx, mode).values()) if count_ops else None
        gc.collect()
        gc.disable()  # no collector pauses inside timed steps
        try:
            for i in tqdm(range(warmup, warmup + iters), desc=f'{sname}: timed', **rounds):
                for r in live.values():
                    t0 = time.perf_counter()  # the device is idle here: the last step ended in .item()
                    r['loss'] = train_step(r, *batches[i], ctx, mode).item()  # waits for the device
                    r['times'].append(time.perf_counter() - t0)
        finally:
            gc.enable()
        for name, r in live.items():
            runs[name], m, dt = r, r.pop('model'), statistics.median(r['times'])
            records.append(dict(
                setting=sname, variant=name, n_layer=shape['n_layer'], n_kv_head=n_kv, compile=mode or False,
                params=m.get_num_params(), first_step_s=r['first_s'],
                flops_per_token=m.flops_per_token(block_size), step_ms=1e3 * dt,
                step_ms_samples=[1e3 * t for t in r['times']], tok_s=batch_size * block_size / dt,
                mfu=m.estimate_mfu(batch_size * block_size, dt, peak) if peak else None, mem_bytes=r['mem'],
                mem_method='cuda_max_memory_allocated(step)' if dev.type == 'cuda' else 'saved_for_backward',
                aten_ops=r['ops'], loss_last=r['loss']))
            del m, r['fwd'], r['opt']  # keep the numbers, free the model
        save(records)  # a benchmark stopped later keeps these
        if not interleave:  # compiled code and CUDA-graph pools may still hold the freed model
            torch._dynamo.reset()
            gc.collect()
            if dev.type == 'cuda':
                torch.cuda.empty_cache()
    base = runs.get('baseline')
    for rec in records:  # ratios to the baseline; 'paired' is the median of the round-by-round ratios
        if base is not None and 'error' not in rec:
            r = runs[rec['variant']]
            rec['step_ratio'] = statistics.median(r['times']) / statistics.median(base['times'])
            rec['step_ratio_paired'] = statistics.median(a / b for a, b in zip(r['times'], base['times']))
            rec['mem_ratio'] = r['mem'] / base['mem']
            if count_ops:  # what the variant adds to the baseline's step, per layer
                rec['ops_ratio'] = r['ops'] / base['ops']
                rec['ops_added_per_layer'] = (r['ops'] - base['ops']) / shape['n_layer']
    return sorted(records, key=lambda rec: names.index(rec['variant']))


if __name__ == '__main__':
    config = configure(globals())
    names = [v.strip() for v in variants.split(',') if v.strip()]
    if not names or len(set(names)) != len(names):
        raise UserError(f"--variants needs distinct names, got '{variants}' (e.g. --variants=baseline,lime,hc)")
    if min(warmup, iters, batch_size, block_size) < 1:
        raise UserError("warmup, iters, batch_size and block_size must be >= 1 (the first step compiles)")
    if threads < 0:
        raise UserError(f"threads={threads} must be >= 0 (0: PyTorch's default)")
    if not (math.isfinite(peak_flops) and peak_flops >= 0):
        raise UserError(f"peak_flops={peak_flops} must be a finite number >= 0 (0: from the GPU's name)")
    if json:  # now, not after the benchmark
        if os.path.isdir(json):
            raise UserError(f"json={json} is a directory; name a file, e.g. --json={os.path.join(json, 'b.json')}")
        writable_dir(os.path.dirname(json) or '.', 'json')
    try:
        layer_list = [int(d) for d in depths.split(',')] if depths.strip() else [n_layer]
    except ValueError:
        raise UserError(f"depths={depths!r}: expected comma-separated layer counts, e.g. --depths=8,16,32") from None
    shape = dict(block_size=block_size, vocab_size=vocab_size, n_head=n_head, n_embd=n_embd, mlp_hidden=mlp_hidden)
    setting_list = parse_settings(settings, n_head, n_kv_head, gqa_kv_head)
    for name, n_kv, L in [(name, s[1], L) for name in names for s in setting_list for L in layer_list]:
        variant_config(name, dict(shape, n_kv_head=n_kv, n_layer=L))  # every error before any work
    if json and os.path.lexists(json):  # an earlier benchmark's records (a link is replaced, not written through)
        print(f"note: json={json} exists: this benchmark's records replace it")
    dev = torch.device(resolve_device(device))  # an indexed device: cuda:N
    ctx = autocast(str(dev), resolve_dtype(dtype, str(dev)))
    torch.set_num_threads(threads or torch.get_num_threads())
    peak = peak_flops or (device_peak_flops(torch.cuda.get_device_name(dev)) if dev.type == 'cuda' else None)
    # random tokens, independent random targets (the loss stays near log V: no denormals), a batch per step
    g = torch.Generator().manual_seed(seed + 1)
    batches = [tuple(torch.randint(vocab_size, (batch_size, block_size), generator=g).to(dev) for _ in 'xy')
               for _ in range(warmup + iters + 1)]
    print(f"bench: {', '.join(names)} | L={','.join(map(str, layer_list))} d={n_embd} H={n_head} V={vocab_size} B={batch_size} "
          f"T={block_size} {dtype} | {dev} threads={torch.get_num_threads()} | {warmup} + {iters} "
          f"{'interleaved' if interleave else 'sequential'} rounds\n{'L':>4} {'setting':>14} {'variant':>16} {'params':>12} "
          f"{'ms/iter':>9} {'x base':>7} {'tok/s':>10} {'MFU':>6} {'ops':>8} {'+ops/L':>7} {'mem MiB':>9} {'x base':>7} "
          f"{'1st step s':>10}",
          flush=True)
    if any(mode for _, _, mode in setting_list):  # the compiler's one-off start (imports, worker processes),
        with fresh_cache():                          # not to be counted in the first variant's compile time
            t = torch.ones(8, device=dev, requires_grad=True)
            torch.compile(lambda t: t.sin().sum(), fullgraph=True)(t).backward()
    records = []

    def save(more=()):
        """Every record so far into --json (after each variant, so that a run cut short keeps what it measured)."""
        if json:
            config.update(device=str(dev), threads=torch.get_num_threads(), peak_flops=peak)  # as resolved
            text = jsonlib.dumps(dict(config=config, records=records + list(more)), indent=1)
            atomic_write(json, lambda f: f.write(text.encode()))
    for L in layer_list:
        for s in setting_list:
            for r in run_setting(*s, names, dict(shape, n_layer=L), batches, dev, ctx, peak, save):
                records.append(r)
                mfu = '-' if r.get('mfu') is None else f"{100 * r['mfu']:.1f}%"
                ops = '-' if r.get('aten_ops') is None else r['aten_ops']
                added = '-' if r.get('ops_added_per_layer') is None else f"{r['ops_added_per_layer']:.1f}"
                print(f"{L:>4} {r['setting']:>14} {r['variant']:>16}  failed: {r['error']}" if 'error' in r else
                      f"{L:>4} {r['setting']:>14} {r['variant']:>16} {r['params']:>12,} {r['step_ms']:>9.2f} "
                      f"{r.get('step_ratio', float('nan')):>7.3f} {r['tok_s']:>10,.0f} {mfu:>6} {ops:>8} {added:>7} "
                      f"{r['mem_bytes'] / 2**20:>9.1f} {r.get('mem_ratio', float('nan')):>7.3f} "
                      f"{r['first_step_s']:>10.1f}", flush=True)
    print("1st step s: the first train step, compilation included (compiled settings: the compile time, from "
          "empty caches)")
    if count_ops:
        print("ops: aten ops in one train step's forward and backward (torch.profiler; a count, not a time); "
              "+ops/L: what the variant adds to the baseline's count, per layer")
    print("mem: " + ("peak allocated in one train step (weights, optimizer state, activations, gradients)" if
                     dev.type == 'cuda' else "bytes saved for backward (activations, not weights or optimizer state)"))
    if json:
        save()
        print(f"wrote {json} ({len(records)} records)")
