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


def test_data_id_sees_a_change_anywhere_and_keeps_small_datasets_ids(tmp_path, monkeypatch):
    """The identity changes with a change in the middle of train.bin (read whole up to EXACT_BYTES, sampled
    beyond), not with the place of the files; a split of 2 MiB or less keeps the identity of its two ends."""
    import hashlib
    ddir = tmp_path / 'd'
    ddir.mkdir()
    (ddir / 'meta.pkl').write_bytes(pickle.dumps({'vocab_size': 65}))
    rng = np.random.default_rng(0)
    (ddir / 'val.bin').write_bytes(rng.integers(0, 65, 1000, dtype=np.uint16).tobytes())
    train_bin = ddir / 'train.bin'

    def changed(offset, length=1):
        before = data.data_id(str(ddir))
        with open(train_bin, 'r+b') as f:
            f.seek(offset)
            old = f.read(length)
            f.seek(offset)
            f.write(bytes(255 - b for b in old))
        after = data.data_id(str(ddir))
        with open(train_bin, 'r+b') as f:  # back as it was: the same identity again
            f.seek(offset)
            f.write(old)
        assert data.data_id(str(ddir)) == before
        return after != before
    def ends(train):  # the identity of earlier versions: each split's size, first and last MiB
        h = hashlib.sha256((ddir / 'meta.pkl').read_bytes())
        for name, blob in (('train', train), ('val', (ddir / 'val.bin').read_bytes())):
            h.update(f"{name} {len(blob)}".encode() + blob[:2 ** 20] + blob[-2 ** 20:])
        return h.hexdigest()[:12]
    small = rng.integers(0, 65, 900_000, dtype=np.uint16).tobytes()  # 1.7 MiB: its two ends are all of it
    train_bin.write_bytes(small)
    assert data.data_id(str(ddir)) == data.ends_data_id(str(ddir)) == ends(small)
    shutil.copytree(ddir, tmp_path / 'copy')
    assert data.data_id(str(tmp_path / 'copy')) == data.data_id(str(ddir))
    large = rng.integers(0, 65, 3_000_000, dtype=np.uint16).tobytes()  # 5.7 MiB: read whole
    train_bin.write_bytes(large)
    assert data.ends_data_id(str(ddir)) == ends(large) != data.data_id(str(ddir))
    assert changed(3_000_000) and changed(2 ** 20) and changed(6_000_000 - 2 ** 20 - 1)
    monkeypatch.setattr(data, 'EXACT_BYTES', 4 * 2 ** 20)  # sampled: 1,024 reads of 4 KiB over 3.7 MiB
    assert changed(3_000_000, 4096) and changed(2 ** 20 + 100, 4096)
