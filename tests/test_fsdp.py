"""FSDP2 (train.py --fsdp=True, nanolime/fsdp.py) on the CPU with 2 gloo ranks, against what one process and DDP
compute: the same losses, gradients averaged over the ranks (not summed), the total norm clipped, the checkpoint
one process writes, an exact resume, sample.py on the checkpoint, and bad input refused on every rank in one line.

The sharded model itself is checked by this file run as the ranks' script (`torchrun tests/test_fsdp.py`, worker()
below), against one process computing the whole global batch: one torchrun for several models.
"""
import json
import os
import shutil
import sys

import pytest
import torch

from conftest import error_of, fails, launch_ranks, ok, run, script_here  # (the ranks' script: tests/ is its path)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    WHY_NOT = None if torch.distributed.is_gloo_available() else "torch.distributed without gloo"
except ImportError:
    WHY_NOT = f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2)"
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"FSDP2 on the CPU needs fully_shard and gloo: {WHY_NOT}")

# LIMe with GQA at 4 layers: KVStack's groups of 2 layers, the second group's routers read before its blocks run
RUN = ['--device=cpu', '--n_layer=4', '--n_head=4', '--n_kv_head=2', '--n_embd=32', '--block_size=32',
       '--batch_size=4', '--total_batch_size=512', '--eval_iters=3', '--warmup_iters=2', '--lr_decay_iters=10',
       '--log_interval=1', '--eval_interval=2']  # 4 x 32 tokens x 2 accumulation steps x 2 ranks; 3 eval batches
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_sharded_model_computes_what_one_process_does():
    """Baseline (MHA), LIMe (GQA; the dynamic router too) and LIMe compiled per block, each sharded over 2 ranks
    for 2 AdamW steps, against one process on both ranks' batches: the same loss, every gradient the mean over
    the ranks (a sum would be 2x), the same clipped norm and weights, the same state dicts gathered for a
    checkpoint, each rank holding 1/2 of the weights; compiled, one graph per block and none compiled again;
    LIMe in bfloat16 to bf16's rounding, its gradients and weights float32 (worker() asserts; exit 0 if all
    hold)."""
    rank0, rank1 = launch_ranks([sys.executable, os.path.join(REPO, 'tests', 'test_fsdp.py')], timeout=600)
    ok(rank1)
    assert ok(rank0).stdout.count('matches one process') == 5, rank0.stdout


@pytest.mark.slow
def test_fsdp_trains_as_ddp_resumes_exactly_and_its_checkpoint_is_ddps(data_dir, tmp_path, run_here, capsys):
    """train.py --fsdp=True under torchrun: the losses of DDP at every iteration and evaluation; resumed from DDP's
    checkpoint at iter 2 it ends where the run of 4 without a stop ends (the sharded AdamW state resumed); its
    checkpoint is read by sample.py and resumed by one process."""
    args = [*RUN, f'--data_dir={data_dir}']
    ddp, fsdp, mixed = (str(tmp_path / name) for name in ('ddp', 'fsdp', 'mixed'))
    for rank in launch_ranks([sys.executable, 'train.py'], *args, f'--out_dir={ddp}', '--max_iters=2', timeout=600):
        ok(rank)
    p = ok(run(TORCHRUN + ['train.py'], *args, f'--out_dir={fsdp}', '--max_iters=4', '--fsdp=True', timeout=600))
    assert 'x 2 accumulation steps x 2 ranks = 512 tokens/iter' in p.stdout
    shutil.copytree(ddp, mixed)  # DDP to iter 2, then FSDP from its checkpoint to 4
    rank0, rank1 = launch_ranks([sys.executable, 'train.py'], *args, f'--out_dir={mixed}', '--max_iters=4',
                                '--fsdp=True', '--init_from=resume', timeout=600)
    ok(rank1)
    assert 'resuming from' in ok(rank0).stdout
    straight, resumed, two = read_log(fsdp), read_log(mixed), read_log(ddp)
    for key in ('loss', 'val_loss', 'train_loss_eval'):
        want = [r[key] for r in resumed if key in r]
        assert len(want) in (3, 4) and [r[key] for r in straight if key in r] == pytest.approx(want, rel=1e-5), key
        assert [r[key] for r in two if key in r] == want[:len([r for r in two if key in r])]  # mixed's start is DDP's
    a, b = (torch.load(os.path.join(d, 'ckpt.pt'), map_location='cpu', weights_only=True) for d in (fsdp, mixed))
    assert a['iter_num'] == b['iter_num'] == 4 and a['world_size'] == 2 and len(a['rng']) == 2
    assert a['model'].keys() == b['model'].keys()
    for k in a['model']:  # a resume with fresh AdamW moments would be ~lr (1e-3) off
        assert torch.allclose(a['model'][k], b['model'][k], rtol=0, atol=1e-6), k
    for sa, sb in zip(a['optimizer'], b['optimizer']):
        assert sa['param_groups'] == sb['param_groups'] and sa['state'].keys() == sb['state'].keys()
        for i in sa['state']:
            for k, v in sa['state'][i].items():
                assert v.shape == sb['state'][i][k].shape and torch.allclose(v, sb['state'][i][k], atol=1e-6), (i, k)
    code, out, _ = script_here('sample.py', f'--out_dir={fsdp}', '--device=cpu', '--num_samples=1',
                               '--max_new_tokens=8')
    assert code == 0 and out.strip()
    assert run_here('train.py', *args, f'--out_dir={fsdp}', '--max_iters=5', '--init_from=resume') == 0  # 1 process
    assert 'resuming from' in capsys.readouterr().out and read_log(fsdp)[-1]['iter'] == 5


