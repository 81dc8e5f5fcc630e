"""The optimizers train.py builds: the model's own AdamW (model.GPT.configure_optimizers: the paper's three
groups, App. A), or that with one of the experiments below, none of them the paper's:

- optimizer='muon': torch.optim.Muon (torch 2.9+) on the blocks' attention and MLP matrices, at muon_lr and
  decayed, its lr scaled by sqrt(max(1, rows/cols)) (Keller Jordan's original rule); AdamW on the rest.
  Routers and other cross-layer mixing weights are never on Muon.
- named_lrs {parameter name: peak lr}: each such parameter in an AdamW group of its own, not decayed
  (Attention Residuals' pseudo-queries at attnres_query_lr).
- router_lr_scaling='fan_in' ('sqrt_fan_in'): an AdamW group per LIMe router, at router_lr * 2 H_kv / (the
  square root of) the sources it reads, so that router_lr is that of layer 1's router, which reads two layers.
  Under Adam a router's update moves k~ by about its lr times the number of sources it sums (correlated
  ones) or its square root (independent ones): experiments/coord_check/ measures it.
Each group keeps its 'peak_lr', the top of the schedule.
"""
import torch

from model import Router


def configure_optimizers(model, weight_decay, learning_rate, router_lr, betas, device_type, optimizer='adamw',
                         muon_lr=0.02, muon_momentum=0.95, named_lrs=None, router_lr_scaling=''):
    """[Muon, AdamW] for optimizer='muon', else the AdamW; ValueError for an unknown choice."""
    if optimizer not in ('adamw', 'muon'):
        raise ValueError(f"unknown optimizer '{optimizer}'; choose 'adamw' or 'muon'")
    if router_lr_scaling not in ('', 'fan_in', 'sqrt_fan_in'):
        raise ValueError(f"unknown router_lr_scaling '{router_lr_scaling}'; choose '' (off), 'fan_in' or "
                         "'sqrt_fan_in'")
    if optimizer == 'muon' and getattr(model.config, 'depth_scaling', 'standard') != 'standard':
        raise ValueError(f"depth_scaling='{model.config.depth_scaling}' has AdamW's rules (CompleteP's Table 1), "
                         "none for optimizer='muon': use optimizer='adamw'")
    adamw = model.configure_optimizers(weight_decay, learning_rate, router_lr, betas, device_type)
    if optimizer == 'adamw' and not named_lrs and not router_lr_scaling:
        return adamw
    groups = adamw.param_groups  # the model's, each with every AdamW setting (a depth scaling's eps too)
    names, named_lrs = {id(p): n for n, p in model.named_parameters()}, named_lrs or {}
    muon = []
    if optimizer == 'muon':  # the blocks' projection matrices, routers aside
        routers = {id(p) for m in model.modules() if isinstance(m, Router) for p in m.parameters()}
        matrices = {id(m.weight) for block in model.transformer.h for part in (block.attn, block.mlp)
                    for m in part.modules() if isinstance(m, torch.nn.Linear)} - routers
        muon = [p for p in model.parameters() if id(p) in matrices and names[id(p)] not in named_lrs]
    taken = {id(p) for p in muon} | {id(p) for p in model.parameters() if names[id(p)] in named_lrs}
    groups = [dict(g, params=[p for p in g['params'] if id(p) not in taken]) for g in groups]
    for name, lr in named_lrs.items():  # a group of its own, not decayed
        params = [p for p in model.parameters() if names[id(p)] == name]
        groups.append(dict(groups[0], name=name, params=params, weight_decay=0.0, lr=lr, peak_lr=lr))
    if router_lr_scaling:  # the routers' group, split into one group per router
        power = 0.5 if router_lr_scaling == 'sqrt_fan_in' else 1.0
        router = [g for g in groups if g['name'] == 'router']  # none without learned routers
        groups = [g for g in groups if g['name'] != 'router']
        in_group = {id(p) for g in router for p in g['params']}
        for m in (m for m in model.modules() if isinstance(m, Router)):
            params = [p for p in m.parameters() if id(p) in in_group]
            lr = router_lr * (2 / len(m.layers)) ** power
            if params:
                groups.append(dict(router[0], name=f'router.{m.layer}', params=params, lr=lr, peak_lr=lr))
    adamw = torch.optim.AdamW([g for g in groups if g['params']])
    if optimizer == 'adamw':
        return adamw
    muon = torch.optim.Muon([dict(name='muon', params=muon, lr=muon_lr, peak_lr=muon_lr)], lr=muon_lr,
                            weight_decay=weight_decay, momentum=muon_momentum)
    return [muon, adamw]
