"""The numeric checks a graph passes before it is published: the check texts
and pairs, each graph run on ONNX Runtime's CPU provider against the float64
numpy network its family builds it from (families/*.py `numpy_forward`,
handed in as `network`: ids -> token states), or against another graph.
A check that fails raises SystemExit, so that nothing is published."""
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

CHECK_TEXTS = [
    "hello",
    "def add(a, b):\n    return a + b",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "Ünïcödé, emoji 🚀 and CJK 漢字 together",
]

CHECK_PAIRS = [
    ("how do I reset my password", "Open settings, choose Account, then Reset password."),
    ("how do I reset my password", "The museum opens at nine on weekdays."),
    ("capital of Portugal", "Lisbon is the capital and largest city of Portugal."),
    ("capital of Portugal", "Rust's borrow checker enforces aliasing rules at compile time."),
]

# The check texts are cut to this many tokens (or to a family's positions: its check_tokens).
CHECK_TOKENS = 256

# A built graph's floor against its float64 network, and its ceiling on the difference.
MIN_COSINE = 0.99999
MAX_DIFF = 1e-3
MAX_LOGIT_DIFF = 1e-4


def cosine(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def right_padded(sequences):
    """input_ids and attention_mask (int64 [B, S]) of token id lists, right-padded with 0."""
    ids = np.zeros((len(sequences), max(map(len, sequences))), np.int64)
    mask = np.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1
    return ids, mask


def tokenizer(path, max_tokens=None):
    """The tokenizer at `path`, unpadded, cut to `max_tokens` when given."""
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    if max_tokens is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_tokens)
    return tok


def session(onnx_path):
    return ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])


def run(sess, feed):
    """The session's first output, fed the inputs of `feed` that its graph takes."""
    return sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})[0]


def mean_state_figures(onnx_path, network, tokenizer_path, max_tokens):
    """The graph (batched, padded) against `network` on the check texts: each
    text's cosine of the mean token states, and the largest |difference| of
    a state. A graph that pools (sentence_embedding [B, H]) is held to the
    network's mean, unit length."""
    tok = tokenizer(tokenizer_path, max_tokens)
    encs = [tok.encode(t) for t in CHECK_TEXTS]
    ids, mask = right_padded([e.ids for e in encs])
    sess = session(onnx_path)
    hidden = run(sess, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    del sess
    cosines, max_abs = [], 0.0
    for i, e in enumerate(encs):
        n = len(e.ids)
        ref = network(e.ids)
        if hidden.ndim == 2:  # a graph that pools: its vector against the reference's mean, unit length
            pooled = ref.mean(0) / np.linalg.norm(ref.mean(0))
            max_abs = max(max_abs, float(np.abs(hidden[i] - pooled).max()))
            cosines.append(cosine(hidden[i], pooled))
        else:
            max_abs = max(max_abs, float(np.abs(hidden[i, :n] - ref).max()))
            cosines.append(cosine(hidden[i, :n].mean(0), ref.mean(0)))
    return cosines, max_abs


def token_state_figures(onnx_path, network, tokenizer_path, max_tokens):
    """The graph (batched, right-padded) against `network`, every real
    token's state: (min cosine, max |difference| relative to the largest state)."""
    tok = tokenizer(tokenizer_path, max_tokens)
    encs = [tok.encode(t).ids for t in CHECK_TEXTS]
    ids, mask = right_padded(encs)
    sess = session(onnx_path)
    hidden = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    del sess  # the runtime's copy of the weights goes before the numpy network reads them
    worst, max_abs = 1.0, 0.0
    for i, e in enumerate(encs):
        ref = network(e)
        got = hidden[i, : len(e)].astype(np.float64)
        worst = min(worst, min(cosine(a, b) for a, b in zip(got, ref)))
        max_abs = max(max_abs, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1.0)))
    return worst, max_abs


def refuse_drift(name, drifts):
    if drifts:
        raise SystemExit(f"{name}: the ONNX graph drifts from the reference network; not publishing it")


def mean_states_held(name, graph, network, tokenizer_path, max_tokens):
    """mean_state_figures, printed and held to MIN_COSINE and MAX_DIFF; the manifest's figures."""
    cosines, max_abs = mean_state_figures(graph, network, tokenizer_path, max_tokens)
    print(f"{name}: ONNX vs numpy float64: min cosine {min(cosines):.8f}, max |hidden diff| {max_abs:.2e}")
    refuse_drift(name, min(cosines) < MIN_COSINE or max_abs > MAX_DIFF)
    return {"min_cosine_vs_numpy_float64": min(cosines), "max_abs_hidden_diff": max_abs}


