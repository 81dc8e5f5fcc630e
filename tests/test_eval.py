"""integrations/eval.py: the lm-eval adapter against log-probabilities computed directly from the model, end-to-end
runs of the harness on a tiny local task, and its one-line errors. Offline, tiny models, seconds."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

if not os.environ.get("CI"):  # CI installs requirements-eval.txt: there a missing lm-eval fails, not skips
    pytest.importorskip("lm_eval", reason="optional: pip install -r requirements-eval.txt")
# the tasks here read local JSON files; integrations/eval.py's subprocesses run with the hub switched off (see run())

import lm_eval  # noqa: E402  (slow: imported once for the module)
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from integrations import eval as ev  # noqa: E402  (imported, it only defines its adapter)
from nanolime import common  # noqa: E402
from nanolime.common import UserError  # noqa: E402
from conftest import run_script  # noqa: E402
from nanolime import data  # noqa: E402
from nanolime.checkpoint import atomic_save  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from relatives import RelativesConfig, build_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHARS = sorted(set("\n !?:.,abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
CHAR_META = {"vocab_size": len(CHARS), "kind": "char", "stoi": {c: i for i, c in enumerate(CHARS)},
             "itos": {i: c for i, c in enumerate(CHARS)}}  # what prepare.py writes for a char dataset
BPE_META = {"vocab_size": data.EOT + 1, "kind": "bpe", "encoding": "gpt2"}
L = 24  # block_size of the tiny models


def tiny_gpt(vocab, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(block_size=L, vocab_size=vocab, n_layer=2, n_head=2, n_embd=16, lime=True)
    args.update(kw)
    return build_model(RelativesConfig(**args)).eval()


def adapter(model, meta, batch_size=4):
    encode, decode = data.codec(meta)
    return ev.NanoLIMeLM(model, encode, decode, "cpu", torch.float32, batch_size=batch_size)


def reqs(kind, args_list, task="t"):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0, metadata=(task, i, 1))
            for i, a in enumerate(args_list)]


def save_ckpt(model, meta, path):
    c = model.config
    model_args = {k: getattr(c, k) for k in c.__dataclass_fields__}
    atomic_save({"nanolime": 1, "model": model.state_dict(), "optimizer": None, "model_args": model_args,
                 "iter_num": 0, "best_val_loss": 0.0, "config": {}, "meta": meta, "rng": None, "tokens": 0,
                 "flops": 0, "world_size": 1}, path)


@torch.no_grad()
def direct_ll(model, ctx, cont):
    """log p(cont | ctx) from the model's full logits on the last block_size tokens (left truncation)."""
    toks = (ctx + cont)[-(L + 1):]
    idx = torch.tensor([toks[:-1]])
    logits, _ = model(idx, idx)
    logp = F.log_softmax(logits[0], dim=-1)
    n = len(toks) - 1
    return sum(logp[n - len(cont) + j, t].item() for j, t in enumerate(cont))


@torch.no_grad()
def naive_ll(model, ctx, cont):
    """The same, one token at a time through the last-position-only forward (no truncation: short inputs)."""
    toks, total = ctx + cont, 0.0
    for j in range(len(ctx), len(toks)):
        logits, _ = model(torch.tensor([toks[:j]]))
        total += F.log_softmax(logits[0, -1], dim=-1)[toks[j]].item()
    return total


