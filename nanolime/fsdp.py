"""
train.py's --fsdp=True: the model, its gradients and AdamW's state sharded over torchrun's ranks with FSDP2
(torch.distributed.fsdp.fully_shard), for models whose weights, gradients and optimizer state do not fit on one
GPU (about 16 bytes a parameter in float32 with DDP, on every GPU; with FSDP that divided by the number of GPUs,
plus the weights of the block being computed).

    fsdp.check(...)                       # before any work: what cannot run sharded, in one line
    shard(model, ptdtype, use_compile)    # after the weights are loaded, before the optimizer is made of them
    clip_grad_norm_(params, max_norm)     # the total norm over every rank's shards
    full_state_dicts(model, optimizers)   # the checkpoint as one process writes it, gathered to rank 0
    sharded_optimizer_state(model, opt, state)  # such a checkpoint's optimizer state, in this rank's shards

How the model is cut: one unit per Block, gathered just before the block runs and freed after; the rest in the
root unit, gathered for the whole forward. The rest is the token embedding (the output head is the same tensor
when tied, and a tied weight must live in one unit), the final norm, and LIMe's routers: the two-phase sum
(model.KVStack) reads the routers of a whole group of layers when the group starts, before those layers'
blocks run, so a router must already be gathered then. They are small (n_kv_head x (l+1) n_kv_head numbers
per layer).

A checkpoint is the one DDP and one process write (ckpt.pt, full tensors): sample.py, the study tools and a run
without --fsdp read it unchanged, and a --fsdp=True run resumes from theirs.
"""
import math

import torch
from torch import nn

import relatives
from nanolime.common import UserError
from nanolime.variants import named


def check(ddp, optimizer, config, dtype):
    """UserError, the same on every rank, for what FSDP does not run here: outside torchrun, Muon, a
    relative that its file does not declare shardable (relatives/base.py: none is; model.GPT's
    baseline and LIMe are), CompleteP, float16 (its GradScaler would see one rank's shards).
    config: the run's options (train.py's)."""
    if not ddp:
        raise UserError("fsdp=True shards the model over torchrun's ranks: start it with torchrun (torchrun "
                        "--standalone --nproc_per_node=N train.py ... --fsdp=True), or drop --fsdp=True")
    if optimizer != 'adamw':
        raise UserError(f"fsdp=True trains with optimizer='adamw' only, not {optimizer!r}: use --optimizer=adamw, "
                        "or DDP (drop --fsdp=True)")
    depth_scaling = config['depth_scaling']
    unsharded = [part for r in relatives.RELATIVES if config[relatives.switch(r)] and not r.fsdp
                 for part in named(r.components, config) or [relatives.switch(r)]]  # variant_name's
    if depth_scaling != 'standard':
        unsharded.append(f"depth_scaling={depth_scaling!r}")
    if unsharded:
        what = ' and '.join(unsharded)
        raise UserError(f"fsdp=True shards the baseline and LIMe only, not {what}: train it with DDP "
                        "(drop --fsdp=True)")
    if dtype == torch.float16:
        raise UserError("fsdp=True does not train in float16 (its gradient scaler would check one rank's shards "
                        "only): use --dtype=bfloat16 or --dtype=float32")
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        raise UserError(f"fsdp=True needs torch.distributed.fsdp.fully_shard (torch 2.6 and newer; this is torch "
                        f"{torch.__version__}): upgrade torch, or drop --fsdp=True") from None


def shard(model, ptdtype, use_compile=False):
    """model (model.GPT, its weights loaded) sharded in place: a unit per Block, the rest in the root unit (see
    the top of this file). With bfloat16 the units are gathered in bfloat16 and gradients reduced in float32.
    use_compile: each Block's forward compiled on its own, one graph per block, none compiled again later
    (torch.compile of the whole model would have to trace FSDP's hooks). Returns the model."""
    from model import GPT
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    if type(model) is not GPT:  # check() names the variants; this is for a model it does not know
        raise UserError(f"fsdp=True shards model.GPT only, not {type(model).__name__}: drop --fsdp=True")
    mp = MixedPrecisionPolicy(param_dtype=ptdtype, reduce_dtype=torch.float32) if ptdtype == torch.bfloat16 \
        else MixedPrecisionPolicy()
    blocks = list(model.transformer.h)
    routers = [block.attn.router for block in blocks]
    if use_compile:  # the baseline's blocks share one graph; LIMe's each read another number of layers: one each
        dynamo = torch._dynamo.config
        limit = 'recompile_limit' if hasattr(dynamo, 'recompile_limit') else 'cache_size_limit'  # (older torch)
        setattr(dynamo, limit, max(getattr(dynamo, limit), len(blocks)))
    for block in blocks:
        if use_compile:  # forward only: FSDP's hooks stay outside the graph, the state dict's names unchanged
            block.forward = torch.compile(block.forward)
        block.attn.router = None  # out of the block's unit, into the root's (below)
        fully_shard(block, mp_policy=mp)
    # the root unit takes every parameter not in a unit yet: the routers too, while they hang from the root
    model.fsdp_routers = nn.ModuleList([r for r in routers if r is not None])
    fully_shard(model, mp_policy=mp)
    del model.fsdp_routers
    for block, router in zip(blocks, routers):  # back where the model reads them
        block.attn.router = router
    if not _reduce_scatter_averages(local(next(model.parameters())).device):
        model.register_forward_hook(_divide_loss_gradient)
    return model


