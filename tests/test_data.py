"""nanolime/data.py: a dataset that is missing, too small for block_size, corrupt, or not plain data is one error
line that names the command that makes or rebuilds it (and never a wrong fix); no code runs from a dataset's files."""
import os
import pickle
import shutil

import numpy as np
import pytest

from nanolime import checkpoint
from nanolime import data
from nanolime.common import UserError
from conftest import TINY_RUN, error_of, train


def test_missing_data_names_the_prepare_command(tmp_path, run_here):
    line = error_of(run_here, 'train.py', f'--data_dir={tmp_path}')
    assert "dataset 'shakespeare_char' is not prepared" in line
    assert f'run: python prepare.py shakespeare_char --data_dir={tmp_path}' in line
    assert 'run: python prepare.py fineweb_edu' in error_of(run_here, 'train.py', '--dataset=fineweb_edu',
                                                            f'--data_dir={tmp_path}')


def test_block_size_larger_than_data(tiny_data_dir, run_here):
    line = error_of(run_here, 'train.py', *TINY_RUN, f'--data_dir={tiny_data_dir}', '--block_size=256',
                    '--total_batch_size=1024')
    assert "block_size=256 is too large for dataset 'shakespeare_char'" in line
    assert 'val split has only 200 tokens' in line


def test_corrupt_data_is_named_with_the_command_that_rebuilds_it(data_dir, tmp_path):
    root = tmp_path / 'data'
    shutil.copytree(os.path.join(data_dir, 'shakespeare_char'), root / 'shakespeare_char')
    ddir, fix = root / 'shakespeare_char', f"rebuild it: python prepare.py shakespeare_char --force --data_dir={root}"
    ids = np.fromfile(ddir / 'train.bin', dtype=np.uint16)
    ids[::100] = 300  # beyond its 75 characters
    ids.tofile(ddir / 'train.bin')
    with pytest.raises(UserError) as e:
        train(root, tmp_path / 'out')
    assert str(e.value) == (f"{ddir}/train.bin is corrupt: token id 300 is beyond the vocabulary of its meta.pkl "
                            f"(75 ids); {fix}")
    with open(ddir / 'val.bin', 'r+b') as f:
        f.truncate(os.path.getsize(ddir / 'val.bin') - 1)
    with pytest.raises(UserError) as e:
        data.data_info('shakespeare_char', str(root))
    assert str(e.value) == f"{ddir}/val.bin is corrupt (39999 bytes, an odd size: cut short); {fix}"
    (ddir / 'meta.pkl').write_bytes(b'\x80\x04garbage')
    with pytest.raises(UserError, match=f"^{ddir}/meta.pkl is corrupt \\(.*\\); {fix}$"):
        data.data_info('shakespeare_char', str(root))


class RunsCode:
    """What a crafted pickle can hold: a call, made while it loads (here: creating a file)."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_no_code_runs_from_a_dataset_file(data_dir, tmp_path):
    root = tmp_path / 'data'
    shutil.copytree(os.path.join(data_dir, 'shakespeare_char'), root / 'shakespeare_char')
    meta_path = root / 'shakespeare_char' / 'meta.pkl'
    meta = data.data_info('shakespeare_char', data_dir)[1]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):  # plain data in any pickle protocol still reads
        meta_path.write_bytes(pickle.dumps({**meta, 'extra': {(1, 2), frozenset('ab')}}, protocol=protocol))
        assert data.data_info('shakespeare_char', str(root))[1]['stoi'] == meta['stoi']
    marker = tmp_path / 'ran'
    meta_path.write_bytes(pickle.dumps({**meta, 'x': RunsCode(str(marker))}))
    with pytest.raises(UserError) as e:
        data.data_info('shakespeare_char', str(root))
    assert str(e.value) == (f"{meta_path} is not plain data: reading it would call posix.mkdir, so it was not read (it "
                            "may run its author's code); rebuild it: python prepare.py shakespeare_char --force "
                            f"--data_dir={root}, or ask where it came from")
    assert not marker.exists()


def test_hints_never_name_the_wrong_fix(short_run, tmp_path):
    (tmp_path / 'mine').mkdir()  # a dataset of one's own: prepare.py cannot make it
    with pytest.raises(UserError) as e:
        data.data_info('mine', str(tmp_path))
    assert 'python prepare.py' not in str(e.value) and str(e.value).endswith(
        f"prepare.py does not make 'mine': put train.bin, val.bin and meta.pkl in {tmp_path}/mine (the format "
        "prepare.py writes), or choose another dataset")
    # a damaged checkpoint: what to do, not torch's internals
    cut = tmp_path / 'cut'
    cut.mkdir()
    (cut / 'ckpt.pt').write_bytes(open(os.path.join(short_run, 'ckpt.pt'), 'rb').read()[:5000])
    with pytest.raises(UserError) as e:
        checkpoint.load_model(str(cut))
    assert str(e.value) == (f"{cut}/ckpt.pt is truncated or not a checkpoint; restore it from a copy, or train "
                            "again (train.py --overwrite replaces it)")
