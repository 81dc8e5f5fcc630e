"""
Train a nanoLIMe model, nanoGPT-style: config globals, setup, a plain loop.

$ python prepare.py && python train.py               # small LIMe on shakespeare_char, 6.6 min on 2 CPU cores
$ python train.py config/train_shakespeare_char.py --lime=False --out_dir=out-baseline
$ torchrun --standalone --nproc_per_node=8 train.py config/train_fineweb_edu_1b.py

The globals below are the defaults; a config/*.py file overrides them, then --key=value does; --help lists them.
Iterations are numbered 1..max_iters (0 is the initial model, evaluated only). init_from='resume' continues
from the checkpoint exactly: N iterations in one run and N/2 + a resumed N/2 give bit-identical weights.
Ctrl-C (or SIGTERM) finishes the iteration, saves a checkpoint and exits.
"""
import os
import sys
import gc
import json
import importlib.util
import math
import time
import dataclasses
from functools import partial

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from nanolime.common import UserError, configure, check_ranges, resolve_device, resolve_dtype, autocast, ddp_env, \
    start_ddp, wrap_ddp, catch_stop_signals, device_peak_flops, out_of_memory
from nanolime.checkpoint import atomic_save, load_checkpoint, claim_out_dir, check_resume, on_rank_0, RunLog, \
    load_optimizers, collect_states, resumed_counts, resumed_rng, check_same_weights, git_commit, load_weights, \
    checkpoint_id, changes_said, CKPT_NAME, CKPT_MARKER
from nanolime.data import data_id, data_info, get_batch
from nanolime.optim import configure_optimizers
import numpy as np
import torch
import torch.distributed as dist
import relatives
from relatives import RelativesConfig, build_model, DEPTH_SCALINGS  # model.py's GPT, or a relative's extension of it
from nanolime.variants import variant_name
from nanolime import fsdp as sharding
from integrations.hf import llama_options, load_llama, resumed_import  # init_from='hf:DIR'

