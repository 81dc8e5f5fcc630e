# CPU benchmark at the shape of the deep-narrow depth sweep (config/sweep_deep_narrow_cpu.py, 32 layers):
# 32 layers, d 64, 4 heads of 16 (MHA), vocab 65 (shakespeare_char), batch 16 x 128 tokens, fp32.
# Deep and narrow is where LIMe's router is heaviest: at this shape it adds 12% forward FLOPs, so
# LIMe/baseline step time cannot go below ~1.12x. Acceptable: <= 1.20x eager. Where time goes:
#   python dev/bench_detail.py config/bench_deep_narrow_cpu.py --sections=profile
# $ python bench.py config/bench_deep_narrow_cpu.py
n_layer = 32
n_head = 4
n_kv_head = None
n_embd = 64
vocab_size = 65
block_size = 128
batch_size = 16
dtype = 'float32'
device = 'cpu'
variants = 'baseline,lime'
settings = 'mha-eager,mha-compiled'   # compiling 32 layers takes a few minutes on a laptop CPU
threads = 1              # as in the sweep, which runs two single-threaded runs side by side
warmup = 3
iters = 20
