"""
A depth coordinate check, as CompleteP's reference code has one (coord_check_shakespeare_char, arXiv 2505.01618):
a few AdamW steps of the baseline, LIMe, LIMe under CompleteP (depth_base 4) and LIMe with router_lr_scaling='fan_in'
and 'sqrt_fan_in' at 4-64 layers of width 64, and per layer, after each step, on one fixed batch:
  act        RMS of the residual stream after the block
  kv         RMS of the keys and values attention reads: LIMe's routed k~, v~ (eq. 2); the baseline's own k, v
  d_act      RMS of the step's change of act
  d_kv       RMS of the step's change of kv
  d_kv_rout  RMS of the part of that change the router's own update makes: (R_new - R_old) applied to the
             sources of before the step (eq. 2 with the update in place of R); a router reads (l+1) H_kv sources
  d_w        RMS of the step's update of the block's matrices (attention and MLP projections)
  d_w_rout   RMS of the step's update of the router's weights R
A parametrization whose quantities stay put as depth grows is one whose lr transfers across depth.

$ python experiments/coord_check/coord_check.py      # -> coord_check.png beside it and a table; seconds on a CPU
$ python experiments/coord_check/coord_check.py --depths=4,8 --steps=2 --plot_path=''
"""
import gzip
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from model import route_reference  # noqa: E402
from nanolime.optim import configure_optimizers  # noqa: E402
from relatives import RelativesConfig, build_model  # noqa: E402

# -----------------------------------------------------------------------------
depths = '4,8,16,32,64'
settings = 'baseline,lime,lime-completep,lime-fan_in,lime-sqrt_fan_in'  # lime-completep: depth_scaling='completep'
                           # from depth_base; lime-fan_in, lime-sqrt_fan_in: router_lr_scaling='fan_in', 'sqrt_fan_in'
depth_base = 4
n_embd = 64
n_head = 4
block_size = 64
batch_size = 8
steps = 5
learning_rate = 2e-3       # config/sweep_deep_narrow_cpu.py's, held constant (no warmup, no decay)
router_lr = 1e-2
weight_decay = 0.1
beta2 = 0.99
seed = 0
router_lr_scaling = ''     # '', 'fan_in' or 'sqrt_fan_in' (nanolime/optim.py) for lime, lime-completep
plot_path = os.path.join(HERE, 'coord_check.png')
# -----------------------------------------------------------------------------
QUANTITIES = ('act', 'kv', 'd_act', 'd_kv', 'd_kv_rout', 'd_w', 'd_w_rout')
SETTINGS = ('baseline', 'lime', 'lime-completep', 'lime-fan_in', 'lime-sqrt_fan_in')


def text_batches(n, batch, length, generator):
    """n (x, y) batches of characters of the Shakespeare text in data/ (bytes as tokens: no prepared data needed)."""
    path = os.path.join(REPO, 'data', 'shakespeare.txt.gz')
    with gzip.open(path, 'rb') as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    out = []
    for _ in range(n):
        ix = torch.randint(len(data) - length - 1, (batch,), generator=generator)
        x = torch.stack([data[i:i + length] for i in ix])
        out.append((x, torch.stack([data[i + 1:i + 1 + length] for i in ix])))
    return out


def rms(x):
    return x.pow(2).mean().sqrt().item()


