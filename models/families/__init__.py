"""The model families eeane builds from a Hub repository's weights: one row
each in models/families.toml (which `eeane pull` reads too, and which alone
names architectures), one builder module each in this folder. Adding a family
is its builder file and its row.

A builder module gives what prepare and gpu_graph call, so that neither of
them asks which family it holds:

  MODEL_TYPES                     config.json's model_type values it reads
                                  (how a caller that names no family finds it)
  prepare_weights(weights, cfg)   -> (weights, cfg) as build_graph reads them
  build_graph(weights, cfg, data=None, **options)
                                  the fp32 graph, token states out; options:
                                  the builder's own (`fused` for gpu_graph
                                  "fused", `fusable` for "optimized", ...)
  numpy_forward(weights, cfg, ids)
                                  the float64 network: one text's token states
  check_tokens(cfg)               how many tokens a check text is cut to
  check_states(name, graph, weights, cfg, tokenizer)
                                  the built graph held to numpy_forward: the
                                  manifest's figures, or SystemExit
and, where the family has them:
  numpy_sequence_logits(weights, cfg, ids, type_ids)
                                  a sequence classifier's logits (its graph:
                                  build_graph(..., sequence_classifier=True))
  numpy_score(weights, cfg, ids, score_tokens)
                                  a language-model reranker's score logit (its
                                  graph: build_graph(..., score_tokens=...))
  OPTIMIZER_MODEL_TYPE            the model_type ONNX Runtime's transformer
                                  optimizer fuses its `fusable` graph as
                                  (gpu_graph = "optimized")
  UNFUSED_ATTENTION               why its GPU graph's attention is not fused
                                  (gpu_graph = "unfused")
"""
import importlib
import tomllib
from pathlib import Path

with open(Path(__file__).resolve().parent.parent / "families.toml", "rb") as f:
    ROWS = {row["name"]: row for row in tomllib.load(f)["family"]}


def row(name):
    """The family's row of families.toml."""
    if name not in ROWS:
        raise SystemExit(f"family {name!r}: models/families.toml has {', '.join(ROWS)}")
    return ROWS[name]


def builder(name):
    """The family's builder module (families/{builder}.py)."""
    return importlib.import_module(f"families.{row(name)['builder']}")


def of(settings, cfg):
    """The family to build: the one `eeane pull` named (settings' "family"),
    else, for a caller that names none, the one whose builder reads
    config.json's model_type (BERT's when the config names none)."""
    named = (settings or {}).get("family")
    if named:
        return named
    kind = cfg.get("model_type", "bert")
    for name in ROWS:
        if kind in builder(name).MODEL_TYPES:
            return name
    known = [t for name in ROWS for t in builder(name).MODEL_TYPES]
    raise SystemExit(f"model_type {kind!r}: graphs are built for {', '.join(known)}")
