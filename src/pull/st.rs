//! A Hub repository read the way sentence-transformers reads it: its
//! pooling from `1_Pooling/config.json` (the module `modules.json` names),
//! normalization from whether a Normalize module is listed, the length limit
//! from `sentence_bert_config.json` (else the tokenizer's, within the
//! model's positions), prompts from `config_sentence_transformers.json`, and
//! the architecture from `config.json`. Each value keeps the file it came from.

use super::PullError;
use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::families::{self, Family};
use crate::manifest::{DenseModule, HubSettings, ScoreTokens, Setting};
use crate::rerank_template::RerankTemplate;

/// The positions a model can embed: `max_position_embeddings` (within a
/// sliding window in use), less the rows (XLM-)RoBERTa spends on numbering
/// from the padding index + 1.
fn positions(config: &Value) -> Option<u64> {
    let rows = config["max_position_embeddings"].as_u64()?;
    // CamemBERT and MPNet number positions as RoBERTa does.
    let roberta = config["model_type"].as_str().is_some_and(|t| t.contains("roberta") || t == "camembert" || t == "mpnet");
    let pad = config["pad_token_id"].as_u64().unwrap_or(1);
    // A sliding window in use (Mistral's): the graph attends in full, the
    // same as the window for inputs no longer than it. Gemma2's and Gemma3's
    // graphs build their sliding-window layers, so their window limits nothing.
    let gemma = matches!(config["model_type"].as_str(), Some("gemma2" | "gemma3_text"));
    let window = config["sliding_window"].as_u64().filter(|_| config["use_sliding_window"].as_bool() != Some(false) && !gemma);
    let rows = window.map_or(rows, |w| rows.min(w));
    Some(if roberta { rows.saturating_sub(pad + 1) } else { rows })
}

/// One inferred setting and the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Inferred<T> {
    pub value: T,
    pub from: String,
}

