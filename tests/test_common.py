"""nanolime/common.py: the choices it makes for the device a run is on; the configuration's --debug flag and every
script's --help; how an error reaches the user: one 'error:' line and a non-zero exit status (out of memory,
a Ctrl-C while torch loads, a DDP rank that lost another), or with --debug the traceback; what each option
takes, as its default says (configuration)."""
import ast
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch

from nanolime import common
from conftest import REPO, TINY_RUN, child_env, ckpt_of, fails, launch_ranks, patched, run, script_here


@pytest.mark.parametrize('gpu, native, want', [('A100', True, torch.bfloat16), ('V100', False, torch.float16),
                                               ('T4', False, torch.float16)])
def test_auto_dtype_is_bf16_only_where_the_gpu_has_it(gpu, native, want, monkeypatch):
    """dtype='auto' on CUDA: bfloat16 on a GPU that computes in it (Ampere and newer); float16 with the GradScaler
    on one that only emulates it (T4, V100), where torch.cuda.is_bf16_supported() alone answers True. The GPU
    is faked: is_bf16_supported answers as torch does for it, emulation included unless told otherwise."""
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda including_emulation=True: native or including_emulation)
    assert common.resolve_dtype('auto', 'cuda:0') == want
    assert common.resolve_dtype('auto', 'cpu') == torch.float32
    assert common.resolve_dtype('bfloat16', 'cuda:0') == torch.bfloat16  # asked for by name: as asked


