"""nanolime/sweep_runs.py: the sweep's option lists, run records, and its check of options by train.py."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nanolime.common import UserError
from nanolime.sweep_runs import (check_options, final_record, int_list, launch_order, read_json, read_state,
                                 run_log, skipped_runs, tier_scores)

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train.py')


def test_int_list_takes_distinct_integers_and_refuses_the_rest():
    assert int_list('depths', '4, 8,16', 1) == [4, 8, 16]
    for text in ['4,4', '0,4', '4,x', '', '4,04']:  # 4 and 04 are one run directory
        with pytest.raises(UserError, match="depths="):
            int_list('depths', text, 1)


def test_read_json_and_final_record(tmp_path):
    (tmp_path / 'bad.json').write_text('{not json')
    (tmp_path / 'list.json').write_text('[1]')
    (tmp_path / 'good.json').write_text('{"a": [1]}')
    assert read_json(tmp_path / 'bad.json') is read_json(tmp_path / 'list.json') is read_json(tmp_path / 'none') is None
    assert read_json(tmp_path / 'good.json') == {'a': [1]}
    (tmp_path / 'log.jsonl').write_text('\n'.join(json.dumps(r) for r in [
        {'iter': 10, 'val_loss': 2.5}, {'iter': 20, 'loss': 2.0}, {'iter': 20, 'val_loss': 2.1}]) + '\n')
    assert final_record(str(tmp_path), 20) == {'iter': 20, 'val_loss': 2.1}
    assert final_record(str(tmp_path), 30) is None


def test_check_options_returns_train_py_s_config_and_names_a_close_key(tiny_data_dir, tmp_path, monkeypatch):
    """train.py checks each variant's options and is stopped before it claims the out_dir: nothing is written, and
    the sweep's error hook (which ends `sweep.py | head` quietly) is the sweep's again, not train.py's."""
    def hook(*args):
        pass
    monkeypatch.setattr(sys, 'excepthook', hook)
    args = ['--dataset=shakespeare_char', f'--data_dir={tiny_data_dir}', '--n_layer=2', '--n_embd=32', '--n_head=2',
            '--device=cpu', f'--out_dir={tmp_path / "run"}']
    configs = check_options(TRAIN_PY, {'baseline': [*args, '--lime=False'], 'lime': [*args, '--lime=True']},
                            ['depths'])
    assert configs['baseline']['lime'] is False and configs['lime']['lime'] is True
    assert configs['lime']['n_layer'] == 2 and not (tmp_path / 'run').exists()
    assert sys.excepthook is hook
    with pytest.raises(UserError, match="variant lime: .*variantss.*did you mean 'variants'"):
        check_options(TRAIN_PY, {'baseline': args, 'lime': [*args, '--variantss=a']}, ['variants'])


def test_read_state_names_what_is_wrong_with_a_sweep_json(tmp_path):
    path = tmp_path / 'sweep.json'
    assert read_state(path) == ({}, None)  # none yet: a run not started
    good = {'status': 'done', 'max_iters': 3, 'lr_decay_iters': 3, 'warmup_iters': 1, 'wall_time_s': 2, 'data': None}
    for state, what in [(good, None), ({**good, 'max_iters': 3.0}, 'its max_iters is 3.0, not an integer'),
                        ({**good, 'wall_time_s': True}, 'its wall_time_s is true, not a number'),
                        ({**good, 'data': 5}, 'its data is 5, not a string'), ({'max_iters': 3}, 'no status')]:
        path.write_text(json.dumps(state))
        assert read_state(path) == ((state, None) if what is None else ({}, what))


def test_tier_scores_refuses_a_damaged_file(tmp_path):
    path = tmp_path / 'arith_eval_test.json'
    assert tier_scores(path) is None
    path.write_text(json.dumps({'per_tier': {'2': {'accuracy': 0.5, 'majority_baseline': 0.25}}}))
    assert tier_scores(path) == {'2': {'accuracy': 0.5, 'majority_baseline': 0.25}}
    for damaged in ({'per_tier': [0.5]}, {'per_tier': {'2': {'accuracy': '50%'}}}, [1]):
        path.write_text(json.dumps(damaged))
        with pytest.raises(UserError, match=f"{path} is damaged: no per_tier of numbers"):
            tier_scores(path)


def test_a_damaged_log_is_a_warning_and_no_record(tmp_path, capsys):
    """A line of log.jsonl that is no record of train.py: the report warns, naming the file and line, and goes on."""
    (tmp_path / 'log.jsonl').write_text(json.dumps({'iter': 10, 'val_loss': 2.5}) + '\n[1, 2]\n')
    assert run_log(str(tmp_path)) == [] and final_record(str(tmp_path), 10) is None
    assert f"warning: {tmp_path / 'log.jsonl'}, line 2: not a record of train.py" in capsys.readouterr().err


def test_skipped_runs_and_the_launch_order():
    """--skip names <variant>-L<depth> of the sweep's (a variant may hold '-L' and '~'); the runs start seed by seed,
    deepest first within a seed, the variants in their order."""
    variants = ['baseline', 'lime~wandb_run_name=a-L2']
    assert skipped_runs('lime~wandb_run_name=a-L2-L8, baseline-L4', variants, [4, 8]) == {
        ('lime~wandb_run_name=a-L2', 8), ('baseline', 4)}
    assert skipped_runs('', variants, [4, 8]) == set()
    for bad in ('lime-L8', 'baseline-L16', 'baseline-8', 'baseline-Lx'):
        with pytest.raises(UserError, match=rf"^skip='{bad}': '{bad}' is no <variant>-L<depth> of this sweep's"):
            skipped_runs(bad, variants, [4, 8])
    runs = [{'depth': d, 'variant': v, 'seed': s} for d in (4, 8) for s in (1, 0) for v in ('baseline', 'lime')]
    assert [(r['seed'], r['depth'], r['variant']) for r in launch_order(runs)] == [
        (0, 8, 'baseline'), (0, 8, 'lime'), (0, 4, 'baseline'), (0, 4, 'lime'),
        (1, 8, 'baseline'), (1, 8, 'lime'), (1, 4, 'baseline'), (1, 4, 'lime')]

