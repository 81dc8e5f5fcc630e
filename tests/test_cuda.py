"""The CUDA path, on a GPU: what only a GPU can get wrong. Every test here is marked `cuda` and skipped,
with its reason, where torch sees no CUDA device.

$ python -m pytest -m cuda          # these tests alone (dev/gpu_check.py runs them first)

bf16 autocast against the float32 reference (every router variant, MHA and GQA); two-phase routing
against eq. (2) as written; inductor (Triton) against eager; cached decoding; SDPA's fused kernels on
LIMe's routed keys and values; compiled peak memory flat in depth; train.py end to end with compile and
bf16, its checkpoint sampled on the CPU. The models are tiny, so that the file takes a few minutes on
one GPU, most of them compiling. float32 runs here with TF32 off (full float32 matmuls), so that the
float32 tolerances are float32's."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.utils import counters

from nanolime import checkpoint
import model as M
from conftest import ok, run
from conftest import GROUPINGS, VARIANTS, build, loss_and_grads, plain_routed, scramble, step_logits

# float32 runs with TF32 off (conftest.full_float32), so that the float32 tolerances are float32's
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
              pytest.mark.usefixtures('full_float32')]
DEV = 'cuda'
V = 50


def tokens(*shape, seed=0):
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed)).to(DEV)


def rel(a, b):
    """Norm-wise relative error of `a` against the reference `b`."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ----------------------------------------------------------------------------- numerics
@pytest.mark.parametrize('router', VARIANTS)
@pytest.mark.parametrize('n_kv_head', [4, 2], ids=['mha', 'gqa'])
def test_bf16_autocast_matches_the_float32_reference(router, n_kv_head, monkeypatch):
    """A 6-layer LIMe model under bf16 autocast (train.py's default on a GPU), forward and backward,
    against the same weights in float32 with eq. (2) as written (route_reference): logits, loss and
    every parameter's gradient. bf16 keeps 8 significant bits (rounding error up to 2^-9 = 0.2 % of a
    value); every matmul output, routed key and value and attention output is rounded once more, six
    layers deep and back, so the errors add up to about 1 % of a tensor's norm. Measured with bf16
    autocast on a CPU (the same rounding points): logits 0.24-0.46 %, gradients at most 1.8 % (a
    dynamic router's); the bounds are about 3x that. A routing error shows far above them: phase 1's
    partial sum dropped under bf16 gives logits 6-16 % off and gradients 80-98 %."""
    model = build(lime=True, router=router, n_kv_head=n_kv_head, n_layer=6, n_embd=64, block_size=64).to(DEV)
    x, y = tokens(4, 64), tokens(4, 64, seed=1)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        logits, grads = loss_and_grads(model, x, y)
    with monkeypatch.context() as patch:
        patch.setattr(M.KVStack, 'routed', plain_routed)
        ref_logits, ref_grads = loss_and_grads(model, x, y)
    assert logits.dtype == torch.bfloat16 and ref_logits.dtype == torch.float32
    assert rel(logits, ref_logits) <= 0.015
    loss, ref_loss = (F.cross_entropy(t.float().view(-1, V), y.view(-1)) for t in (logits, ref_logits))
    assert abs(loss.item() - ref_loss.item()) <= 0.01  # ln(50) = 3.9: 0.25 % (measured: <= 0.0001)
    assert grads.keys() == ref_grads.keys() and any('router' in n for n in grads) == (router != 'average')
    for name, g in grads.items():
        assert g.dtype == torch.float32, name  # float32 weights get float32 gradients under autocast
        assert rel(g, ref_grads[name]) <= 0.05, (name, rel(g, ref_grads[name]))


def test_rms_norm_reads_and_returns_float32_under_bf16_autocast():
    """The residual stream stays float32 under bf16 autocast, so every RMSNorm reads float32 and returns it, as on
    the CPU (tests/test_model.py): torch 2.12's float32 rms_norm for bf16 inputs under CUDA autocast (pytorch
    issue 188955) finds no bf16 input here, and the model is the same under CI's torch and the GPU's."""
    model, dtypes = build(lime=True, n_kv_head=2).to(DEV), []
    for m in model.modules():
        if isinstance(m, torch.nn.RMSNorm):
            m.register_forward_hook(lambda m, args, out: dtypes.append((args[0].dtype, out.dtype)))
    with torch.autocast('cuda', dtype=torch.bfloat16):
        model(tokens(2, 16), tokens(2, 16))
    assert dtypes == [(torch.float32, torch.float32)] * (2 * model.config.n_layer + 1)


