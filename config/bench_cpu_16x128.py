# CPU benchmark (ii): 16 layers, d 128, 4 heads (MHA); fp32, batch 8 x 256 tokens, vocab 256.
# The deep one of the three: LIMe's routing reads (l+1) sources at layer l, so its cost grows with depth.
# Acceptable: LIMe/baseline step time <= 1.25x (the authors' own code: 1.42x), memory <= 1.15x and the
# same as at 4 layers (compare with config/bench_cpu_4x128.py). Measured numbers: README, "Performance".
# $ python bench.py config/bench_cpu_16x128.py --threads=2
# $ python dev/bench_detail.py config/bench_cpu_16x128.py --sections=profile   # where the time goes
n_layer = 16
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
warmup = 3
iters = 30
