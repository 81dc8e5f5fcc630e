"""sample.py: its options checked before anything is loaded; top_k reaches the model as given; a missing, foreign or
damaged checkpoint and a prompt outside the vocabulary, each one error line."""
import os

import pytest
import torch

from nanolime.common import UserError
from conftest import REPO, error_of, script_here
from model import GPT


@pytest.mark.parametrize('top_p', ['0.0', '1.5', '-0.1'])
def test_top_p_out_of_range_is_refused(top_p, tmp_path):
    with pytest.raises(UserError, match=rf"top_p={float(top_p)} must be in \(0, 1\] \(1.0: no nucleus cut\)"):
        script_here('sample.py', f'--out_dir={tmp_path}', f'--top_p={top_p}')


@pytest.mark.parametrize('args, want', [([], 200), (['--top_k=None'], None), (['--top_k=5'], 5),
                                        (['--top_k=5', '--temperature=0'], 1)])  # temperature 0: greedy
def test_top_k_is_a_count_or_none(args, want, short_run, monkeypatch):
    """top_k is 200 by default and None (no limit) when asked: the model samples with what was given."""
    seen = []

    def generate(self, idx, max_new_tokens, **kw):
        seen.append(kw['top_k'])
        return idx
    monkeypatch.setattr(GPT, 'generate', generate)
    assert script_here('sample.py', f'--out_dir={short_run}', '--num_samples=1', '--device=cpu', *args)[0] == 0
    assert seen == [want]


def test_sample_without_checkpoint(tmp_path, run_here):
    line = error_of(run_here, 'sample.py', f'--out_dir={tmp_path}')
    assert f'no checkpoint at {tmp_path}/ckpt.pt' in line and 'train one first' in line


def test_sample_foreign_truncated_and_garbage_checkpoints(short_run, tmp_path, run_here):
    (tmp_path / 'foreign').mkdir()
    torch.save({'model': {}, 'model_args': {}, 'config': {}}, tmp_path / 'foreign' / 'ckpt.pt')
    assert 'is not a nanoLIMe checkpoint' in error_of(run_here, 'sample.py', f'--out_dir={tmp_path / "foreign"}')
    (tmp_path / 'cut').mkdir()
    data = open(os.path.join(short_run, 'ckpt.pt'), 'rb').read()
    (tmp_path / 'cut' / 'ckpt.pt').write_bytes(data[:len(data) // 2])
    assert 'is truncated or not a checkpoint' in error_of(run_here, 'sample.py', f'--out_dir={tmp_path / "cut"}')
    (tmp_path / 'junk').mkdir()
    (tmp_path / 'junk' / 'ckpt.pt').write_text('hello')
    assert 'is truncated or not a checkpoint' in error_of(run_here, 'sample.py', f'--out_dir={tmp_path / "junk"}')


def test_sample_prompt_outside_the_vocabulary(short_run, tmp_path, run_here):
    line = error_of(run_here, 'sample.py', f'--out_dir={short_run}', '--start=Hello ☃ world€', '--device=cpu')
    assert '--start: characters not in the vocabulary' in line and '€☃' in line
    assert 'no such file' in error_of(run_here, 'sample.py', f'--out_dir={short_run}',
                                      f'--start=FILE:{tmp_path}/nope.txt')
    assert '--start is empty' in error_of(run_here, 'sample.py', f'--out_dir={short_run}', '--start=')


@pytest.mark.parametrize('args, needle', [
    (['--max_new_tokens=0'], 'max_new_tokens=0 must be >= 1'),
    (['--max_new_tokens=-5'], 'max_new_tokens=-5 must be >= 1'),
    (['--num_samples=0'], 'num_samples=0 must be >= 1'),
    (['--temperature=-1.0'], 'temperature=-1.0 must be a finite number >= 0'),
    (['--top_k=0'], 'top_k=0 must be >= 1'),
    (['--top_k=all'], "top_k='all': expected int or None, got str (--top_k=all)"),
    (['--tempreature=0.5'], "did you mean 'temperature'?"),
])
def test_sample_bad_options(args, needle, short_run, run_here):
    assert needle in error_of(run_here, 'sample.py', f'--out_dir={short_run}', *args)


def test_a_checkpoint_without_a_vocabulary_or_a_dataset_says_so(run_here):
    """tests/fixtures/*.pt hold a model only: sampling one names what is missing (not a dataset named '')."""
    with pytest.raises(UserError) as e:
        run_here('sample.py', '--out_dir=' + os.path.join(REPO, 'tests', 'fixtures', 'lime.pt'), '--device=cpu')
    assert str(e.value) == ("the checkpoint holds no vocabulary and names no dataset: its tokens cannot be read as "
                            "text; use a checkpoint that train.py wrote (it keeps its vocabulary)")