def _divide_loss_gradient(module, args, output):
    """Where the reduce-scatter sums instead of averaging (gloo in some torch releases): each rank's gradient
    divided by the number of ranks before the sum makes the mean. The loss itself (logged) stays as it is."""
    loss = output[1]
    if loss is not None and loss.requires_grad:
        world = torch.distributed.get_world_size()
        loss.register_hook(lambda grad: grad / world)


def _reduce_scatter_averages(device):
    """Whether the process group's reduce-scatter averages when asked to (ReduceOp.AVG), as FSDP's gradient
    reduction does: gloo in torch 2.7 sums instead."""
    dist = torch.distributed
    reduce_scatter = getattr(dist, 'reduce_scatter_single', None) or dist.reduce_scatter_tensor  # (older torch)
    out = torch.zeros(1, device=device)
    reduce_scatter(out, torch.ones(dist.get_world_size(), device=device), op=dist.ReduceOp.AVG)
    return out.item() == 1.0


def local(t):
    """This rank's shard of a sharded tensor (a DTensor); any other tensor as it is."""
    return t.to_local() if hasattr(t, 'to_local') else t


def clip_grad_norm_(params, max_norm):
    """torch.nn.utils.clip_grad_norm_ over sharded gradients: the norm of the whole gradient, from the squares
    of every rank's shards (which do not overlap) summed over the ranks, then every shard scaled by the same
    factor. Returns the total norm (float32, the same on every rank)."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    squares = torch.zeros((), device=grads[0].device if grads else 'cpu')
    for g in grads:
        squares += g.float().pow(2).sum()
    torch.distributed.all_reduce(squares)
    total = squares.sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.to(g.dtype))
    return total


def checkpoint_state():
    """torch.distributed.checkpoint.state_dict (imported when first used: it takes seconds), and its
    options for the state one process has: full tensors, on the CPU, gathered to rank 0 or sent from
    it to every rank."""
    from torch.distributed.checkpoint import state_dict
    return state_dict, state_dict.StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                   broadcast_from_rank0=True)


def full_state_dicts(model, optimizers):
    """(model.state_dict(), [opt.state_dict() for opt in optimizers]) as one process would return them:
    full tensors, on the CPU, on rank 0; None on the other ranks. Collective: every rank calls it, and
    each tensor is gathered in turn, so rank 0 holds one full copy of model and optimizer state (in CPU
    memory), the GPU one tensor at a time. A tied weight is saved once (both names hold it, as in
    state_dict())."""
    dcp, full = checkpoint_state()
    model_state = dcp.get_model_state_dict(model, options=full)
    states = [dcp.get_optimizer_state_dict(model, opt, options=full) for opt in optimizers]
    if torch.distributed.get_rank():
        return None
    if model.config.tie_embeddings:
        model_state['lm_head.weight'] = model_state['transformer.wte.weight']
    return model_state, [renamed(state, {n: i for i, n in enumerate(names(model, opt))})
                         for opt, state in zip(optimizers, states)]


def sharded_optimizer_state(model, opt, state):
    """opt, made of model's sharded parameters, loaded with `state`, a full optimizer state dict (a
    checkpoint's, from any run): rank 0's, sent to every rank, each keeping its shards. Returns
    opt.state_dict(), which opt.load_state_dict takes as it is. Collective. ValueError for a state
    of other parameter groups."""
    sizes = [[len(g['params']) for g in s['param_groups']] for s in (state, opt.state_dict())]
    if sizes[0] != sizes[1]:
        raise ValueError("its groups hold other numbers of parameters")
    dcp, full = checkpoint_state()
    dcp.set_optimizer_state_dict(model, opt, renamed(state, names(model, opt)), options=full)
    return opt.state_dict()


def names(model, opt):
    """The name of each of opt's parameters in model, in opt's order: torch.distributed.checkpoint
    keys an optimizer's state by these names, where opt.state_dict() numbers the parameters."""
    name = {p: n for n, p in model.named_parameters()}
    return [name[p] for group in opt.param_groups for p in group['params']]


def renamed(state, new):
    """An optimizer state dict, each parameter's key k replaced by new[k]: numbers to names, or
    back."""
    return {'state': {new[k]: s for k, s in state['state'].items()}, 'param_groups': [
        {**group, 'params': [new[k] for k in group['params']]} for group in state['param_groups']]}
