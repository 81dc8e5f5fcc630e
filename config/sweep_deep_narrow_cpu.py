# Depth sweep on a 2-core laptop CPU, deep and narrow: does LIMe's advantage grow with depth
# (paper Sec. 5.5, Fig. 6: 32-128 layers)? LLaMA baseline vs LIMe at 4, 8, 16 and 32 layers,
# width 64 (4 heads of 16), on shakespeare_char, 3 seeds each: 24 runs.
#
# $ python prepare.py
# $ python sweep.py config/sweep_deep_narrow_cpu.py          # -> out-sweep-deep-narrow/: sweep.csv, table, plots
# $ python sweep.py config/sweep_deep_narrow_cpu.py --report_only=True   # the table and plots of the runs so far
# Interrupted (Ctrl-C, a crash, a reboot)? Run the same command again: finished runs are skipped, the
# others resume from their last checkpoint (every eval_interval iterations).
#
# Budget: <= 60 minutes on 2 cores. Measured at 32 layers x 64, batch 16 x 128, 400 iterations, two
# runs side by side with one thread each: 294 s (baseline), 390 s (LIMe), i.e. ~0.74 and ~0.98 s/iter.
# At this width the time per iteration is about proportional to depth (small per-layer ops dominate),
# so one seed of depths 4+8+16+32 = 60 layers costs 60/32 = 1.9x a 32-layer run. At 500 iterations:
#   baseline 1.9 x 294 s x 500/400 = 690 s, LIMe 1.9 x 390 s x 500/400 = 915 s (an upper bound: LIMe's
#   router costs relatively less at small depth) -> 1,600 s per seed, 4,800 s for 3 seeds,
#   2 runs at a time -> 40 min; evaluations (3 x 2 x 25 forward batches = ~50 iterations' worth, +10%)
#   and 24 process starts bring it to ~45 min: ~15 min of slack for a busy machine.
# The sweep starts the deepest runs first, so the 32-layer runs do not end up alone at the end.
# Faster or slower machine: scale max_iters, lr_decay_iters (and eval_interval) together.

# the sweep
out_dir = 'out-sweep-deep-narrow'
depths = '4,8,16,32'
variants = 'baseline,lime'
seeds = '0,1,2'
jobs = 2                   # two runs at a time, one thread each: more throughput than one run on two
                           # threads for models this small

# train.py, every run
dataset = 'shakespeare_char'
n_embd = 64
n_head = 4                 # head size 16
n_kv_head = None           # MHA
dropout = 0.0
router = 'full'
block_size = 128
batch_size = 16
total_batch_size = 16 * 128  # 2,048 tokens per iteration, 500 iterations = 1.02M tokens (~0.23 epoch)
learning_rate = 2e-3       # as the repo's shakespeare_char model; the 400-iteration 32 x 64 runs above
router_lr = 1e-2           #   trained stably with it
max_iters = 500
lr_decay_iters = 500
warmup_iters = 50
min_lr = 2e-4
beta2 = 0.99
eval_interval = 250        # evaluate and checkpoint at 250 and 500 (and iteration 0)
eval_iters = 25            # x 16 x 128 = 51k val tokens per evaluation; the same batches for every variant
log_interval = 25
always_save_checkpoint = True  # an interrupted sweep resumes from the last evaluation
device = 'cpu'
dtype = 'float32'
compile = False            # compiling costs more than it saves in runs of a few minutes