def test_autocast_is_mixed_precision_except_in_float32():
    x = torch.ones(2, 2)
    with common.autocast('cpu', torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
    with common.autocast('cpu', torch.float32):
        assert (x @ x).dtype == torch.float32


# ------------------------------------------------------------------------ one error line, or with --debug the traceback
@pytest.mark.slow
def test_debug_shows_the_traceback(data_dir, monkeypatch, capsys):
    """--debug (a bare flag; --debug=True is the same check) and NANOLIME_DEBUG=1: the traceback instead."""
    p = run('train.py', f'--data_dir={data_dir}', '--n_layers=2', '--debug')
    assert p.returncode != 0 and 'Traceback' in p.stderr and 'UserError' in p.stderr
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
    try:
        raise common.UserError('bad')
    except common.UserError as e:
        err = e
    for debug in ('1', ''):  # the same handler, here: the environment variable turns it on
        monkeypatch.setenv('NANOLIME_DEBUG', debug)
        common.configure({'n_layer': 2}, argv=[])
        with pytest.raises(SystemExit) if not debug else contextlib.nullcontext():
            common.excepthook(common.UserError, err, err.__traceback__)
        assert ('Traceback' in capsys.readouterr().err) == bool(debug)


def test_bare_debug_flag_trains(data_dir, tmp_path, run_here, capsys):
    assert run_here('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--max_iters=2',
                    '--debug') == 0
    assert ckpt_of(str(tmp_path))['config']['debug'] is True and 'done: 2 iters' in capsys.readouterr().out


def test_out_of_memory_on_the_cpu_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
    monkeypatch.delenv('NANOLIME_DEBUG', raising=False)
    common.configure({'n_layer': 2}, argv=[])
    errors = [MemoryError()]  # numpy's, or Python's
    try:
        torch.empty(2 ** 62, dtype=torch.uint8)  # the CPU allocator's own error (a RuntimeError)
    except RuntimeError as e:
        errors.append(e)
    assert len(errors) == 2
    for e in errors:
        with pytest.raises(SystemExit):
            common.excepthook(type(e), e, e.__traceback__)
        assert capsys.readouterr().err == ("error: out of memory: lower batch_size (train.py then accumulates more "
                                           "micro-steps) or block_size; the last checkpoint, if any, is intact\n")


# on one rank, at its 6th optimizer step (after the checkpoint of iter 4): a kill, or an error only it sees
ONE_RANK_STOPS = """
import os, signal, torch
from nanolime import common
_step, _calls = torch.optim.AdamW.step, [0]
def step(self, *args, **kwargs):
    _calls[0] += 1
    if os.environ['RANK'] == os.environ['STOPPING_RANK'] and _calls[0] == 6:
        if os.environ['HOW'] == 'kill':
            os.kill(os.getpid(), signal.SIGKILL)
        raise common.UserError('a problem only this rank sees')
    return _step(self, *args, **kwargs)
torch.optim.AdamW.step = step
"""


@pytest.mark.slow
@pytest.mark.parametrize('stopping, how', [(1, 'kill'), (0, 'error')])
def test_a_rank_that_stops_alone_is_named_by_the_other(stopping, how, data_dir, tmp_path, monkeypatch):
    """The other rank says what happened and that the checkpoint is intact, not gloo's text."""
    monkeypatch.setenv('STOPPING_RANK', str(stopping))
    monkeypatch.setenv('HOW', how)
    args = [*TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', '--max_iters=10', '--eval_interval=4',
            '--total_batch_size=256']
    ranks = launch_ranks(patched(ONE_RANK_STOPS), *args, timeout=240)
    other = ranks[1 - stopping]
    line = fails(other, 'lost the connection to another rank, which stopped (killed, or with an error it reports '
                        'itself): stopping too; the last checkpoint, if any, is intact (rank 0 writes it whole): fix '
                        'what stopped that rank, then continue with --init_from=resume')
    assert line.startswith('error: [rank 1] ' if stopping == 0 else 'error: lost')
    if how == 'kill':
        assert ranks[stopping].returncode == -signal.SIGKILL
    else:
        assert fails(ranks[stopping]) == 'error: a problem only this rank sees'
    assert ckpt_of(str(tmp_path))['iter_num'] == 4


# ----------------------------------------------------------------------------- every script's --help and early Ctrl-C
SCRIPTS = ['train.py', 'sample.py', 'prepare.py', 'sweep.py', 'study/analyze.py', 'bench.py', 'integrations/eval.py',
           'study/arithmetic.py']


@pytest.mark.parametrize('flag', ['--help', '-h'])
@pytest.mark.parametrize('script', SCRIPTS)
def test_help_says_where_the_options_are(script, flag):
    """The usage line is the command that runs the script: `python train.py` at the top of the repository,
    `python -m study.analyze` for a module of its packages."""
    code, out, err = script_here(script, flag)
    assert code == 0 and err == '', err
    text = ' '.join(out.split())
    command = f"python {script}" if '/' not in script else f"python -m {script[:-3].replace('/', '.')}"
    assert f"usage: {command} [" in text and f"The options are the globals at the top of {script}" in text
    assert "A config file" in text and "then --key=value sets one" in text
    assert re.search(r'^  debug +=  ?False$', out, re.M)  # the options, with their defaults


# the import of torch is interrupted, as by a Ctrl-C in the seconds it takes
CTRL_C_IN_IMPORT = """
import sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == 'torch':
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
"""


@pytest.mark.slow
@pytest.mark.parametrize('script', SCRIPTS)
def test_ctrl_c_while_torch_loads_is_one_line(script):
    run_script = f"import runpy\nsys.argv[0] = {script!r}\nrunpy.run_path({script!r}, run_name='__main__')\n"
    p = run([sys.executable, '-c', CTRL_C_IN_IMPORT + run_script])
    assert p.returncode == -signal.SIGINT and p.stdout == ''
    assert p.stderr == "error: interrupted while starting; nothing was done\n"


# ----------------------------------------------------------------------------- configuration
@pytest.mark.parametrize('default, value, want', [
    (None, 3, 3), (None, None, None),  # None: an optional count
    ('auto', 'auto', 'auto'), ('auto', True, True), ('auto', False, False), ('auto', 'cuda:1', 'cuda:1'),
    (1.0, 2, 2.0), (2, 3, 3), ('out', 'x', 'x'), (False, True, True)])  # anything else: the default's type
def test_the_default_says_what_an_option_takes(default, value, want):
    got = common.check_value('key', value, default)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize('default, value, message', [
    (None, 'abc', "key='abc': expected int or None, got str"),
    (None, 2.5, "key=2.5: expected int or None, got float"),
    (None, True, "key=True: expected int or None, got bool"),
    ('auto', 1, "key=1: expected 'auto', a bool or a string, got int"),
    ('auto', None, "key=None: expected 'auto', a bool or a string, got None"),
    (200, None, "key=None: expected int, got None"),
    ('cpu', True, "key=True: expected str, got bool"),
    (False, 'auto', "key='auto': expected bool, got str")])
def test_what_the_default_refuses(default, value, message):
    with pytest.raises(common.UserError) as e:
        common.check_value('key', value, default)
    assert str(e.value) == message


def test_nullable_is_for_a_count_that_also_takes_none():
    """sample.py's top_k: 200 by default, None for no limit; nothing else changes."""
    assert common.check_value('top_k', None, 200, nullable=('top_k',)) is None
    assert common.check_value('top_k', 50, 200, nullable=('top_k',)) == 50
    with pytest.raises(common.UserError, match="top_k='all': expected int or None, got str"):
        common.check_value('top_k', 'all', 200, nullable=('top_k',))


def script_defaults(script):
    """A script's options as configure() finds them: its top-level NAME = <constant>."""
    tree = ast.parse(open(os.path.join(REPO, script)).read())
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) for t in node.targets if isinstance(t, ast.Name)}


