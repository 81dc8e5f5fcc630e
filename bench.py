"""
Benchmark LIMe against the baseline (and Hyper-Connections) on the same config and batches.

$ python bench.py                                   # small default config, CPU, < 2 min on 2 cores
$ python bench.py config/bench_cpu_ii.py            # one of the issue's CPU targets
$ python bench.py config/bench_1b.py                # the paper's 1B shapes (Table 9), GPU
$ python bench.py --variants=baseline,lime,lime-average,lime-last-2,hc,hc-dynamic
$ python bench.py --settings=mha-eager,gqa-eager,mha-compiled --json=bench.json
$ python bench.py config/bench_cpu_ii.py --profile=True --decode=False

Variants (one model each, built from one seeded baseline init; shared weights identical):
  baseline          plain Llama
  lime              LIMe, full router (= lime-full)
  lime-<router>     LIMe with a router variant: average, dynamic, last-<j>, first-<j>
  hc, hc-dynamic    Hyper-Connections, rate 4 (hc<n>, hc<n>-dynamic for rate n)
Settings (comma list; each a dash-joined choice of attention and mode, missing parts from the config):
  attention: mha (n_kv_head = n_head), gqa (n_kv_head = gqa_kv_head), kv<N>
  mode:      eager, compiled (torch.compile default mode), ro (mode reduce-overhead)
  e.g. --settings=mha-eager,gqa-eager,mha-compiled,gqa-ro

Per variant x setting: train step time (forward + backward + AdamW step; median over `iters`
interleaved rounds A B C A B C ... after `warmup` rounds), tokens/s, MFU (peak from the GPU's name
via model.GPU_PEAK_FLOPS, or --peak_flops), achieved TFLOP/s (3x model.flops_per_token), peak memory
and decode throughput of generate() with and without the KV cache.

Peak memory. CUDA, interleave=False (one variant on the GPU at a time): torch.cuda.max_memory_allocated()
from just before the variant is built to after its memory step, minus what was allocated before (so
compile and CUDA-graph pools count); interleave=True: the peak over one train step after a reset, minus
what the other resident variants hold. CPU: distinct storages saved for backward (saved_tensors_hooks,
dedup by untyped_storage().data_ptr(), storage nbytes, parameter storages excluded; through the compiled
model when compiled) plus parameters, buffers and optimizer state. (Gradients and backward temporaries
are not in the CPU measure.)

Decode runs the eager model (batch decode_batch, greedy) in every setting; compiled settings compile
only the train step. On a busy CPU pass --threads=1: OpenMP threads spinning on shared cores make
steps many times slower and noisy.

Data: random tokens with independent random targets (or `dataset=<name>`: data/<name>/train.bin), one
fresh batch per step index, the same for every variant; losses stay ~log(vocab_size) so nothing
collapses to denormals (and denormals are flushed on CPU anyway).
"""
import contextlib
import difflib
import gc
import json as jsonlib
import os
import statistics
import sys
import time
from ast import literal_eval

import torch

# ----------------------------------------------------------------------------- config (nanoGPT style)
# model shape (the default: a small CPU config that finishes in under 2 minutes on 2 cores)
n_layer = 4
n_head = 4
n_kv_head = None          # None: n_head (MHA)
gqa_kv_head = None        # KV heads of the `gqa` setting; None: n_kv_head if < n_head, else ~n_head/4
n_embd = 64
mlp_hidden = None         # None: the Llama rule
vocab_size = 256
block_size = 128          # training sequence length T
batch_size = 8
dropout = 0.0
# what to run
variants = 'baseline,lime,hc'
settings = ''             # '' = one setting from n_kv_head and compile
compile = False           # False/True, or a torch.compile mode: 'default', 'reduce-overhead', 'max-autotune'
device = 'cpu'            # 'cpu', 'cuda', 'cuda:1', ...
dtype = 'float32'         # 'float32', 'bfloat16' or 'float16' (autocast)
threads = 0               # torch.set_num_threads; 0 = leave PyTorch's default
seed = 1337
dataset = ''              # '' = random tokens with random targets; else data/<dataset>/train.bin
# timing
warmup = 3                # interleaved rounds before timing (compilation happens here)
iters = 20                # interleaved timed rounds; medians are reported
interleave = True         # False: one variant at a time (build, time, free), for models too big to co-reside
# optimizer (the paper's App. A)
learning_rate = 1e-3
router_lr = 1e-2
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 0.0           # 0 = no clipping (the step is forward + backward + AdamW)
# decode throughput of generate(): batch decode_batch, a decode_prompt-token prompt, decode_tokens new
decode = True
decode_tokens = 512
decode_prompt = 1
decode_batch = 1
decode_iters = 1          # interleaved rounds, median
decode_block_size = 0     # block_size of the decode model; 0 = max(block_size, prompt + tokens)
# reporting
peak_flops = 0.0          # FLOP/s for MFU; 0 = from the GPU's name (model.GPU_PEAK_FLOPS), none on CPU
json = ''                 # write one record per variant x setting to this file
profile = False           # torch.profiler over profile_steps train steps per variant: top ops + breakdown
profile_steps = 5
profile_top = 15
# -----------------------------------------------------------------------------
CONFIG_KEYS = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]

