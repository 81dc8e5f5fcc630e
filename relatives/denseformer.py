"""DenseFormer (arXiv 2402.02622; `denseformer=True`): a learned weighted average of earlier block outputs."""
import torch
import torch.nn as nn

from .base import Component, Relative, Stream, fp32

OPTIONS = dict(
    denseformer=False,  # a learned weighted average of all earlier block outputs after each block
)


def attach(model):
    """After block i, a weighted average of the embedding and blocks 0..i's outputs: model.dwa[i]."""
    model.dwa = nn.ModuleList([DepthWeightedAverage(i + 2) for i in range(model.config.n_layer)])


def stream(model, x):
    return DenseStream(model, x)


def flops(c, T):
    return sum(2 * (i + 2) * c.n_embd for i in range(c.n_layer))  # after block i, a weighted sum of i + 2 tensors


class DepthWeightedAverage(nn.Module):
    """DenseFormer (arXiv 2402.02622): after block i, the input to the next block is a learned
    weighted sum of the embedding and the outputs of blocks 0..i. Weights start one-hot on
    block i's own output, so at init the model computes exactly the baseline function."""

    def __init__(self, n_inputs):
        super().__init__()
        weight = torch.zeros(n_inputs)
        weight[-1] = 1.0
        self.weight = nn.Parameter(weight)

    def forward(self, outputs):  # outputs: the embedding and blocks 0..i's outputs, each (B, T, d)
        return sum(w * x for w, x in zip(self.weight.unbind(), outputs))


class DenseStream(Stream):
    """The baseline's sum inside a block; after each block the DenseFormer average."""

    def __init__(self, model, x):
        self.dwa, self.x, self.sub = model.dwa, x.float(), 0
        self.outputs = [self.x]  # the embedding and every block's output

    def read(self):
        return self.x

    def write(self, y):
        self.x = self.x + y.float()
        self.sub += 1
        if self.sub % 2 == 0:  # a block's end
            self.outputs.append(self.x)
            with fp32(self.x):
                self.x = self.dwa[self.sub // 2 - 1](self.outputs)

    def output(self):
        return self.x


RELATIVE = Relative(
    family=lambda config: "DenseFormer", options=OPTIONS, stream=stream, flops=flops, attach=attach,
    rewires_stream=True, components={"denseformer": Component({"denseformer": True})})