@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'integrations/eval.py', 'prepare.py', 'study/analyze.py',
                                    'bench.py', 'study/arithmetic.py', 'sweep.py', 'integrations/export.py',
                                    'dev/bench_detail.py'])
def test_every_script_configures_without_lists(script, monkeypatch):
    """What each script's None and 'auto' options take, from the command line and from a config file, with
    configure(globals()) and nothing more: None or a count; 'auto', True, False or a name."""
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)  # configure() installs its own
    defaults = script_defaults(script)
    optional = [k for k, v in defaults.items() if v is None]
    auto = [k for k, v in defaults.items() if v == 'auto']
    assert script not in ('train.py', 'integrations/eval.py', 'bench.py') or (optional and auto), defaults
    for key in optional:
        assert common.configure(dict(defaults), [f'--{key}=4'])[key] == 4
        assert common.configure(dict(defaults), [f'--{key}=4', f'--{key}=None'])[key] is None  # later wins
        with pytest.raises(common.UserError, match=rf"^{key}='abc': expected int or None, got str \(--{key}=abc\)$"):
            common.configure(dict(defaults), [f'--{key}=abc'])
    for key in auto:
        for raw, want in (('True', True), ('False', False), ('auto', 'auto'), ('cpu', 'cpu')):
            got = common.configure(dict(defaults), [f'--{key}={raw}'])[key]
            assert got == want and type(got) is type(want)


