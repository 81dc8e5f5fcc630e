"""
Our baseline's train step next to the same architecture in transformers (LlamaForCausalLM: sdpa attention,
SwiGLU 384, tied embeddings, RMSNorm eps 1e-6, no biases) and next to nanoGPT's GPT-2, at nanoGPT's CPU recipe
for Shakespeare characters (4 layers, 4 heads, width 128, block 64, batch 12, no dropout, fp32 eager, AdamW),
timed in interleaved rounds in one process so that a busy machine slows all alike; then a profile of ours and
nanoGPT's (torch.profiler, self CPU time by op). nanoGPT is not shipped here: clone it beside this repository
first; transformers comes from requirements-hf.txt.

$ git clone https://github.com/karpathy/nanoGPT ../nanoGPT
$ python dev/bench_nanogpt.py ../nanoGPT          # 30 rounds of 10 steps each, about 3 minutes on 2 cores

LlamaForCausalLM is the like-for-like anchor: the same function, written by another project.

The models differ by design in the MLP (our SwiGLU, hidden 384 by the Llama rule, against nanoGPT's GELU
with 512: 12.5 % more MLP FLOPs), the norm (RMSNorm against LayerNorm, which has a fused CPU kernel), RoPE
against learned positions. "nanoLIMe" is the default model (what a user switching from nanoGPT pays per
step); "nanoLIMe, MLP 344" has nanoGPT's MLP FLOPs (3 x 128 x 344 = 2 x 128 x 512, rounded to 8).
"""
import importlib.util
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from model import GPT, GPTConfig  # noqa: E402

if len(sys.argv) < 2 or not os.path.isfile(os.path.join(sys.argv[1], 'model.py')):
    sys.exit("error: give the path of a nanoGPT checkout (git clone https://github.com/karpathy/nanoGPT), "
             "e.g. python dev/bench_nanogpt.py ../nanoGPT")
spec = importlib.util.spec_from_file_location('nanogpt_model', os.path.join(sys.argv[1], 'model.py'))
nanogpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nanogpt)
rounds, steps = 30, 10
B, T, V = 12, 64, 65
shape = dict(n_layer=4, n_head=4, n_embd=128, block_size=T, vocab_size=V, dropout=0.0)
NAMES = ('nanoGPT', 'nanoLIMe', 'nanoLIMe, MLP 344', 'LlamaForCausalLM')


class Llama(torch.nn.Module):
    """transformers' LlamaForCausalLM at our baseline's shape, called as our GPT is: (logits, loss)."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=V, hidden_size=shape['n_embd'], intermediate_size=384,
                             num_hidden_layers=shape['n_layer'], num_attention_heads=shape['n_head'],
                             num_key_value_heads=shape['n_head'], max_position_embeddings=T, rms_norm_eps=1e-6,
                             tie_word_embeddings=True, attention_bias=False, mlp_bias=False, attention_dropout=0.0)
        config._attn_implementation = 'sdpa'
        self.llama = LlamaForCausalLM(config)

    def forward(self, x, y):
        logits = self.llama(input_ids=x, use_cache=False).logits
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, V), y.view(-1))


def build(name):
    torch.manual_seed(0)
    if name == 'nanoGPT':
        model = nanogpt.GPT(nanogpt.GPTConfig(**shape, bias=False))
        return model, model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), 'cpu')
    if name == 'LlamaForCausalLM':  # AdamW with our groups: the matrices decayed, embedding and norms not
        model = Llama()
        params = [p for p in model.parameters()]
        groups = [dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
                  dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)]
        return model, torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))
    model = GPT(GPTConfig(**shape, mlp_hidden=344 if 'MLP' in name else None))
    return model, model.configure_optimizers(0.1, 1e-3, 1e-2, (0.9, 0.99), 'cpu')


def step(model, opt, x, y):
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


g = torch.Generator().manual_seed(0)
x, y = torch.randint(V, (B, T), generator=g), torch.randint(V, (B, T), generator=g)
models = {name: build(name) for name in NAMES}
for name, (model, opt) in models.items():
    print(f"{name:>18}: {sum(p.numel() for p in model.parameters()):,} parameters")
    for _ in range(3):  # warm-up
        step(model, opt, x, y)
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {rounds} rounds of {steps} steps, batch {B} x {T}")
ratios = {name: [] for name in NAMES[1:]}
for r in range(rounds):
    ms = {}
    for name in (NAMES if r % 2 == 0 else NAMES[::-1]):  # alternate who goes first
        model, opt = models[name]
        t0 = time.perf_counter()
        for _ in range(steps):
            step(model, opt, x, y)
        ms[name] = (time.perf_counter() - t0) / steps * 1e3
    for name in ratios:
        ratios[name].append(ms[name] / ms['nanoGPT'])
    print(f"round {r + 1:>2}: " + ", ".join(f"{name} {ms[name]:.2f} ms" for name in NAMES))
for name, rs in ratios.items():
    q1, _, q3 = statistics.quantiles(rs, n=4)
    print(f"median step ratio {name} / nanoGPT: {statistics.median(rs):.3f} (quartiles {q1:.3f}-{q3:.3f})")
rs = [a / b for a, b in zip(ratios['nanoLIMe'], ratios['LlamaForCausalLM'])]  # the same rounds, nanoGPT cancels
q1, _, q3 = statistics.quantiles(rs, n=4)
print(f"median step ratio nanoLIMe / LlamaForCausalLM: {statistics.median(rs):.3f} (quartiles {q1:.3f}-{q3:.3f})")
d, L = shape['n_embd'], shape['n_layer']  # forward matmul FLOPs per token, multiply-add = 2, as flops_per_token
gpt2 = L * (2 * 4 * d * d + 2 * 2 * d * 4 * d + 2 * 2 * T * d) + 2 * d * V  # qkv + proj, GELU MLP 4d, attention
ours = models['nanoLIMe'][0].flops_per_token(T)  # q, k, v, o + SwiGLU 384 (3 matrices) + attention
print(f"forward matmul FLOPs per token: nanoLIMe {ours:,}, nanoGPT {gpt2:,}: {ours / gpt2:.3f}x")
for name in NAMES[:2]:  # where the time goes: self CPU time per op, per step
    model, opt = models[name]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step(model, opt, x, y)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) / steps / 1e3
    print(f"\n{name}: {total:.1f} ms of self CPU time per step (profiled); the ops above 1 %:")
    for e in events:
        ms = e.self_cpu_time_total / steps / 1e3
        if ms >= total / 100:
            print(f"  {e.key[:58]:<58} {ms:6.2f} ms  {e.count // steps:>4} calls")
