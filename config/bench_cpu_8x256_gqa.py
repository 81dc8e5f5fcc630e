# CPU benchmark (iii): 8 layers, d 256, 8 heads with 2 KV heads (GQA); fp32, batch 8 x 256 tokens, vocab 256.
# With grouped-query attention LIMe routes only 2 KV heads per layer, so it should cost almost nothing.
# Acceptable: LIMe/baseline step time <= 1.03x (the authors' own code: 1.05x), memory <= 1.15x.
# Measured numbers: README, "Performance".
# $ python bench.py config/bench_cpu_8x256_gqa.py --threads=2 [--variants=baseline,lime,hc]
n_layer = 8
n_head = 8
n_kv_head = 2
n_embd = 256
vocab_size = 256
block_size = 256
batch_size = 8
dtype = 'float32'
device = 'cpu'
variants = 'baseline,lime'
settings = 'gqa-eager'
warmup = 3
iters = 30