class Probe:
    """One forward pass on a fixed batch, keeping every block's output, every layer's own [k; v] (the sources)
    and every router's output."""

    def __init__(self, model):
        self.model, self.hooks, self.seen = model, [], None  # seen: only while probing, not in training steps
        for layer, block in enumerate(model.transformer.h):
            self.hooks.append(block.register_forward_hook(self.keep('act', layer)))
            self.hooks.append(block.attn.kv_proj.register_forward_hook(self.keep('own', layer)))
            if block.attn.router is not None:
                self.hooks.append(block.attn.router.register_forward_hook(self.keep('routed', layer)))

    def keep(self, what, layer):
        def hook(module, args, output):
            if self.seen is not None:
                self.seen[what][layer] = output.detach().clone()
        return hook

    @torch.no_grad()
    def __call__(self, x):
        self.seen = {'act': {}, 'own': {}, 'routed': {}}
        self.model(x, x)
        seen, self.seen, (B, T) = self.seen, None, x.shape
        kv = {}
        for layer, own in seen['own'].items():  # (B, T, 2 H_kv d_h) -> (H_kv, 2, B, T, d_h), as the router sees it
            own = own.view(B, T, 2, -1, self.model.config.n_embd // self.model.config.n_head).permute(3, 2, 0, 1, 4)
            seen['own'][layer] = own
            kv[layer] = seen['routed'].get(layer, own)
        seen['kv'] = kv
        seen['router'] = {layer: block.attn.router.matrix().detach().clone()
                          for layer, block in enumerate(self.model.transformer.h) if block.attn.router is not None}
        return seen


def check(setting, n_layer, batches, probe_x, config=None):
    """{quantity: [[value per layer] per step]} of one setting at one depth (config: this module's options)."""
    c = {**{k: v for k, v in globals().items() if k in DEFAULTS}, **(config or {})}
    torch.manual_seed(c['seed'])
    extra = dict(depth_scaling='completep', depth_base=c['depth_base']) if setting == 'lime-completep' else {}
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting '{setting}'")
    model = build_model(RelativesConfig(block_size=c['block_size'], vocab_size=256, n_layer=n_layer,
                                        n_head=c['n_head'], n_embd=c['n_embd'], lime=setting != 'baseline', **extra))
    scaling = setting[len('lime-'):] if setting.endswith('fan_in') else c['router_lr_scaling']
    kwargs = {'router_lr_scaling': scaling} if scaling else {}
    opt = configure_optimizers(model, c['weight_decay'], c['learning_rate'], c['router_lr'], (0.9, c['beta2']), 'cpu',
                                     **kwargs)
    probe = Probe(model)
    before, out = probe(probe_x), {q: [] for q in QUANTITIES}
    for x, y in batches:
        weights = [[p.detach().clone() for n, p in block.named_parameters() if p.dim() == 2 and 'router' not in n]
                   for block in model.transformer.h]  # the block's matrices, before the step
        routers = {i: block.attn.router.weight.detach().clone() for i, block in enumerate(model.transformer.h)
                   if block.attn.router is not None and isinstance(block.attn.router.weight, torch.nn.Parameter)}
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        after = probe(probe_x)
        layers = range(n_layer)
        out['d_w'].append([rms(torch.cat([(p.detach() - w).flatten() for w, (n, p) in zip(weights[i], (
            (n, p) for n, p in model.transformer.h[i].named_parameters() if p.dim() == 2 and 'router' not in n))]))
                           for i in layers])
        out['d_w_rout'].append([rms(model.transformer.h[i].attn.router.weight.detach() - routers[i])
                                if i in routers else math.nan for i in layers])
        out['act'].append([rms(after['act'][i]) for i in layers])
        out['kv'].append([rms(after['kv'][i]) for i in layers])
        out['d_act'].append([rms(after['act'][i] - before['act'][i]) for i in layers])
        out['d_kv'].append([rms(after['kv'][i] - before['kv'][i]) for i in layers])
        out['d_kv_rout'].append([rms(route_reference(after['router'][i] - before['router'][i],
                                                     torch.cat([before['own'][j] for j in range(i + 1)])))
                                 if i in before['router'] else math.nan for i in layers])
        before = after
    return out


def mean(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def plot(path, results, depth_list, setting_list, n_kv):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    titles = {'act': 'residual stream after the block', 'kv': "k, v attention reads (LIMe: routed)",
              'd_act': "step's change of the residual stream", 'd_kv': "step's change of k, v",
              'd_kv_rout': "the router update's part of d_kv", 'd_w': "step's update of the block's matrices",
              'd_w_rout': "step's update of the router's R"}
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for ax, q in zip(axes.flat, QUANTITIES):
        for i, s in enumerate(setting_list):
            for step, style in ((0, ':'), (-1, '-')):
                ys = [mean(results[s, d][q][step]) for d in depth_list]
                if not all(math.isnan(y) for y in ys):
                    n = len(results[s, depth_list[0]][q])
                    ax.plot(depth_list, ys, style, marker='o', color=colors[i],
                            label=f"{s}, step {1 if step == 0 else n}")
        ax.set(xscale='log', yscale='log', xlabel='n_layer', ylabel="RMS, mean over layers", title=f"{q}: {titles[q]}")
        ax.set_xticks(depth_list, [str(d) for d in depth_list])
        ax.minorticks_off()
    axes.flat[0].legend(fontsize='x-small')  # one legend: each setting a colour, step 1 dotted, the last solid
    ax, deepest = axes.flat[-1], max(depth_list)
    for i, s in enumerate(setting_list):
        if (s, deepest) in results and s != 'baseline':
            ys = results[s, deepest]['d_kv_rout'][-1]
            ax.plot([(layer + 1) * n_kv for layer in range(1, deepest)], ys[1:], '.-', color=colors[i], label=s)
    ax.set(xscale='log', yscale='log', xlabel='sources a router reads, (l+1) H_kv',
           ylabel='RMS', title=f"d_kv_rout per layer at {deepest} layers, last step")
    ax.legend(fontsize='x-small')
    fig.suptitle(f"depth coordinate check: width {n_embd}, {n_head} heads, AdamW lr {learning_rate:g}, router_lr "
                 f"{router_lr:g}{' ' + router_lr_scaling if router_lr_scaling else ''}, "
                 f"batch {batch_size} x {block_size}, "
                 f"seed {seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


DEFAULTS = ('depth_base', 'n_embd', 'n_head', 'block_size', 'batch_size', 'steps', 'learning_rate', 'router_lr',
            'weight_decay', 'beta2', 'seed', 'router_lr_scaling')


def main():
    from nanolime.common import UserError, configure
    configure(globals())
    depth_list = [int(d) for d in str(depths).split(',') if d.strip()]
    setting_list = [s for s in settings.split(',') if s]
    unknown = set(setting_list) - set(SETTINGS)
    if unknown or not depth_list or min(depth_list) < 1 or steps < 1:
        raise UserError(f"settings={settings!r}, depths={depths!r}, steps={steps}: expected settings among "
                        f"{', '.join(SETTINGS)}, depths >= 1, steps >= 1")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    batches = text_batches(steps + 1, batch_size, block_size, g)
    probe_x, batches = batches[0][0], batches[1:]
    results = {(s, d): check(s, d, batches, probe_x) for s in setting_list for d in depth_list}
    print(f"RMS, mean over layers, after step {steps} (of the step's change: d_); width {n_embd}, "
          f"lr {learning_rate:g}, "
          f"router_lr {router_lr:g}{' ' + router_lr_scaling if router_lr_scaling else ''}")
    print(f"{'setting':<16} {'depth':>5}  " + '  '.join(f"{q:>9}" for q in QUANTITIES) + '  d_kv_rout of layer 1, '
          'of the last')
    for (s, d), r in results.items():
        print(f"{s:<16} {d:>5}  " + '  '.join(f"{mean(r[q][-1]):9.4f}" for q in QUANTITIES)
              + (f"  {r['d_kv_rout'][-1][1]:9.4f}  {r['d_kv_rout'][-1][-1]:9.4f}" if d > 1 else ''))
    if plot_path:
        plot(plot_path, results, depth_list, setting_list, n_head)
        print(f"plot: {plot_path}")
    return results


if __name__ == '__main__':
    main()
