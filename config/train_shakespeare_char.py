# The default run, written out: a small LIMe model on shakespeare_char (characters, vocab 84,
# 4.55M training tokens) that trains in 6.6 minutes on a 2-core x86-64 CPU (idle, torch 2.13) and writes
# recognisable Shakespeare-like text.
#
# $ python prepare.py && python train.py config/train_shakespeare_char.py && python sample.py
# $ python train.py config/train_shakespeare_char.py --lime=False --out_dir=out-shakespeare-char-llama
#
# How the size was chosen (CPU, fp32, eager; timings on a 2-core machine shared with other jobs):
# at this width the cost per token is about flat in batch and context, so for a budget of minutes
# (~5M tokens) a 4 x 128 model with context 128 beat a 6 x 128 one given the same FLOPs
# (val loss 1.549 after 2600 iterations vs 1.588 for 6 layers and 1700 iterations), and both beat
# nanoGPT's CPU recipe (4 x 128, context 64, batch 12, 2000 iterations: 1.87).
# Val loss 1.5558 after 2500 iterations (our run: 2-core x86-64 CPU, torch 2.13). If your machine is much
# faster or slower, scale max_iters and lr_decay_iters together.

out_dir = 'out-shakespeare-char'
eval_interval = 500
eval_iters = 20
log_interval = 50
always_save_checkpoint = True

dataset = 'shakespeare_char'
total_batch_size = 16 * 128  # tokens per iteration: one micro-step of 16 sequences
batch_size = 16
block_size = 128           # characters of context

n_layer = 4
n_head = 4
n_embd = 128               # mlp_hidden: the Llama rule gives 384
dropout = 0.0              # 2500 x 2048 = 5.1M tokens seen, ~1.1 epochs: no overfitting at this size
lime = True
router = 'full'

learning_rate = 2e-3       # small models take a high lr
router_lr = 1e-2           # the paper's router lr
max_iters = 2500
lr_decay_iters = 2500
warmup_iters = 100
min_lr = 2e-4
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99               # nanoGPT's choice for small batches (the paper's 0.95 is for 2M-token batches)
grad_clip = 1.0

device = 'auto'
dtype = 'auto'
compile = 'auto'           # eager on CPU: compiling costs more than it saves in a run of minutes
