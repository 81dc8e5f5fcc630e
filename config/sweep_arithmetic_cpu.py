# The Arithmetic Expression Task (paper Sec. 5.3.2) as a sweep: LLaMA baseline vs LIMe, 3 seeds each,
# at a tier and budget where the models learn the task on a laptop, not only its format.
#
# $ python prepare.py arithmetic-2 --samples=6000    # tier 2: expressions with 2 operators
# $ python sweep.py config/sweep_arithmetic_cpu.py   # -> out-sweep-arithmetic/: sweep.csv, tables
# After training, the sweep evaluates every run with study/arithmetic.py (greedy decoding of the 1,000 test
# examples) and tabulates the accuracy with its interval over seeds, next to the majority answer's
# (always answering the most common result, ~11%): "above" only when the whole interval is above it.
#
# Why tier 2, not the paper's 4-6 operators: with one seed of the baseline at this model and budget
# (2-core CPU, ~5 min per run), test accuracy vs the majority answer's was
#   tiers 4, 5, 6 (350 of 700 iterations x 4,096 tokens)   9.3%  vs 10.5%
#   tiers 3, 4    (350 iterations x 4,096 tokens)          12.9%  vs 11.6%
#   tiers 2, 3    (700 iterations x 2,048 tokens)          23.3% / 17.1%  vs 11.4% / 12.5%
#   tier 2        (700 iterations x 2,048 tokens)          69.2%  vs 11.4%
# The paper trains 200 epochs (~1.7B tokens); a laptop has ~1.4M tokens in 5 minutes. Tier 2 has only
# ~10,000 distinct expressions: 1,000 test, 1,000 val, 6,000 train (84k tokens, so ~17 epochs here).
# For the paper's tiers on a GPU: python prepare.py arithmetic and config/train_arithmetic.py.
#
# Budget: <= 20 minutes on 2 cores for 6 runs, 2 at a time, one thread each. Measured on an idle
# 2-core x86-64 CPU: a 4-layer baseline or LIMe run ~180 s of training (700 x 2,048 tokens), an 8-layer
# one ~360 s, plus a few seconds of scoring; Block AttnRes 1.3x that, mHC 1.7x.

# the sweep
out_dir = 'out-sweep-arithmetic'
depths = '4'
variants = 'baseline,lime'
seeds = '0,1,2'
jobs = 2

# train.py, every run
dataset = 'arithmetic-2'
n_embd = 128
n_head = 4
n_kv_head = None
dropout = 0.0
router = 'full'
block_size = 128           # ~8 examples per window (the longest is 16 characters + newline)
batch_size = 16
total_batch_size = 16 * 128  # 2,048 tokens per iteration: more optimizer steps per minute
learning_rate = 2e-3       # the repo's stable lr for this shape (the paper's 1e-3 is for 200 epochs)
router_lr = 1e-2           # the paper's router lr
max_iters = 700
lr_decay_iters = 700
warmup_iters = 50
min_lr = 2e-4
weight_decay = 0.1
beta2 = 0.95
grad_clip = 1.0
eval_interval = 350
eval_iters = 20
log_interval = 25
always_save_checkpoint = True
device = 'cpu'
dtype = 'float32'
compile = False
