"""optimizer='muon': which parameters Muon takes (derived from the modules), and that its step is
torch.optim.Muon's. Exact resume and DDP with Muon: tests/test_train.py."""
import pytest
import torch

from conftest import MUON

from model import GPT, GPTConfig, Router
from nanolime.optim import configure_optimizers
from relatives import RelativesConfig, build_model  # noqa: E402

pytestmark = MUON
V = 50


def build(**kw):
    torch.manual_seed(0)
    args = dict(block_size=16, vocab_size=V, n_layer=3, n_head=4, n_kv_head=2, n_embd=32)
    return build_model(RelativesConfig(**{**args, **kw}))


@pytest.mark.parametrize("kw", [dict(lime=True, router="dynamic"), dict(hc=2, hc_dynamic=True),
                                dict(hc=2, mhc='dynamic', tie_embeddings=False), dict(denseformer=True, lime=True)])
def test_muon_takes_the_block_matrices_and_nothing_else(kw):
    model = build(**kw)
    muon, adamw = configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu", optimizer="muon", muon_lr=0.03)
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    on_muon = sorted(names[id(p)] for g in muon.param_groups for p in g["params"])
    on_adamw = sorted(names[id(p)] for g in adamw.param_groups for p in g["params"])
    assert sorted(on_muon + on_adamw) == sorted(names.values())  # every parameter, once
    projections = sorted(f"transformer.h.{l}.{m}.weight" for l in range(3) for m in (
        "attn.q_proj", "attn.kv_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
    assert on_muon == projections
    routers = {id(p) for m in model.modules() if isinstance(m, Router) for p in m.parameters()}
    router_group = [g for g in adamw.param_groups if g["name"] == "router"]
    assert {id(p) for g in router_group for p in g["params"]} == routers
    assert (muon.param_groups[0]["lr"], muon.param_groups[0]["peak_lr"]) == (0.03, 0.03)
    assert muon.param_groups[0]["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="unknown optimizer"):
        configure_optimizers(model, 0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu", optimizer="sgd")


def test_muon_step_is_torch_muon_applied_by_hand():
    """Two steps of our [Muon, AdamW] against torch.optim.Muon and AdamW built by hand on the same split."""
    ours, ref = build(lime=True), build(lime=True)
    x = torch.randint(0, V, (2, 16))
    opts = configure_optimizers(ours, 0.1, 1e-3, 1e-2, (0.9, 0.95), "cpu", optimizer="muon", muon_lr=0.02,
                                     muon_momentum=0.9)
    matrices = [m.weight for b in ref.transformer.h for m in (b.attn.q_proj, b.attn.kv_proj, b.attn.o_proj,
                                                               b.mlp.gate_proj, b.mlp.up_proj, b.mlp.down_proj)]
    rest = [p for p in ref.parameters() if all(p is not m for m in matrices)]
    routers = [p for n, p in ref.named_parameters() if "router" in n]
    plain = [p for p in rest if all(p is not r for r in routers)]
    by_hand = [torch.optim.Muon(matrices, lr=0.02, weight_decay=0.1, momentum=0.9),
               torch.optim.AdamW([dict(params=plain, weight_decay=0.0), dict(params=routers, lr=1e-2, weight_decay=0.0)],
                                 lr=1e-3, betas=(0.9, 0.95), eps=1e-8)]
    for _ in range(2):
        for model, optimizers in ((ours, opts), (ref, by_hand)):
            model(x, x)[1].backward()
            for opt in optimizers:
                opt.step()
            model.zero_grad()
    moved = 0
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    for p, p0 in zip(ours.parameters(), build(lime=True).parameters()):
        moved += not torch.equal(p, p0)
    assert moved == len(list(ours.parameters()))  # every parameter was stepped
