"""train.py end to end on the CPU (and sample.py on what it trained): tiny models, a small char dataset in a temp
dir; its bad configurations (one 'error:' line each, before any work); its faults (a NaN loss, a save that fails,
a kill between the checkpoint and the log, Ctrl-C, DDP ranks that stop), after which the last good checkpoint and
every log record are intact.

The scripts run unchanged (seeded, fp32): as subprocesses where the process matters (the one-line error, a
SIGKILL, Ctrl-C, DDP under torchrun, torch.compile, whose caches should not outlive a test), else in this
process (conftest's run_here and run_script), which spares a fresh Python importing torch for each run. What a
CPU cannot run (CUDA) is patched in from outside: torch.cuda's functions are replaced before train.py runs.
"""
import errno
import glob
import json
import math
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import types

import pytest
import torch
import torch.distributed

from conftest import (MUON, OPTIMIZERS, REPO, TINY_RUN, ckpt_of, error_of, fails, files, interrupted, launch_ranks,
                      log_iters, ok, patched, run, run_script, script_here, train)
from nanolime import checkpoint
from nanolime import common
import model
from nanolime.common import UserError
from model import GPT, GPTConfig
from relatives import RelativesConfig, build_model  # noqa: E402

# 8 sequences x 32 tokens per micro-step, one micro-step per iteration
TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=8',
        '--total_batch_size=256', '--eval_iters=4', '--warmup_iters=5', '--log_interval=1', '--learning_rate=3e-3',
        '--min_lr=3e-4']


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def load(out_dir):
    return torch.load(os.path.join(out_dir, 'ckpt.pt'), map_location='cpu', weights_only=True)


@pytest.fixture(scope='session')
def trained(data_dir, tmp_path_factory):
    """One 30-iteration run, shared by the tests that only read its outputs."""
    out = str(tmp_path_factory.mktemp('run') / 'out')
    code, stdout, _ = script_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=30',
                                  '--lr_decay_iters=40', '--eval_interval=15')
    assert code == 0
    return out, stdout


def test_end_to_end_loss_falls_checkpoint_resume_sample(trained, data_dir, tmp_path, run_here, capsys):
    out = str(tmp_path / 'out')
    shutil.copytree(trained[0], out)  # the shared run stays as it was for the other tests
    log = read_log(out)
    evals = [r for r in log if 'val_loss' in r]
    assert [r['iter'] for r in evals] == [0, 15, 30]
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 0.5  # ln(vocab) ~ 4.2 at init
    losses = [r['loss'] for r in log if 'loss' in r]
    assert sum(losses[-5:]) < sum(losses[:5]) - 2.0
    ck = load(out)
    assert ck['nanolime'] == 1 and ck['iter_num'] == 30
    assert not any(k.startswith(('_orig_mod.', 'module.')) for k in ck['model'])
    assert ck['config']['dataset'] == 'shakespeare_char' and ck['config']['data_dir'] == data_dir
    assert ck['config']['total_batch_size'] == 256
    assert ck['model_args']['lime'] is True and ck['best_val_loss'] == pytest.approx(evals[-1]['val_loss'])
    assert {'optimizer', 'rng', 'meta', 'tokens', 'flops'} <= set(ck)
    assert ck['torch_version'] == torch.__version__ and ck['git_commit'] == checkpoint.git_commit()  # the code it ran
    assert ck['git_commit'] is None or len(ck['git_commit'].split('+')[0]) == 40  # None outside a git checkout
    # the router group follows the same schedule shape at its own peak
    last_lr = log[-1]['lr']
    adamw, = ck['optimizer']  # one state dict per optimizer
    for g in adamw['param_groups']:
        assert g['lr'] == pytest.approx(g['peak_lr'] * last_lr / 3e-3)
    assert any(g['peak_lr'] == 1e-2 for g in adamw['param_groups'])  # router_lr

    # resume: continues at iter 31, keeps the earlier log lines
    assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=40',
                    '--lr_decay_iters=40', '--eval_interval=15', '--init_from=resume') == 0
    stdout = capsys.readouterr().out
    assert 'resuming from' in stdout and 'at iter 31' in stdout
    log2 = read_log(out)
    iters = [r['iter'] for r in log2 if 'loss' in r]
    assert iters == list(range(1, 41))
    assert load(out)['iter_num'] == 40

    # sample with the KV cache: starts with the prompt, then new text
    assert run_here('sample.py', f'--out_dir={out}', '--start=ROMEO:', '--num_samples=2', '--max_new_tokens=40',
                    '--device=cpu') == 0
    captured = capsys.readouterr()
    assert f"iter 40, torch {torch.__version__}, commit {ck['git_commit'] or 'not recorded'}" in captured.err
    samples = [x.strip('\n') for x in captured.out.split('---------------') if x.strip()]
    assert len(samples) == 2 and all(x.startswith('ROMEO:') and len(x) >= 40 for x in samples)


def test_log_fields_and_flop_accounting(trained):
    out, stdout = trained
    log = read_log(out)
    ck = load(out)
    fpt = build_model(RelativesConfig(**ck['model_args'])).flops_per_token(ck['model_args']['block_size'])
    tokens_per_iter = 8 * 32 * 1 * 1
    assert f'x 1 accumulation steps x 1 ranks = {tokens_per_iter:,} tokens/iter' in stdout
    assert 'parameters, variant lime, ' in stdout  # train.py's default model
    for r in log:
        assert r['tokens'] == r['iter'] * tokens_per_iter
        assert r['flops'] == 3 * fpt * r['tokens']
        if 'loss' in r:
            assert {'iter', 'tokens', 'flops', 'loss', 'lr', 'dt_ms', 'tokens_per_s', 'mfu'} <= set(r)
            assert r['mfu'] is None  # no peak known on a CPU
            assert r['tokens_per_s'] == pytest.approx(tokens_per_iter / (r['dt_ms'] / 1000))
    assert ck['flops'] == 3 * fpt * 30 * tokens_per_iter and ck['tokens'] == 30 * tokens_per_iter


def test_lr_schedule(trained):
    """Linear warm-up to learning_rate at warmup_iters, cosine down to min_lr at lr_decay_iters."""
    lrs = {r['iter']: r['lr'] for r in read_log(trained[0]) if 'lr' in r}
    assert sorted(lrs) == list(range(1, 31))
    for it, lr in lrs.items():  # --learning_rate=3e-3 --min_lr=3e-4 --warmup_iters=5 --lr_decay_iters=40
        want = 3e-3 * it / 5 if it <= 5 else 3e-4 + 0.5 * (1 + math.cos(math.pi * (it - 5) / 35)) * (3e-3 - 3e-4)
        assert lr == pytest.approx(want), it


def test_mfu_with_peak_flops(data_dir, tmp_path, run_here, capsys):
    out = str(tmp_path / 'o')
    assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=3',
                    '--lr_decay_iters=10', '--eval_interval=100', '--peak_flops=1e11', '--lime=False') == 0
    rows = [r for r in read_log(out) if 'loss' in r]
    assert all(r['mfu'] == pytest.approx(r['flops'] / r['iter'] / (r['dt_ms'] / 1000) / 1e11) for r in rows)
    assert 'mfu ' in capsys.readouterr().out


