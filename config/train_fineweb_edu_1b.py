# The paper's 1B language-modelling run (arXiv 2502.09245, App. A, Tables 2 and 3):
# LIMe on FineWeb-Edu, d 2048, 16 layers, 32 heads, MLP 8192, T 2048, tied embeddings,
# global batch 1024 sequences (2.1M tokens), 20k steps (~43B tokens), bf16.
#
# $ python prepare.py fineweb_edu --hf_config=sample-100BT --num_tokens=44000000000   # ~88 GB of uint16
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_fineweb_edu_1b.py
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_fineweb_edu_1b.py --lime=False --out_dir=out-fineweb-edu-1b-llama
# GQA variants (paper: H_kv 8): add --n_kv_head=8.  (prepare.py's default of 10M tokens is a smoke test only.)

out_dir = 'out-fineweb-edu-1b'
dataset = 'fineweb_edu'
eval_interval = 1000
eval_iters = 200           # batches per split, shared out between ranks
log_interval = 10
always_save_checkpoint = True
wandb_log = False          # --wandb_log=True to log to wandb (pip install wandb)
wandb_project = 'nanolime'
wandb_run_name = 'lime-1b-mha'

# model (Table 3); vocab_size 50257 comes from the dataset's meta.pkl
n_layer = 16
n_head = 32
n_kv_head = 32             # MHA, as in the paper's main run; --n_kv_head=8 for GQA
n_embd = 2048
mlp_hidden = 8192
block_size = 2048
dropout = 0.0
lime = True
router = 'full'

# batch: 1024 sequences (2.1M tokens) per iteration, whatever the number of GPUs; batch_size is per GPU and
# micro-step (8 x 2048 tokens fits an 80 GB H100 in bf16), gradient accumulation makes up the rest
# (8 GPUs: 16 micro-steps each)
total_batch_size = 1024 * 2048
batch_size = 8

# optimisation (Table 2)
learning_rate = 1e-3
router_lr = 1e-2
max_iters = 20000
lr_decay_iters = 20000
warmup_iters = 200
min_lr = 1e-6
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
dtype = 'bfloat16'
compile = 'auto'           # on, on CUDA
