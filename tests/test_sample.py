"""sample.py: its options checked before anything is loaded; top_k reaches the model as given."""
import pytest
import torch

import checkpoint
from common import UserError
from conftest import script_here
from model import GPT, GPTConfig


@pytest.mark.parametrize('top_p', ['0.0', '1.5', '-0.1'])
def test_top_p_out_of_range_is_refused(top_p, tmp_path):
    with pytest.raises(UserError, match=rf"top_p={float(top_p)} must be in \(0, 1\] \(1.0: no nucleus cut\)"):
        script_here('sample.py', f'--out_dir={tmp_path}', f'--top_p={top_p}')


@pytest.fixture
def tiny_run(tmp_path):
    """An out_dir holding an untrained 1-layer model over the characters '\\n' and a..j."""
    chars = '\nabcdefghij'
    args = dict(block_size=8, vocab_size=len(chars), n_layer=1, n_head=2, n_embd=8)
    meta = {'vocab_size': len(chars), 'stoi': {c: i for i, c in enumerate(chars)}, 'itos': dict(enumerate(chars))}
    torch.save({checkpoint.CKPT_MARKER: 1, 'model': GPT(GPTConfig(**args)).state_dict(), 'model_args': args,
                'iter_num': 0, 'config': {}, 'meta': meta}, tmp_path / checkpoint.CKPT_NAME)
    return str(tmp_path)


@pytest.mark.parametrize('args, want', [([], 200), (['--top_k=None'], None), (['--top_k=5'], 5),
                                        (['--top_k=5', '--temperature=0'], 1)])  # temperature 0: greedy
def test_top_k_is_a_count_or_none(args, want, tiny_run, monkeypatch):
    """top_k is 200 by default and None (no limit) when asked: the model samples with what was given."""
    seen = []

    def generate(self, idx, max_new_tokens, **kw):
        seen.append(kw['top_k'])
        return idx
    monkeypatch.setattr(GPT, 'generate', generate)
    assert script_here('sample.py', f'--out_dir={tiny_run}', '--num_samples=1', '--device=cpu', *args)[0] == 0
    assert seen == [want]


@pytest.mark.parametrize('top_k, message', [('0', 'top_k=0 must be >= 1, or None for no limit'),
                                            ('all', "top_k='all': expected int or None, got str (--top_k=all)")])
def test_bad_top_k_is_refused(top_k, message, tmp_path):
    with pytest.raises(UserError) as e:
        script_here('sample.py', f'--out_dir={tmp_path}', f'--top_k={top_k}')
    assert str(e.value) == message
