# GPU benchmark at the paper's 1B shapes (its Tables 8 and 9): d 2048, 16 layers, 32 heads, SwiGLU hidden
# 8192, vocab 50257, T 2048, tied embeddings, bf16 autocast, torch.compile; GQA (8 KV heads) and MHA.
# For one 80 GB H100 (or H200). Compare the ratios with the paper's Table 9: LIMe/baseline step time
# +1.57% (GQA) and +10.46% (MHA), memory +0.00%; HC +25.39% / +22.85%.
# $ python bench.py config/bench_1b.py --json=bench_1b.json
# $ python bench.py config/bench_1b.py --settings=gqa-ro,mha-ro      # with CUDA graphs (reduce-overhead)
n_layer = 16
n_head = 32
n_kv_head = 8            # the `gqa` setting; `mha` uses 32
n_embd = 2048
mlp_hidden = 8192
vocab_size = 50257
block_size = 2048
# Memory per variant at batch 4 (bf16 autocast, fp32 weights + AdamW state ~16 bytes/param = 17-19 GB,
# plus ~2.3 MB/token of eager activations ~19 GB): ~40 GB eager; HC's 4 residual streams add ~1.3 MB/token
# (~11 GB). Batch 8 fits baseline and LIMe in 80 GB but leaves HC eager at the edge.
batch_size = 4
dtype = 'bfloat16'
device = 'cuda'
settings = 'gqa-compiled,mha-compiled'
variants = 'baseline,lime,hc'
# One variant at a time on the GPU (build, warm up, time, free), as the paper measures each model alone:
# three 1B models with their optimizer states do not fit beside each other's activations at batch 4.
# GPU timings are steady enough for this; --interleave=True --batch_size=2 interleaves instead.
interleave = False
warmup = 5               # the first step compiles (minutes per variant and setting)
iters = 20
# peak_flops = 0: from the GPU's name (H100 SXM/H200 989, H100 NVL 835, H100 PCIe 756, A100 312 TFLOP/s)
