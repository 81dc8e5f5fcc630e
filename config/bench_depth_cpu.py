# LIMe's cost against depth on a CPU, in one command: at 8, 16, 32 and 64 layers (width 64, 4 heads of
# 16, MHA, batch 16 x 128 tokens, vocab 65, fp32), LIMe over the baseline, eager and compiled
# (torch.compile, fullgraph, inductor): step time, bytes saved for backward, and the first step's time
# (compilation included). Measured numbers: docs/performance.md. A long run: compiling 64 layers takes
# minutes on a laptop CPU; --settings=mha-eager alone takes a few.
# $ python bench.py config/bench_depth_cpu.py
depths = '8,16,32,64'
n_head = 4
n_kv_head = None
n_embd = 64
vocab_size = 65
block_size = 128
batch_size = 16
dtype = 'float32'
device = 'cpu'
variants = 'baseline,lime'
settings = 'mha-eager,mha-compiled'
warmup = 3
iters = 15