# ----------------------------------------------------------------------------- (a) loglikelihood
def test_loglikelihood_equals_direct_logprobs_char():
    model = tiny_gpt(len(CHARS))
    lm = adapter(model, CHAR_META, batch_size=3)
    enc = data.codec(CHAR_META)[0]
    long_ctx = "the quick brown fox jumps over the lazy dog." * 2  # > block_size: truncated on the left
    pairs = [("Question: is it?\nAnswer:", " yes"), ("ab", "c"), ("Hi", " there!"), (long_ctx, " again"),
             ("x", "y" * 5), ("", "hello")]
    out = lm.loglikelihood(reqs("loglikelihood", pairs))
    assert len(long_ctx) > L
    for (ctx, cont), (ll, _) in zip(pairs, out):
        c = enc(ctx) if ctx else enc("\n")  # no context: the newline stands in for end-of-text
        assert ll == pytest.approx(direct_ll(model, c, enc(cont)), abs=1e-4), (ctx, cont)
        if len(c) + len(cont) <= L:
            assert ll == pytest.approx(naive_ll(model, c, enc(cont)), abs=1e-4), (ctx, cont)
    # the truncated one really lost its beginning: a different beginning does not change the score
    other = lm.loglikelihood(reqs("loglikelihood", [("THE QUICK " + long_ctx[10:], " again")]))[0][0]
    assert other == pytest.approx(out[3][0], abs=1e-5)
    # batching and padding change nothing
    one = adapter(model, CHAR_META, batch_size=1).loglikelihood(reqs("loglikelihood", pairs))
    assert [o[0] for o in one] == pytest.approx([o[0] for o in out], abs=1e-5)


def test_loglikelihood_bpe_boundary_merge_like_the_hf_adapter():
    model = tiny_gpt(data.EOT + 1, n_embd=8)
    lm = adapter(model, BPE_META)
    enc = data.codec(BPE_META)[0]

    class Ref(TemplateLM):  # the harness's own context/continuation split (what `--model hf` uses)
        backend = "causal"
        eot_token_id = data.EOT
        def tok_encode(self, s, **kw): return enc(s)
        def _loglikelihood_tokens(self, *a, **kw): pass
        def loglikelihood_rolling(self, *a, **kw): pass
        def generate_until(self, *a, **kw): pass

    ref = Ref()
    pairs = [("Hello wor", "ld!"), ("The answer is ", "yes"), ("Question: why?\nAnswer:", " because")]
    # "Hello world!" is Hello| world|!, so " wor" merges away: the harness scores "!" after Hello| wor
    assert ref._encode_pair(*pairs[0]) == (enc("Hello wor"), [enc("!")[0]])
    out = lm.loglikelihood(reqs("loglikelihood", pairs + [("", "Hello")]))
    for (ctx, cont), (ll, _) in zip(pairs, out):
        c, k = ref._encode_pair(ctx, cont)
        assert ll == pytest.approx(naive_ll(model, c, k), abs=1e-4), (ctx, cont)
    assert out[3][0] == pytest.approx(naive_ll(model, [data.EOT], enc("Hello")), abs=1e-4)


@torch.no_grad()
def test_is_greedy():
    model = tiny_gpt(len(CHARS), seed=3)
    lm = adapter(model, CHAR_META)
    enc, dec = data.codec(CHAR_META)
    ids = enc("Once upon a")
    for _ in range(4):  # the model's own greedy continuation
        ids.append(model(torch.tensor([ids]))[0][0, -1].argmax().item())
    greedy = dec(ids[-4:])
    wrong = greedy[:-1] + next(c for c in "xyzq" if c != greedy[-1])
    (_, g1), (_, g2) = lm.loglikelihood(reqs("loglikelihood", [("Once upon a", greedy), ("Once upon a", wrong)]))
    assert g1 is True and g2 is False


# ----------------------------------------------------------------------------- (b) loglikelihood_rolling
@torch.no_grad()
def test_loglikelihood_rolling():
    model = tiny_gpt(len(CHARS), seed=1)
    lm = adapter(model, CHAR_META, batch_size=2)
    enc = data.codec(CHAR_META)[0]
    short, long = "To be, or not to be.", "All the world is a stage, and all the men and women merely players."
    nl = enc("\n")[0]
    got = lm.loglikelihood_rolling(reqs("loglikelihood_rolling", [(short,), (long,)]))
    toks = enc(short)
    assert len(toks) < L < len(enc(long))
    idx, tgt = torch.tensor([[nl] + toks[:-1]]), torch.tensor([toks])
    _, loss = model(idx, tgt)  # mean loss over the sequence: x tokens = -log-likelihood
    assert got[0] == pytest.approx(-loss.item() * len(toks), abs=1e-3)
    toks = enc(long)
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(toks, nl, L, 1)]
    assert sum(len(p) for _, p in windows) == len(toks) and len(windows) > 1  # each token predicted once
    expect = sum(direct_ll(model, c, p) for c, p in windows)
    assert got[1] == pytest.approx(expect, abs=1e-3)