def test_peak_flops_table():
    """Dense bf16 peaks by GPU name: the PCIe and NVL H100s are slower than the SXM one."""
    assert common.device_peak_flops('NVIDIA H100 PCIe') == 756e12
    assert common.device_peak_flops('NVIDIA H100 NVL') == 835e12
    assert common.device_peak_flops('NVIDIA H100 80GB HBM3') == 989e12
    assert common.device_peak_flops('NVIDIA H200') == 989e12
    assert common.device_peak_flops('NVIDIA A100-SXM4-80GB') == 312e12
    assert common.device_peak_flops('Tesla T4') is None


@pytest.mark.parametrize('optimizer', OPTIMIZERS)
def test_resume_is_exact(optimizer, data_dir, tmp_path, run_here):
    """N iterations in one run == N/2, then a resumed N/2: same losses, bit-identical weights and optimizer."""
    args = [*TINY, f'--data_dir={data_dir}', '--lr_decay_iters=20', '--eval_interval=5', '--dropout=0.1',
            f'--optimizer={optimizer}']
    full, half = str(tmp_path / 'full'), str(tmp_path / 'half')
    assert run_here('train.py', *args, f'--out_dir={full}', '--max_iters=20') == 0
    assert run_here('train.py', *args, f'--out_dir={half}', '--max_iters=10') == 0
    assert run_here('train.py', *args, f'--out_dir={half}', '--max_iters=20', '--init_from=resume') == 0
    la = [(r['iter'], r['loss'], r['lr']) for r in read_log(full) if 'loss' in r]
    lb = [(r['iter'], r['loss'], r['lr']) for r in read_log(half) if 'loss' in r]
    assert [i for i, _, _ in la] == list(range(1, 21))
    assert la == lb
    a, b = load(full), load(half)
    assert a['iter_num'] == b['iter_num'] == 20
    assert a['model'].keys() == b['model'].keys()
    for k in a['model']:
        assert torch.equal(a['model'][k], b['model'][k]), k
    assert len(a['optimizer']) == len(b['optimizer']) == (2 if optimizer == 'muon' else 1)
    for oa, ob in zip(a['optimizer'], b['optimizer']):
        assert len(oa['state']) == len(ob['state']) > 0
        for sa, sb in zip(oa['state'].values(), ob['state'].values()):
            assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_completep_resume_is_exact_and_keeps_its_depth_base(data_dir, tmp_path, run_here):
    """depth_scaling='completep' (2 layers from a base of 1): N iterations == N/2 + a resumed N/2, bit for bit, AdamW's
    eps halved in every group; resuming it with another depth_base, or as the standard model, is refused."""
    args = [*TINY, f'--data_dir={data_dir}', '--lr_decay_iters=8', '--eval_interval=3', '--lime=True',
            '--depth_scaling=completep', '--depth_base=1']
    full, half = str(tmp_path / 'full'), str(tmp_path / 'half')
    assert run_here('train.py', *args, f'--out_dir={full}', '--max_iters=6') == 0
    assert run_here('train.py', *args, f'--out_dir={half}', '--max_iters=3') == 0
    assert run_here('train.py', *args, f'--out_dir={half}', '--max_iters=6', '--init_from=resume') == 0
    assert [(r['iter'], r['loss']) for r in read_log(full) if 'loss' in r] == \
        [(r['iter'], r['loss']) for r in read_log(half) if 'loss' in r]
    a, b = load(full), load(half)
    assert a['model_args']['depth_scaling'] == 'completep' and a['model_args']['depth_base'] == 1
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    for oa, ob in zip(a['optimizer'], b['optimizer']):
        assert [g['eps'] for g in oa['param_groups']] == [g['eps'] for g in ob['param_groups']] == [0.5e-8] * 3
        for sa, sb in zip(oa['state'].values(), ob['state'].values()):
            assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for other, what in (('--depth_base=2', 'depth_base: 1 in the checkpoint, 2 now'),
                        ('--depth_scaling=standard', "depth_scaling: 'completep' in the checkpoint, 'standard' now")):
        extra = ['--depth_base=None'] if other == '--depth_scaling=standard' else []
        with pytest.raises(UserError, match=what):
            run_here('train.py', *args, f'--out_dir={half}', '--max_iters=8', '--init_from=resume', other, *extra)


def test_accumulation_is_derived_from_total_batch_size(data_dir, tmp_path, run_here, capsys):
    """total_batch_size=512 in micro-steps of 8 x 32 tokens: 2 accumulation steps, and the same training
    (to rounding) as one micro-step of 16 sequences, which draws the same 16 windows."""
    args = [*TINY, f'--data_dir={data_dir}', '--max_iters=4', '--lr_decay_iters=10', '--eval_interval=100',
            '--total_batch_size=512']
    two, one = str(tmp_path / 'two'), str(tmp_path / 'one')
    assert run_here('train.py', *args, f'--out_dir={two}') == 0
    stdout = capsys.readouterr().out
    assert 'global batch: 8 seqs x 32 tokens x 2 accumulation steps x 1 ranks = 512 tokens/iter' in stdout
    assert run_here('train.py', *args, f'--out_dir={one}', '--batch_size=16') == 0
    la, lb = read_log(two), read_log(one)
    assert [r['tokens'] for r in la if 'loss' in r] == [512, 1024, 1536, 2048]
    assert [r['loss'] for r in la if 'loss' in r] == pytest.approx([r['loss'] for r in lb if 'loss' in r], rel=1e-5)


