# CPU benchmark (i): 4 layers, d 128, 4 heads (MHA); fp32, batch 8 x 256 tokens, vocab 256.
# Measures LIMe's train-step time and activation memory against the baseline at a shallow depth.
# Acceptable: LIMe/baseline step time <= 1.08x, memory <= 1.15x (the authors' own code: 1.12x step time
# on the same machine). Measured numbers: README, "Performance".
# $ python bench.py config/bench_cpu_4x128.py --threads=2
# $ python bench.py config/bench_cpu_4x128.py --threads=2 --settings=mha-compiled   # the same, compiled
n_layer = 4
n_head = 4
n_kv_head = None
n_embd = 128
vocab_size = 256
block_size = 256
batch_size = 8
dtype = 'float32'
device = 'cpu'
variants = 'baseline,lime'
settings = 'mha-eager'
warmup = 5
iters = 60
