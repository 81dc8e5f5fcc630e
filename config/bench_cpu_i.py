# The CPU target (i): d=128, 4 layers, 4 heads (MHA); fp32, eager, batch 8, T 256, vocab 256.
# Target: LIMe/baseline step time <= 1.08x, memory <= 1.15x.
# $ python bench.py config/bench_cpu_i.py [--threads=2] [--variants=baseline,lime,hc]
n_layer = 4
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
warmup = 5
iters = 60
decode_tokens = 512
decode_batch = 1
decode_iters = 3