# -----------------------------------------------------------------------------
# default config values: a small LIMe model (4 x 128, 0.86M parameters) on shakespeare_char that trains on a
# 2-core CPU to val loss ~1.56; config/train_shakespeare_char.py says why this shape
# I/O
out_dir = 'out-shakespeare-char'
eval_interval = 500        # evaluate train/val loss (and checkpoint) every this many iterations, and at the end
log_interval = 50          # print and log (out_dir/log.jsonl, written with every checkpoint) every this many iters
eval_iters = 20            # batches per split and evaluation (shared out between DDP ranks)
eval_only = False          # evaluate the initial (or resumed) model and exit
always_save_checkpoint = True  # False: checkpoint only when val loss improves
init_from = 'scratch'      # 'scratch', 'resume' (from out_dir/ckpt.pt) or 'hf:DIR' (a LlamaForCausalLM, docs/export.md)
overwrite = False          # True: a scratch run may replace the model already in out_dir (at its first checkpoint)
# wandb logging (needs `pip install wandb`)
wandb_log = False
wandb_project = 'nanolime'
wandb_run_name = 'run'
# data: <data_dir>/<dataset>/{train,val}.bin + meta.pkl, written by prepare.py
dataset = 'shakespeare_char'
data_dir = ''              # '' = prepare.py's default (data/ next to this file)
total_batch_size = 16 * 128  # tokens per iteration, whatever the number of GPUs
batch_size = 16            # sequences per micro-step and rank; gradient accumulation makes up the rest
block_size = 128
# model
n_layer = 4
n_head = 4
n_kv_head = None           # None: n_head (MHA); fewer heads: GQA
n_embd = 128
mlp_hidden = None          # None: the Llama rule (8/3 * n_embd, rounded up to 64)
dropout = 0.0
tie_embeddings = True      # the output head is the token embedding (False: a head of its own, as most Llamas)
rope_theta = 10000.0       # RoPE's base
norm_eps = 1e-6            # RMSNorm's eps
lime = True                # the paper's method; False: the Llama baseline
router = 'full'            # full, average, dynamic, last-<j>, first-<j>
router_init = 'paper'      # 'paper' (the authors' init) or 'identity' (LIMe starts as the baseline function)
# the cross-layer relatives LIMe is compared with (hc, mhc, denseformer, attnres, mudd, ...), all
# off: each relative's options are declared, with what they do, in its file (relatives/<name>.py)
globals().update(relatives.OPTIONS)
# depth scaling: 'standard' (the paper's model) or 'completep' (CompleteP, arXiv 2505.01618: each attention and MLP
# output times depth_base / n_layer, AdamW's eps too, so that one learning rate transfers across depth; with the
# baseline, lime or attnres; AdamW only; relatives/completep.py, docs/deviations.md)
depth_scaling = 'standard'
depth_base = None          # completep: the base depth, the n_layer its learning rate was tuned at
# optimizer: 'adamw' (the paper's) or 'muon' (torch.optim.Muon on the blocks' projection matrices, AdamW on the rest)
optimizer = 'adamw'
muon_lr = 0.02             # peak lr of Muon's matrices (optimizer='muon'); the schedule below scales it too
muon_momentum = 0.95
learning_rate = 2e-3       # peak lr (AdamW)
router_lr = 1e-2           # peak lr of the LIMe routers (paper: 10x the model's)
router_lr_scaling = ''     # 'fan_in' ('sqrt_fan_in'): router_lr * 2 / (the root of) the layers it reads (not the paper)
attnres_query_lr = 0.0     # peak lr of Attention Residuals' pseudo-queries w_l; 0.0: learning_rate
max_iters = 2500
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0            # clip gradients at this norm; 0.0 = off
# learning rate schedule: linear warm-up, then cosine down to min_lr at lr_decay_iters
decay_lr = True
warmup_iters = 100
lr_decay_iters = 2500      # usually = max_iters
min_lr = 2e-4
# system
device = 'auto'            # 'auto' (cuda, mps, cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'             # 'auto' (CUDA: bfloat16 if supported, else float16; float32 elsewhere), 'float32', ...
compile = 'auto'           # 'auto' (on CUDA only), True or False
seed = 1337
peak_flops = 0.0           # per-device peak FLOP/s for MFU; 0.0: from the GPU's name (nanolime/common.py), none on CPU
fsdp = False               # torchrun only: weights, gradients, AdamW's state sharded over the ranks (nanolime/fsdp.py)
check_only = False         # check every option, print the run's config (JSON) and exit before out_dir is claimed
# -----------------------------------------------------------------------------
# given: the options a config file or --key=value set: an import (init_from='hf:DIR') checks its shape's
config = configure(globals(), given=(given := set()))
hf_dir = imported_from = init_from[len('hf:'):] if init_from.startswith('hf:') else None  # a Llama (resumed: ckpt's)

# everything that can be checked is checked before any work
check_ranges({**config, 'init_from': 'hf:DIR' if hf_dir else init_from},
             at_least_1=('batch_size', 'total_batch_size', 'block_size', 'eval_interval', 'log_interval',
                         'eval_iters'), at_least_0=('max_iters', 'warmup_iters', 'lr_decay_iters', 'seed'),
             choices={'optimizer': ('adamw', 'muon'), 'init_from': ('scratch', 'resume', 'hf:DIR'),
                      'compile': ('auto', True, False), 'depth_scaling': DEPTH_SCALINGS,
                      'router_lr_scaling': ('', 'fan_in', 'sqrt_fan_in')},
             finite=('router_lr', 'attnres_query_lr', 'min_lr', 'weight_decay', 'grad_clip', 'peak_flops'),
             positive=('learning_rate', 'muon_lr', 'rope_theta', 'norm_eps'),
             fraction=('dropout', 'beta1', 'beta2', 'muon_momentum'))
if decay_lr and lr_decay_iters <= warmup_iters:
    raise UserError(f"lr_decay_iters={lr_decay_iters} must be > warmup_iters={warmup_iters} (or set decay_lr=False)")
