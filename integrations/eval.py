"""
Evaluate a nanoLIMe checkpoint on downstream tasks with EleutherAI's LM Evaluation Harness
(the `lm_eval` package, an optional dependency: pip install -r requirements-eval.txt).

$ python -m integrations.eval --out_dir=out-fineweb-edu-1b --tasks=arc_easy,arc_challenge,wic,multirc,qnli --num_fewshot=3
$ python -m integrations.eval --out_dir=out-fineweb-edu-1b --tasks=arc_easy --limit=100  # a quick look
$ python -m integrations.eval --out_dir=out-mine --tasks=my_task --include_path=my_tasks/  # task YAMLs of your own

Prints the harness's results table and writes the harness's results JSON next to the checkpoint
(out_dir/eval_results.json). Scoring follows the harness's own Hugging Face adapter (`lm_eval --model hf`):
a continuation is scored by encoding context+continuation whole and splitting at the context's token
length, inputs longer than block_size lose tokens on the left, and documents longer than block_size are
scored in the harness's rolling windows. Generation is greedy unless a task asks to sample.

Character-level checkpoints work on text in their own alphabet only: a task with a character that is not
in the vocabulary stops with an error that names the task and the characters (dropping or replacing them
would score a different text). Such checkpoints have no end-of-text token; a newline stands in for it
(the context of a request with an empty context, and the first input of loglikelihood_rolling).
"""
import os
import sys
import json
import socket
import difflib
from urllib.parse import urlparse

# common first: a Ctrl-C in the seconds torch takes to load is then one line, not a traceback
from nanolime.common import UserError, configure, resolve_device, resolve_dtype, autocast
from nanolime.checkpoint import load_model, atomic_write, writable_dir, trained_with, CKPT_NAME
from nanolime.data import load_codec
import torch
import torch.nn.functional as F

# -----------------------------------------------------------------------------
out_dir = 'out-fineweb-edu-1b'  # where ckpt.pt is (or the path of a .pt file)
tasks = 'arc_easy,arc_challenge,wic,multirc,qnli'  # comma-separated harness task (or group) names
num_fewshot = None         # None: each task's own default; the paper's Table 1 uses 3
limit = None               # at most this many examples per task (a quick look; the scores are then not comparable)
include_path = ''          # a directory of task YAMLs of your own (as lm_eval --include_path)
include_defaults = True    # False: only the tasks under include_path (skips indexing the harness's ~15k tasks)
batch_size = 16            # sequences per forward pass
max_gen_toks = 256         # generate_until: the most new tokens when a task does not say (the harness's default)
results_file = 'eval_results.json'  # written in out_dir ('' to not write it)
log_samples = False        # also keep every example's prompt and scores in the results file
device = 'auto'            # 'auto', 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'             # 'auto' (bfloat16 on CUDA if supported, else float16; float32 elsewhere)
seed = 1234                # the harness's seeds (python, numpy, torch, few-shot sampling)
# -----------------------------------------------------------------------------


def hub_reachable():
    """Can this machine open a connection to the Hugging Face hub? (DNS + TCP: a fraction of a second)"""
    if any(os.environ.get(v) for v in ('HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy')):
        return True  # behind a proxy: let the libraries try
    url = urlparse(os.environ.get('HF_ENDPOINT', 'https://huggingface.co'))
    try:
        socket.create_connection((url.hostname, url.port or (80 if url.scheme == 'http' else 443)), timeout=5).close()
        return True
    except OSError:
        return False


if __name__ == '__main__':  # (imported, e.g. by tests, it only defines the adapter)
    config = configure(globals())
    # no network: the hub libraries then use their caches at once (a cached dataset still works) instead of
    # retrying for half a minute per file; must be decided before they are imported
    offline_vars = ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')
    if not any(os.environ.get(v, '0') not in ('0', '') for v in offline_vars) and not hub_reachable():
        os.environ.update({v: '1' for v in offline_vars})

try:  # optional: only this script needs it
    import lm_eval
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table, get_rolling_token_windows, make_disjoint_window, handle_non_serializable
    from lm_eval.models.utils import normalize_gen_kwargs, handle_stop_sequences, postprocess_generated_text