def test_what_fsdp_does_not_run_is_one_line():
    """Outside torchrun, Muon, a relative (named as in its variant name), CompleteP, float16: one error naming
    it, before any work."""
    from nanolime.common import UserError
    from nanolime import fsdp
    from nanolime.variants import DEFAULTS, parse_variant

    def config(variant, depth_scaling='standard'):  # train.py's options of a variant
        return {**DEFAULTS, **parse_variant(variant)[0], 'depth_scaling': depth_scaling}
    with pytest.raises(UserError, match="start it with torchrun"):
        fsdp.check(False, 'adamw', config('lime'), torch.float32)
    with pytest.raises(UserError, match="optimizer='adamw' only, not 'muon'"):
        fsdp.check(True, 'muon', config('lime'), torch.float32)
    with pytest.raises(UserError, match="the baseline and LIMe only, not attnres:block and mudd:prepost: train"):
        fsdp.check(True, 'adamw', config('lime+attnres:block+mudd:prepost'), torch.float32)
    with pytest.raises(UserError, match="not mhc:static and hc8 and depth_scaling='completep'"):
        fsdp.check(True, 'adamw', config('mhc:static+hc8', 'completep'), torch.float32)
    with pytest.raises(UserError, match="float16"):
        fsdp.check(True, 'adamw', config('lime:first-2@identity'), torch.float16)
    fsdp.check(True, 'adamw', config('lime:first-2@identity'), torch.bfloat16)  # runs


def test_a_resume_of_other_parameter_groups_is_refused_before_any_collective():
    """A checkpoint's optimizer of other groups (LIMe's routers' group against the baseline's): the ValueError
    that train.py's resume turns into its one line, raised before the ranks exchange anything."""
    from model import GPT, GPTConfig
    from nanolime import fsdp
    lime, baseline = (GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=16, lime=on))
                      for on in (True, False))
    opt, theirs = (m.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.99), 'cpu') for m in (lime, baseline))
    with pytest.raises(ValueError, match="its groups hold other numbers of parameters"):
        fsdp.sharded_optimizer_state(lime, opt, theirs.state_dict())


