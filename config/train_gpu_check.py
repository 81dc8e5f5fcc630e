# The training runs of the GPU check (dev/gpu_check.py, stage 2): a small LIMe model (6 layers x 384,
# 6 heads, ~30M parameters, most of them the tied 50,257-token embedding) with torch.compile and bf16 on
# one GPU, on the shipped Shakespeare corpus in GPT-2 BPE, which prepare.py makes offline (1.40M training
# tokens). 200 iterations x 8k tokens = 1.6M tokens, about one epoch: the loss falls. What it measures is
# the GPU path in a minute or two (tokens/s, MFU, a compiled bf16 checkpoint that resumes exactly and
# loads on a CPU), not a model worth keeping. On an H200 (torch 2.11): 200 iterations in 47 s, val loss 4.77.
# $ python prepare.py shakespeare && python train.py config/train_gpu_check.py
# $ python sample.py --out_dir=out-gpu-check --start=ROMEO:

out_dir = 'out-gpu-check'
dataset = 'shakespeare'
device = 'cuda'
dtype = 'bfloat16'
compile = True

n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
lime = True

batch_size = 32
total_batch_size = 32 * 256  # one micro-step per iteration
max_iters = 200
lr_decay_iters = 200       # also when stopped at 100 (the check's resume): the same schedule
warmup_iters = 20
learning_rate = 1e-3
router_lr = 1e-2           # 10x, as the paper
min_lr = 1e-4
beta2 = 0.95

eval_interval = 100        # checkpoints at 100 and 200
eval_iters = 10
log_interval = 10