except ImportError as e:
    if getattr(e, 'name', None) and e.name.split('.')[0] == 'lm_eval':
        raise UserError("integrations/eval.py needs lm-eval: pip install -r requirements-eval.txt") from None
    raise UserError(f"lm-eval is installed but does not import ({e}); reinstall it: "
                    "pip install -r requirements-eval.txt") from None
from tqdm import tqdm


class NanoLIMeLM(LM):
    """The harness's view of a nanoLIMe model: text in, log-likelihoods and generations out."""

    def __init__(self, model, encode, decode, device, ptdtype, batch_size=16, max_gen_toks=256):
        super().__init__()
        self.model, self._encode, self.decode = model, encode, decode
        self._device, self.ptdtype = device, ptdtype
        self.batch_size, self.max_gen_toks = batch_size, max_gen_toks
        self.max_length = model.config.block_size
        # GPT-2 BPE knows <|endoftext|> as one token: the document separator it was trained with, so it is
        # what precedes a text with no context and what ends a generation, as for GPT-2 under `--model hf`.
        # A character vocabulary has no such token: a newline (which separates its passages) stands in.
        self.eot = self.eot_str = None
        try:
            ids = encode('<|endoftext|>')
            if len(ids) == 1:
                self.eot, self.eot_str = ids[0], '<|endoftext|>'
        except ValueError:
            pass
        if self.eot is not None:
            self.prefix = self.eot
        else:
            try:
                self.prefix = encode('\n')[0]
            except ValueError:  # a vocabulary without a newline: its first character
                self.prefix = 0

    # ---- tokens
    def tok_encode(self, s, task=None):
        try:
            return self._encode(s)
        except ValueError as e:  # characters outside a character-level vocabulary
            raise UserError(f"task {task or '?'}: {e}; a character-level checkpoint can only be evaluated on "
                            "text in its own alphabet") from None

    def encode_pair(self, context, continuation, task=None):
        """(context tokens, continuation tokens) as the harness's HF adapter makes them (TemplateLM):
        trailing spaces of the context move to the continuation, and context+continuation is encoded
        whole and split at the context's own token length, so a continuation whose first token merges
        with the end of the context (BPE) is scored on the tokens the model would really see."""
        if context == '':  # nothing to condition on: the end-of-text token (or the first token) is the context
            cont = self.tok_encode(continuation, task)
            if cont and cont[0] != self.prefix:
                return [self.prefix], cont
            return cont[:1], cont[1:]
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self.tok_encode(context + continuation, task)
        ctx = self.tok_encode(context, task)
        return ctx, whole[len(ctx):]

    # ---- scoring
    @torch.no_grad()
    def score(self, pairs, desc='loglikelihood', disable_tqdm=False, tasks=None):
        """[(context tokens, continuation tokens)] -> [(sum of log p(continuation), is_greedy)], batched.
        The input is the last block_size tokens of context+continuation minus its final token (left
        truncation, as the harness does); the continuation is scored on the last len(continuation) logits."""
        L, results = self.max_length, [None] * len(pairs)
        for i, (ctx, cont) in enumerate(pairs):
            if len(cont) > L:
                raise UserError(f"task {(tasks or [None])[i] or '?'}: a continuation of {len(cont)} tokens is longer "
                                f"than the model's block_size={L}; it cannot be scored in one window")
            if not cont:  # nothing to score (an empty continuation)
                results[i] = (0.0, True)
        # longest first, as the harness does: the first batch shows the worst-case memory at once
        order = sorted((i for i in range(len(pairs)) if results[i] is None),
                       key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        bar = tqdm(total=len(order), desc=desc, disable=disable_tqdm)
        for b in range(0, len(order), self.batch_size):
            batch = order[b:b + self.batch_size]
            inps = [(pairs[i][0] + pairs[i][1])[-(L + 1):][:-1] for i in batch]
            T = max(len(x) for x in inps)
            x = torch.zeros(len(batch), T, dtype=torch.long)  # right padding: causal attention never sees it
            for r, inp in enumerate(inps):
                x[r, :len(inp)] = torch.tensor(inp)
            x = x.to(self._device)
            with autocast(self._device, self.ptdtype):
                logits, _ = self.model(x, x)  # with targets the model returns every position's logits
            for r, i in enumerate(batch):
                cont = torch.tensor(pairs[i][1], device=self._device)
                n = len(inps[r])
                lp = F.log_softmax(logits[r, n - len(cont):n].float(), dim=-1)  # only the scored positions
                greedy = bool((lp.argmax(dim=-1) == cont).all())
                results[i] = (float(lp.gather(1, cont[:, None]).sum()), greedy)
            bar.update(len(batch))
        bar.close()
        return results

    def loglikelihood(self, requests, disable_tqdm=False):
        pairs = [self.encode_pair(*req.args, task=req.task_name) for req in requests]
        res = self.score(pairs, 'loglikelihood', disable_tqdm, [req.task_name for req in requests])
        for req, r in zip(requests, res):
            self.cache_hook.add_partial('loglikelihood', req.args, r)
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        # the harness's rolling windows: each token predicted once, each window with as much context as fits
        windows, owner = [], []
        for k, req in enumerate(requests):
            toks = self.tok_encode(req.args[0], req.task_name)
            for w in get_rolling_token_windows(toks, self.prefix, self.max_length, context_len=1):
                windows.append(make_disjoint_window(w))
                owner.append(k)
        res = self.score(windows, 'loglikelihood_rolling', disable_tqdm,
                         [requests[k].task_name for k in owner])
        totals = [0.0] * len(requests)
        for k, (lp, _) in zip(owner, res):
            totals[k] += lp
        for req, t in zip(requests, totals):
            self.cache_hook.add_partial('loglikelihood_rolling', req.args, t)
        return totals

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm=False):
        """Greedy (or sampled, when a task sets do_sample) continuations, cut at the first stop string.
        Prompts of the same token length and settings run as one batch (no padding: the model has no
        attention mask); model.generate keeps the KV cache within a round, and rounds double in length
        until every row has met a stop string or max_gen_toks."""
        L = self.max_length
        items = []
        for k, req in enumerate(requests):
            context, gen_kwargs = req.args
            kw = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kw.pop('until', None), eos=self.eot_str)
            n_new = kw.pop('max_gen_toks')
            # room for the new tokens, as the harness does; a block too short for that slides its window
            keep = L - n_new if L > n_new else L
            ids = self.tok_encode(context, req.task_name)[-keep:] or [self.prefix]
            temperature = float(kw.get('temperature', 0.0)) if kw.get('do_sample') else 0.0
            items.append((k, ids, until, n_new, temperature))
        out = [None] * len(requests)
        groups = {}
        for it in items:  # same length, stop strings and settings: one batch
            groups.setdefault((len(it[1]), tuple(it[2]), it[3], it[4]), []).append(it)
        bar = tqdm(total=len(requests), desc='generate_until', disable=disable_tqdm)
        for (_, until, n_new, temperature), group in sorted(groups.items(), key=lambda g: -g[0][0]):
            for b in range(0, len(group), self.batch_size):
                batch = group[b:b + self.batch_size]
                x = torch.tensor([it[1] for it in batch], dtype=torch.long, device=self._device)
                T, done, step = x.size(1), False, 16
                while not done and x.size(1) - T < n_new:
                    step = min(step, n_new - (x.size(1) - T))
                    with autocast(self._device, self.ptdtype):
                        x = self.model.generate(x, step, temperature=temperature or 1.0,
                                                top_k=None if temperature else 1)
                    texts = [self.decode(row[T:].tolist()) for row in x]
                    done = bool(until) and all(any(s and s in t for s in until) for t in texts)
                    step *= 2
                for it, row in zip(batch, x):
                    text = postprocess_generated_text(self.decode(row[T:].tolist()), until, None)
                    out[it[0]] = text
                    self.cache_hook.add_partial('generate_until', requests[it[0]].args, text)
                bar.update(len(batch))
        bar.close()
        return out