def token_states_held(name, graph, network, tokenizer_path, max_tokens):
    """token_state_figures, printed and held to MIN_COSINE and MAX_DIFF; the manifest's figures."""
    worst, max_rel = token_state_figures(graph, network, tokenizer_path, max_tokens)
    print(f"{name}: ONNX vs numpy float64, every token's state: min cosine {worst:.8f}, max |diff| / max |state| {max_rel:.2e}")
    refuse_drift(name, worst < MIN_COSINE or max_rel > MAX_DIFF)
    return {"min_cosine_vs_numpy_float64": worst, "max_rel_hidden_diff": max_rel}


def _family_check(held, numpy_forward, check_tokens):
    def check_states(name, graph, weights, cfg, tokenizer_path):
        return held(name, graph, lambda ids: numpy_forward(weights, cfg, ids), tokenizer_path, check_tokens(cfg))

    check_states.__doc__ = f"The built graph held to the family's numpy network ({held.__name__})."
    return check_states


def mean_state_check(numpy_forward, check_tokens):
    """A family's `check_states(name, graph, weights, cfg, tokenizer)` by mean_states_held."""
    return _family_check(mean_states_held, numpy_forward, check_tokens)


def every_state_check(numpy_forward, check_tokens):
    """A family's `check_states(name, graph, weights, cfg, tokenizer)` by token_states_held."""
    return _family_check(token_states_held, numpy_forward, check_tokens)


def token_ids(tokenizer_path, score_tokens):
    """The ids of a language-model reranker's true and false tokens
    ({"true": "yes", "false": "no"}), each one token of the vocabulary."""
    tok = Tokenizer.from_file(str(tokenizer_path))
    ids = []
    for key in ("true", "false"):
        token = score_tokens.get(key)
        found = None if token is None else tok.token_to_id(token)
        if token is not None and found is None:
            raise SystemExit(f"the reranker's {key} token {token!r} is not one token of the vocabulary")
        ids.append(found)
    return tuple(ids)


def language_model_reranker_figure(onnx_path, tokenizer_path, score):
    """A language-model reranker's graph (batched, right-padded) against its
    float64 network `score` (ids -> logit) on the check pairs written as
    query then document: the largest |difference| of the score logits."""
    tok = tokenizer(tokenizer_path)
    seqs = [tok.encode(f"{q}\n{d}").ids[:CHECK_TOKENS] for q, d in CHECK_PAIRS]
    ids, mask = right_padded(seqs)
    logits = session(onnx_path).run(None, {"input_ids": ids, "attention_mask": mask})[0][:, 0]
    return max(abs(float(logits[i]) - score(s)) for i, s in enumerate(seqs))


def sequence_classifier_figure(onnx_path, tokenizer_path, logits_of):
    """The graph's logits on CHECK_PAIRS (one padded batch) against the float64
    network `logits_of(ids, type_ids)`; the largest absolute difference."""
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    encs = [tok.encode(q, d) for q, d in CHECK_PAIRS]
    seq = max(len(e.ids) for e in encs)
    feed = {k: np.zeros((len(encs), seq), np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    for i, e in enumerate(encs):
        feed["input_ids"][i, : len(e.ids)] = e.ids
        feed["attention_mask"][i, : len(e.ids)] = 1
        feed["token_type_ids"][i, : len(e.ids)] = e.type_ids
    logits = run(session(onnx_path), feed)
    return max(float(np.abs(logits[i] - logits_of(e.ids, e.type_ids)).max()) for i, e in enumerate(encs))


def logits_held(name, figure, what):
    """A classifier's or reranker's largest logit difference, printed and held to MAX_LOGIT_DIFF."""
    print(f"{name}: ONNX vs numpy float64 {what} on {len(CHECK_PAIRS)} pairs: max |difference| {figure:.2e}")
    refuse_drift(name, figure > MAX_LOGIT_DIFF)


def mean_states_alone(onnx_path, seqs):
    """Each id sequence's mean of the graph's last_hidden_state, one sequence at a time."""
    sess = session(onnx_path)
    out = []
    for seq in seqs:
        ids = np.asarray([seq], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        out.append(run(sess, feed)[0].astype(np.float64).mean(0))
    return out


def mean_hidden(onnx_path, tokenizer_path, texts, max_tokens=CHECK_TOKENS):
    """Each text's mask-mean of the graph's last_hidden_state, one text at a time."""
    tok = tokenizer(tokenizer_path, max_tokens)
    return mean_states_alone(onnx_path, [tok.encode(t).ids for t in texts])


def mean_pooled(onnx_path, tokenizer_path, texts):
    """Mask-mean pooled, L2-normalized vectors, each text run alone."""
    return [v / np.linalg.norm(v) for v in mean_hidden(onnx_path, tokenizer_path, texts)]


def fixture_texts():
    """The test suite's texts (tests/fixtures/texts.json), which no
    calibration saw: what a conversion or a quantization is measured on."""
    rows = json.loads((Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "texts.json").read_text())
    return [t["text"] if isinstance(t, dict) else t for t in rows]