if lime and router == 'average' and router_init == 'identity':
    raise UserError("router_init='identity' has nothing to initialize with router='average' (fixed weights): use "
                    "router_init='paper' with it, or another router")
if optimizer == 'muon' and depth_scaling == 'standard' and not hasattr(torch.optim, 'Muon'):
    raise UserError(f"optimizer='muon' needs torch.optim.Muon, in torch 2.9 and newer (this is torch "
                    f"{torch.__version__}): upgrade torch, or use optimizer='adamw'")
if wandb_log and importlib.util.find_spec('wandb') is None:
    raise UserError("wandb_log=True but wandb is not installed: pip install wandb (or --wandb_log=False)")
ddp = ddp_env()  # (rank, local_rank, world_size) under torchrun, else None
rank, world_size = (ddp[0], ddp[2]) if ddp else (0, 1)
master = rank == 0
tokens_per_micro_step = batch_size * block_size * world_size
if total_batch_size % tokens_per_micro_step:
    raise UserError(f"total_batch_size={total_batch_size} is not a multiple of batch_size * block_size * world_size "
                    f"= {batch_size} * {block_size} * {world_size} = {tokens_per_micro_step}; set it to a multiple "
                    f"of {tokens_per_micro_step} (it is the global batch in tokens), or change batch_size")
grad_accum = total_batch_size // tokens_per_micro_step
ddir, meta, sizes = data_info(dataset, data_dir, block_size)
data_identity = data_id(ddir)  # every checkpoint records it: sweep.py tells results on other data apart
if hf_dir is not None:  # the model's shape is the Llama's (LIMe's routers, if any, are added to it)
    config.update(llama_options(hf_dir, config, given, int(meta['vocab_size']), announce=master))
ckpt_path = os.path.join(out_dir, CKPT_NAME)
ckpt = load_checkpoint(ckpt_path, "checkpoint to resume from (init_from='resume')") if init_from == 'resume' else None
if ckpt is not None:  # an imported run's shape is its checkpoint's
    imported_from = resumed_import(ckpt, config, given)
try:  # shapes and the router variant
    model_config = RelativesConfig(vocab_size=int(meta['vocab_size']), **{
        f.name: config[f.name] for f in dataclasses.fields(RelativesConfig) if f.name in config})
except ValueError as e:
    raise UserError(f"invalid model config: {e}") from None
changes = check_resume(ckpt, ckpt_path, dataclasses.asdict(model_config), config, meta, ddir)

# devices and DDP
device = resolve_device(device)  # an indexed 'cuda:N' on CUDA: cuda:LOCAL_RANK under torchrun
device_type = device.split(':')[0]
ptdtype = resolve_dtype(dtype, device)
ctx = autocast(device, ptdtype)
model_variant = variant_name(config)  # the name bench.py and sweep.py give this model
if fsdp:
    sharding.check(ddp, optimizer, config, ptdtype)
use_compile = (device_type == 'cuda') if compile == 'auto' else compile
if device_type == 'cuda':
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
if ddp:  # one run on every rank: the same options, data and checkpoint (wherever each keeps them)
    run = {k: v for k, v in config.items() if k not in ('out_dir', 'data_dir', 'debug')}
    run.update(data=data_identity, checkpoint=ckpt and checkpoint_id(ckpt_path))
    start_ddp(device, rank, world_size, run)

# model and optimizer, from the Llama's weights or the checkpoint's; all checked before out_dir is claimed
torch.manual_seed(seed)
with out_of_memory("building the model: train a smaller one, or on a device with more memory"):
    model = build_model(model_config).to(device)
if hf_dir is not None:  # the Llama's weights; with router_init='identity' a LIMe computes the same function
    load_llama(model, hf_dir)
if ckpt is not None:  # the weights first: FSDP shards them, and the optimizer is made of the shards
    load_weights(model, ckpt, ckpt_path)
if fsdp:
    sharding.shard(model, ptdtype, use_compile)
