"""
What compiling costs, counted: the C++ kernels inductor builds (each one a gcc run on a CPU) for one
training step of the baseline or LIMe, from an empty compile cache, and the seconds spent in gcc (summed
over inductor's compile workers) and in compiling the forward and the backward graph.

$ python dev/compile_kernels.py 8 baseline      # layers, variant; width 64, 4 heads, batch 2 x 32
$ python dev/compile_kernels.py 8 lime

The baseline's layers are identical, so they share their kernels; a kernel whose shapes differ from
layer to layer (as LIMe's routing gradients and block concatenations do) is built once per shape.
"""
import glob
import os
import sys
import tempfile
import time

os.environ['TORCHINDUCTOR_CACHE_DIR'] = tempfile.mkdtemp(prefix='inductor-')  # before torch reads it
import torch  # noqa: E402
from torch._dynamo.utils import compile_times  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from model import GPT, GPTConfig  # noqa: E402

L, variant = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = GPT(GPTConfig(block_size=32, vocab_size=65, n_layer=L, n_head=4, n_embd=64, lime=variant == 'lime'))
x = torch.randint(65, (2, 32))
t0 = time.perf_counter()
torch.compile(model, fullgraph=True)(x, x)[1].backward()
kernels = glob.glob(os.path.join(os.environ['TORCHINDUCTOR_CACHE_DIR'], '**', '*.so'), recursive=True)
print(f"L={L} {variant}: {len(kernels)} compiled C++ kernels, first step {time.perf_counter() - t0:.0f} s")
# where the seconds went: gcc (summed over the compile workers), forward and backward compilation
lines = compile_times(repr='str', aggregate=True).splitlines()[1:]  # 'name   seconds' after a title
phases = dict(line.rsplit(None, 1) for line in lines if line.strip())
names = ('compile_file', 'compile_fx.<locals>.fw_compiler_base', 'compile_fx.<locals>.bw_compiler')
print(', '.join(f"{name} {float(phases[name]):.1f} s" for name in names if name in phases))