@pytest.mark.parametrize('n_kv_head', [4, 2], ids=['mha', 'gqa'])
def test_two_phase_routing_matches_eq2_on_cuda(n_kv_head, monkeypatch):
    """KVStack's two-phase sum against eq. (2) as written (route_reference), in float32 on the GPU:
    logits and every gradient, every router variant, every group-size case of tests/test_model.py.
    Only the summation order differs: the CPU test's float32 tolerances."""
    for router in VARIANTS:
        for n_layer, group in GROUPINGS:
            model = build(lime=True, router=router, n_kv_head=n_kv_head, n_layer=n_layer).to(DEV)
            if group is not None:
                model.route_group_size = group
            x, y = tokens(2, 16), tokens(2, 16, seed=1)
            fast_logits, fast_grads = loss_and_grads(model, x, y)
            with monkeypatch.context() as patch:
                patch.setattr(M.KVStack, 'routed', plain_routed)
                ref_logits, ref_grads = loss_and_grads(model, x, y)
            where = f"router={router}, L={n_layer}, group={group}"
            torch.testing.assert_close(fast_logits, ref_logits, atol=1e-5, rtol=1e-5, msg=where)
            assert fast_grads.keys() == ref_grads.keys()
            for name in ref_grads:
                torch.testing.assert_close(fast_grads[name], ref_grads[name], atol=1e-6, rtol=1e-4,
                                           msg=f"{name} ({where})")


@pytest.mark.slow
@pytest.mark.parametrize('kw', [dict(lime=True, n_kv_head=2), dict(lime=True, router='dynamic')],
                         ids=['lime-gqa', 'lime-dynamic'])
def test_inductor_matches_eager_on_cuda(kw):
    """torch.compile (inductor, Triton kernels) against eager, float32, one training step: one graph,
    no graph break, loss to 1e-5 and every gradient to 1e-4 of its largest entry (the CPU test's bounds:
    fused kernels change the summation order, nothing else)."""
    torch._dynamo.reset()
    counters.clear()
    model, ref = build(n_layer=3, **kw).to(DEV), build(n_layer=3, **kw).to(DEV)
    x = tokens(2, 16, seed=2)
    _, loss = torch.compile(model, fullgraph=True)(x, x)
    loss.backward()
    _, ref_loss = ref(x, x)
    ref_loss.backward()
    assert sum(counters['graph_break'].values()) == 0, dict(counters['graph_break'])
    assert counters['stats']['unique_graphs'] == 1
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=0)
    grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        scale = grads[name].grad.abs().max().clamp_min(1e-12)
        assert ((p.grad - grads[name].grad).abs().max() / scale).item() <= 1e-4, name


@pytest.mark.slow
def test_compiled_gradients_match_eager_at_a_mid_shape():
    """dev/grad_check.py at 2 layers x 1024, T 1024, batch 4, bf16, vocab 50257: every compiled gradient within
    bf16's tolerance of eager's. Here, on torch 2.11, with an earlier routing sum (an autograd.Function whose
    forward added in place: pytorch issue 180642) every gradient behind layer 1's routed keys and values was off
    by about its own size (H200), in float32 too, while the baseline and autograd's own routing passed; the tiny
    shapes of test_inductor_matches_eager_on_cuda did not show it."""
    out = ok(run('dev/grad_check.py', '--n_layer=2')).stdout
    assert 'ok: every compiled gradient within' in out, out


@pytest.mark.parametrize('kw', [dict(), dict(lime=True), dict(lime=True, router='dynamic', n_kv_head=2)],
                         ids=['baseline', 'lime', 'lime-dynamic-gqa'])
def test_cached_decoding_is_exact_on_cuda(kw):
    """Greedy decoding with the KV cache on the GPU (float32): each step's logits equal a full
    recomputation (the CPU test's tolerance), and generate() gives the same tokens with and without the
    cache."""
    model = scramble(build(seed=1, **kw)).to(DEV).eval()
    prompt = tokens(2, 4, seed=3)
    with torch.no_grad():
        idx, cached = step_logits(model, prompt, 12)
        for t in range(12):
            full, _ = model(idx[:, :4 + t], idx[:, :4 + t])
            torch.testing.assert_close(cached[t], full[:, -1], atol=1e-5, rtol=1e-5)
    assert torch.equal(model.generate(prompt, 12, top_k=1), idx)
    assert torch.equal(model.generate(prompt, 12, top_k=1, use_cache=False), idx)


# ----------------------------------------------------------------------------- kernels and memory
FUSED = ('flash', 'efficient', 'cudnn')  # aten::_scaled_dot_product_{flash,efficient,cudnn}_attention[_backward]