try:
    optimizers = configure_optimizers(model, weight_decay, learning_rate, router_lr, (beta1, beta2), device_type,
                                      optimizer=optimizer, muon_lr=muon_lr, muon_momentum=muon_momentum,
                                      named_lrs={'attn_res.query': attnres_query_lr}
                                      if attnres and attnres_query_lr else None,
                                      router_lr_scaling=router_lr_scaling)
except ValueError as e:  # an optimizer the model has no rules for (CompleteP's are AdamW's)
    raise UserError(str(e)) from None
optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
scaler = torch.amp.GradScaler(device_type, enabled=(ptdtype == torch.float16))
if ckpt is not None:  # their states (and the scaler's), with this run's settings
    load_optimizers(optimizers, scaler, ckpt, ckpt_path, changes,
                    partial(sharding.sharded_optimizer_state, model) if fsdp else None)
if check_only:  # sweep.py checks each of its runs so
    print(json.dumps(config))
    sys.exit(0)
# out_dir is this run's alone (checkpoint.claim_out_dir): rank 0 claims it, and its verdict reaches every rank
on_rank_0(claim_out_dir, out_dir, 'scratch' if hf_dir else init_from, overwrite, max_iters > 0 and not eval_only)

# the state a resumed run continues from, and the code it runs (every checkpoint records it)
commit = git_commit()
iter_num, best_val_loss, tokens_seen, flops_seen = resumed_counts(ckpt)  # 0, inf, 0, 0 for a new run
torch.manual_seed(seed + 1 + rank)  # dropout
data_rng = resumed_rng(ckpt, seed, rank, world_size, device, announce=master)  # each rank draws its own batches
if master and ckpt is not None:
    print(f"resuming from {ckpt_path} at iter {iter_num + 1} (best val loss {best_val_loss:.4f})"
          + (f"\n{changes_said(changes, ckpt_path, iter_num + 1)}" if changes else ''))
# log.jsonl (rank 0's; it says from when on the changes hold); the checkpoint's file freed
run_log, ckpt = RunLog(out_dir, ckpt if master else None, None if eval_only else changes), None
flops_per_token = model.flops_per_token(block_size)
if master:
    print(f"global batch: {batch_size} seqs x {block_size} tokens x {grad_accum} accumulation steps x "
          f"{world_size} ranks = {total_batch_size:,} tokens/iter")
    print(f"model: {model.get_num_params() / 1e6:.2f}M parameters, variant {model_variant}"
          f"{f' (CompleteP from depth_base={depth_base})' if depth_scaling != 'standard' else ''}, "
          f"{flops_per_token / 1e6:.2f} MFLOPs/token forward; device {device}, {ptdtype}, compile {use_compile}")
raw_model = model  # the plain module: its state_dict has no compile/DDP prefixes
if use_compile and not fsdp:  # (FSDP: each block compiled on its own, sharding.shard)
    model = torch.compile(model)
if ddp and not fsdp:
    model = wrap_ddp(model, device)
peak = peak_flops or (device_peak_flops(torch.cuda.get_device_name(device)) if device_type == 'cuda' else None)

def get_lr(it):
    """lr of iteration it (1-based): linear warm-up to learning_rate, cosine down to min_lr, then min_lr."""
    if not decay_lr:
        return learning_rate
    if it <= warmup_iters:
        return learning_rate * it / warmup_iters
    if it >= lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

def train_batch():
    return get_batch(ddir, 'train', data_rng.integers(0, sizes['train'] - block_size, batch_size), block_size, device,
                     model_config.vocab_size)

@torch.no_grad()
def estimate_loss():
    """Mean loss over the same eval_iters batches per split at every evaluation (their own RNG, so evaluating
    never changes the training data order); DDP ranks share the batches out. Printed by rank 0."""
    out = {}
    model.eval()
    for split in ('train', 'val'):
        ix = np.random.default_rng([seed, 999, split == 'val']).integers(
            0, sizes[split] - block_size, size=(eval_iters, batch_size))
        acc = torch.zeros(2, device=device)
        # FSDP: every rank runs as many forwards (each gathers weights with the others), the extra ones not counted
        for k in range(rank, eval_iters + (-eval_iters % world_size if fsdp else 0), world_size):
            x, y = get_batch(ddir, split, ix[k % eval_iters], block_size, device, model_config.vocab_size)
            with ctx:
                loss = model(x, y)[1]  # not the logits: they would stay alive into the next forward
            if k < eval_iters:
                acc += torch.stack([loss.float(), torch.ones((), device=device)])
        if ddp:
            dist.all_reduce(acc)
        out[split] = (acc[0] / acc[1]).item()
    model.train()
    if master:
        print(f"iter {iter_num}: train loss {out['train']:.4f}, val loss {out['val']:.4f}")
    return out