@pytest.mark.slow
def test_ddp_cpu_two_ranks(data_dir, tmp_path):
    """torchrun, 2 gloo ranks, gradient accumulation, Muon (and AdamW beside it; AdamW alone before torch 2.9):
    both ranks end with identical weights, and DDP does not broadcast the model's buffers at every forward."""
    out = str(tmp_path / 'ddp')
    spy = tmp_path / 'ddp_spy.py'  # train.py, with DDP reporting whether it syncs buffers every forward
    spy.write_text("import os, runpy, sys, torch.nn.parallel as par\n"
                   "sys.path.insert(0, os.getcwd())  # the repository, as for `torchrun train.py`\n"
                   "init = par.DistributedDataParallel.__init__\n"
                   "def spied(self, *a, **kw):\n"
                   "    init(self, *a, **kw)\n"
                   f"    open(os.path.join({str(tmp_path)!r}, 'spy' + os.environ['RANK']), 'w').write(\n"
                   "        str(self.will_sync_module_buffers()))\n"
                   "par.DistributedDataParallel.__init__ = spied\n"
                   "sys.argv[0] = 'train.py'\n"
                   "runpy.run_path('train.py', run_name='__main__')\n")
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', str(spy)]
    args = [*TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--lr_decay_iters=10', '--eval_interval=3',
            '--total_batch_size=1024', f"--optimizer={'muon' if hasattr(torch.optim, 'Muon') else 'adamw'}"]
    # batch x block x accumulation x world = 8 x 32 x 2 x 2
    p = ok(run(cmd, *args, '--max_iters=6'))
    assert 'x 2 accumulation steps x 2 ranks = 1,024 tokens/iter' in p.stdout
    assert 'ddp: weights identical on all 2 ranks' in p.stdout
    # the RoPE tables are the same on every rank: no broadcast of them at every forward
    assert [(tmp_path / f'spy{rank}').read_text() for rank in (0, 1)] == ['False', 'False']
    log = read_log(out)
    assert [r['tokens'] for r in log if 'loss' in r] == [i * 1024 for i in range(1, 7)]
    ck = load(out)
    assert ck['world_size'] == 2 and len(ck['rng']) == 2 and ck['iter_num'] == 6
    assert ck['rng'][0]['data'] != ck['rng'][1]['data']  # each rank draws its own batches
    # an exact resume of both ranks' data streams, as a single DDP run of 6 would not tell: resume to 8 (the
    # ranks started as torchrun starts them, without its launcher process)
    rank0, rank1 = launch_ranks([sys.executable, 'train.py'], *args, '--max_iters=8', '--init_from=resume')
    ok(rank1)
    assert 'at iter 7' in ok(rank0).stdout and 'weights identical on all 2 ranks' in rank0.stdout


# torch.compile's graph capture (dynamo) without inductor's code generation, which tests/test_compile.py
# checks against eager: what this test checks is train.py's use of the compiled model
DYNAMO_ONLY = """
import functools, torch
torch.compile = functools.partial(torch.compile, backend='eager')
"""


@pytest.mark.slow
def test_compile_smoke_cpu(data_dir, tmp_path, run_here):
    """LIMe trains with --compile=True (torch.compile) and matches eager over the first steps."""
    out = str(tmp_path / 'c')
    p = ok(run(patched(DYNAMO_ONLY), *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=3',
               '--lr_decay_iters=10', '--eval_interval=100', '--compile=True', '--n_layer=3', timeout=600))
    assert 'compile True' in p.stdout
    eager = str(tmp_path / 'e')
    assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={eager}', '--max_iters=3',
                    '--lr_decay_iters=10', '--eval_interval=100', '--compile=False', '--n_layer=3') == 0
    lc = [r['loss'] for r in read_log(out) if 'loss' in r]
    le = [r['loss'] for r in read_log(eager) if 'loss' in r]
    assert len(lc) == 3 and lc == pytest.approx(le, rel=1e-4)
    assert not any(k.startswith('_orig_mod.') for k in load(out)['model'])


@pytest.mark.parametrize('gpus, torchrun, want', [(1, None, 'cuda:0'), (2, None, 'cuda:0'), (2, 1, 'cuda:1')])
def test_cuda_setup_reaches_model_placement(gpus, torchrun, want, data_dir, tmp_path, run_here, monkeypatch, capsys):
    """With one or two (fake) GPUs, `python train.py` and a torchrun rank get through device setup to place
    the model on an indexed device: rank 1 on cuda:1. torch.cuda is made to answer as on a machine with
    `gpus` H100s, as far as train.py's setup goes (set_device checks its argument as torch does); placing
    the model (Module.to) records the device and ends the run with status 17."""
    def set_device(device):
        index = torch.cuda._get_device_index(device)  # ValueError for 'cuda' without an index
        assert 0 <= index < gpus, index
        print('set_device', index)

    def to(self, *args, **kwargs):
        print('placed on', args[0] if args else kwargs['device'], flush=True)
        raise SystemExit(17)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: gpus)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, 'set_device', set_device)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'NVIDIA H100 80GB HBM3')
    monkeypatch.setattr(torch.distributed, 'init_process_group',
                        lambda backend=None, **k: print('init_process_group', backend))
    monkeypatch.setattr(torch.distributed, 'broadcast_object_list', lambda objects, src=0, **k: None)  # rank 0: ok
    monkeypatch.setattr(torch.distributed, 'all_gather_object', lambda runs, run, **k: runs.__setitem__(  # the same
        slice(None), [run] * len(runs)))
    monkeypatch.setattr(torch.nn.Module, 'to', to)
    # cuBLAS's settings on a stand-in: torch's object answers allow_tf32 from its __getattr__ (nothing in its
    # __dict__), so monkeypatching the attribute itself is undone by a delattr that fails on pytest >= 9.2 and
    # stops the undoing of every patch above; the module attribute is undone alike by every pytest
    matmul = types.SimpleNamespace(allow_tf32=False)
    monkeypatch.setattr(torch.backends.cuda, 'matmul', matmul)
    if torchrun is not None:
        for k, v in dict(RANK=torchrun, LOCAL_RANK=torchrun, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2, MASTER_ADDR='127.0.0.1',
                         MASTER_PORT=29500).items():
            monkeypatch.setenv(k, str(v))
    args = [a for a in TINY if not a.startswith(('--device', '--total_batch_size'))]
    assert run_here('train.py', *args, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--device=auto',
                    f'--total_batch_size={256 * (2 if torchrun is not None else 1)}') == 17
    stdout = capsys.readouterr().out
    assert f'placed on {want}' in stdout and f'set_device {want[-1]}' in stdout
    assert ('init_process_group nccl' in stdout) == (torchrun is not None)
    assert matmul.allow_tf32 is True  # TF32 matmuls on CUDA, as nanoGPT


def test_no_step_outlives_the_next_forward(data_dir, tmp_path, run_here, monkeypatch):
    """Nothing of a training step (its logits, its loss, its autograd graph with whatever the model keeps on it,
    as LIMe's routing keeps its buffer) is alive when the next forward starts: two steps never coexist."""
    import weakref
    import model

    class Token:
        pass

    class Tagged(torch.autograd.Function):  # keeps a Token on the graph, alive exactly as long as the graph
        @staticmethod
        def forward(ctx, loss):
            ctx.token = Token()
            alive_refs.append(weakref.ref(ctx.token))
            return loss.view_as(loss)

        @staticmethod
        def backward(ctx, grad):
            return grad
    real_forward, alive_refs = model.GPT.forward, []

    def forward(self, *args, **kwargs):
        if not self.training:
            return real_forward(self, *args, **kwargs)
        alive = [r() for r in alive_refs if r() is not None]
        assert not alive, f'still alive at the next forward: {[type(t).__name__ for t in alive]}'
        logits, loss = real_forward(self, *args, **kwargs)
        alive_refs[:] = [weakref.ref(logits), weakref.ref(loss)]
        return logits, Tagged.apply(loss)
    monkeypatch.setattr(model.GPT, 'forward', forward)
    assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--max_iters=4',
                    '--lr_decay_iters=10', '--eval_interval=2', '--total_batch_size=512') == 0  # 2 micro-steps


