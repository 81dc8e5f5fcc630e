# LIMe next to its relatives on a CPU, against depth: Attention Residuals (Full and Block, 8 blocks) and
# mHC (with HC, which it constrains), at 8, 16 and 32 layers, width 64 (4 heads of 16, MHA), batch
# 16 x 128 tokens, vocab 65, fp32, eager: the shapes of config/sweep_deep_narrow_cpu.py. Step time and
# bytes saved for backward, each over the baseline.
# $ python bench.py config/bench_relatives_cpu.py
depths = '8,16,32'
n_head = 4
n_kv_head = None
n_embd = 64
vocab_size = 65
block_size = 128
batch_size = 16
dtype = 'float32'
device = 'cpu'
variants = 'baseline,lime,attnres,attnres-block,hc,mhc'
settings = 'mha-eager'
warmup = 3
iters = 15