def log(record):
    if master:
        run_log.add(record)
        if wandb_log:
            wandb.log(record, step=record['iter'])

def save_checkpoint(rng_states, states=None):
    """ckpt.pt, then log.jsonl, each replaced atomically. The checkpoint holds its log too: after a kill between the
    two writes, the run that resumes it writes the records the file lacks. states: (model's, optimizers' state
    dicts), FSDP's gathered; None: this process's."""
    model_state, optimizer_states = states or (raw_model.state_dict(), [o.state_dict() for o in optimizers])
    atomic_save({CKPT_MARKER: 1, 'model': model_state, 'optimizer': optimizer_states,
                 'scaler': scaler.state_dict() if scaler.is_enabled() else None, 'config': config, 'meta': meta,
                 'model_args': dataclasses.asdict(model_config), 'iter_num': iter_num, 'best_val_loss': best_val_loss,
                 'rng': rng_states, 'tokens': tokens_seen, 'flops': flops_seen, 'world_size': world_size,
                 'log': run_log.lines, 'imported_from': imported_from, 'data_id': data_identity, 'git_commit': commit,
                 'torch_version': str(torch.__version__)},
                ckpt_path, resume_hint())
    run_log.write(resume_hint())
    print(f"saved checkpoint to {ckpt_path} (iter {iter_num})")

def resume_hint():
    """How to go on after this run stops: from the checkpoint in out_dir if it is this run's (or the one it resumed)."""
    return RESUME_COMMAND if last_saved is not None or init_from == 'resume' else "run again"

# the same command, continued: the model options an import set come from the checkpoint
RESUME_COMMAND = f"continue with --init_from=resume{f' (in place of --init_from={init_from})' if hf_dir else ''}"

def stopped(reason):
    """The error of a run that cannot go on, saying which checkpoint survives it."""
    kept = (f"the last good checkpoint ({ckpt_path}, iter {last_saved}) is kept" if last_saved is not None
            else f"no checkpoint was written by this run ({ckpt_path}, if any, is unchanged)")
    return f"{reason}: training stopped; {kept}. Try a lower learning_rate, grad_clip, or dtype='float32'"

if wandb_log and master:
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)
stop_request, stop_now, last_saved = catch_stop_signals(announce=master), False, None  # Ctrl-C, SIGTERM

# ----------------------------------------------------------------------------- the training loop
t_start = time.time()
if init_from != 'resume' or eval_only:
    losses = estimate_loss()
    log({'iter': iter_num, 'tokens': tokens_seen, 'flops': flops_seen,
         'train_loss_eval': losses['train'], 'val_loss': losses['val']})
if iter_num >= max_iters and master and not eval_only:
    print(f"nothing to do: iter {iter_num} >= max_iters={max_iters} (raise --max_iters to train on)")