def test_a_config_file_sets_none_and_auto_options(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
    f = tmp_path / 'cfg.py'
    f.write_text("n_kv_head = 2\nmlp_hidden = None\ncompile = False\n")
    c = common.configure(script_defaults('train.py'), [str(f)])
    assert (c['n_kv_head'], c['mlp_hidden'], c['compile']) == (2, None, False)
    f.write_text("compile = 1\n")
    with pytest.raises(common.UserError, match=rf"^compile=1: expected 'auto', a bool or a string, got int \({f}\)$"):
        common.configure(script_defaults('train.py'), [str(f)])


@pytest.mark.parametrize('script, args, message', [
    ('train.py', ['--compile=maybe'], "compile='maybe': expected 'auto', True or False"),
    ('train.py', ['--compile=None'], "compile='None': expected 'auto', True or False"),
    ('sample.py', ['--device=True'], "device=True: expected 'auto', 'cpu', 'cuda', 'cuda:<n>' or 'mps'"),
    ('sample.py', ['--dtype=False'], "dtype=False: expected 'auto', 'float32', 'bfloat16' or 'float16'")])
def test_the_script_checks_its_auto_options(script, args, message, tmp_path):
    """An 'auto' option takes any bool or name from configure(); the script refuses the ones it has no use for."""
    with pytest.raises(common.UserError) as e:
        script_here(script, f'--out_dir={tmp_path}', *args)
    assert str(e.value) == message


def test_check_ranges_refuses_each_kind_of_option_out_of_range():
    """One line for the option out of its range; a finite option takes 0, a positive one does not."""
    kinds = dict(at_least_1=('n',), at_least_0=('seed',), finite=('wd',), positive=('lr',), fraction=('beta',),
                 choices={'opt': ('adamw', 'muon')})
    good = {'n': 1, 'seed': 0, 'wd': 0.0, 'lr': 1e-3, 'beta': 0.0, 'opt': 'muon'}
    common.check_ranges(good, **kinds)
    for bad, message in [({'n': 0}, "n=0 must be >= 1"), ({'seed': -1}, "seed=-1 must be >= 0"),
                         ({'wd': float('inf')}, "wd=inf must be a finite number >= 0"),
                         ({'lr': 0.0}, "lr=0.0 must be > 0"), ({'lr': -1.0}, "lr=-1.0 must be a finite number >= 0"),
                         ({'beta': 1.0}, "beta=1.0 must be in [0, 1)"),
                         ({'opt': 'sgd'}, "opt='sgd': expected 'adamw' or 'muon'")]:
        with pytest.raises(common.UserError) as e:
            common.check_ranges({**good, **bad}, **kinds)
        assert str(e.value) == message


# ----------------------------------------------------------------------------- DDP: torchrun's environment
TORCHRUN = {'RANK': '1', 'LOCAL_RANK': '1', 'WORLD_SIZE': '2', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': '29500'}
# README's multi-node line on its second machine: `torchrun --nnodes=2 --node_rank=1 --master_addr=10.0.0.1
# --master_port=29500 --nproc_per_node=8 train.py ...`, its second process: rank 9 of 16, the machine's GPU 1
SECOND_NODE = {'RANK': '9', 'LOCAL_RANK': '1', 'WORLD_SIZE': '16', 'LOCAL_WORLD_SIZE': '8', 'GROUP_RANK': '1',
               'MASTER_ADDR': '10.0.0.1', 'MASTER_PORT': '29500'}


@pytest.mark.parametrize('env, want', [({}, None), ({'RANK': '', 'WORLD_SIZE': ''}, None),  # empty: as unset
                                       (TORCHRUN, (1, 1, 2)), ({**TORCHRUN, 'RANK': '0', 'LOCAL_RANK': '0'}, (0, 0, 2)),
                                       (SECOND_NODE, (9, 1, 16))])
def test_ddp_env_reads_torchrun_s_variables(env, want):
    assert common.ddp_env(env) == want


@pytest.mark.parametrize('env, message', [
    ({'WORLD_SIZE': '2'}, "the DDP environment is half set: RANK and LOCAL_RANK are missing (WORLD_SIZE=2 is set); "
                          "start DDP with torchrun (it sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and "
                          "MASTER_PORT), or unset WORLD_SIZE for one process"),
    ({'RANK': '0', 'WORLD_SIZE': '2'}, "the DDP environment is half set: LOCAL_RANK is missing"),
    ({'RANK': '1'}, "the DDP environment is half set: LOCAL_RANK and WORLD_SIZE are missing (RANK=1 is set)"),
    ({'LOCAL_RANK': '0', 'RANK': '0'}, "the DDP environment is half set: WORLD_SIZE is missing"),
    ({'RANK': 'a'}, "the DDP environment is half set: LOCAL_RANK and WORLD_SIZE are missing (RANK=a is set)"),
    ({**TORCHRUN, 'RANK': ''}, "the DDP environment is half set: RANK is missing"),  # left empty by a shell
    ({**TORCHRUN, 'RANK': 'a'}, "RANK='a' in the environment is not an integer >= 0; start DDP with torchrun"),
    ({**TORCHRUN, 'WORLD_SIZE': '-2'}, "WORLD_SIZE='-2' in the environment is not an integer >= 0"),
    ({**TORCHRUN, 'LOCAL_RANK': '0x1'}, "LOCAL_RANK='0x1' in the environment is not an integer >= 0"),
    ({**TORCHRUN, 'RANK': '2'}, "RANK=2 in the environment must be below WORLD_SIZE=2 (ranks count from 0)"),
    ({**TORCHRUN, 'MASTER_ADDR': ''}, "MASTER_ADDR is not set: the 2 DDP ranks meet at MASTER_ADDR:MASTER_PORT"),
    ({k: v for k, v in TORCHRUN.items() if k != 'MASTER_PORT'}, "MASTER_PORT='' in the environment is not a port"),
    ({**TORCHRUN, 'MASTER_PORT': 'http'}, "MASTER_PORT='http' in the environment is not a port (an integer from 1 "
                                          "to 65535)"),
    ({**TORCHRUN, 'MASTER_PORT': '70000'}, "MASTER_PORT='70000' in the environment is not a port"),
])
def test_ddp_env_names_the_variable_at_fault(env, message):
    """Each problem of the DDP environment is one UserError naming its variable (the world size and DDP come from
    the same variables: a shell that exported WORLD_SIZE alone would count the tokens of ranks that do not exist)."""
    with pytest.raises(common.UserError) as e:
        common.ddp_env(env)
    assert str(e.value).startswith(message), str(e.value)


def test_start_ddp_says_what_it_waits_for_before_it_waits(monkeypatch, capsys):
    """WORLD_SIZE=2 with one process started: init_process_group waits for the missing rank until torch's timeout;
    the line before it says so."""
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
    seen = []
    monkeypatch.setattr(torch.distributed, 'init_process_group',
                        lambda backend: seen.append((backend, capsys.readouterr().out)))
    monkeypatch.setattr(torch.distributed, 'all_gather_object', lambda runs, run: runs.__setitem__(slice(None), [run] * 2))
    common.start_ddp('cpu', 1, 2, {'seed': 1})
    (backend, said), = seen
    assert backend == 'gloo' and said == ("ddp: rank 1 waits for all 2 ranks (WORLD_SIZE) to join at 127.0.0.1:29500 "
                                          "(MASTER_ADDR:MASTER_PORT); torchrun starts them together\n")
    assert sys.excepthook is common.excepthook



@pytest.mark.parametrize('runs, message', [
    ([{'a': 1, 'lr': 0.002}, {'a': 1, 'lr': 0.01}], "lr is 0.002 on rank 0; 0.01 on rank 1;"),
    ([{'a': 1}, {'a': 2}, {'a': 1}, {'a': 1, 'b': 0}], "a is 1 on ranks 0, 2, 3; 2 on rank 1 (b too);"),
    ([{'a': 1}, {'a': 1, 'b': 0}], "b is 'not set' on rank 0; 0 on rank 1;"),  # a key only some ranks have
    ([{'a': float('nan')}] * 2, None)])  # the same value, even one that equals nothing
def test_ranks_that_would_run_different_runs_stop_before_any_other_collective(runs, message, monkeypatch):
    """start_ddp compares the ranks' runs right after the process group starts: every rank raises the same error,
    naming the first key that differs and each rank's value (tests/test_train.py: two real ranks)."""
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
    monkeypatch.setattr(torch.distributed, 'init_process_group', lambda backend: None)
    monkeypatch.setattr(torch.distributed, 'all_gather_object', lambda out, run: out.__setitem__(slice(None), runs))
    with contextlib.redirect_stdout(None) if message is None else pytest.raises(common.UserError) as e:
        common.start_ddp('cpu', 1, len(runs), runs[1])
    if message is not None:
        assert str(e.value).startswith(f"the ranks were started for different runs: {message} start every rank with "
                                       "the same options, data and checkpoint"), str(e.value)


def test_a_master_port_in_use_is_named(monkeypatch, capsys):
    """torch's socket error ('EADDRINUSE') where rank 0 cannot listen: one line naming MASTER_PORT."""
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        for k, v in {**TORCHRUN, 'RANK': '0', 'LOCAL_RANK': '0', 'WORLD_SIZE': '1', 'MASTER_PORT': str(port)}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(sys, 'excepthook', sys.excepthook)
        try:
            with pytest.raises(common.UserError) as e:
                common.start_ddp('cpu', 0, 1, {})
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
    assert str(e.value) == (f"the ranks cannot meet at MASTER_ADDR:MASTER_PORT=127.0.0.1:{port} (the port is in use "
                            "by another program); choose another MASTER_PORT (torchrun --master_port=N), or end what "
                            "holds it")


def test_printed_text_from_files_has_no_control_characters():
    assert common.printable('abc\x1b[2J\x07 é\n') == 'abc\\x1b[2J\\x07 é\\n'


@pytest.mark.slow
def test_a_closed_stdout_is_one_line_that_says_so(data_dir, tmp_path):
    """`train.py | head -1`: the reader of stdout goes away after the first line; the next print stops the run with
    one line saying so (not BrokenPipeError's), exit status 1."""
    out = str(tmp_path / 'out')
    cmd = [sys.executable, 'train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={out}', '--max_iters=50']
    train = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    train.stdout.readline()
    train.stdout.close()  # head -1 exits
    stderr = train.communicate(timeout=300)[1].decode()
    assert train.returncode == 1 and stderr == ("error: stdout was closed by its reader (a pipe into head, say): "
                                                "stopped here; what was saved is intact\n")


@pytest.mark.slow
@pytest.mark.parametrize('script, args, rank', [('sample.py', ['--out_dir=/nonexistent'], 'a'),
                                                ('prepare.py', ['nope_no_dataset'], '')])
def test_a_bad_rank_does_not_break_the_error_line(script, args, rank):
    """RANK=a, or RANK= left empty by a shell: any script's error is still its one line (the error hook reads RANK
    only where it is a number); train.py's own error names the variable."""
    p = run(script, *args, env={'RANK': rank})
    line = fails(p)
    assert not line.startswith('error: [rank')


@pytest.mark.slow
def test_a_bad_ddp_environment_is_one_line_in_a_process(data_dir, tmp_path):
    p = run('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}/out', '--max_iters=1',
            env={**TORCHRUN, 'RANK': 'a'})
    fails(p, "error: RANK='a' in the environment is not an integer >= 0")
    p = run('train.py', *TINY_RUN, f'--data_dir={data_dir}', f'--out_dir={tmp_path}/out', '--max_iters=1',
            env={'WORLD_SIZE': 2})
    fails(p, 'the DDP environment is half set: RANK and LOCAL_RANK are missing (WORLD_SIZE=2 is set)', 'torchrun')
    assert not os.path.exists(f'{tmp_path}/out')
