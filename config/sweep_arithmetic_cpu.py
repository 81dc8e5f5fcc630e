# The Arithmetic Expression Task (paper Sec. 5.3.2) as a sweep: LLaMA baseline vs LIMe, 3 seeds each,
# at a budget meant for the models to learn the task, not only its format (estimates below).
#
# $ python prepare.py arithmetic
# $ python sweep.py config/sweep_arithmetic_cpu.py           # -> out-sweep-arithmetic/: sweep.csv, tables
# After training, the sweep evaluates every run with arithmetic.py (greedy decoding of the 1,000 test
# examples per tier) and tabulates the accuracy per tier with its interval over seeds, next to the
# tier's majority baseline (always answering the most common result, ~10%): "above" only when the
# whole interval is above it.
#
# Why not config/train_arithmetic.py's model: at its d = 32 and lr 1e-3, 800 iterations x 8k tokens
# (0.8 epoch, 7 min) left both models below the majority baseline, the baseline with 0.2% of its
# reduction steps right. The paper gets there with 200 epochs; a laptop has ~1. So: the repo's
# default 4 x 128 shape (its speed is measured), a higher lr and smaller batches, i.e. more optimizer
# steps per minute.
#
# Budget: <= 20 minutes on 2 cores for 6 runs, 2 at a time = 3 rounds of <= 6.5 min. Measured for
# 4 x 128 at block 128: 113-136 ms per 2,048-token iteration on 2 threads, i.e. ~60 ms per 1k tokens;
# assume ~100 ms per 1k tokens for each of two runs side by side on one thread each. A 4,096-token
# iteration is then ~0.4 s: 700 iterations = ~280 s, + 3 loss evaluations (~40 iterations' worth,
# ~15 s), the process start (~10 s) and the accuracy evaluation (3,000 greedy decodings, assumed
# ~60 s) = ~6.1 min per run, ~18.5 min for the sweep. 700 x 4,096 = 2.9M tokens (~0.34 epoch of the
# 8.4M-token training set).

# the sweep
out_dir = 'out-sweep-arithmetic'
depths = '4'
variants = 'baseline,lime'
seeds = '0,1,2'
jobs = 2

# train.py, every run
dataset = 'arithmetic'
n_embd = 128
n_head = 4
n_kv_head = None
dropout = 0.0
router = 'full'
block_size = 128           # the longest example is 95 characters + newline
batch_size = 32
total_batch_size = 32 * 128  # 4,096 tokens per iteration
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