while iter_num < max_iters and not eval_only:
    iter_num += 1
    lr = get_lr(iter_num)
    for g in (g for opt in optimizers for g in opt.param_groups):  # each group at its own peak (router_lr, muon_lr)
        g['lr'] = g['peak_lr'] * lr / learning_rate
    t0 = time.time()
    loss_sum = torch.zeros((), device=device)
    x, y = train_batch()
    for micro_step in range(grad_accum):
        if ddp and not fsdp:  # all-reduced on the last micro-step only (FSDP reduces each one into its shards)
            model.require_backward_grad_sync = micro_step == grad_accum - 1
        with ctx:
            loss = model(x, y)[1] / grad_accum
        loss_sum += loss.detach().float()
        if micro_step < grad_accum - 1:  # the next batch, while the backward runs on the GPU
            x, y = train_batch()
        scaler.scale(loss).backward()
        del loss  # nothing of this step's graph may live on into the next forward
    for opt in optimizers:
        scaler.unscale_(opt)  # the gradients' own norm: logged, and clipped to grad_clip (0: not clipped)
    grad_norm = (sharding.clip_grad_norm_ if fsdp else torch.nn.utils.clip_grad_norm_)(raw_model.parameters(),
                                                                                         grad_clip or math.inf)
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    model.zero_grad(set_to_none=True)
    # one sync per iteration: the loss and the gradient norm (means over ranks), whether any rank was signalled
    stats = torch.stack([loss_sum, grad_norm.float(), torch.tensor(float(bool(stop_request)), device=device)])
    if ddp:
        dist.all_reduce(stats)
    (lossf, normf), stop_now = (stats[:2] / world_size).tolist(), stats[2].item() > 0
    dt = time.time() - t0
    tokens_seen += total_batch_size
    flops_seen += 3 * flops_per_token * total_batch_size
    if not math.isfinite(lossf):  # the same all-reduced value on every rank: they all stop here
        raise UserError(stopped(f"loss is {lossf} at iter {iter_num}"))
    record = {'iter': iter_num, 'tokens': tokens_seen, 'flops': flops_seen, 'loss': lossf, 'lr': lr,
              'grad_norm': normf, 'clipped': 0 < grad_clip < normf}  # the norm before clipping
    logged = iter_num % log_interval == 0 or iter_num in (1, max_iters) or stop_now
    if logged:
        mfu = raw_model.estimate_mfu(total_batch_size, dt, peak * world_size, block_size) if peak else None
        record.update(dt_ms=dt * 1000, tokens_per_s=total_batch_size / dt, mfu=mfu)
        if master:
            print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, grad norm {normf:.3f}"
                  f"{' (clipped)' if record['clipped'] else ''}, {dt * 1000:.1f} ms/iter, "
                  f"{total_batch_size / dt:,.0f} tok/s, {flops_seen:.3e} FLOPs"
                  + (f", mfu {mfu * 100:.2f}%" if mfu is not None else ""), flush=True)
    save, evaluated = stop_now, iter_num % eval_interval == 0 or iter_num == max_iters
    if evaluated:
        losses = estimate_loss()
        record.update(train_loss_eval=losses['train'], val_loss=losses['val'])
        save = save or always_save_checkpoint or losses['val'] < best_val_loss
        best_val_loss = min(best_val_loss, losses['val'])
    if logged or evaluated:
        log(record)
    if save:
        rng_states, finite = collect_states(raw_model, data_rng, device)  # every rank's, under DDP
        if not finite:
            raise UserError(stopped(f"the weights are not finite at iter {iter_num}"))
        # a full disk, say: then the files there stay as they were, and every rank stops
        states = sharding.full_state_dicts(raw_model, optimizers) if fsdp else None  # collective
        on_rank_0(save_checkpoint, rng_states, states, error_prefix=f"training stopped at iter {iter_num}: ")
        last_saved = iter_num
    if stop_now:
        if master:
            print(f"interrupted at iter {iter_num}: checkpoint saved to {ckpt_path}; {RESUME_COMMAND}", flush=True)
        break

on_rank_0(run_log.write, resume_hint())  # records since the last checkpoint (eval_only, always_save_checkpoint=False)
if master and not stop_now and not eval_only:
    print(f"done: {iter_num} iters in {time.time() - t_start:.1f} s, best val loss {best_val_loss:.4f}")
if ddp:
    if not fsdp:  # (FSDP's ranks hold different shards)
        check_same_weights(raw_model)
    model = None  # free DDP (its reducer) before the process group: the other order can hang
    gc.collect()
    dist.destroy_process_group()
if wandb_log and master:
    wandb.finish()
sys.exit(130 if stop_now else 0)
