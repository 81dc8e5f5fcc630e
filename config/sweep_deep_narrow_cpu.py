# Depth sweep on a 2-core laptop CPU, deep and narrow: does LIMe's advantage grow with depth
# (paper Sec. 5.5, Fig. 6: 32-128 layers)? LLaMA baseline vs LIMe, with the paper's router init and
# with the identity init, at 4, 8, 16 and 32 layers, width 64 (4 heads of 16), on shakespeare_char,
# 3 seeds each: 36 runs. Why the identity init too: at 32 layers its differences to the baseline,
# paired by seed, scatter 2.7x less (sd 0.015 vs 0.040 over 5 seeds; experiments/one_lr_comparison/), so 3 seeds
# resolve what the paper's init, which starts each seed as another random mixture, cannot.
#
# $ python prepare.py
# $ python sweep.py config/sweep_deep_narrow_cpu.py          # -> out-sweep-deep-narrow/: sweep.csv, table, plots
# $ python sweep.py config/sweep_deep_narrow_cpu.py --report_only=True   # the table and plots of the runs so far
# Interrupted (Ctrl-C, a crash, a reboot)? Run the same command again: finished runs are skipped, the
# others resume from their last checkpoint (every eval_interval iterations).
#
# Budget: about 80 minutes on 2 cores. Measured (2-core x86-64, torch 2.13.0 CPU, idle machine, two
# runs side by side on one thread each): baseline and LIMe took 51.6 minutes, the three variants 82
# (with other work on the machine part of the time). One run, 300 iterations:
#   depth       4      8     16     32
#   baseline  68 s  101 s  217 s  529 s
#   LIMe      68 s  122 s  249 s  699 s   (LIMe/baseline wall time 1.32x at 32 layers)
# 300 x 2,048 tokens = 0.61M tokens (~0.14 epoch). The sweep starts the deepest runs first, so the
# 32-layer runs do not end up alone at the end.
# Faster or slower machine: scale max_iters, lr_decay_iters (and eval_interval) together.

# the sweep
out_dir = 'out-sweep-deep-narrow'
depths = '4,8,16,32'
variants = 'baseline,lime,lime@identity'
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
total_batch_size = 16 * 128  # 2,048 tokens per iteration
learning_rate = 2e-3       # as the repo's shakespeare_char model; 32 x 64 trains stably with it
router_lr = 1e-2           # the paper's router lr
max_iters = 300
lr_decay_iters = 300
warmup_iters = 30
min_lr = 2e-4
beta2 = 0.99
eval_interval = 100        # evaluate and checkpoint every 100 iterations: a learning curve per run
eval_iters = 25            # x 16 x 128 = 51k val tokens per evaluation; the same batches for every variant
log_interval = 25
always_save_checkpoint = True  # an interrupted sweep resumes from the last evaluation
device = 'cpu'
dtype = 'float32'
compile = False            # compiling costs more than it saves in runs of a few minutes