HC_RATE = 4


def fail(msg, code=2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def closest(key, keys):
    m = difflib.get_close_matches(key, keys, n=1, cutoff=0.0)
    return f" (did you mean '{m[0]}'?)" if m else ""


def configure(argv, defaults):
    """nanoGPT configurator: config files are exec'd, then --key=value overrides (literal_eval)."""
    cfg = dict(defaults)
    for arg in argv:
        if not arg.startswith('--'):
            if not os.path.isfile(arg):
                fail(f"config file '{arg}' not found")
            scope = {}
            with open(arg) as f:
                exec(f.read(), scope)
            for k, v in scope.items():
                if k.startswith('_') or isinstance(v, type(sys)) or callable(v):
                    continue
                if k not in cfg:
                    fail(f"unknown config key '{k}' in {arg}{closest(k, list(cfg))}")
                cfg[k] = v
            continue
        key, eq, val = arg[2:].partition('=')
        if not eq:
            fail(f"expected --key=value, got '{arg}'")
        if key not in cfg:
            fail(f"unknown config key '{key}'{closest(key, list(cfg))}")
        try:
            val = literal_eval(val)
        except (ValueError, SyntaxError):
            pass  # a bare string
        old = cfg[key]
        if old is not None and val is not None and type(old) is not type(val):
            if isinstance(old, float) and isinstance(val, int) and not isinstance(val, bool):
                val = float(val)
            elif key == 'compile' and isinstance(val, str):
                pass  # a compile mode
            elif isinstance(old, str):
                val = str(val)  # e.g. --variants=lime
            else:
                fail(f"--{key} expects {type(old).__name__}, got {val!r}")
        cfg[key] = val
    return cfg


# ----------------------------------------------------------------------------- memory
def storage_key(t):
    s = t.untyped_storage()
    return (s.device.type, s.device.index, s.data_ptr())


def saved_tensor_bytes(fn, exclude=()):
    """Run fn() and return (its result, bytes of the distinct storages autograd saved for backward).

    Every tensor saved for backward is packed through saved_tensors_hooks; storages are
    de-duplicated by data pointer and counted at their full nbytes (a saved view counts its whole
    base storage). Storages whose key (see storage_key) is in `exclude` (e.g. parameters) are skipped.
    """
    seen = {}
    exclude = set(exclude)

    @torch.compiler.disable  # called from compiled code too: never trace the hook itself
    def pack(t):
        k = storage_key(t)
        if k not in exclude and k[2] != 0:
            seen[k] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def tensor_bytes(tensors):
    seen = {}
    for t in tensors:
        if torch.is_tensor(t):
            seen[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def model_bytes(model):
    return tensor_bytes(list(model.parameters()) + list(model.buffers()))


def optim_bytes(opt):
    return tensor_bytes([v for st in opt.state.values() for v in st.values()])


# ----------------------------------------------------------------------------- variants and settings
def variant_overrides(name):
    """Variant name -> GPTConfig overrides (ValueError on an unknown name)."""
    if name == 'baseline':
        return dict(lime=False, hc=0)
    if name == 'lime':
        return dict(lime=True, router='full')
    if name.startswith('lime-'):
        return dict(lime=True, router=name[len('lime-'):])
    if name.startswith('hc'):
        rate, _, dyn = name[2:].partition('-')
        if (rate == '' or rate.isdigit()) and dyn in ('', 'dynamic'):
            return dict(hc=int(rate or HC_RATE), hc_dynamic=dyn == 'dynamic')
    raise ValueError(f"unknown variant '{name}'; use baseline, lime, lime-<router>, hc, hc-dynamic, hc<n>[-dynamic]")


def default_gqa(n_head, n_kv_head, gqa_kv_head):
    if gqa_kv_head:
        return gqa_kv_head
    if n_kv_head and n_kv_head < n_head:
        return n_kv_head
    return max(d for d in range(1, max(1, n_head // 4) + 1) if n_head % d == 0)


def parse_settings(cfg):
    """-> list of (name, n_kv_head, compile mode or None)."""
    H = cfg['n_head']
    kv0 = cfg['n_kv_head'] or H
    mode0 = cfg['compile']
    if mode0 is True:
        mode0 = 'default'
    mode0 = mode0 or None
    modes = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
    if mode0 is not None and mode0 not in modes:
        fail(f"unknown compile mode '{mode0}'{closest(str(mode0), list(modes))}")
    names = [s.strip() for s in str(cfg['settings']).split(',') if s.strip()] or ['']
    out = []
    for name in names:
        kv, mode = kv0, mode0
        for tok in [t for t in name.split('-') if t]:
            if tok == 'mha':
                kv = H
            elif tok == 'gqa':
                kv = default_gqa(H, cfg['n_kv_head'], cfg['gqa_kv_head'])
            elif tok.startswith('kv') and tok[2:].isdigit():
                kv = int(tok[2:])
            elif tok == 'eager':
                mode = None
            elif tok in ('compiled', 'compile', 'default'):
                mode = 'default'
            elif tok in ('ro', 'reduce', 'overhead'):
                mode = 'reduce-overhead'
            elif tok in ('autotune',):
                mode = 'max-autotune'
            else:
                fail(f"unknown setting token '{tok}' in '{name}'{closest(tok, ['mha', 'gqa', 'kv<N>', 'eager', 'compiled', 'ro'])}")
        gqa = default_gqa(H, cfg['n_kv_head'], cfg['gqa_kv_head'])
        attn = 'mha' if kv == H else 'gqa' if kv == gqa else f'kv{kv}'
        label = {None: 'eager', 'default': 'compiled', 'reduce-overhead': 'ro', 'max-autotune': 'autotune',
                 'max-autotune-no-cudagraphs': 'autotune-nocg'}[mode]
        out.append((f"{attn}-{label}", kv, mode))
    return out


# ----------------------------------------------------------------------------- the benchmark
class Runner:
    """One variant in one setting: model, optimizer, compiled step, measurements."""

    def __init__(self, name, model, opt, mode, cfg, dev, ctx):
        self.name, self.model, self.opt, self.mode, self.cfg, self.dev, self.ctx = name, model, opt, mode, cfg, dev, ctx
        self.fwd = torch.compile(model, mode=mode) if mode else model
        self.times, self.losses, self.mem = [], [], {}
        self.decode = {}
        self.lifetime_base = None  # CUDA, interleave=False: bytes allocated before this variant was built

    def step(self, x, y):
        if self.mode == 'reduce-overhead':
            torch.compiler.cudagraph_mark_step_begin()
        with self.ctx:
            _, loss = self.fwd(x, y)
        loss.backward()
        if self.cfg['grad_clip'] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg['grad_clip'])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def timed_step(self, x, y):
        sync(self.dev)
        t0 = time.perf_counter()
        loss = self.step(x, y)
        sync(self.dev)
        dt = time.perf_counter() - t0
        self.losses.append(loss.item())
        return dt

    def resident_bytes(self):
        return model_bytes(self.model) + optim_bytes(self.opt)

    def measure_memory(self, x, y):
        if self.dev.type == 'cuda':
            sync(self.dev)
            if self.lifetime_base is not None:
                # alone on the GPU (interleave=False): the peak since just before this variant was built,
                # so CUDA-graph pools (reduce-overhead) and compile-time allocations count too
                self.step(x, y)
                sync(self.dev)
                peak = torch.cuda.max_memory_allocated(self.dev)
                self.mem = dict(mem_bytes=peak - self.lifetime_base, mem_method='cuda_max_memory_allocated(lifetime)')
            else:
                # other variants are resident: the peak over one step, minus what the others hold
                gc.collect()
                base = torch.cuda.memory_allocated(self.dev)
                own = self.resident_bytes()
                torch.cuda.reset_peak_memory_stats(self.dev)
                self.step(x, y)
                sync(self.dev)
                peak = torch.cuda.max_memory_allocated(self.dev)
                self.mem = dict(mem_bytes=peak - base + own, mem_method='cuda_max_memory_allocated(step)')
                if self.mode == 'reduce-overhead':
                    self.mem['mem_note'] = 'interleaved: CUDA-graph pools recorded earlier are not counted; use interleave=False'
            self.mem.update(mem_process_max_allocated_bytes=peak,
                            mem_process_max_reserved_bytes=torch.cuda.max_memory_reserved(self.dev))
            return
        # CPU: distinct storages saved for backward (through the compiled model too: what AOTAutograd keeps)
        params = {storage_key(p) for p in self.model.parameters()}

        def fwd():
            with self.ctx:
                return self.fwd(x, y)[1]

        loss, saved = saved_tensor_bytes(fwd, exclude=params)
        loss.backward()
        if self.cfg['grad_clip'] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg['grad_clip'])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        mb, ob = model_bytes(self.model), optim_bytes(self.opt)
        self.mem = dict(mem_bytes=saved + mb + ob, mem_saved_bytes=saved, mem_model_bytes=mb,
                        mem_optim_bytes=ob, mem_method='saved_tensors+params+optimizer')


def sync(dev):
    if dev.type == 'cuda':
        torch.cuda.synchronize(dev)


def make_batches(cfg, n, dev):
    g = torch.Generator().manual_seed(cfg['seed'] + 1)
    B, T, V = cfg['batch_size'], cfg['block_size'], cfg['vocab_size']
    if cfg['dataset']:
        import numpy as np
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', cfg['dataset'], 'train.bin')
        if not os.path.isfile(path):
            fail(f"{path} not found (run python prepare.py {cfg['dataset']})")
        data = np.memmap(path, dtype=np.uint16, mode='r')
        if len(data) <= T + 1:
            fail(f"{path} has only {len(data)} tokens")
        out = []
        for _ in range(n):
            ix = torch.randint(len(data) - T - 1, (B,), generator=g).tolist()
            xy = torch.stack([torch.from_numpy(data[i:i + T + 1].astype(np.int64)) for i in ix])
            out.append((xy[:, :-1].to(dev), xy[:, 1:].to(dev)))
        return out
    return [(torch.randint(V, (B, T), generator=g).to(dev), torch.randint(V, (B, T), generator=g).to(dev))
            for _ in range(n)]


def build(cfg, GPT, GPTConfig, name, kv, dev, base_state):
    """The variant's model: every weight it shares with the baseline equals the seeded baseline init."""
    args = dict(block_size=cfg['block_size'], vocab_size=cfg['vocab_size'], n_layer=cfg['n_layer'],
                n_head=cfg['n_head'], n_kv_head=kv, n_embd=cfg['n_embd'], mlp_hidden=cfg['mlp_hidden'],
                dropout=cfg['dropout'])
    args.update(variant_overrides(name))
    torch.manual_seed(cfg['seed'])
    with torch.device(dev):  # initialised on the device (fast for 1B models); shared weights are overwritten
        model = GPT(GPTConfig(**args))
    missing, unexpected = model.load_state_dict(base_state, strict=False)
    assert not unexpected, unexpected
    return model, args


def measure_decode(runners, cfg, dev, GPT, GPTConfig):
    """generate() throughput with and without the cache, models sharing the trained weights."""
    n_new, P, Bd = cfg['decode_tokens'], cfg['decode_prompt'], cfg['decode_batch']
    block = cfg['decode_block_size'] or max(cfg['block_size'], P + n_new)
    g = torch.Generator().manual_seed(cfg['seed'] + 2)
    prompt = torch.randint(cfg['vocab_size'], (Bd, P), generator=g).to(dev)
    models = {}
    for r in runners:
        if block == r.args['block_size']:
            m = r.model
        else:
            with torch.device(dev):
                m = GPT(GPTConfig(**dict(r.args, block_size=block)))
            m.load_state_dict(r.model.state_dict())
        models[r.name] = m.eval()
    note = '' if P + n_new <= block else f'sliding window: prompt + {n_new} > decode block_size {block}'
    times = {(r.name, c): [] for r in runners for c in (True, False)}
    with torch.no_grad():
        for r in runners:  # warm-up
            for c in (True, False):
                with r.ctx:
                    models[r.name].generate(prompt, min(8, n_new), top_k=1, use_cache=c)
        for _ in range(cfg['decode_iters']):
            for c in (True, False):
                for r in runners:
                    sync(dev)
                    t0 = time.perf_counter()
                    with r.ctx:
                        models[r.name].generate(prompt, n_new, top_k=1, use_cache=c)
                    sync(dev)
                    times[(r.name, c)].append(time.perf_counter() - t0)
    for r in runners:
        r.model.train()
        for c, key in ((True, 'decode_tok_s_cache'), (False, 'decode_tok_s_nocache')):
            r.decode[key] = Bd * n_new / statistics.median(times[(r.name, c)])
        r.decode.update(decode_tokens=n_new, decode_prompt=P, decode_batch=Bd, decode_block_size=block,
                        decode_note=note)


def profile_step(r, x, y):
    """One train step under torch.profiler -> ({op: self ms}, {region: {op: self ms}}); regions: inside
    LIMe's Route forward ('route fwd'), inside its backward ('route bwd'), the optimizer, the rest."""
    from torch.profiler import profile as tprofile, ProfilerActivity
    cuda = r.dev.type == 'cuda'
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with tprofile(activities=acts) as prof:
        r.step(x, y)
        sync(r.dev)

    def region(e):
        while e is not None:
            if e.name == 'Route':
                return 'route fwd'
            if e.name.endswith('RouteBackward'):
                return 'route bwd'
            if e.name.startswith('Optimizer.step'):
                return 'optimizer'
            e = e.cpu_parent
        return 'model'

    by_op, by_region = {}, {}
    for e in prof.events():
        if e.device_type.name != 'CPU':  # kernels count once, as the self device time of the op launching them
            continue
        ms = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e3
        if ms:
            by_op[e.name] = by_op.get(e.name, 0.0) + ms
            reg = by_region.setdefault(region(e), {})
            reg[e.name] = reg.get(e.name, 0.0) + ms
    return by_op, by_region


def profile_runners(runners, batches, cfg):
    """profile_steps steps per variant, interleaved like the timing; prints top ops and the region split.
    Returns {variant: {op: self ms per step}}."""
    steps, top_n = cfg['profile_steps'], cfg['profile_top']
    acc = {r.name: ({}, {}) for r in runners}
    for i in range(steps):
        for r in runners:
            ops, regions = profile_step(r, *batches[i % len(batches)])
            for k, v in ops.items():
                acc[r.name][0][k] = acc[r.name][0].get(k, 0.0) + v / steps
            for reg, d in regions.items():
                tgt = acc[r.name][1].setdefault(reg, {})
                for k, v in d.items():
                    tgt[k] = tgt.get(k, 0.0) + v / steps
    kind = 'device' if runners[0].dev.type == 'cuda' else 'CPU'
    for r in runners:
        ops, regions = acc[r.name]
        total = sum(ops.values())
        print(f"\n--- profile: {r.setting}/{r.name}: self {kind} time, ms per step (mean of {steps} steps): {total:.2f}")
        for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:top_n]:
            print(f"  {k[:70]:70s} {v:9.2f}  {100 * v / max(total, 1e-9):5.1f}%")
        print("  by region:")
        for reg in ('route fwd', 'route bwd', 'model', 'optimizer'):
            d = regions.get(reg)
            if d:
                sub = sum(d.values())
                print(f"    {reg:10s} {sub:9.2f} ms ({100 * sub / max(total, 1e-9):5.1f}%)  " + ', '.join(
                    f"{k.replace('aten::', '')} {v:.2f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:6]))
    return {name: a[0] for name, a in acc.items()}


def print_profile_diff(profiles, cfg):
    """Per-op self time, each variant minus the baseline: where the extra time goes."""
    if 'baseline' not in profiles:
        return
    base = profiles['baseline']
    for name, ops in profiles.items():
        if name == 'baseline':
            continue
        diff = {k: ops.get(k, 0.0) - base.get(k, 0.0) for k in set(ops) | set(base)}
        top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:cfg['profile_top']]
        print(f"\n--- profile: {name} minus baseline, self ms per step (total {sum(ops.values()):.2f} vs "
              f"{sum(base.values()):.2f}, {sum(diff.values()):+.2f})")
        for k, v in top:
            print(f"  {k[:70]:70s} {v:+9.2f}   ({ops.get(k, 0.0):.2f} vs {base.get(k, 0.0):.2f})")


def fmt_bytes(b):
    return f"{b / 2**20:,.1f}" if b is not None else '-'


def run_setting(cfg, setting, names, dev, ctx, GPT, GPTConfig, peak):
    sname, kv, mode = setting
    base_args = dict(block_size=cfg['block_size'], vocab_size=cfg['vocab_size'], n_layer=cfg['n_layer'],
                     n_head=cfg['n_head'], n_kv_head=kv, n_embd=cfg['n_embd'], mlp_hidden=cfg['mlp_hidden'],
                     dropout=cfg['dropout'])
    torch.manual_seed(cfg['seed'])
    with torch.device(dev):  # the seeded init every variant shares, kept on the host
        base_state = {k: v.cpu() for k, v in GPT(GPTConfig(**base_args)).state_dict().items()}
    if dev.type == 'cuda':
        torch.cuda.empty_cache()
    n_steps = cfg['warmup'] + cfg['iters']
    batches = make_batches(cfg, n_steps + 1, dev)

    def make_runner(name):
        model, args = build(cfg, GPT, GPTConfig, name, kv, dev, base_state)
        opt = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'], cfg['router_lr'],
                                         (cfg['beta1'], cfg['beta2']), dev.type)
        r = Runner(name, model, opt, mode, cfg, dev, ctx)
        r.args, r.setting = args, sname
        return r

    def warm_and_time(group):
        gc.collect()
        for i in range(cfg['warmup']):
            for r in group:
                t0 = time.perf_counter()
                r.step(*batches[i])
                sync(dev)
                if i == 0:
                    r.first_step_s = time.perf_counter() - t0
        for r in group:
            r.measure_memory(*batches[n_steps])
        gc.collect()
        gc.disable()
        try:
            for i in range(cfg['warmup'], n_steps):
                for r in group:
                    r.times.append(r.timed_step(*batches[i]))
        finally:
            gc.enable()

    runners, oom = [], []
    if cfg['interleave']:
        runners = [make_runner(n) for n in names]
        warm_and_time(runners)
        if cfg['decode']:
            measure_decode(runners, cfg, dev, GPT, GPTConfig)
        if cfg['profile']:
            print_profile_diff(profile_runners(runners, batches, cfg), cfg)
    else:
        profiles = {}
        for n in names:
            r = None
            try:
                base0 = None
                if dev.type == 'cuda':
                    sync(dev)
                    base0 = torch.cuda.memory_allocated(dev)
                    torch.cuda.reset_peak_memory_stats(dev)
                r = make_runner(n)
                r.lifetime_base = base0
                warm_and_time([r])
                if cfg['decode']:
                    measure_decode([r], cfg, dev, GPT, GPTConfig)
                if cfg['profile']:
                    profiles.update(profile_runners([r], batches, cfg))
                runners.append(r)
            except torch.OutOfMemoryError:
                print(f"warning: {sname}/{n} ran out of memory at batch_size={cfg['batch_size']}; skipped", flush=True)
                oom.append(n)
            if r is not None:
                r.model = r.opt = r.fwd = None  # keep the numbers, free the memory
            r = None
            if mode:  # compiled code, guards and CUDA-graph pools may still reference the freed model
                torch._dynamo.reset()
            gc.collect()
            if dev.type == 'cuda':
                torch.cuda.empty_cache()
        if cfg['profile']:
            print_profile_diff(profiles, cfg)

    tokens = cfg['batch_size'] * cfg['block_size']
    records = []
    base = None
    for r in runners:
        cfg_obj = GPTConfig(**r.args)
        with torch.device('meta'):
            meta = GPT(cfg_obj)
        n_params = meta.get_num_params()
        fpt = meta.flops_per_token(cfg['block_size'])
        dt = statistics.median(r.times)
        q = statistics.quantiles(r.times, n=4) if len(r.times) >= 2 else [dt, dt, dt]
        rec = dict(setting=sname, variant=r.name, attention='mha' if kv == cfg['n_head'] else 'gqa',
                   n_kv_head=kv, compile=mode or False, device=str(dev), device_name=device_name(dev),
                   dtype=cfg['dtype'], threads=torch.get_num_threads(), batch_size=cfg['batch_size'],
                   block_size=cfg['block_size'], n_layer=cfg['n_layer'], n_head=cfg['n_head'],
                   n_embd=cfg['n_embd'], vocab_size=cfg['vocab_size'], params=n_params,
                   lime=r.args.get('lime', False), router=r.args.get('router') if r.args.get('lime') else None,
                   hc=r.args.get('hc', 0), hc_dynamic=r.args.get('hc_dynamic', False),
                   step_ms=1e3 * dt, step_ms_min=1e3 * min(r.times), step_ms_p25=1e3 * q[0], step_ms_p75=1e3 * q[2],
                   step_ms_samples=[1e3 * t for t in r.times], first_step_s=getattr(r, 'first_step_s', None),
                   tokens_per_iter=tokens, tok_s=tokens / dt, flops_per_token=fpt,
                   train_tflops=3 * fpt * tokens / dt / 1e12,
                   mfu=(3 * fpt * tokens / dt / peak) if peak else None, peak_flops=peak or None,
                   loss_first=r.losses[0] if r.losses else None, loss_last=r.losses[-1] if r.losses else None)
        rec.update(r.mem)
        rec.update(r.decode)
        if r.name == 'baseline':
            base = r
        records.append(rec)
    for rec, r in zip(records, runners):  # ratios to the baseline, also paired round by round
        if base is not None:
            rec['step_ratio'] = rec['step_ms'] / (1e3 * statistics.median(base.times))
            rec['step_ratio_paired'] = statistics.median(a / b for a, b in zip(r.times, base.times))
            rec['mem_ratio'] = r.mem['mem_bytes'] / base.mem['mem_bytes']
    for n in oom:
        records.append(dict(setting=sname, variant=n, error='out of memory', batch_size=cfg['batch_size']))
    return records


def device_name(dev):
    if dev.type == 'cuda':
        return torch.cuda.get_device_name(dev)
    import platform
    return platform.processor() or platform.machine() or 'cpu'


def auto_peak(cfg, dev, GPU_PEAK_FLOPS):
    if cfg['peak_flops']:
        return float(cfg['peak_flops'])
    if dev.type == 'cuda':
        name = torch.cuda.get_device_name(dev)
        for k, v in GPU_PEAK_FLOPS.items():
            if k.lower() in name.lower():
                return v  # dense bf16 peak; MFU of fp32 runs is against it too
    return 0.0


def print_table(records):
    cols = [('setting', 12, 's'), ('variant', 14, 's'), ('params', 12, ','), ('step ms', 9, '.2f'),
            ('p25-p75', 15, 's'), ('x base', 7, '.3f'), ('tok/s', 10, ',.0f'), ('TFLOP/s', 8, '.3f'),
            ('MFU', 6, 's'), ('mem MiB', 10, 's'), ('x base', 7, '.3f'), ('dec tok/s', 10, 's'),
            ('nocache', 9, 's'), ('loss', 6, '.3f')]
    print(' '.join(f"{c:>{w}}" for c, w, _ in cols))
    for r in records:
        if 'error' in r:
            print(f"{r['setting']:>12} {r['variant']:>14} {r['error']}")
            continue
        vals = [r['setting'], r['variant'], r['params'], r['step_ms'],
                f"{r['step_ms_p25']:.2f}-{r['step_ms_p75']:.2f}", r.get('step_ratio', float('nan')),
                r['tok_s'], r['train_tflops'], f"{100 * r['mfu']:.1f}%" if r['mfu'] is not None else '-',
                fmt_bytes(r.get('mem_bytes')), r.get('mem_ratio', float('nan')),
                f"{r['decode_tok_s_cache']:,.0f}" if 'decode_tok_s_cache' in r else '-',
                f"{r['decode_tok_s_nocache']:,.0f}" if 'decode_tok_s_nocache' in r else '-',
                r['loss_last'] if r['loss_last'] is not None else float('nan')]
        print(' '.join(f"{v:>{w}{f if f != 's' else ''}}" for v, (_, w, f) in zip(vals, cols)))
    notes = {r['decode_note'] for r in records if r.get('decode_note')}  # noqa: C401
    for n in notes:
        print(f"note: decode {n}")


def summary_line(records):
    parts = []
    for s in dict.fromkeys(r['setting'] for r in records):
        recs = [r for r in records if r['setting'] == s and r['variant'] != 'baseline' and 'error' not in r]
        errs = [f"{r['variant']} {r['error']}" for r in records if r['setting'] == s and 'error' in r]
        if not any(r['setting'] == s and r['variant'] == 'baseline' and 'error' not in r for r in records):
            parts.append(f"[{s}] no baseline")
            continue
        items = [f"{r['variant']}/baseline step {r['step_ratio']:.3f}x (paired {r['step_ratio_paired']:.3f}x) "
                 f"mem {r['mem_ratio']:.3f}x" for r in recs]
        parts.append(f"[{s}] " + ', '.join(items + errs or ['baseline only']))
    return 'summary: ' + '; '.join(parts)


def main(argv):
    defaults = {k: globals()[k] for k in CONFIG_KEYS}
    cfg = configure(argv, defaults)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model import GPT, GPTConfig, GPU_PEAK_FLOPS

    names = [v.strip() for v in str(cfg['variants']).split(',') if v.strip()]
    if not names:
        fail("no variants given")
    if len(set(names)) != len(names):
        fail(f"duplicate variant in '{cfg['variants']}'")
    for n in names:
        try:
            GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=8, **variant_overrides(n))
        except ValueError as e:
            fail(str(e).splitlines()[0])
    if cfg['dataset']:
        import pickle
        meta = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', cfg['dataset'], 'meta.pkl')
        if os.path.isfile(meta):
            with open(meta, 'rb') as f:
                cfg['vocab_size'] = pickle.load(f)['vocab_size']
    for k in ('iters', 'batch_size', 'block_size', 'decode_tokens', 'decode_prompt', 'decode_batch', 'decode_iters'):
        if int(cfg[k]) < 1:
            fail(f"{k} must be >= 1, got {cfg[k]}")
    settings_list = parse_settings(cfg)
    for _, kv, _ in settings_list:
        try:
            GPTConfig(n_layer=1, n_head=cfg['n_head'], n_kv_head=kv, n_embd=cfg['n_embd'], block_size=8, vocab_size=8)
        except ValueError as e:
            fail(str(e))

    dtypes = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
    if cfg['dtype'] not in dtypes:
        fail(f"unknown dtype '{cfg['dtype']}'{closest(cfg['dtype'], list(dtypes))}")
    # ---- validation ends here: global torch state changes below
    try:
        dev = torch.device(cfg['device'])
    except RuntimeError as e:
        fail(str(e))
    if dev.type == 'cuda' and not torch.cuda.is_available():
        fail("device=cuda but CUDA is not available (use --device=cpu)")
    if dev.type == 'cpu':
        torch.set_flush_denormal(True)
    if cfg['threads']:
        torch.set_num_threads(int(cfg['threads']))
    if dev.type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ptdtype = dtypes[cfg['dtype']]
    ctx = contextlib.nullcontext() if ptdtype == torch.float32 else torch.autocast(dev.type, dtype=ptdtype)
    peak = auto_peak(cfg, dev, GPU_PEAK_FLOPS)

    print(f"bench: {', '.join(names)} | settings {', '.join(s[0] for s in settings_list)} | "
          f"L={cfg['n_layer']} d={cfg['n_embd']} H={cfg['n_head']} V={cfg['vocab_size']} "
          f"B={cfg['batch_size']} T={cfg['block_size']} {cfg['dtype']} | {dev} ({device_name(dev)}) "
          f"threads={torch.get_num_threads()} | warmup {cfg['warmup']} + {cfg['iters']} interleaved rounds"
          f"{'' if cfg['interleave'] else ' (sequential: interleave=False)'}", flush=True)
    records = []
    for s in settings_list:
        t0 = time.time()
        records += run_setting(cfg, s, names, dev, ctx, GPT, GPTConfig, peak)
        print(f"[{s[0]} done in {time.time() - t0:.1f}s]", flush=True)
    print()
    print_table(records)
    if cfg['json']:
        with open(cfg['json'], 'w') as f:
            jsonlib.dump(dict(config=cfg, records=records), f, indent=1)
        print(f"wrote {cfg['json']} ({len(records)} records)")
    print(summary_line(records), flush=True)
    return records


if __name__ == '__main__':
    main(sys.argv[1:])
