# LIMe's cost against depth on one GPU, in the paper's deep setting (section 5.5, config/train_deep_narrow.py):
# 32, 64 and 128 layers x 512 wide, 8 heads (MHA), T 1024, vocab 50257, bf16 autocast, torch.compile;
# baseline and LIMe from one init, interleaved: step time and peak memory, beside the forward FLOP ratio
# (flops_per_token). This is where two-phase routing should matter most (about tenfold fewer routing
# kernels at 128 layers: predicted, not measured). Not yet run on a GPU. Compiling 128 layers takes
# minutes per variant.
# $ python bench.py config/bench_depth_gpu.py --json=bench_depth.json
# $ python bench.py config/bench_depth_gpu.py --depths=128 --settings=mha-eager    # without the compile
depths = '32,64,128'
n_head = 8
n_kv_head = None
n_embd = 512
vocab_size = 50257
block_size = 1024
batch_size = 8            # 8k tokens a step; 128 layers: 437M parameters
dtype = 'bfloat16'
device = 'cuda'
variants = 'baseline,lime'
settings = 'mha-compiled'
warmup = 2                # the first step compiles
iters = 10