def sdpa_ops(fn):
    """The names of the attention ops that fn() dispatched (torch.profiler), e.g.
    aten::_scaled_dot_product_flash_attention; the math fallback is ..._attention_math, or, compiled,
    no fused op at all (inductor decomposes it into matmuls and a softmax)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages() if 'scaled_dot_product' in e.key}


@pytest.mark.slow
@pytest.mark.parametrize('n_kv_head, compiled', [(8, False), (2, False), (2, True)],
                         ids=['mha', 'gqa', 'gqa-compiled'])
def test_sdpa_runs_a_fused_kernel_on_routed_keys_and_values(n_kv_head, compiled):
    """LIMe's routed keys and values reach SDPA as views of the routed (H_kv, 2, B, T, d_h) tensor, and
    with GQA through enable_gqa, which only flash attention (and the math fallback) support: under bf16
    autocast the forward, the backward and cached decoding must each run a fused kernel (flash,
    memory-efficient or cuDNN) and never the math fallback, eager and compiled."""
    model = build(lime=True, n_layer=3, n_head=8, n_kv_head=n_kv_head, n_embd=128, block_size=128).to(DEV)
    fwd = torch.compile(model, fullgraph=True) if compiled else model
    x = tokens(4, 128)

    def train_step():
        with torch.autocast(DEV, dtype=torch.bfloat16):
            _, loss = fwd(x, x)
        loss.backward()
    if compiled:
        train_step()  # compile outside the profiler
    ops = sdpa_ops(train_step)
    assert any(k in op for op in ops for k in FUSED) and not any('math' in op for op in ops), ops
    assert any('backward' in op and any(k in op for k in FUSED) for op in ops), ops
    if not compiled:  # prefill (causal, no mask) and one token at a time (no mask)
        model.eval()
        with torch.autocast(DEV, dtype=torch.bfloat16):
            ops = sdpa_ops(lambda: model.generate(x[:1, :8], 8, top_k=1))
        assert any(k in op for op in ops for k in FUSED) and not any('math' in op for op in ops), ops


@pytest.mark.slow
def test_compiled_peak_memory_is_flat_in_depth():
    """Peak CUDA memory of one compiled bf16 training step (forward and backward), LIMe over the
    baseline, at 4 and 8 layers: activations dominate (vocab 50), and LIMe adds about a fixed share per
    layer (its sources, their block copies and gradients), so the ratio stays about put. Measured on a
    CPU with the same partitioner (aot_eager_decomp_partition, peak from the profiler's allocation
    events): 1.10 at 4 layers, 1.14 at 8 (more of the layers' sources sit in completed blocks); with eq.
    (2) as written instead (a torch.cat of every source per layer, kept for backward: O(L^2)), 1.18 and
    1.38. Bounds: <= 1.5, and at most 0.08 higher at 8 layers."""
    x = tokens(8, 256)
    ratios = {}
    for L in (4, 8):
        peak = {}
        for name, kw in (('baseline', {}), ('lime', dict(lime=True))):
            torch._dynamo.reset()
            model = build(n_layer=L, n_embd=64, block_size=256, **kw).to(DEV)
            compiled = torch.compile(model, fullgraph=True)
            for i in range(2):  # the first step compiles; the second is measured
                model.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                with torch.autocast(DEV, dtype=torch.bfloat16):
                    _, loss = compiled(x, x)
                loss.backward()
                del loss
                torch.cuda.synchronize()
                peak[name] = torch.cuda.max_memory_allocated() - before
            del model, compiled
        ratios[L] = peak['lime'] / peak['baseline']
    assert ratios[4] <= 1.5 and ratios[8] <= 1.5, ratios
    assert ratios[8] - ratios[4] <= 0.08, ratios


# ----------------------------------------------------------------------------- train.py and sample.py
@pytest.mark.slow
def test_train_on_cuda_compiled_bf16_then_sample_on_the_cpu(data_dir, tmp_path):
    """train.py on the GPU as its defaults run it there (compile, bf16, fused AdamW): the loss falls; the
    checkpoint samples on the GPU and, loaded on the CPU, samples there too."""
    out = str(tmp_path / 'out')
    p = ok(run('train.py', f'--data_dir={data_dir}', f'--out_dir={out}', '--device=cuda', '--compile=True',
               '--dtype=bfloat16', '--n_layer=2', '--n_head=4', '--n_embd=64', '--block_size=64', '--batch_size=16',
               '--total_batch_size=1024', '--max_iters=60', '--lr_decay_iters=60', '--warmup_iters=5',
               '--eval_interval=60', '--eval_iters=4', '--log_interval=10', '--learning_rate=3e-3', '--min_lr=3e-4'))
    assert 'device cuda:0, torch.bfloat16, compile True' in p.stdout
    log = checkpoint.read_log(out)
    evals = [r['val_loss'] for r in log if 'val_loss' in r]
    losses = [r['loss'] for r in log if 'loss' in r]
    assert len(evals) == 2 and evals[-1] < evals[0] - 0.5, evals  # ln(vocab) ~ 4.2 at init
    assert losses[-1] < losses[0] - 0.5, losses
    for device in ('cuda', 'cpu'):
        s = ok(run('sample.py', f'--out_dir={out}', f'--device={device}', '--num_samples=1', '--max_new_tokens=40'))
        assert len(s.stdout.split('---------------')[0]) >= 40, s.stdout
    model, _ = checkpoint.load_model(out, 'cpu')
    assert {t.device.type for t in model.state_dict().values()} == {'cpu'}