# ----------------------------------------------------------------------------- configuration
@pytest.fixture
def train_config(monkeypatch):
    """The config train.py ends up with for some command-line arguments (run in-process, up to configure())."""
    class Configured(Exception):
        pass

    def configure(namespace, argv=None, **kwargs):
        raise Configured(real(namespace, argv, **kwargs))
    real = common.configure
    monkeypatch.setattr(common, 'configure', configure)

    def config_of(*argv):
        monkeypatch.setattr(sys, 'argv', ['train.py', *argv])
        monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
        monkeypatch.chdir(REPO)
        with pytest.raises(Configured) as e:
            runpy.run_path('train.py', run_name='__main__')
        return e.value.args[0]
    return config_of


def test_config_parsing_types_and_files(train_config, tmp_path):
    c = train_config('--learning_rate=1', '--compile=False', '--n_kv_head=2', '--out_dir=2024', '--router=first-2')
    assert c['learning_rate'] == 1.0 and type(c['learning_rate']) is float
    assert c['compile'] is False and c['n_kv_head'] == 2 and c['out_dir'] == '2024' and c['router'] == 'first-2'
    f = tmp_path / 'cfg.py'
    f.write_text("import math\n_helper = 3\nn_layer = _helper * 2\nbatch_size = 4\n")
    c = train_config(str(f), '--batch_size=8')
    assert c['n_layer'] == 6 and c['batch_size'] == 8  # the command line wins over the file
    assert train_config('--debug')['debug'] is True
    assert train_config('--eval_only')['eval_only'] is True  # a bare flag sets a bool key
    for bad, msg in [(['--lime=1'], 'expected bool, got int'), (['--batch_size=2.5'], 'expected int, got float'),
                     (['--n_layers=3'], "did you mean 'n_layer'"), (['--n_kv_head=abc'], 'expected int or None'),
                     (['--batch_size'], 'expected --key=value'),
                     (['--gradient_accumulation_steps=2'], "unknown config key 'gradient_accumulation_steps'")]:
        with pytest.raises(common.UserError, match=msg):
            train_config(*bad)


