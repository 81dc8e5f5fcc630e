# Deep, narrow models (paper section 5.5, Fig. 6): LIMe vs LLaMA at 32, 64 and 128 layers, 8 heads
# per layer. The paper gives neither the width nor the token budget of these runs: the numbers
# below are ours (d 512, ~3.2M parameters per layer; 64 layers: ~230M parameters), on FineWeb-Edu.
#
# $ python prepare.py fineweb_edu --num_tokens=3000000000
# $ for L in 32 64 128; do for LIME in True False; do
#     torchrun --standalone --nproc_per_node=8 train.py config/train_deep_narrow.py \
#         --n_layer=$L --lime=$LIME --out_dir=out-deep-$L-lime$LIME; done; done
# On one GPU, plain `python train.py config/train_deep_narrow.py ...` works too (more accumulation).
# A CPU-sized look at the same question, on shakespeare_char (~minutes per run):
# $ python train.py config/train_deep_narrow.py --dataset=shakespeare_char --n_embd=64 --n_head=4 \
#     --n_kv_head=4 --n_layer=16 --block_size=128 --batch_size=16 --max_iters=2000 --lr_decay_iters=2000 \
#     --warmup_iters=100 --eval_interval=250 --eval_iters=20 --learning_rate=2e-3 --min_lr=2e-4 --lime=True \
#     --total_batch_size=2048

out_dir = 'out-deep-narrow'
dataset = 'fineweb_edu'
eval_interval = 500
eval_iters = 100
log_interval = 10
always_save_checkpoint = True
wandb_project = 'nanolime-deep'
wandb_run_name = 'deep-narrow'

n_layer = 64               # the depth under study: 32, 64 or 128
n_head = 8                 # as in the paper
n_kv_head = 8
n_embd = 512
block_size = 1024
dropout = 0.0
lime = True
router = 'full'

# 256 sequences x 1024 tokens = 262k tokens per iteration on any number of GPUs; 10k iterations = 2.6B tokens
total_batch_size = 256 * 1024
batch_size = 16

# the paper's optimiser settings (Table 2); deep models keep the 1/sqrt(2L) init of model.py
learning_rate = 1e-3
router_lr = 1e-2
max_iters = 10000
lr_decay_iters = 10000
warmup_iters = 200
min_lr = 1e-6
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