@pytest.mark.slow
def test_every_rank_refuses_bad_input_with_the_same_line(data_dir, tmp_path, run_here):
    """Two ranks as torchrun starts them, --fsdp=True with a relative: both stop with the same one-line error
    (rank 1's prefixed), neither waits for the other, nothing is written; without torchrun it is refused too."""
    args = [*RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--fsdp=True']
    rank0, rank1 = launch_ranks([sys.executable, 'train.py'], *args, '--denseformer=True', timeout=300)
    line = fails(rank0, 'fsdp=True shards the baseline and LIMe only, not denseformer')
    assert fails(rank1) == line.replace('error: ', 'error: [rank 1] ')
    assert "fsdp=True shards the model over torchrun's ranks: start it with torchrun" in \
        error_of(run_here, 'train.py', *args)
    assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------- the ranks' side (torchrun this file)
def close(a, b, rel=1e-4):
    """a equals b to rounding, measured against b's largest entry (AdamW's moments are of the gradients' scale)."""
    return a.shape == b.shape and (a.float() - b.float()).abs().max() <= rel * b.float().abs().max() + 1e-12


def worker():
    """Each rank: models sharded over the ranks, each against the same model whole in this process on the global
    batch (both ranks' micro-batches), step by step. Prints '<name> matches one process' for each."""
    import functools
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    sys.path.insert(0, REPO)
    from model import GPT, GPTConfig
    from nanolime import fsdp
    torch.compile = functools.partial(torch.compile, backend='eager')  # dynamo's graphs, no code generation
    dist.init_process_group('gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    models = {'baseline': dict(lime=False), 'lime-gqa': dict(lime=True, n_kv_head=2),
              'lime-dynamic': dict(lime=True, router='dynamic'), 'lime-gqa compiled': dict(lime=True, n_kv_head=2)}
    for name, kw in models.items():
        config = GPTConfig(block_size=16, vocab_size=50, n_layer=4, n_head=4, n_embd=32, **kw)
        torch.manual_seed(0)
        whole = GPT(config)
        torch.manual_seed(0)
        sharded = fsdp.shard(GPT(config), torch.float32, use_compile='compiled' in name)
        optimizers = [m.configure_optimizers(0.1, 1e-2, 2e-2, (0.9, 0.99), 'cpu') for m in (whole, sharded)]
        # each rank holds its part of every tensor, the parts adding up to the whole: 1/world of it
        held = torch.tensor(sum(fsdp.local(p).numel() for p in sharded.parameters()))
        assert held <= sum(-(-p.numel() // world) for p in whole.parameters()), (name, held)
        dist.all_reduce(held)
        assert held == sum(p.numel() for p in whole.parameters()), (name, held)
        x = torch.randint(50, (2 * world, 16), generator=torch.Generator().manual_seed(1))
        for step in range(2):
            loss = sharded(x[2 * rank:2 * rank + 2], x[2 * rank:2 * rank + 2])[1]
            loss.backward()
            want = whole(x, x)[1]
            want.backward()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            assert torch.allclose(mean / world, want, rtol=1e-5), (name, mean / world, want)
            for (n, p), (n_, q) in zip(whole.named_parameters(), sharded.named_parameters()):
                assert n == n_
                g = q.grad.full_tensor()  # every rank in turn: a collective
                assert close(g, p.grad), (name, n, (g - p.grad).abs().max() / p.grad.abs().max())  # 2x if summed
            norm = fsdp.clip_grad_norm_(list(sharded.parameters()), 0.05)  # below the norm: it clips
            assert torch.allclose(norm, torch.nn.utils.clip_grad_norm_(whole.parameters(), 0.05), rtol=1e-5)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if 'compiled' in name:  # one graph per block, the same graphs at the second step
                assert counters['stats']['unique_graphs'] == config.n_layer, dict(counters['stats'])
        states = fsdp.full_state_dicts(sharded, [optimizers[1]])
        if rank == 0:
            model_state, (opt_state,) = states
            assert model_state.keys() == whole.state_dict().keys()
            assert model_state['lm_head.weight'] is model_state['transformer.wte.weight']  # tied: saved once
            # AdamW's steps on gradients equal to rounding: its division by sqrt(v) makes more of it (1e-4)
            for k, v in whole.state_dict().items():
                assert close(model_state[k], v, rel=1e-3), (name, k)
            ref = optimizers[0].state_dict()
            assert opt_state['param_groups'] == ref['param_groups'] and opt_state['state'].keys() == ref['state'].keys()
            for i, s in ref['state'].items():
                for k, v in s.items():
                    assert close(opt_state['state'][i][k], v, rel=1e-3), (name, i, k)
        else:
            assert states is None
        # a fresh sharded optimizer resumes from the full state, rank 0's (the others' is not read): every
        # shard as it was
        torch.manual_seed(0)
        again = fsdp.shard(GPT(config), torch.float32)
        opt = again.configure_optimizers(0.1, 1e-2, 2e-2, (0.9, 0.99), 'cpu')
        other = optimizers[0].state_dict()
        other['state'] = {i: {k: torch.full_like(v, 7.0) for k, v in s.items()} for i, s in other['state'].items()}
        state = fsdp.sharded_optimizer_state(again, opt, states[1][0] if rank == 0 else other)
        for i, s in optimizers[1].state_dict()['state'].items():
            for k, v in s.items():
                assert torch.equal(fsdp.local(state['state'][i][k]), fsdp.local(v)), (name, i, k)
        if rank == 0:
            print(f"{name} matches one process", flush=True)
    # bfloat16 (CUDA's default dtype, here on the CPU): gathered and computed in bf16, gradients reduced and
    # weights kept in float32; the loss of one process's autocast to bf16 rounding
    config = GPTConfig(block_size=16, vocab_size=50, n_layer=4, n_head=4, n_embd=32, lime=True, n_kv_head=2)
    torch.manual_seed(0)
    whole = GPT(config)
    torch.manual_seed(0)
    sharded = fsdp.shard(GPT(config), torch.bfloat16)
    with torch.autocast('cpu', torch.bfloat16):
        loss = sharded(x[2 * rank:2 * rank + 2], x[2 * rank:2 * rank + 2])[1]
        want = whole(x, x)[1]
    loss.backward()
    want.backward()
    mean = loss.detach().float()
    dist.all_reduce(mean)
    assert torch.allclose(mean / world, want.float(), rtol=1e-2), (mean / world, want)
    for p, q in zip(whole.parameters(), sharded.parameters()):
        assert q.dtype == fsdp.local(q.grad).dtype == torch.float32
        assert close(q.grad.full_tensor(), p.grad, rel=5e-2)
    if rank == 0:
        print("lime-gqa bf16 matches one process", flush=True)
    dist.destroy_process_group()


if __name__ == '__main__':
    worker()