def test_configs(train_config):
    """The default config file restates train.py's defaults; the 1B config is the paper's (Tables 2, 3, 8)."""
    assert train_config('config/train_shakespeare_char.py') == train_config()
    c = train_config('config/train_fineweb_edu_1b.py')
    assert c['total_batch_size'] == 1024 * 2048 and c['block_size'] == 2048 and c['batch_size'] == 8
    assert (c['learning_rate'], c['router_lr'], c['weight_decay'], c['beta1'], c['beta2'], c['warmup_iters'],
            c['min_lr'], c['grad_clip'], c['max_iters'], c['dtype']) == (1e-3, 1e-2, 0.1, 0.9, 0.95, 200, 1e-6, 1.0,
                                                                          20000, 'bfloat16')
    args = {k: c[k] for k in ('block_size', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden', 'lime')}
    with torch.device('meta'):
        assert round(GPT(GPTConfig(vocab_size=50257, **args)).get_num_params() / 1e9, 5) == 1.17687  # LIMe-MHA
        args['n_kv_head'] = 8
        assert round(GPT(GPTConfig(vocab_size=50257, **args)).get_num_params() / 1e9, 5) == 1.07608  # LIMe-GQA
    c = train_config('config/train_deep_narrow.py', '--n_layer=128', '--batch_size=4')
    assert c['n_layer'] == 128 and c['n_head'] == 8 and c['total_batch_size'] == 256 * 1024 and c['batch_size'] == 4
    c = train_config('config/train_arithmetic.py')
    assert c['total_batch_size'] == c['batch_size'] * c['block_size']  # one micro-step


@pytest.mark.slow
def test_muon_on_a_torch_without_it_is_one_line(data_dir, tmp_path):
    """torch.optim.Muon came in torch 2.9: on an older release optimizer='muon' is refused before any work, in one
    line naming the version it needs (torch.optim.Muon removed here stands in for an older torch)."""
    out = tmp_path / 'out'
    older = ("import runpy, sys, torch\nvars(torch.optim).pop('Muon', None)\nsys.argv[0] = 'train.py'\n"
             "runpy.run_path('train.py', run_name='__main__')\n")
    p = run([sys.executable, '-c', older], *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=2',
            '--optimizer=muon')
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"error: optimizer='muon' needs torch.optim.Muon, in torch 2.9 and newer (this is torch {torch.__version__}): "
        "upgrade torch, or use optimizer='adamw'"]
    assert not out.exists()


# ------------------------------------------------------------------ bad configurations: one error line, before any work
@pytest.mark.parametrize('args, needles', [
    (['--n_layers=2'], ["unknown config key 'n_layers'", "did you mean 'n_layer'?"]),
    (['--learnig_rate=1e-3'], ["did you mean 'learning_rate'?"]),
    (['--batch_size=abc'], ["batch_size='abc': expected int, got str"]),
    (['--batch_size=2.5'], ['expected int, got float']),
    (['--lime=yes'], ["lime='yes': expected bool, got str"]),
    (['--compile=sometimes'], ["expected 'auto', True or False"]),
    (['--max_iters'], ['expected --key=value']),
    (['config/no_such_config.py'], ['no such config file: config/no_such_config.py']),
    (['--n_embd=30', '--n_head=4'], ['invalid model config', 'n_embd=30 must be divisible by n_head=4']),
    (['--n_head=4', '--n_kv_head=3'], ['n_head=4 must be divisible by n_kv_head=3']),
    (['--n_embd=12', '--n_head=4'], ['must be even for RoPE']),
    (['--router=last-x'], ["unknown router 'last-x'", 'first-<j>']),
    (['--router=average', '--router_init=identity'],
     ["router_init='identity' has nothing to initialize with router='average' (fixed weights)"]),
    (['--batch_size=0'], ['batch_size=0 must be >= 1']),
    (['--total_batch_size=0'], ['total_batch_size=0 must be >= 1']),
    (['--batch_size=8', '--block_size=32', '--total_batch_size=1000'],
     ['total_batch_size=1000 is not a multiple of batch_size * block_size * world_size = 8 * 32 * 1 = 256',
      'set it to a multiple of 256']),
    (['--init_from=gpt2'], ["init_from='gpt2': expected 'scratch', 'resume' or 'hf:DIR'"]),
    (['--dtype=float16', '--device=cpu'], ["dtype='float16' needs CUDA"]),
    (['--device=tpu'], ["device='tpu'"]),
    (['--dataset=shakespear_char'], ["unknown dataset 'shakespear_char'", "did you mean 'shakespeare_char'?"]),
    (['--depth_scaling=completeP'], ["depth_scaling='completeP': expected", "'standard' or 'completep'"]),
    (['--depth_scaling=completep'], ["invalid model config", "depth_scaling='completep' needs depth_base >= 1"]),
    (['--depth_scaling=completep', '--depth_base=2', '--hc=2'], ["supports the baseline, lime and attnres, not hc"]),
    (['--depth_scaling=completep', '--depth_base=2', '--optimizer=muon'],
     ["depth_scaling='completep' has AdamW's rules (CompleteP's Table 1), none for optimizer='muon'"]),
])
def test_bad_config(args, needles, data_dir, run_here):
    line = error_of(run_here, 'train.py', f'--data_dir={data_dir}', '--out_dir=/nonexistent/never-written', *args)
    assert all(n in line for n in needles), (needles, line)


@pytest.mark.slow
def test_bad_config_is_one_error_line(data_dir):
    """As the user sees it, from a real process: one line on stderr, exit status 1, nothing else."""
    p = run('train.py', f'--data_dir={data_dir}', '--out_dir=/nonexistent/never-written', '--n_layers=2')
    assert p.returncode == 1 and p.stdout == ''
    assert fails(p) == "error: unknown config key 'n_layers' (--n_layers=2); did you mean 'n_layer'?"


def test_cuda_requested_without_cuda(data_dir, run_here):
    if torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    assert "device='cuda' but CUDA is not available" in error_of(run_here, 'train.py', f'--data_dir={data_dir}',
                                                                 '--device=cuda')


def test_bad_config_file(tmp_path, data_dir, run_here):
    f = tmp_path / 'bad.py'
    f.write_text("n_layer = 2\nn_heads = 4\n")
    line = error_of(run_here, 'train.py', str(f), f'--data_dir={data_dir}')
    assert "unknown config key 'n_heads'" in line and str(f) in line and "did you mean 'n_head'?" in line
    f.write_text("n_layer = 2\nbatch_size = = 3\n")
    assert f'{f}, line 2: SyntaxError' in error_of(run_here, 'train.py', str(f))
    f.write_text("import os\n_w = int(os.environ['NOPE_NOT_SET'])\n")
    assert f'{f}, line 2: KeyError' in error_of(run_here, 'train.py', str(f))


def test_total_batch_size_per_number_of_ranks(data_dir, run_here, monkeypatch):
    """The 1B config's 2M-token batch divides among 8 GPUs, not among 3: the error says so before any work."""
    for k, v in dict(RANK='0', LOCAL_RANK='0', WORLD_SIZE='3', MASTER_ADDR='127.0.0.1', MASTER_PORT='29500').items():
        monkeypatch.setenv(k, v)
    assert 'total_batch_size=2097152 is not a multiple of batch_size * block_size * world_size = 8 * 2048 * 3' in \
        error_of(run_here, 'train.py', os.path.join(REPO, 'config/train_fineweb_edu_1b.py'), f'--data_dir={data_dir}')


@pytest.mark.parametrize('arg, message', [
    ('--learning_rate=1e999', 'learning_rate=inf must be a finite number >= 0'),
    ('--router_lr=1e999', 'router_lr=inf must be a finite number >= 0'),
    ('--learning_rate=0', 'learning_rate=0.0 must be > 0'),
    ('--beta1=1.0', 'beta1=1.0 must be in [0, 1)'),
    ('--beta2=-0.5', 'beta2=-0.5 must be in [0, 1)'),
    ('--block_size=0', 'block_size=0 must be >= 1'),
    ('--seed=-1', 'seed=-1 must be >= 0'),
    ('--mlp_hidden=0', 'invalid model config: mlp_hidden=0 must be >= 1'),
    ('--n_kv_head=0', 'invalid model config: n_kv_head=0 must be >= 1'),
    ('--out_dir=', 'out_dir is empty: name a directory (--out_dir=DIR)'),
])
def test_nonsense_numbers_are_refused_before_any_work(arg, message, data_dir, tmp_path, capsys):
    with pytest.raises(UserError) as e:
        train(data_dir, tmp_path / 'out', '--max_iters=2', arg)
    assert str(e.value) == message and capsys.readouterr().out == '' and not (tmp_path / 'out').exists()


def test_resume_without_checkpoint(data_dir, tmp_path, run_here):
    assert "no checkpoint to resume from (init_from='resume') at" in error_of(
        run_here, 'train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--init_from=resume')


def test_a_mistyped_run_directory_is_not_created(short_run, data_dir, tmp_path):
    typo = str(tmp_path / 'runn')
    with pytest.raises(UserError, match="no checkpoint to resume from"):
        train(data_dir, typo, '--init_from=resume')
    shutil.copytree(short_run, tmp_path / 'run')
    with pytest.raises(UserError) as e:
        run_script('study/analyze.py', typo)
    assert str(e.value) == (f"{typo} is not a run (no ckpt.pt or log.jsonl there); did you mean {tmp_path}/run? "
                            "name the out_dirs of train.py runs")
    assert not os.path.exists(typo)


# ----------------------------------------------------------- faults: the last good checkpoint and every log record kept
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, run_here, monkeypatch):
    import model
    forward, calls = model.GPT.forward, [0]

    def nan_at_iter_8(self, *args, **kwargs):
        logits, loss = forward(self, *args, **kwargs)
        if self.training:
            calls[0] += 1
            if calls[0] == 8:
                loss = loss * float('nan')
        return logits, loss
    monkeypatch.setattr(model.GPT, 'forward', nan_at_iter_8)
    out = str(tmp_path)
    line = error_of(run_here, 'train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=20',
                    '--eval_interval=5')
    assert 'loss is nan at iter 8: training stopped' in line and 'the last good checkpoint' in line
    assert 'iter 5) is kept' in line and out in line
    ck = ckpt_of(out)
    assert ck['iter_num'] == 5
    assert all(torch.isfinite(v).all() for v in ck['model'].values())
    assert not glob.glob(os.path.join(out, '*.tmp'))


def test_a_failed_resume_leaves_the_checkpoint_and_the_log_as_they_were(run_copy, data_dir, monkeypatch):
    # records past the checkpoint (iter 4), as a run with always_save_checkpoint=False leaves them
    with open(os.path.join(run_copy, 'log.jsonl'), 'a') as f:
        for it in (5, 6):
            f.write(json.dumps({'iter': it, 'loss': 3.0}) + '\n')
    before = files(run_copy)
    forward, steps = model.GPT.forward, []

    def nan_from_the_second_step(self, *args, **kwargs):  # iter 5 is logged, iter 6 fails
        logits, loss = forward(self, *args, **kwargs)
        if self.training:
            steps.append(1)
        return logits, loss * float('nan') if len(steps) >= 2 else loss
    with monkeypatch.context() as m:
        m.setattr(model.GPT, 'forward', nan_from_the_second_step)
        with pytest.raises(UserError, match='loss is nan at iter 6: training stopped'):
            train(data_dir, run_copy, '--init_from=resume', '--max_iters=8', '--eval_interval=2')
    assert files(run_copy) == before
    # a resumed run that saves a checkpoint replaces the records past the one it started from with its own
    assert train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', '--eval_interval=2') == 0
    assert log_iters(run_copy) == [0, 1, 2, 3, 4, 5, 6]
    assert files(run_copy)['log.jsonl'].startswith(before['log.jsonl'].split(b'{"iter": 5')[0])


