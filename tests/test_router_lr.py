"""router_lr_scaling='fan_in' ('sqrt_fan_in'): each LIMe router in an AdamW group of its own at router_lr * 2 / (the
root of) the layers it reads (nanolime/optim.py, train.py's option);
experiments/coord_check/coord_check.py, the depth coordinate check that motivates it."""
import importlib.util
import math
import os

import pytest
import torch

from conftest import REPO, build, ckpt_of, error_of, train
from nanolime.optim import configure_optimizers


def groups(model, **kw):
    return {g['name']: g for g in configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.99), 'cpu', **kw).param_groups}


@pytest.mark.parametrize('scaling, power', [('fan_in', 1.0), ('sqrt_fan_in', 0.5)])
@pytest.mark.parametrize('router', ['full', 'dynamic', 'last-2'])
def test_a_group_per_router_at_its_fan_in(router, scaling, power):
    model = build(n_layer=5, n_kv_head=2, lime=True, router=router)
    plain, scaled = groups(model), groups(model, router_lr_scaling=scaling)
    assert plain['router']['lr'] == 1e-2 and 'router' not in scaled
    reads = {layer: (2 if router == 'last-2' else layer + 1) if layer > 1 else 2 for layer in range(1, 5)}
    for layer, n in reads.items():  # layer l reads l + 1 layers (last-2: 2): lr 1e-2 * (2 / that) ** power
        g, own = scaled[f'router.{layer}'], list(model.transformer.h[layer].attn.router.parameters())
        assert g['lr'] == g['peak_lr'] == pytest.approx(1e-2 * (2 / n) ** power) and g['weight_decay'] == 0.0
        assert [id(p) for p in g['params']] == [id(p) for p in own] and len(own) == (2 if router == 'dynamic' else 1)
    # every other group as without the option; every parameter in exactly one group
    assert {k: (v['lr'], len(v['params'])) for k, v in scaled.items() if not k.startswith('router')} == \
        {k: (v['lr'], len(v['params'])) for k, v in plain.items() if k != 'router'}
    ids = [id(p) for g in scaled.values() for p in g['params']]
    assert sorted(ids) == sorted(id(p) for p in model.parameters()) and len(set(ids)) == len(ids)


def test_no_router_no_group_and_bad_value():
    assert 'router.1' not in groups(build(n_layer=3, lime=True, router='average'), router_lr_scaling='fan_in')
    assert groups(build(n_layer=3), router_lr_scaling='fan_in').keys() == groups(build(n_layer=3)).keys()
    with pytest.raises(ValueError, match="unknown router_lr_scaling 'fanin'"):
        groups(build(n_layer=3, lime=True), router_lr_scaling='fanin')


def test_adams_first_step_moves_each_router_by_its_lr():
    """Adam's first step is lr * sign(gradient) per entry (|g| >> eps): the largest change of router l is its lr."""
    model = build(n_layer=4, lime=True)
    opt = configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.99), 'cpu', router_lr_scaling='fan_in')
    before = {l: model.transformer.h[l].attn.router.weight.detach().clone() for l in range(1, 4)}
    x = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(0))
    model(x, x)[1].backward()
    opt.step()
    for layer, w in before.items():
        step = (model.transformer.h[layer].attn.router.weight - w).abs().max().item()
        assert step == pytest.approx(1e-2 * 2 / (layer + 1), rel=1e-4)


def test_train_py_option(data_dir, tmp_path, run_here):
    out = str(tmp_path / 'run')
    assert train(data_dir, out, '--n_layer=3', '--lime=True', '--router_lr_scaling=fan_in', '--max_iters=2',
                 '--eval_interval=2', '--learning_rate=1e-3', '--router_lr=6e-3') == 0
    ckpt = ckpt_of(out)
    lrs = {g['name']: g['peak_lr'] for g in ckpt['optimizer'][0]['param_groups']}
    assert lrs['router.1'] == pytest.approx(6e-3) and lrs['router.2'] == pytest.approx(4e-3) and 'router' not in lrs
    assert ckpt['config']['router_lr_scaling'] == 'fan_in'
    line = error_of(run_here, 'train.py', f'--data_dir={data_dir}', '--out_dir=/nonexistent/never-written',
                    '--router_lr_scaling=fanin')
    assert "router_lr_scaling='fanin'" in line and 'fan_in' in line


def test_coord_check_measures_the_routers_update():
    """experiments/coord_check/coord_check.py at 2 and 4 layers, 2 steps: the router's part of the change in k~ is
    zero with router_lr 0 and not otherwise; the baseline has none; CompleteP at its base depth is LIMe, number for
    number."""
    spec = importlib.util.spec_from_file_location('coord_check',
                                                  os.path.join(REPO, 'experiments', 'coord_check', 'coord_check.py'))
    cc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cc)
    batches = cc.text_batches(3, 2, 16, torch.Generator().manual_seed(0))
    small = dict(n_embd=32, block_size=16, depth_base=2)
    lime = cc.check('lime', 4, batches[1:], batches[0][0], small)
    assert all(x > 0 for x in lime['d_kv_rout'][-1][1:]) and math.isnan(lime['d_kv_rout'][-1][0])
    frozen = cc.check('lime', 4, batches[1:], batches[0][0], {**small, 'router_lr': 0.0})
    assert all(x == 0 for x in frozen['d_kv_rout'][-1][1:]) and all(x > 0 for x in frozen['d_kv'][-1])
    assert all(x == 0 for x in frozen['d_w_rout'][-1][1:]) and all(x > 0 for x in lime['d_w_rout'][-1][1:])
    assert frozen['d_w'] == lime['d_w'][:1] + frozen['d_w'][1:] and all(x > 0 for x in frozen['d_w'][0])
    assert all(math.isnan(x) for x in cc.check('baseline', 2, batches[1:], batches[0][0], small)['d_kv_rout'][0])
    assert cc.check('lime-completep', 2, batches[1:], batches[0][0], small) == \
        cc.check('lime', 2, batches[1:], batches[0][0], small)
    scaled = cc.check('lime', 4, batches[1:], batches[0][0], {**small, 'router_lr_scaling': 'fan_in'})
    assert scaled['d_kv_rout'][0][3] < lime['d_kv_rout'][0][3]  # layer 3's router at half the lr: a smaller move