# ----------------------------------------------------------------------------- generate_until
@torch.no_grad()
def test_generate_until_is_greedy_and_stops():
    model = tiny_gpt(len(CHARS), seed=2, block_size=64)
    lm = adapter(model, CHAR_META)
    enc, dec = data.codec(CHAR_META)
    n = 40  # tokens to generate: the context keeps its last block_size - n tokens, as the harness does
    prompts = ["Hello there", "Goodbye now", "abc", "To be or not to be, that is"]  # two of one length: a batch
    refs = []
    for p in prompts:
        ids = enc(p)[-(64 - n):]
        for _ in range(n):
            ids.append(model(torch.tensor([ids]))[0][0, -1].argmax().item())
        refs.append(dec(ids[-n:]))
    stop = refs[0][5:7]
    calls, generate = [], model.generate
    model.generate = lambda x, k, *a, **kw: calls.append((*x.shape, k)) or generate(x, k, *a, **kw)
    out = lm.generate_until(reqs("generate_until", [(p, {"until": [stop], "max_gen_toks": n}) for p in prompts]))
    assert out == [r.split(stop)[0] for r in refs]
    assert len(out[0]) == refs[0].index(stop) < n
    assert calls[0][:2] == (1, 64 - n)  # the longest prompt first, truncated on the left
    assert (2, len(prompts[0]), 16) in calls  # the two of one length together, in rounds of 16, 24 tokens
    calls.clear()
    out = lm.generate_until(reqs("generate_until", [(prompts[2], {"until": [], "max_gen_toks": 7}),
                                                    (prompts[2], {"until": [refs[2][2:4]], "max_gen_toks": n})]))
    assert out == [refs[2][:7], refs[2].split(refs[2][2:4])[0]]
    assert sorted(calls) == [(1, 3, 7), (1, 3, 16)]  # a stop string met in the first round ends it
    del model.generate


def test_char_checkpoint_rejects_foreign_characters():
    lm = adapter(tiny_gpt(len(CHARS)), CHAR_META)
    with pytest.raises(ev.UserError, match=r"task arc_easy: characters not in the vocabulary: '0é'"):
        lm.loglikelihood(reqs("loglikelihood", [("Question: 0", " é")], task="arc_easy"))


# ----------------------------------------------------------------------------- (c) the harness end to end
WORDS = ["cat", "dog", "sun", "map", "pen", "box", "cup", "hat", "jar", "key", "owl", "fig"]
VOWELS = "aeiou"


