# The CPU target (ii): d=128, 16 layers, 4 heads (MHA); fp32, eager, batch 8, T 256, vocab 256.
# Target: LIMe/baseline step time <= 1.25x, memory <= 1.15x (and flat in depth: compare with (i)).
# $ python bench.py config/bench_cpu_ii.py [--threads=2] [--profile=True --decode=False]
n_layer = 16
n_head = 4
n_kv_head = None
n_embd = 128
vocab_size = 256
block_size = 256
batch_size = 8
dtype = 'float32'
compile = False
device = 'cpu'
variants = 'baseline,lime'
warmup = 3
iters = 30
decode_tokens = 512
decode_batch = 1
decode_iters = 1