def task_manager_for(names, include_path, include_defaults):
    """The harness's TaskManager. When every task asked for is a plain task under include_path, those
    alone (indexing the harness's ~15k built-in tasks takes most of a minute); a group or tag there may
    name built-in tasks, so then everything is indexed, as `lm_eval --include_path` does."""
    if include_path:
        if not os.path.isdir(include_path):
            raise UserError(f"include_path={include_path!r} is not a directory of task YAMLs")
        tm = TaskManager(include_path=include_path, include_defaults=False)
        if not include_defaults or all(n in tm.all_subtasks for n in names):
            return tm
    elif not include_defaults:
        raise UserError("include_defaults=False needs include_path=DIR (a directory of task YAMLs)")
    return TaskManager(include_path=include_path or None)


def is_offline_error(e):
    """Is this (or what caused it) the hub being unreachable?"""
    while e is not None:
        name = type(e).__name__
        if isinstance(e, (ConnectionError, TimeoutError)) or name in (
                'OfflineModeIsEnabled', 'LocalEntryNotFoundError', 'ConnectError', 'ConnectTimeout',
                'MaxRetryError', 'NameResolutionError'):
            return True
        if "Couldn't reach" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


# -----------------------------------------------------------------------------
if __name__ == '__main__':
    names = [t.strip() for t in tasks.split(',') if t.strip()]
    if not names:
        raise UserError("tasks is empty: give comma-separated task names, e.g. --tasks=arc_easy,arc_challenge")
    if limit is not None and limit < 1:
        raise UserError(f"limit={limit} must be >= 1, or None for every example")
    if num_fewshot is not None and num_fewshot < 0:
        raise UserError(f"num_fewshot={num_fewshot} must be >= 0, or None for each task's default")
    if batch_size < 1 or max_gen_toks < 1:
        raise UserError("batch_size and max_gen_toks must be >= 1")
    if seed < 0:
        raise UserError(f"seed={seed} must be >= 0")

    device = resolve_device(device)
    ptdtype = resolve_dtype(dtype, device)
    model, ckpt = load_model(out_dir, device)
    # the results go next to the checkpoint (out_dir may name the .pt file): checked now, not after hours of evaluation
    results_path = os.path.join(out_dir if os.path.isdir(out_dir) else os.path.dirname(out_dir), results_file)
    if results_file:
        writable_dir(os.path.dirname(results_path) or '.', 'out_dir')
    encode, decode = load_codec(ckpt)
    print(f"{out_dir}: {trained_with(ckpt)}", file=sys.stderr)
    task_manager = task_manager_for(names, include_path, include_defaults)
    unknown = [n for n in names if not task_manager.match_tasks([n])]
    if unknown:
        known = task_manager.all_tasks
        close = difflib.get_close_matches(unknown[0], known, n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if len(known) <= 20:  # only the tasks under include_path
            raise UserError(f"unknown task '{unknown[0]}'{hint} (include_path={include_path} has: {', '.join(known)})")
        raise UserError(f"unknown task '{unknown[0]}'{hint} (`lm-eval ls tasks` lists all {len(known)}; "
                        "task YAMLs of your own: --include_path=DIR)")

    lm = NanoLIMeLM(model, encode, decode, device, ptdtype, batch_size, max_gen_toks)
    try:
        results = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=num_fewshot, limit=limit,
                                          task_manager=task_manager, log_samples=log_samples,
                                          random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                          fewshot_random_seed=seed)
    except Exception as e:
        if not is_offline_error(e):
            raise
        culprit = names[0]
        for n in names:  # which task needs the hub (loading a task fetches its dataset)
            try:
                task_manager.load([n])
            except Exception as e2:
                if is_offline_error(e2):
                    culprit = n
                    break
        raise UserError(f"task {culprit} needs its dataset from the Hugging Face hub and there is no network "
                        "(nor a cached copy); "
                        "point the task at local files with a YAML under --include_path "
                        "(dataset_path: json, data_files: ...)") from None

    print(make_table(results))
    if 'groups' in results:
        print(make_table(results, 'groups'))
    counts = [n.get('effective', n.get('original')) for n in (results.get('n-samples') or {}).values()]
    if counts and not any(counts):  # a result file is never replaced by the scores of nothing
        raise UserError(f"no examples were evaluated: the tasks {', '.join(names)} have none; check their data files "
                        f"({results_path if results_file else 'nothing'} was not written)")
    if results_file:
        results['checkpoint'] = {k: ckpt.get(k) for k in ('iter_num', 'tokens', 'flops', 'best_val_loss', 'model_args')}
        results['checkpoint']['path'] = out_dir if not os.path.isdir(out_dir) else os.path.join(out_dir, CKPT_NAME)
        text = json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False)
        atomic_write(results_path, lambda f: f.write(text.encode()))
        print(f"wrote {results_path}")