def write_task(d, name="tiny_mc", dataset=None):
    """A multiple-choice task over a local JSON file: which word was said? (the answer is in the question)"""
    rows = []
    for i, w in enumerate(WORDS):
        other = ["aei", "oua", "eio"][i % 3]  # vowels only: what the rigged model prefers
        choices = [w, other, WORDS[(i + 5) % len(WORDS)]]
        ans = i % 3
        choices[0], choices[ans] = choices[ans], choices[0]
        rows.append({"question": f"Say {w}. You said", "choices": choices, "answer": ans, "vowel": choices.index(other)})
    with open(os.path.join(d, "tiny_mc.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    src = dataset or f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {os.path.join(d, 'tiny_mc.jsonl')}"
    with open(os.path.join(d, f"{name}.yaml"), "w") as f:
        f.write(f"task: {name}\n{src}\ntest_split: test\noutput_type: multiple_choice\n"
                "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: answer\n"
                "metric_list:\n  - metric: acc\n")
    return rows


@torch.no_grad()
def rig(model, prefer):
    """Make every position predict the characters in `prefer` strongly: blocks off (their outputs
    zeroed), embeddings sharing one direction, an untied head that reads that direction."""
    for name, p in model.named_parameters():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            p.zero_()
    wte = model.transformer.wte.weight
    wte.copy_(torch.ones_like(wte) + 0.01 * torch.randn_like(wte))
    head = torch.full_like(model.lm_head.weight, -1.0)
    head[[CHAR_META["stoi"][c] for c in prefer]] = 1.0
    model.lm_head.weight.copy_(head)
    return model


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tasks")
    rows = write_task(str(d))
    return str(d), rows


@pytest.mark.slow  # lm-eval's simple_evaluate starts `pip list` for its report
@torch.no_grad()
def test_simple_evaluate_local_task(task_dir, tmp_path):
    d, rows = task_dir
    tm = TaskManager(include_path=d, include_defaults=False)
    model = tiny_gpt(len(CHARS), seed=4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    text = "".join(f"Say {w}. You said {w}\n" for w in WORDS)
    tokens = torch.tensor(data.codec(CHAR_META)[0](text))
    with torch.enable_grad():  # a few steps: a tiny *trained* checkpoint
        model.train()
        for _ in range(30):
            ix = torch.randint(len(tokens) - L - 1, (8,))
            _, loss = model(torch.stack([tokens[i:i + L] for i in ix]), torch.stack([tokens[i + 1:i + L + 1] for i in ix]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
    lm = adapter(model, CHAR_META)
    res = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc"], task_manager=tm, num_fewshot=0)
    acc = res["results"]["tiny_mc"]["acc,none"]
    enc = data.codec(CHAR_META)[0]
    expect = sum(max(range(3), key=lambda j: naive_ll(model, enc(r["question"]), enc(" " + r["choices"][j])))
                 == r["answer"] for r in rows) / len(rows)
    assert acc == pytest.approx(expect)  # the harness's accuracy is the model's, computed directly
    # told the answer: a model rigged to prefer vowels, on a task whose answer is the vowel-only choice
    for r in rows:
        r["answer"] = r["vowel"]
    with open(os.path.join(d, "tiny_mc.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    rigged = adapter(rig(tiny_gpt(len(CHARS), tie_embeddings=False), VOWELS + " "), CHAR_META)
    res = lm_eval.simple_evaluate(model=rigged, tasks=["tiny_mc"], task_manager=tm, num_fewshot=1)
    assert res["results"]["tiny_mc"]["acc,none"] == 1.0
    write_task(d)  # restore for the other tests


# ----------------------------------------------------------------------------- integrations.eval as a user runs it
def run(*args, env=None, **kw):
    e = dict(os.environ, OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    e.update(env or {})
    for k in [k for k, v in e.items() if v is None] + ["NANOLIME_DEBUG"]:
        e.pop(k, None)
    return subprocess.Popen([sys.executable, "-m", "integrations.eval", *args], cwd=kw.get("cwd", ROOT),
                            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(task_dir, tmp_path_factory):
    """integrations/eval.py where the process itself is tested (without lm-eval; with no network, before lm-eval is
    imported), both started together: each spends seconds importing; and a checkpoint for the others."""
    t = tmp_path_factory.mktemp("runs")
    ckpt_dir = t / "out"
    ckpt_dir.mkdir()
    save_ckpt(tiny_gpt(len(CHARS)), CHAR_META, str(ckpt_dir / "ckpt.pt"))
    hub = t / "hub"
    hub.mkdir()
    write_task(str(hub), name="hub_mc", dataset="dataset_path: allenai/ai2_arc\ndataset_name: ARC-Easy")
    shim = t / "shim" / "lm_eval"  # an environment without lm-eval
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'lm_eval'\", name='lm_eval')\n")
    ok = [f"--out_dir={ckpt_dir}", "--device=cpu"]
    procs = {
        "missing": run(*ok, env={"PYTHONPATH": str(t / "shim")}),
        # no offline switch, but the hub is unreachable (a closed port here): it finds out and says so
        "offline": run(*ok, "--tasks=hub_mc", f"--include_path={hub}",
                       env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_DATASETS_OFFLINE": None, "HF_HUB_OFFLINE": None}),
    }
    out = {k: (*p.communicate(timeout=300), p.returncode) for k, p in procs.items()}
    return out, ckpt_dir


@pytest.fixture
def eval_here(run_here, monkeypatch):
    """integrations/eval.py run in this process (the hub switched off, as in run()): its UserError propagates."""
    for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(v, "1")
    monkeypatch.delenv("NANOLIME_DEBUG", raising=False)
    return lambda *args: run_here("integrations/eval.py", *args)


def one_error_line(result):
    stdout, stderr, code = result
    lines = [l for l in stderr.splitlines() if l.startswith("error:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.slow
def test_eval_py_end_to_end(runs, task_dir, eval_here, capsys):
    ckpt_dir = runs[1]
    assert eval_here(f"--out_dir={ckpt_dir}", "--device=cpu", "--tasks=tiny_mc", f"--include_path={task_dir[0]}",
                     "--limit=6", "--num_fewshot=1") == 0
    captured = capsys.readouterr()
    stdout = captured.out
    assert "tiny_mc" in stdout and "acc" in stdout and "|" in stdout  # the harness's table
    ckpt = torch.load(ckpt_dir / "ckpt.pt", weights_only=True)  # what it was trained with, printed
    assert f"iter {ckpt['iter_num']}, torch {ckpt.get('torch_version') or 'not recorded'}, commit " in captured.err
    with open(ckpt_dir / "eval_results.json") as f:
        res = json.load(f)
    acc = res["results"]["tiny_mc"]["acc,none"]
    assert 0.0 <= acc <= 1.0 and res["n-shot"]["tiny_mc"] == 1 and res["n-samples"]["tiny_mc"]["effective"] == 6


@pytest.mark.slow
def test_error_lm_eval_missing(runs):
    line = one_error_line(runs[0]["missing"])
    assert line == "error: integrations/eval.py needs lm-eval: pip install -r requirements-eval.txt"


def test_error_not_our_checkpoint(task_dir, eval_here, tmp_path):
    torch.save({"state_dict": {}}, str(tmp_path / "foreign.pt"))
    with pytest.raises(common.UserError, match="not a nanoLIMe checkpoint"):
        eval_here(f"--out_dir={tmp_path / 'foreign.pt'}", "--tasks=tiny_mc", f"--include_path={task_dir[0]}")


@pytest.mark.slow
def test_error_unknown_task(runs, task_dir, eval_here):
    with pytest.raises(common.UserError) as e:
        eval_here(f"--out_dir={runs[1]}", "--device=cpu", "--tasks=tiny_mcq", f"--include_path={task_dir[0]}",
                  "--include_defaults=False")
    line = str(e.value)
    assert "unknown task 'tiny_mcq'" in line and "did you mean tiny_mc?" in line and line.endswith("has: tiny_mc)")


@pytest.mark.slow
def test_error_no_network(runs):
    line = one_error_line(runs[0]["offline"])
    assert line.startswith("error: task hub_mc needs its dataset from the Hugging Face hub and there is no network")
    assert "--include_path" in line and "dataset_path: json" in line
    assert "Retrying" not in runs[0]["offline"][1]  # found out at once, not after the hub client's retries


def test_eval_checks_its_output_before_the_evaluation(short_run, monkeypatch):
    pytest.importorskip('lm_eval')  # (slow: most of this test)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
    with pytest.raises(UserError, match=f'cannot write into out_dir={short_run}/ckpt.pt: it is a file'):
        run_script('integrations/eval.py', f'--out_dir={short_run}', '--device=cpu', '--results_file=ckpt.pt/r.json')
