//! `eeane bench --rerank`: a rerank model's throughput in documents per
//! second, two ways in one run: the model in-process (one query against the
//! whole corpus as one job) and the server's /rerank over HTTP (`batch`
//! documents per request, `clients` at once), and their ratio.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use super::{corpus, percentile, BenchError, BenchOptions};
use crate::config::{Config, ModelConfig, ModelKind};
use crate::model::{Inputs, LoadedModel};

/// The query every document is scored against.
const QUERY: &str = "how do I read a configuration file and handle a missing key";

#[derive(Debug, Serialize)]
pub struct RerankReport {
    pub model: String,
    pub kind: &'static str,
    pub documents: usize,
    pub in_process_docs_per_s: f64,
    pub server_docs_per_s: f64,
    pub server_p50_ms: Option<f64>,
    pub server_p99_ms: Option<f64>,
    pub server_over_in_process: f64,
}

fn inputs(model: &ModelConfig, documents: Vec<String>) -> Inputs {
    match model.kind {
        ModelKind::Reranker => Inputs::Pairs { query: QUERY.into(), documents, instruction: None },
        ModelKind::Embedding => Inputs::Texts(std::iter::once(QUERY.to_string()).chain(documents).collect()),
    }
}

pub async fn run(config: Config, options: &BenchOptions) -> Result<RerankReport, BenchError> {
    let model = match &options.model {
        Some(name) => {
            config.models.iter().find(|m| m.names().any(|n| n == name)).ok_or_else(|| BenchError::Config(format!("no model {name:?} in the config")))?
        }
        None => config
            .models
            .iter()
            .find(|m| m.kind == ModelKind::Reranker)
            .or_else(|| config.models.iter().find(|m| m.rerank))
            .ok_or_else(|| BenchError::Config("no rerank model in the config".into()))?,
    }
    .clone();
    if model.kind != ModelKind::Reranker && !model.rerank {
        return Err(BenchError::Config(format!("{} neither is a reranker nor has rerank = true", model.id)));
    }
    let documents = corpus(options.texts, options.seed);
    eprintln!("eeane bench --rerank: model {}, {} documents, {} per request", model.id, documents.len(), options.batch);

    let in_process = ModelConfig { max_batch: options.batch, isolation: Some(crate::config::Isolation::Thread), ..model.clone() };
    let engine = LoadedModel::load(&in_process, &config).await?;
    engine.embed(Arc::new(inputs(&model, documents[..documents.len().min(32)].to_vec())), None).await?;
    let started = Instant::now();
    engine.embed(Arc::new(inputs(&model, documents.clone())), None).await?;
    let in_process = documents.len() as f64 / started.elapsed().as_secs_f64();
    drop(engine);

    let (base, _service, server) = super::serve_only(config, &model, options.batch).await?;
    let url = format!("{base}/rerank");
    let chunks: Arc<Vec<Vec<String>>> = Arc::new(documents.chunks(options.batch).map(<[String]>::to_vec).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let started = Instant::now();
    let tasks: Vec<_> = (0..options.clients)
        .map(|_| {
            let (chunks, next, client, url, id) = (chunks.clone(), next.clone(), client.clone(), url.clone(), model.id.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while let Some(chunk) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let sent = Instant::now();
                    let body = json!({"model": id, "query": QUERY, "documents": chunk, "top_n": chunk.len()});
                    let response = client.post(&url).json(&body).send().await?;
                    if !response.status().is_success() {
                        return Err(BenchError::Http(format!("HTTP {}: {}", response.status(), response.text().await.unwrap_or_default())));
                    }
                    response.bytes().await?;
                    latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                }
                Ok::<_, BenchError>(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let served = documents.len() as f64 / started.elapsed().as_secs_f64();
    server.abort();
    latencies.sort_by(f64::total_cmp);
    Ok(RerankReport {
        model: model.id.clone(),
        kind: if model.kind == ModelKind::Reranker { "cross-encoder" } else { "embedding model, cosine" },
        documents: documents.len(),
        in_process_docs_per_s: in_process,
        server_docs_per_s: served,
        server_p50_ms: percentile(&latencies, 0.5),
        server_p99_ms: percentile(&latencies, 0.99),
        server_over_in_process: served / in_process,
    })
}

pub fn table(r: &RerankReport, options: &BenchOptions) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    format!(
        "rerank: model {} ({}), {} documents against one query\n\n| phase | documents/s | p50 ms | p99 ms |\n| --- | ---: | ---: | ---: |\n\
         | model in-process (one job) | {:.1} | - | - |\n| server /rerank ({} documents/request, {} clients) | {:.1} | {} | {} |\n\n\
         server / in-process: {:.2}\n",
        r.model,
        r.kind,
        r.documents,
        r.in_process_docs_per_s,
        options.batch,
        options.clients,
        r.server_docs_per_s,
        ms(r.server_p50_ms),
        ms(r.server_p99_ms),
        r.server_over_in_process
    )
}
