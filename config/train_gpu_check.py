# The training run of the GPU check (dev/gpu_check.py, stage 4): a GPT-2-small-sized LIMe model
# (12 layers x 768, 12 heads, ~124M parameters with the tied 50,257-token embedding) with torch.compile
# and bf16 on one GPU, on the shipped Shakespeare corpus in GPT-2 BPE, which prepare.py makes offline
# (1.40M training tokens). 300 iterations x 16k tokens = 4.9M tokens, 3.5 epochs: the loss falls, and
# the validation loss may turn up near the end. What it measures is the GPU path (tokens/s, MFU, a
# compiled bf16 checkpoint that loads on a CPU), not a model worth keeping. Not yet run on a GPU.
# $ python prepare.py shakespeare && python train.py config/train_gpu_check.py
# $ python sample.py --out_dir=out-gpu-check-124m --start=ROMEO:

out_dir = 'out-gpu-check-124m'
dataset = 'shakespeare'
device = 'cuda'
dtype = 'bfloat16'
compile = True

n_layer = 12
n_head = 12
n_embd = 768               # mlp_hidden: the Llama rule gives 2048
block_size = 1024
lime = True

batch_size = 16
total_batch_size = 16 * 1024  # one micro-step per iteration
max_iters = 300
lr_decay_iters = 300
warmup_iters = 30
learning_rate = 6e-4       # GPT-2 small's
router_lr = 6e-3           # 10x, as the paper
min_lr = 6e-5
beta2 = 0.95

eval_interval = 150        # checkpoints at 150 and 300 (1.5 GB: weights and AdamW state, 12 bytes a parameter)
eval_iters = 10
log_interval = 10
