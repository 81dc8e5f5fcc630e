# The paper's 1B shapes (Table 8/9): d 2048, 16 layers, 32 heads, SwiGLU hidden 8192, vocab 50257
# (unpadded), T 2048, tied embeddings, bf16 autocast, torch.compile; GQA with 8 KV heads and MHA.
# For one 80 GB H100 (or an H200).
# $ python bench.py config/bench_1b.py --json=bench_1b.json
# $ python bench.py config/bench_1b.py --settings=gqa-ro,mha-ro      # Table 9's "+" rows (reduce-overhead)
# $ python bench.py config/bench_1b.py --settings=gqa-eager --variants=baseline,lime --profile=True
n_layer = 16
n_head = 32
n_kv_head = 8            # the `gqa` setting; `mha` uses 32
n_embd = 2048
mlp_hidden = 8192
vocab_size = 50257
block_size = 2048
# Memory per variant at batch 4 (bf16 autocast, fp32 weights + AdamW state ~16 bytes/param = 17-19 GB,
# plus ~2.3 MB/token of eager activations ~19 GB): ~40 GB eager; HC's 4 residual streams add ~1.3 MB/token
# (~11 GB). Batch 8 fits baseline/LIMe in 80 GB but leaves HC eager at the edge.
batch_size = 4
dtype = 'bfloat16'
device = 'cuda'
compile = True
settings = 'gqa-compiled,mha-compiled'
variants = 'baseline,lime,hc'
# One variant at a time on the GPU (build, warm up, time, decode, free), as the paper measures each
# model alone: three 1B models with their optimizer states do not co-reside with activations at
# batch 4 (and reduce-overhead keeps a CUDA-graph memory pool per model). GPU timings are steady
# enough for this; use --interleave=True --batch_size=2 for interleaved rounds.
interleave = False
warmup = 5               # the first steps compile (minutes per variant and setting)
iters = 20
decode_tokens = 512      # block_size 2048 >= prompt + 512: the cached path never slides
decode_prompt = 1
decode_batch = 1
decode_iters = 3
# peak_flops = 0: from the device name via model.GPU_PEAK_FLOPS (H100/H200 989 TFLOP/s dense bf16, A100 312)
