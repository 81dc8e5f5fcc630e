"""nanolime/sweep_runs.py: the sweep's option lists, run records, and its check of options by train.py."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nanolime.common import UserError
from nanolime.sweep_runs import check_options, final_record, int_list, read_json

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train.py')


def test_int_list_takes_distinct_integers_and_refuses_the_rest():
    assert int_list('depths', '4, 8,16', 1) == [4, 8, 16]
    for text in ['4,4', '0,4', '4,x', '', '4,04']:  # 4 and 04 are one run directory
        with pytest.raises(UserError, match="depths="):
            int_list('depths', text, 1)


def test_read_json_and_final_record(tmp_path):
    (tmp_path / 'bad.json').write_text('{not json')
    (tmp_path / 'list.json').write_text('[1]')
    assert read_json(tmp_path / 'bad.json') == {} == read_json(tmp_path / 'list.json') == read_json(tmp_path / 'none')
    (tmp_path / 'log.jsonl').write_text('\n'.join(json.dumps(r) for r in [
        {'iter': 10, 'val_loss': 2.5}, {'iter': 20, 'loss': 2.0}, {'iter': 20, 'val_loss': 2.1}]) + '\n')
    assert final_record(str(tmp_path), 20) == {'iter': 20, 'val_loss': 2.1}
    assert final_record(str(tmp_path), 30) is None


def test_check_options_returns_train_py_s_config_and_names_a_close_key(tiny_data_dir, tmp_path, monkeypatch):
    """train.py checks each variant's options and is stopped before it claims the out_dir: nothing is written."""
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)  # train.py's configure() installs its own
    args = ['--dataset=shakespeare_char', f'--data_dir={tiny_data_dir}', '--n_layer=2', '--n_embd=32', '--n_head=2',
            '--device=cpu', f'--out_dir={tmp_path / "run"}']
    configs = check_options(TRAIN_PY, {'baseline': [*args, '--lime=False'], 'lime': [*args, '--lime=True']},
                            ['depths'])
    assert configs['baseline']['lime'] is False and configs['lime']['lime'] is True
    assert configs['lime']['n_layer'] == 2 and not (tmp_path / 'run').exists()
    with pytest.raises(UserError, match="variant lime: .*variantss.*did you mean 'variants'"):
        check_options(TRAIN_PY, {'baseline': args, 'lime': [*args, '--variantss=a']}, ['variants'])