def test_a_save_that_fails_keeps_the_previous_checkpoint_and_log(run_copy, data_dir, monkeypatch):
    before = files(run_copy)

    def full_disk(obj, f, *args, **kwargs):
        f.write(b'half a checkpoint')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(torch, 'save', full_disk)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', '--eval_interval=2')
    assert str(e.value) == (f"training stopped at iter 6: cannot write {run_copy}/ckpt.pt: no space left on device; "
                            "the file there, if any, is unchanged: free some space (or fix the permissions), then "
                            "continue with --init_from=resume")
    assert files(run_copy) == before and sorted(os.listdir(run_copy)) == ['.lock', 'ckpt.pt', 'log.jsonl']


# the log's write after the second checkpoint's: the process dies as by `kill -9` before it
KILL_BEFORE_SECOND_LOG = """
import os, signal
from nanolime import checkpoint
_write, _logs = checkpoint.atomic_write, [0]
def atomic_write(path, *args):
    if path.endswith('log.jsonl'):
        _logs[0] += 1
        if _logs[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return _write(path, *args)
checkpoint.atomic_write = atomic_write
"""


@pytest.mark.slow
def test_kill_between_checkpoint_and_log_loses_no_record(data_dir, tmp_path, run_here, capsys):
    """The checkpoint (iter 10) is replaced, the log (iter 5) is not: the resumed run writes the records between."""
    out = str(tmp_path)
    args = [*TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=10', '--eval_interval=5']
    p = run(patched(KILL_BEFORE_SECOND_LOG), *args)
    assert p.returncode == -signal.SIGKILL and ckpt_of(out)['iter_num'] == 10
    assert [r['iter'] for r in checkpoint.read_log(out)] == list(range(6))
    assert run_here('train.py', *args, '--init_from=resume') == 0
    assert 'nothing to do' in capsys.readouterr().out
    log = checkpoint.read_log(out)
    assert [r['iter'] for r in log] == list(range(11)) and 'val_loss' in log[-1] and 'val_loss' in log[5]


def test_a_log_that_fell_behind_its_checkpoint_is_completed_on_resume(run_copy, data_dir, monkeypatch):
    """The log's write fails after the checkpoint's (a read-only disk; a kill there:
    test_kill_between_checkpoint_and_log_loses_no_record): the checkpoint holds its log, and the run that resumes
    it writes the records the file lacks."""
    complete = files(run_copy)['log.jsonl']
    write = checkpoint.atomic_write

    def log_fails(path, *args):
        if path.endswith('log.jsonl'):
            raise UserError('read-only file system')
        return write(path, *args)
    with monkeypatch.context() as m:
        m.setattr(checkpoint, 'atomic_write', log_fails)
        with pytest.raises(UserError, match='training stopped at iter 6: read-only file system'):
            train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', '--eval_interval=2')
    assert files(run_copy)['log.jsonl'] == complete and torch.load(f'{run_copy}/ckpt.pt')['iter_num'] == 6
    assert train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', '--eval_interval=2') == 0  # no work
    assert log_iters(run_copy) == [0, 1, 2, 3, 4, 5, 6] and 'val_loss' in checkpoint.read_log(run_copy)[-1]
    assert files(run_copy)['log.jsonl'].startswith(complete)


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_exits(data_dir, tmp_path, run_here, capsys):
    out = str(tmp_path)
    code, stdout, stderr = interrupted([*TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=100000',
                                        '--lr_decay_iters=100000', '--eval_interval=100000'], signal.SIGINT, 'iter 3:')
    assert code == 130, stdout + stderr
    assert 'Traceback' not in stderr and 'SIGINT received' in stderr
    n = ckpt_of(out)['iter_num']
    assert n >= 3 and f'interrupted at iter {n}: checkpoint saved to' in stdout
    assert run_here('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', f'--max_iters={n + 2}',
                    '--lr_decay_iters=100000', '--eval_interval=100000', '--init_from=resume') == 0
    assert f'at iter {n + 1}' in capsys.readouterr().out and ckpt_of(out)['iter_num'] == n + 2


# --------------------------------------------------------------------------- DDP: every rank stops, with the same error
# on rank 1 only, the 4th optimizer step leaves a weight infinite (after that iteration's loss was computed)
INF_WEIGHT_ON_RANK_1 = """
import os, torch
_step, _calls = torch.optim.AdamW.step, [0]
def step(self, *args, **kwargs):
    out = _step(self, *args, **kwargs)
    _calls[0] += 1
    if os.environ['RANK'] == '1' and _calls[0] == 4:
        with torch.no_grad():
            self.param_groups[0]['params'][0].view(-1)[0] = float('inf')
    return out
torch.optim.AdamW.step = step
"""


@pytest.mark.slow
def test_non_finite_weights_on_one_rank_stop_every_rank(data_dir, tmp_path):
    """Two DDP ranks (gloo), as torchrun starts them; one rank's weights go non-finite before a checkpoint:
    every rank reaches the same verdict and exits with the same error, none waits in a collective."""
    args = [*TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--max_iters=8', '--eval_interval=4',
            '--total_batch_size=256']  # 4 x 32 tokens x 2 ranks
    rank0, rank1 = launch_ranks(patched(INF_WEIGHT_ON_RANK_1), *args, timeout=240)
    want = 'the weights are not finite at iter 4: training stopped; no checkpoint was written by this run'
    line0, line1 = fails(rank0, want), fails(rank1, want)
    assert line1 == line0.replace('error: ', 'error: [rank 1] ')
    assert not os.path.exists(os.path.join(tmp_path, 'ckpt.pt'))


FULL_DISK = """
import torch
_save = torch.save
def save(obj, f, *args, **kwargs):  # a checkpoint's bytes go to /dev/full: torch raises its own RuntimeError
    if not str(getattr(f, 'name', '')).endswith('.tmp'):  # not a checkpoint: torch.distributed's objects
        return _save(obj, f, *args, **kwargs)
    f.write(b'the start of a checkpoint')
    dev = open('/dev/full', 'wb')
    try:
        _save(obj, dev, *args, **kwargs)
    finally:
        try:
            dev.close()
        except OSError:
            pass
torch.save = save
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
def test_a_full_disk_under_ddp_is_rank_0s_error_on_every_rank(data_dir, tmp_path):
    args = [*TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--max_iters=4', '--eval_interval=4',
            '--total_batch_size=256']  # 4 x 32 tokens x 2 ranks
    rank0, rank1 = launch_ranks(patched(FULL_DISK), *args, timeout=240)
    want = (f"error: training stopped at iter 4: cannot write {tmp_path}/ckpt.pt: no space left on device; the file "
            "there, if any, is unchanged: free some space (or fix the permissions), then run again")
    assert fails(rank0) == want and fails(rank1) == want.replace('error: ', 'error: [rank 1] ')
    assert os.listdir(tmp_path) == ['.lock']


@pytest.mark.slow
def test_every_ddp_rank_stops_when_the_out_dir_is_busy(run_copy, data_dir, held):
    """Only rank 0 takes the lock; its verdict reaches rank 1, which would otherwise go on alone and wait for rank 0
    in its first collective (or fail there with gloo's own error)."""
    held(run_copy, 'out_dir')
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS='1', WORLD_SIZE='2', LOCAL_WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
               MASTER_PORT=str(port))
    env.pop('NANOLIME_DEBUG', None)
    args = [sys.executable, 'train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={run_copy}',
            '--init_from=resume', '--max_iters=8', '--total_batch_size=256']
    procs = [subprocess.Popen(args, cwd=REPO, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = f"error: out_dir {run_copy} is in use by another process (pid {os.getpid()})"
    assert [p.returncode for p in procs] == [1, 1]
    assert errs[0].splitlines()[0].startswith(want), errs
    assert errs[1].splitlines()[0].startswith(want.replace('error: ', 'error: [rank 1] ')), errs


def test_attnres_query_lr_puts_the_pseudo_queries_in_their_own_group(data_dir, tmp_path, run_here, capsys):
    out = str(tmp_path / 'out')
    assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=2',
                    '--lr_decay_iters=2', '--warmup_iters=0', '--eval_interval=2', '--lime=False', '--attnres=block',
                    '--attnres_query_lr=5e-3') == 0
    assert 'parameters, variant attnres:block, ' in capsys.readouterr().out  # the startup line names the relative
    adamw, = load(out)['optimizer']
    peaks = {g['name']: (g['peak_lr'], g['weight_decay'], len(g['params'])) for g in adamw['param_groups']}
    assert peaks.pop('attn_res.query') == (5e-3, 0.0, 1)  # the one (2L, d) parameter, without decay
    assert {lr for lr, _, _ in peaks.values()} == {3e-3}  # everything else at learning_rate


def test_check_only_prints_the_config_and_claims_nothing(data_dir, tmp_path, run_here, capsys):
    """--check_only=True: every option checked (the model and its optimizer built too), the run's config printed as
    JSON, exit 0 before out_dir is claimed (sweep.py checks its runs so); a refusal is the run's refusal."""
    out = tmp_path / 'out'
    assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--check_only=True') == 0
    config = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert config['n_layer'] == 2 and config['learning_rate'] == 3e-3 and config['check_only'] is True
    assert not out.exists()
    with pytest.raises(UserError, match="depth_scaling='completep' has AdamW's rules"):
        run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--check_only=True',
                 '--depth_scaling=completep', '--depth_base=2', '--optimizer=muon')
    assert not out.exists()


# --------------------------------------------------------------------------- what the log says is what was trained
def test_the_log_has_the_gradient_norm_before_clipping_and_whether_it_clipped(data_dir, tmp_path, run_here, capsys):
    """grad_norm is the gradients' norm before clipping: at iter 1 (the same weights and batch in every run) it is
    the same unclipped (grad_clip=0), clipped hard (1e-3: clipped, the norm far above it) and clipped loosely."""
    norms, stdout = {}, {}
    for clip in ('0.0', '1e-3', '1e9'):
        out = str(tmp_path / clip)
        assert run_here('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=3',
                        '--lr_decay_iters=10', '--eval_interval=3', f'--grad_clip={clip}') == 0
        stdout[clip], log = capsys.readouterr().out, read_log(out)
        assert all({'grad_norm', 'clipped'} <= set(r) for r in log if 'loss' in r)
        norms[clip] = [(r['grad_norm'], r['clipped']) for r in log if 'loss' in r]
    first = norms['0.0'][0][0]
    assert first > 1e-2 and all(math.isfinite(n) for n, _ in norms['0.0'])
    assert norms['1e-3'][0][0] == pytest.approx(first, rel=1e-5) == norms['1e9'][0][0]
    assert [c for _, c in norms['0.0']] == [False] * 3 == [c for _, c in norms['1e9']]
    assert [c for _, c in norms['1e-3']] == [True] * 3
    assert f"grad norm {first:.3f} (clipped), " in stdout['1e-3']
    assert f"grad norm {first:.3f}, " in stdout['0.0'] and '(clipped)' not in stdout['0.0']


def test_a_resume_with_other_optimizer_settings_applies_them_and_says_so(data_dir, tmp_path, run_here, capsys):
    """Resumed with other optimizer options, the optimizer applies them (its groups are this run's: peak lrs,
    weight decay, betas), stdout says so in one line, and the log, the checkpoint's config and the optimizer agree."""
    out = str(tmp_path / 'out')
    args = [*TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--lr_decay_iters=20', '--eval_interval=4']
    assert run_here('train.py', *args, '--max_iters=4') == 0
    capsys.readouterr()
    assert run_here('train.py', *args, '--max_iters=6', '--init_from=resume', '--learning_rate=1e-3', '--min_lr=1e-4',
                    '--router_lr=5e-3', '--weight_decay=0.5', '--beta2=0.9') == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if 'other settings' in line]
    assert lines == [f"resuming with other settings than {out}/ckpt.pt's, applied from iter 5 on: "
                     "learning_rate 0.003 -> 0.001, min_lr 0.0003 -> 0.0001, router_lr 0.01 -> 0.005, "
                     "weight_decay 0.1 -> 0.5, beta2 0.99 -> 0.9"]
    ck, log = load(out), read_log(out)
    assert (ck['config']['learning_rate'], ck['config']['weight_decay'], ck['config']['beta2']) == (1e-3, 0.5, 0.9)
    want = 1e-4 + 0.5 * (1 + math.cos(math.pi * (6 - 5) / 15)) * (1e-3 - 1e-4)  # the new schedule at iter 6
    assert log[-1]['iter'] == 6 and log[-1]['lr'] == pytest.approx(want)
    adamw, = ck['optimizer']
    peaks = {g['name']: g['peak_lr'] for g in adamw['param_groups']}
    assert peaks.pop('router') == 5e-3 and set(peaks.values()) == {1e-3}
    for g in adamw['param_groups']:
        assert g['lr'] == pytest.approx(g['peak_lr'] * want / 1e-3) and g['betas'] == (0.9, 0.9)
        assert g['weight_decay'] == (0.5 if g['name'] == 'decay' else 0.0)  # the routers and norms: none


def test_a_resume_whose_optimizer_has_other_groups_is_refused_in_one_line(data_dir, tmp_path, run_here):
    """attnres_query_lr set on resume gives the pseudo-queries a group of their own, which the checkpoint's optimizer
    lacks: refused in one line before out_dir is touched, the checkpoint as it was."""
    out = str(tmp_path / 'out')
    args = [*TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--lr_decay_iters=20', '--attnres=block']
    assert run_here('train.py', *args, '--max_iters=2') == 0
    before = files(out)
    with pytest.raises(UserError, match=r"cannot resume from .*/ckpt.pt: its optimizer's parameter groups differ from "
                                        r"this run's \(.*\); resume with --attnres_query_lr=0.0, or train into "
                                        "another out_dir"):
        run_here('train.py', *args, '--max_iters=4', '--init_from=resume', '--attnres_query_lr=5e-3')
    assert files(out) == before


# --------------------------------------------------------------------------- what a resume changes
def test_every_option_is_classified_for_a_resume():
    """Each train.py option is in one class of checkpoint.RESUME_OPTIONS, or is one of the model's options (refused
    as the model builds them), never both (but dropout, the model's option that may change); docs/errors.md names
    each, class by class."""
    import dataclasses
    classes = checkpoint.RESUME_OPTIONS
    model_options = {f.name for f in dataclasses.fields(RelativesConfig)}
    named = [k for options in classes.values() for k in options]
    assert len(named) == len(set(named)) and set(named) & model_options == {'dropout'}
    options = set(common.script_options(os.path.join(REPO, 'train.py'))) | {'debug'}
    assert options - model_options == set(named) - {'dropout'}, options ^ (set(named) | model_options)
    docs = open(os.path.join(REPO, 'docs', 'errors.md')).read()
    table = docs[docs.index('## Resuming'):]
    for kind, options in classes.items():
        line = next(line for line in table.splitlines() if line.startswith(f'| {kind} |'))
        assert all(f'`{k}`' in line for k in options), (kind, [k for k in options if f'`{k}`' not in line])


def test_a_resume_says_and_logs_what_it_changes(data_dir, tmp_path, run_here, capsys):
    """Options that may change on a resume (the optimizer's, dropout, the batch, the evaluation's): applied, named in
    one line with an option the checkpoint's config lacks, and logged from the iteration they hold; the model
    trains with the new dropout, and the checkpoint and its log say from when."""
    out = str(tmp_path / 'out')
    args = [*TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--lr_decay_iters=20', '--eval_interval=2']
    assert run_here('train.py', *args, '--max_iters=2') == 0
    ck = load(out)
    del ck['config']['router_lr_scaling']  # as an older version wrote it
    torch.save(ck, os.path.join(out, 'ckpt.pt'))
    capsys.readouterr()
    assert run_here('train.py', *args, '--max_iters=4', '--init_from=resume', '--dropout=0.1', '--eval_iters=2',
                    '--total_batch_size=512', '--log_interval=2') == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if 'other settings' in line]
    assert lines == [f"resuming with other settings than {out}/ckpt.pt's, applied from iter 3 on: router_lr_scaling "
                     "(not recorded) -> '', dropout 0.0 -> 0.1, total_batch_size 256 -> 512, eval_iters 4 -> 2"]
    log = read_log(out)
    assert [r['iter'] for r in log] == [0, 1, 2, 3, 4]  # log_interval=2: the change's record at 3
    assert log[3] == {'iter': 3, 'changed': {'router_lr_scaling': [None, ''], 'dropout': [0.0, 0.1],
                                             'total_batch_size': [256, 512], 'eval_iters': [4, 2]}}
    assert log[-1]['tokens'] == 2 * 256 + 2 * 512
    ck = load(out)
    assert ck['model_args']['dropout'] == ck['config']['dropout'] == 0.1 and ck['log'] == [
        json.dumps(r) + '\n' for r in log]


@pytest.mark.parametrize('arg, message', [
    ('--seed=7', "the run differs (seed: 1337 in the checkpoint, 7 now; a resume continues the run the checkpoint "
                 "holds); resume with --seed=1337, or train into another out_dir"),
    ('--router_init=identity', "the model differs (router_init: 'paper' in the checkpoint, 'identity' now; a resume "
                               "continues the run the checkpoint holds); resume with --router_init=paper, or train "
                               "into another out_dir"),
    pytest.param('--optimizer=muon', "the run differs (optimizer: 'adamw' in the checkpoint, 'muon' now; a "
                 "resume continues the run the checkpoint holds); resume with --optimizer=adamw, or train into "
                 "another out_dir", marks=MUON)])
def test_a_resume_refuses_what_made_the_run(arg, message, run_copy, data_dir):
    """The seed (of the init, the data order and the evaluation batches) and the model's init are the run's: a
    resume that would change them is refused in one line saying which option to give, the run's files as they were."""
    before = files(run_copy)
    with pytest.raises(UserError) as e:
        train(data_dir, run_copy, '--init_from=resume', '--max_iters=6', arg)
    assert str(e.value) == f"cannot resume from {run_copy}/ckpt.pt: {message}"
    assert files(run_copy) == before


def test_a_model_too_large_for_the_device_is_said_as_such(data_dir, tmp_path, run_here):
    """Out of memory while the model is built (a shape too large, or an imported Llama's) is not a batch to lower."""
    with pytest.raises(UserError) as e:  # 2 layers of 2^20: terabytes, refused by the allocator at once
        run_here('train.py', *TINY, '--n_embd=1048576', '--n_head=1024', f'--data_dir={data_dir}',
                 f'--out_dir={tmp_path}/out')
    assert str(e.value) == "out of memory building the model: train a smaller one, or on a device with more memory"
    assert not os.path.exists(tmp_path / 'out')


# --------------------------------------------------------------------------- one run on every rank
@pytest.mark.slow
@pytest.mark.parametrize('both, rank1, message', [
    ([], ['--fsdp=True'], "fsdp is False on rank 0; True on rank 1"),  # FSDP on one rank: mismatched collectives
    (['--fsdp=True'], ['--learning_rate=1e-2', '--max_iters=6'],  # with max_iters: one would leave the loop early
     "learning_rate is 0.002 on rank 0; 0.01 on rank 1 (max_iters too)"),
    (['--init_from=resume'], ['resaved'], "checkpoint is ")])  # another out_dir, another checkpoint in it
def test_ranks_started_for_different_runs_stop_before_any_work(both, rank1, message, run_copy, data_dir, tmp_path):
    """Two ranks started by hand, as two machines' torchrun lines are, that differ in an option (or in the
    checkpoint they resume): every rank stops at once with one line naming the first that differs and each rank's
    value, before any collective of the run (they would hang, abort, or train apart); nothing is written."""
    out = str(tmp_path / 'out') if 'resaved' not in rank1 else run_copy
    if 'resaved' in rank1:  # the same run, saved again: another checkpoint
        other = str(tmp_path / 'other')
        shutil.copytree(run_copy, other)
        torch.save(torch.load(os.path.join(other, 'ckpt.pt'), weights_only=True), os.path.join(other, 'ckpt.pt'))
        rank1 = [f'--out_dir={other}']
    before = files(run_copy)
    per_rank = f"import os, sys\nsys.argv += {rank1!r} if os.environ['RANK'] == '1' else []"
    ranks = launch_ranks(patched(per_rank), *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=8',
                         '--total_batch_size=256', *both, timeout=240)
    line = fails(ranks[0], f"error: the ranks were started for different runs: {message}")
    assert line.endswith("; start every rank with the same options, data and checkpoint (torchrun passes its "
                         "command line to each)")
    assert fails(ranks[1]) == line.replace('error: ', 'error: [rank 1] ')
    assert files(run_copy) == before and not os.path.exists(os.path.join(tmp_path, 'out'))