fn inferred<T>(value: T, from: &str) -> Inferred<T> {
    Inferred { value, from: from.to_string() }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StModel {
    pub architecture: String,
    /// The row of models/families.toml that builds its graph; `None` when
    /// the repository's own ONNX graph is served.
    pub family: Option<&'static Family>,
    /// A cross-encoder (`*ForSequenceClassification` with one label): served
    /// on /rerank, its logit through a sigmoid as CrossEncoder scores one.
    pub reranker: bool,
    /// "mean", "cls", or "none" for a reranker (eeane's pooling names).
    pub pooling: Inferred<&'static str>,
    pub normalize: Inferred<bool>,
    pub max_tokens: Inferred<usize>,
    pub prompts: Inferred<BTreeMap<String, String>>,
    pub default_prompt_name: Option<Inferred<String>>,
    /// A reranker's activation ("sigmoid" or "identity"), as CrossEncoder picks it.
    pub score_activation: Option<Inferred<&'static str>>,
    /// The repository's own graph, when it ships one.
    pub onnx: Option<String>,
    /// Dense modules after pooling, in order: the prepared graph pools
    /// (`graph_pooling`) and applies them, so eeane's pooling is "none".
    pub dense: Vec<DenseModule>,
    /// The pooling the prepared graph does, with Dense modules ("mean" or "cls").
    pub graph_pooling: Option<&'static str>,
    /// A reranker that is a language model: the template its pairs are
    /// written into, and the tokens whose logits score them (true, false).
    pub rerank_template: Option<Inferred<RerankTemplate>>,
    pub score_tokens: Option<(String, Option<String>)>,
}

/// Qwen3-Reranker's prompt, as its model card writes it
/// (Qwen/Qwen3-Reranker-0.6B, 4B and 8B): a system prefix, the filled pair
/// and an assistant suffix, each tokenized apart; scored by p("yes") over
/// "yes" and "no" at the last position.
fn qwen3_reranker_template() -> RerankTemplate {
    RerankTemplate {
        parts: vec![
            "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. \
             Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
                .into(),
            "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}".into(),
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".into(),
        ],
        instruction: "Given a web search query, retrieve relevant passages that answer the query".into(),
        query_tokens: None,
        pair_tokens: None,
    }
}

/// bge-reranker-v2-gemma's prompt, as its model card's `get_inputs` builds
/// it: the tokenizer's bos, "A: {query}" cut to three quarters of the
/// card's max_length, "\n", "B: {document}" cut so that these four fit
/// max_length (`only_second`), then "\n" and the prompt after the budget;
/// each tokenized apart without special tokens. Scored by the logit of "Yes".
fn bge_gemma_reranker_template(bos: &str, max_length: usize) -> RerankTemplate {
    RerankTemplate {
        parts: ["{bos}", "A: {query}", "\n", "B: {document}", "\n", "{instruction}"].map(|p| p.replace("{bos}", bos)).to_vec(),
        instruction: "Given a query A and a passage B, determine whether the passage contains an answer to the query by providing \
                      a prediction of either 'Yes' or 'No'."
            .into(),
        query_tokens: Some(max_length * 3 / 4),
        pair_tokens: Some(max_length),
    }
}

/// The model card's max_length for Qwen3-Reranker.
const LANGUAGE_MODEL_RERANKER_TOKENS: u64 = 8192;
/// bge-reranker-v2-gemma's card's max_length: the pair's budget, before the prompt.
const BGE_GEMMA_PAIR_TOKENS: usize = 1024;

/// The activations of a Dense module that the prepared graph applies
/// (models/graph_tail.py `DENSE_ACTIVATIONS`).
const DENSE_ACTIVATIONS: &[&str] = &[
    "torch.nn.modules.linear.Identity",
    "torch.nn.modules.activation.Tanh",
    "torch.nn.modules.activation.ReLU",
    "torch.nn.modules.activation.Sigmoid",
    "torch.nn.modules.activation.GELU",
];

fn read_json(dir: &Path, file: &str) -> Result<Option<Value>, PullError> {
    match std::fs::read(dir.join(file)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| PullError::Unsupported(format!("{file} is not JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PullError::Io(format!("cannot read {file}: {e}"))),
    }
}

/// The message for an architecture eeane cannot build, with the export that would give it an ONNX file.
pub fn unsupported(repo: &str, architecture: &str) -> String {
    format!(
        "{repo} is a {architecture}; eeane builds graphs from safetensors for {} only, and serves any architecture from an ONNX file. \
         Export one with `optimum-cli export onnx --model {repo} --task feature-extraction {}-onnx/` and serve its model.onnx with engine = {:?}",
        families::architectures(false).join(", "),
        repo.rsplit('/').next().unwrap_or(repo),
        crate::engines::default_engine().name()
    )
}

impl StModel {
    /// Reads the snapshot in `dir`; `ships_onnx`: the repository lists
    /// onnx/model.onnx (read before the weights are fetched).
    pub fn read(dir: &Path, repo: &str, ships_onnx: bool) -> Result<StModel, PullError> {
        let config = read_json(dir, "config.json")?.ok_or_else(|| PullError::Unsupported(format!("{repo} has no config.json: not a transformers model")))?;
        let architecture = config["architectures"].get(0).and_then(Value::as_str).unwrap_or("").to_string();
        let onnx = (ships_onnx || dir.join("onnx/model.onnx").is_file()).then(|| "onnx/model.onnx".to_string());
        let family = onnx.is_none().then(|| families::for_architecture(&architecture)).flatten();
        if onnx.is_none() && family.is_none() {
            return Err(PullError::Unsupported(unsupported(repo, if architecture.is_empty() { "model without `architectures`" } else { &architecture })));
        }
        // Its own modeling code (trust_remote_code): the graph eeane builds is
        // transformers' own architecture, which need not compute the same
        // (gte-Qwen2's code makes Qwen2's attention bidirectional).
        if let (None, Some(code)) = (&onnx, config["auto_map"]["AutoModel"].as_str()) {
            return Err(PullError::Unsupported(format!(
                "{repo} computes with its own modeling code ({code}, named by config.json's auto_map), which eeane does not run; \
                 the {architecture} graph eeane builds from transformers' definition need not compute the same. Export an ONNX file \
                 with `optimum-cli export onnx --model {repo} --trust-remote-code --task feature-extraction DIR` and serve its model.onnx"
            )));
        }
        if architecture.ends_with("ForSequenceClassification") {
            return Self::cross_encoder(dir, repo, architecture, &config, onnx).map(|m| StModel { family, ..m });
        }
        let modules = read_json(dir, "modules.json")?;
        // A causal language model without sentence-transformers' modules,
        // named a reranker (Qwen/Qwen3-Reranker-0.6B): scored by its head.
        if architecture.ends_with("ForCausalLM") && modules.is_none() && repo.to_lowercase().contains("rerank") && onnx.is_none() {
            return Self::language_model_reranker(dir, repo, architecture, &config).map(|m| StModel { family, ..m });
        }
        let modules: Vec<Value> = modules.as_ref().and_then(Value::as_array).cloned().unwrap_or_default();
        let module_of = |kind: &str| modules.iter().find(|m| m["type"].as_str().is_some_and(|t| t.ends_with(kind)));
        let mut dense = Vec::new();
        for module in modules.iter().filter(|m| m["type"].as_str().is_some_and(|t| t.ends_with("Dense"))) {
            let path = module["path"].as_str().unwrap_or("2_Dense").to_string();
            let file = format!("{path}/config.json");
            let config = read_json(dir, &file)?.ok_or_else(|| PullError::Unsupported(format!("{repo}: modules.json names {file}, which is missing")))?;
            // sentence-transformers' own default, for configs written before it was saved.
            let activation = config["activation_function"].as_str().unwrap_or("torch.nn.modules.activation.Tanh").to_string();
            if !DENSE_ACTIVATIONS.contains(&activation.as_str()) {
                return Err(PullError::Unsupported(format!(
                    "{repo}: the Dense module's activation {activation} ({file}) is not one eeane applies ({})",
                    DENSE_ACTIVATIONS.iter().map(|a| a.rsplit('.').next().unwrap_or(a)).collect::<Vec<_>>().join(", ")
                )));
            }
            dense.push(DenseModule { path, activation });
        }
        let pooling = match module_of("Pooling") {
            Some(module) => {
                let file = format!("{}/config.json", module["path"].as_str().unwrap_or("1_Pooling"));
                let pooling = read_json(dir, &file)?.ok_or_else(|| PullError::Unsupported(format!("{repo}: modules.json names {file}, which is missing")))?;
                let mode = pooling["pooling_mode"].as_str().map(str::to_string);
                // sentence-transformers' modes and eeane's names; several
                // at once are concatenated there, which eeane does not do.
                const MODES: [(&str, &str, &str); 5] = [
                    ("cls", "pooling_mode_cls_token", "cls"),
                    ("mean", "pooling_mode_mean_tokens", "mean"),
                    ("max", "pooling_mode_max_tokens", "max"),
                    ("lasttoken", "pooling_mode_lasttoken", "last_token"),
                    ("mean_sqrt_len_tokens", "pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
                ];
                let unserved = |what: String| {
                    PullError::Unsupported(format!(
                        "{repo}: pooling {what} ({file}) is not one eeane serves (cls, mean, max, lasttoken, mean_sqrt_len_tokens, one at a time)"
                    ))
                };
                let chosen = match mode.as_deref() {
                    Some(name) => MODES.iter().find(|(m, _, _)| *m == name).map(|(_, _, ours)| *ours).ok_or_else(|| unserved(format!("{name:?}")))?,
                    None => {
                        let set: Vec<&str> = pooling
                            .as_object()
                            .into_iter()
                            .flatten()
                            .filter(|(k, v)| k.starts_with("pooling_mode") && v.as_bool() == Some(true))
                            .map(|(k, _)| k.as_str())
                            .collect();
                        match MODES.iter().find(|(_, flag, _)| set == [*flag]) {
                            Some((_, _, ours)) => *ours,
                            None => return Err(unserved(format!("{set:?}"))),
                        }
                    }
                };
                inferred(chosen, &file)
            }
            // A plain transformers checkpoint: sentence-transformers' own default.
            None => inferred("mean", "no modules.json: sentence-transformers pools by mean"),
        };
        // Dense modules come after pooling: the prepared graph does both.
        let (pooling, graph_pooling) = match dense.is_empty() {
            true => (pooling, None),
            false => {
                let Some(in_graph) = ["mean", "cls"].into_iter().find(|m| *m == pooling.value) else {
                    return Err(PullError::Unsupported(format!(
                        "{repo}: pooling {:?} ({}) before a Dense module: eeane applies Dense modules after mean or cls pooling",
                        pooling.value, pooling.from
                    )));
                };
                let paths: Vec<&str> = dense.iter().map(|d| d.path.as_str()).collect();
                let from = format!("{} ({in_graph}) and {}: pooled and projected inside the prepared graph", pooling.from, paths.join(", "));
                (inferred("none", &from), Some(in_graph))
            }
        };
        let normalize = match module_of("Normalize") {
            Some(_) => inferred(true, "modules.json (a Normalize module)"),
            None => inferred(false, "modules.json (no Normalize module)"),
        };
        let positions = positions(&config);
        let sbert = read_json(dir, "sentence_bert_config.json")?;
        if sbert.as_ref().is_some_and(|s| s["do_lower_case"].as_bool() == Some(true)) {
            return Err(PullError::Unsupported(format!("{repo}: sentence_bert_config.json sets do_lower_case, which eeane does not apply yet")));
        }
        let tokenizer = read_json(dir, "tokenizer_config.json")?;
        let max_tokens = match (sbert.as_ref().and_then(|s| s["max_seq_length"].as_u64()), tokenizer.as_ref().and_then(|t| t["model_max_length"].as_u64())) {
            (Some(n), _) => inferred(n, "sentence_bert_config.json (max_seq_length)"),
            (None, Some(n)) if n < 1_000_000 => inferred(n, "tokenizer_config.json (model_max_length)"),
            _ => inferred(positions.unwrap_or(512), "config.json (max_position_embeddings)"),
        };
        let max_tokens = match positions {
            Some(p) if max_tokens.value > p => inferred(p, "config.json (max_position_embeddings)"),
            _ => max_tokens,
        };
        let st = read_json(dir, "config_sentence_transformers.json")?;
        let prompts: BTreeMap<String, String> = st
            .as_ref()
            .and_then(|s| s["prompts"].as_object())
            .map(|p| p.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
            .unwrap_or_default();
        let default_prompt_name =
            st.as_ref().and_then(|s| s["default_prompt_name"].as_str()).map(|n| inferred(n.to_string(), "config_sentence_transformers.json"));
        Ok(StModel {
            architecture,
            family,
            pooling,
            normalize,
            max_tokens: Inferred { value: max_tokens.value as usize, from: max_tokens.from },
            prompts: inferred(prompts, "config_sentence_transformers.json"),
            default_prompt_name,
            score_activation: None,
            onnx,
            reranker: false,
            dense,
            graph_pooling,
            rerank_template: None,
            score_tokens: None,
        })
    }

    /// A reranker that is a language model: Qwen3-Reranker's template and
    /// yes/no scoring, or bge-reranker-v2-gemma's and its "Yes"; other
    /// families are refused by name.
    fn language_model_reranker(dir: &Path, repo: &str, architecture: String, config: &Value) -> Result<StModel, PullError> {
        let family = config["model_type"].as_str().unwrap_or("");
        if !matches!(family, "qwen3" | "gemma") {
            return Err(PullError::Unsupported(format!(
                "{repo} is a {architecture} reranker; eeane scores language-model rerankers with Qwen3-Reranker's template \
                 (model_type qwen3) and bge-reranker-v2-gemma's (model_type gemma) only so far"
            )));
        }
        let positions = positions(config).unwrap_or(LANGUAGE_MODEL_RERANKER_TOKENS);
        let tokenizer = read_json(dir, "tokenizer_config.json")?;
        let max_tokens = match tokenizer.as_ref().and_then(|t| t["model_max_length"].as_u64()).filter(|n| *n <= positions.min(LANGUAGE_MODEL_RERANKER_TOKENS)) {
            Some(n) => inferred(n as usize, "tokenizer_config.json (model_max_length)"),
            None if family == "gemma" => inferred(positions.min(LANGUAGE_MODEL_RERANKER_TOKENS) as usize, "config.json's positions (up to 8192)"),
            None => inferred(positions.min(LANGUAGE_MODEL_RERANKER_TOKENS) as usize, "the model card's max_length (8192), within config.json's positions"),
        };
        let (rerank_template, score_tokens, score_from) = if family == "gemma" {
            // tokenizer_config.json writes bos_token as a string or as an AddedToken's table.
            let bos = tokenizer.as_ref().and_then(|t| t["bos_token"].as_str().or_else(|| t["bos_token"]["content"].as_str())).unwrap_or("<bos>");
            let template = bge_gemma_reranker_template(bos, BGE_GEMMA_PAIR_TOKENS.min(max_tokens.value));
            (
                inferred(template, "bge-reranker-v2-gemma's model card (get_inputs, max_length 1024)"),
                ("Yes".to_string(), None),
                "the model card: sigmoid of the logit of \"Yes\"",
            )
        } else {
            (
                inferred(qwen3_reranker_template(), "Qwen3-Reranker's model card"),
                ("yes".into(), Some("no".into())),
                "the model card: p(\"yes\") over \"yes\" and \"no\"",
            )
        };
        Ok(StModel {
            architecture,
            family: None,
            reranker: true,
            pooling: inferred("none", "the graph scores the pair at its last token"),
            normalize: inferred(false, "a score, not a vector"),
            max_tokens,
            prompts: inferred(BTreeMap::new(), "none for a reranker"),
            default_prompt_name: None,
            score_activation: Some(inferred("sigmoid", score_from)),
            onnx: None,
            dense: Vec::new(),
            graph_pooling: None,
            rerank_template: Some(rerank_template),
            score_tokens: Some(score_tokens),
        })
    }

    /// A `*ForSequenceClassification` repository: one label, or refused.
    fn cross_encoder(dir: &Path, repo: &str, architecture: String, config: &Value, onnx: Option<String>) -> Result<StModel, PullError> {
        let labels = config["id2label"].as_object().map(|l| l.len() as u64).or_else(|| config["num_labels"].as_u64()).unwrap_or(2);
        if labels != 1 {
            return Err(PullError::Unsupported(format!("{repo} is a {architecture} with {labels} labels; /rerank takes a cross-encoder with one score")));
        }
        // CrossEncoder's activation: config.json's sentence_transformers.activation_fn
        // (or the older sbert_ce_default_activation_function), else sigmoid for one label.
        let named = config["sentence_transformers"]["activation_fn"].as_str().or_else(|| config["sbert_ce_default_activation_function"].as_str());
        let score_activation = match named {
            None => inferred("sigmoid", "config.json (CrossEncoder's default for one label)"),
            Some(name) if name.ends_with("Sigmoid") => inferred("sigmoid", "config.json (activation_fn)"),
            Some(name) if name.ends_with("Identity") => inferred("identity", "config.json (activation_fn)"),
            Some(name) => return Err(PullError::Unsupported(format!("{repo}: activation_fn {name} is not one eeane applies (Sigmoid, Identity)"))),
        };
        let positions = positions(config).unwrap_or(512);
        let tokenizer = read_json(dir, "tokenizer_config.json")?;
        let max_tokens = match tokenizer.as_ref().and_then(|t| t["model_max_length"].as_u64()).filter(|n| *n <= positions) {
            Some(n) => inferred(n as usize, "tokenizer_config.json (model_max_length)"),
            None => inferred(positions as usize, "config.json (max_position_embeddings)"),
        };
        Ok(StModel {
            architecture,
            family: None,
            reranker: true,
            pooling: inferred("none", "config.json (a sequence classifier scores its pair itself)"),
            normalize: inferred(false, "config.json (a score, not a vector)"),
            max_tokens,
            prompts: inferred(BTreeMap::new(), "none for a cross-encoder"),
            default_prompt_name: None,
            score_activation: Some(score_activation),
            onnx,
            dense: Vec::new(),
            graph_pooling: None,
            rerank_template: None,
            score_tokens: None,
        })
    }
}

impl StModel {
    /// What was read and from which file: what models/prepare.py builds,
    /// and what the prepared model's manifest records.
    pub fn settings(&self) -> HubSettings {
        fn setting<T: Clone, U: From<T>>(inferred: &Inferred<T>) -> Setting<U> {
            Setting { value: inferred.value.clone().into(), from: inferred.from.clone() }
        }
        HubSettings {
            architecture: self.architecture.clone(),
            family: self.family.map(|f| f.name.clone()),
            kind: if self.reranker { "reranker" } else { "embedding" }.into(),
            weights: self.onnx.clone().unwrap_or_else(|| "model.safetensors".into()),
            pooling: setting(&self.pooling),
            normalize: setting(&self.normalize),
            max_tokens: setting(&self.max_tokens),
            prompts: setting(&self.prompts),
            score_activation: self.score_activation.as_ref().map(setting),
            dense: self.graph_pooling.map(|_| self.dense.clone()),
            graph_pooling: self.graph_pooling.map(str::to_string),
            default_prompt_name: self.default_prompt_name.as_ref().map(setting),
            score_tokens: self.score_tokens.as_ref().map(|(yes, no)| ScoreTokens { relevant: yes.clone(), irrelevant: no.clone() }),
        }
    }

    /// The `[[models]]` entry that serves the prepared model, each inferred
    /// value with the file it came from.
    pub fn entry(&self, repo: &str, commit: &str, dir_name: &str, target: &super::target::Target) -> String {
        let kind = match (self.reranker, &self.rerank_template) {
            (true, Some(_)) => "kind = \"reranker\"  # a causal language model named a reranker, with no sentence-transformers modules\n",
            (true, None) => "kind = \"reranker\"  # config.json (a sequence classifier with one label)\n",
            (false, _) => "",
        };
        let engine = target.engine;
        let mut entry = format!(
            "[[models]]\nid = {repo:?}\n{kind}engine = \"{engine}\"\nmodel = \"{{cache}}/models/{dir_name}/{}\"\ntokenizer = \"{{cache}}/models/{dir_name}/tokenizer.json\"\n\
             pooling = {:?}  # {}\nnormalize = {}  # {}\nmax_tokens = {}  # {}\n# source: hf:{repo}@{commit} ({}{})\n",
            target.model_file(),
            self.pooling.value,
            self.pooling.from,
            self.normalize.value,
            self.normalize.from,
            self.max_tokens.value,
            self.max_tokens.from,
            if self.architecture.is_empty() { "architecture not named" } else { &self.architecture },
            if self.onnx.is_some() { ", the repository's onnx/model.onnx" } else { ", graph built from model.safetensors" },
        );
        if !self.prompts.value.is_empty() {
            let prompts: Vec<String> = self.prompts.value.iter().map(|(k, v)| format!("{k:?} = {v:?}")).collect();
            entry += &format!("prompts = {{ {} }}  # {}\n", prompts.join(", "), self.prompts.from);
        }
        if let Some(activation) = &self.score_activation {
            entry += &format!("score_activation = {:?}  # {}\n", activation.value, activation.from);
        }
        if let Some(default) = &self.default_prompt_name {
            entry += &format!("default_prompt_name = {:?}  # {}\n", default.value, default.from);
        }
        if let Some(template) = &self.rerank_template {
            let mut table = toml_edit::InlineTable::new();
            table.insert("parts", template.value.parts.iter().map(String::as_str).collect::<toml_edit::Array>().into());
            table.insert("instruction", template.value.instruction.as_str().into());
            for (key, value) in [("query_tokens", template.value.query_tokens), ("pair_tokens", template.value.pair_tokens)] {
                if let Some(n) = value {
                    table.insert(key, (n as i64).into());
                }
            }
            entry += &format!("rerank_template = {table}  # {}\n", template.from);
        }
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    const BERT: &str = r#"{"architectures": ["BertModel"], "model_type": "bert", "max_position_embeddings": 512}"#;
    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

    #[test]
    fn reads_pooling_normalize_length_and_prompts_with_their_files() {
        let dir = repo(&[
            ("config.json", BERT),
            ("modules.json", MODULES),
            ("1_Pooling/config.json", r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#),
            ("sentence_bert_config.json", r#"{"max_seq_length": 1024, "do_lower_case": false}"#),
            ("config_sentence_transformers.json", r#"{"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"}"#),
        ]);
        let st = StModel::read(dir.path(), "org/m", false).unwrap();
        assert_eq!(st.pooling, inferred("cls", "1_Pooling/config.json"));
        assert!(st.normalize.value);
        // Longer than the positions: held to them.
        assert_eq!(st.max_tokens, inferred(512, "config.json (max_position_embeddings)"));
        assert_eq!(st.prompts.value["query"], "query: ");
        assert_eq!(st.default_prompt_name.unwrap().value, "passage");
    }

    #[test]
    fn no_normalize_module_means_raw_vectors() {
        let modules = r#"[{"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#;
        let dir = repo(&[("config.json", BERT), ("modules.json", modules), ("1_Pooling/config.json", r#"{"pooling_mode": "mean"}"#)]);
        let st = StModel::read(dir.path(), "org/m", false).unwrap();
        assert!(!st.normalize.value);
        assert_eq!(st.pooling.value, "mean");
    }

    #[test]
    fn a_repository_with_its_own_modeling_code_is_refused_unless_it_ships_onnx() {
        let config = r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "auto_map": {"AutoModel": "modeling_qwen.Qwen2Model"}}"#;
        let dir = repo(&[("config.json", config)]);
        let e = StModel::read(dir.path(), "Alibaba-NLP/gte-Qwen2-1.5B-instruct", false).unwrap_err().to_string();
        assert!(e.contains("modeling_qwen.Qwen2Model") && e.contains("--trust-remote-code"), "{e}");
        assert!(StModel::read(dir.path(), "Alibaba-NLP/gte-Qwen2-1.5B-instruct", true).is_ok());
    }

    #[test]
    fn language_model_rerankers_take_their_cards_templates() {
        let gemma = repo(&[
            ("config.json", r#"{"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "max_position_embeddings": 8192}"#),
            ("tokenizer_config.json", r#"{"bos_token": {"content": "<bos>"}, "model_max_length": 1000000000000000019884624838656}"#),
        ]);
        let st = StModel::read(gemma.path(), "BAAI/bge-reranker-v2-gemma", false).unwrap();
        let template = st.rerank_template.unwrap().value;
        assert_eq!((st.max_tokens.value, template.query_tokens, template.pair_tokens), (8192, Some(768), Some(1024)));
        assert_eq!(template.parts[0], "<bos>");
        assert_eq!(st.score_tokens, Some(("Yes".into(), None)));
        let qwen3 = repo(&[("config.json", r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": 40960}"#)]);
        let st = StModel::read(qwen3.path(), "Qwen/Qwen3-Reranker-0.6B", false).unwrap();
        assert_eq!((st.max_tokens.value, st.rerank_template.unwrap().value.parts.len()), (8192, 3));
        let llama = repo(&[("config.json", r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}"#)]);
        let e = StModel::read(llama.path(), "org/llama-reranker", false).unwrap_err().to_string();
        assert!(e.contains("LlamaForCausalLM reranker") && e.contains("bge-reranker-v2-gemma's"), "{e}");
    }

    #[test]
    fn refusals_say_what_and_why() {
        let neox = repo(&[("config.json", r#"{"architectures": ["GPTNeoXForCausalLM"]}"#)]);
        let e = StModel::read(neox.path(), "org/llm", false).unwrap_err();
        assert!(matches!(e, PullError::Unsupported(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("GPTNeoXForCausalLM") && e.contains("BertModel") && e.contains("optimum-cli export onnx --model org/llm"), "{e}");
        let dense = repo(&[("config.json", BERT), ("modules.json", r#"[{"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#)]);
        assert!(StModel::read(dense.path(), "org/d", false).unwrap_err().to_string().contains("Dense"));
        let two = repo(&[
            ("config.json", BERT),
            ("modules.json", MODULES),
            ("1_Pooling/config.json", r#"{"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": true}"#),
        ]);
        assert!(StModel::read(two.path(), "org/x", false).unwrap_err().to_string().contains("pooling_mode_max_tokens"));
        let weighted = repo(&[("config.json", BERT), ("modules.json", MODULES), ("1_Pooling/config.json", r#"{"pooling_mode": "weightedmean"}"#)]);
        assert!(StModel::read(weighted.path(), "org/w", false).unwrap_err().to_string().contains("weightedmean"));
        for (file, ours) in [
            (r#"{"pooling_mode_max_tokens": true}"#, "max"),
            (r#"{"pooling_mode": "lasttoken"}"#, "last_token"),
            (r#"{"pooling_mode_mean_sqrt_len_tokens": true, "pooling_mode_cls_token": false}"#, "mean_sqrt_len"),
        ] {
            let dir = repo(&[("config.json", BERT), ("modules.json", MODULES), ("1_Pooling/config.json", file)]);
            assert_eq!(StModel::read(dir.path(), "org/p", false).unwrap().pooling.value, ours, "{file}");
        }
        let two_labels = repo(&[("config.json", r#"{"architectures": ["BertForSequenceClassification"], "id2label": {"0": "no", "1": "yes"}}"#)]);
        assert!(StModel::read(two_labels.path(), "org/nli", false).unwrap_err().to_string().contains("2 labels"));
        let one_label =
            repo(&[("config.json", r#"{"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}, "max_position_embeddings": 512}"#)]);
        let ce = StModel::read(one_label.path(), "org/ce", false).unwrap();
        assert!(ce.reranker && ce.pooling.value == "none" && !ce.normalize.value);
        assert_eq!(ce.score_activation.unwrap().value, "sigmoid");
        let identity = repo(&[(
            "config.json",
            r#"{"architectures": ["XLMRobertaForSequenceClassification"], "model_type": "xlm-roberta", "id2label": {"0": "LABEL_0"},
            "max_position_embeddings": 514, "pad_token_id": 1, "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}"#,
        )]);
        let ce = StModel::read(identity.path(), "org/xce", false).unwrap();
        assert_eq!((ce.score_activation.unwrap().value, ce.max_tokens.value), ("identity", 512));
        let tanh = repo(&[(
            "config.json",
            r#"{"architectures": ["BertForSequenceClassification"], "id2label": {"0": "L"}, "sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}"#,
        )]);
        assert!(StModel::read(tanh.path(), "org/t", false).unwrap_err().to_string().contains("Tanh"));
        // Any architecture with its own ONNX.
        let onnx = repo(&[("config.json", r#"{"architectures": ["NewModel"]}"#), ("onnx/model.onnx", "x")]);
        assert_eq!(StModel::read(onnx.path(), "org/n", false).unwrap().onnx.as_deref(), Some("onnx/model.onnx"));
    }
}
