//! `eeane bench`: throughput of one model, measured four ways in one run, so
//! that the ratios between them are meaningful:
//! 1. the engine in-process, one job holding the whole corpus (sorted batches);
//! 2. the server over HTTP, bulk requests (`batch` texts, `clients` clients);
//! 3. the server over HTTP, one text per request, `parallel` at once (Open WebUI's pattern);
//! 4. the engine in-process with arrival-order batches padded to their longest,
//!    the baseline that sorting and buckets are measured against.

mod buckets;

pub mod rerank;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Why a bench run stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The config has no model to bench as asked.
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("{model}: {source}")]
    Load { model: String, source: crate::model::ModelError },
    /// A resident model failed its start-up load.
    #[error(transparent)]
    Preflight(#[from] crate::registry::AcquireError),
    /// The server phase's requests failed.
    #[error("{0}")]
    Http(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("a bench task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl From<reqwest::Error> for BenchError {
    fn from(e: reqwest::Error) -> Self {
        BenchError::Http(e.to_string())
    }
}
use serde::Serialize;
use serde_json::json;

use crate::config::{BatchOrder, Config, LoadPolicy, ModelConfig};
use crate::http::{router, AppState};
use crate::model::{Inputs, LoadedModel};
use crate::serving::Service;
use crate::tokenize::TextTokenizer;

pub use crate::corpus::corpus;
pub use buckets::{BucketFigure, ModelFigures};

/// `eeane bench --buckets`: every model in `ids` (comma-separated), bucket by bucket.
pub async fn run_buckets(config: Config, ids: &str, min_seconds: f64) -> Result<(Vec<ModelFigures>, String), BenchError> {
    let mut figures = Vec::new();
    for id in ids.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let model = config.models.iter().find(|m| m.names().any(|n| n == id)).ok_or_else(|| BenchError::Config(format!("no model {id:?} in the config")))?;
        eprintln!("eeane bench --buckets: {id}");
        figures.push(buckets::measure(model, &config, min_seconds).await?);
    }
    let table = buckets::table(&figures);
    Ok((figures, table))
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub model: Option<String>,
    pub texts: usize,
    pub seed: u64,
    /// A JSON array of texts to use instead of the built-in corpus.
    pub corpus: Option<PathBuf>,
    pub batch: usize,
    pub clients: usize,
    pub parallel: usize,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub texts_per_s: f64,
    pub tokens_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Share of computed tokens that were padding.
    pub padding: f64,
    pub engine_batches: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub model: String,
    pub engine: String,
    pub texts: usize,
    pub tokens: usize,
    pub mean_tokens: f64,
    pub phases: Vec<Phase>,
    /// One text per request, one request at a time: the latency a lone
    /// user sees on an idle server (median and 99th percentile, ms).
    pub idle_p50_ms: Option<f64>,
    pub idle_p99_ms: Option<f64>,
    /// The tokenizer alone on the corpus: texts/s on one thread, and as one
    /// request of every text (spread over the cores), with how many cores.
    pub tokenizer_one_thread_per_s: f64,
    pub tokenizer_all_cores_per_s: f64,
    pub cores: usize,
    /// The accelerator's memory from its driver (NVML for CUDA), before
    /// the run, while the server holds the model, and after it stopped.
    pub device_memory: Option<DeviceMemoryReport>,
    pub server_bulk_over_engine: f64,
    pub one_per_request_over_bulk: f64,
    pub sorted_over_pad_to_longest: f64,
}

#[derive(Debug, Serialize)]
pub struct DeviceMemoryReport {
    pub device: String,
    pub total_mib: u64,
    pub at_rest_mib: u64,
    pub loaded_mib: u64,
    pub after_mib: u64,
}

fn progress(label: &str, total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(ProgressStyle::with_template("{prefix:>34} [{bar:30}] {pos}/{len} texts {per_sec}").unwrap().progress_chars("=> "));
    bar.set_prefix(label.to_string());
    bar
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * p).round() as usize])
}

/// Engine statistics between two snapshots: (batches, padding share).
fn engine_delta(before: (u64, u64, u64), after: (u64, u64, u64)) -> (u64, f64) {
    let (batches, padded, real) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    (batches, if padded == 0 { 0.0 } else { 1.0 - real as f64 / padded as f64 })
}

fn snapshot(model: &LoadedModel) -> (u64, u64, u64) {
    let s = model.stats();
    (s.batches.load(Ordering::Relaxed), s.padded_tokens.load(Ordering::Relaxed), s.real_tokens.load(Ordering::Relaxed))
}

/// Phases 1 and 4: the whole corpus as one job to a model loaded in-process
/// (on a thread, whatever the config's isolation: the server phases use that,
/// so their ratio to these includes the engine process's pipe).
async fn in_process(label: &'static str, name: &'static str, config: &ModelConfig, server: &Config, texts: &[String]) -> Result<(Phase, usize), BenchError> {
    let config = ModelConfig { isolation: Some(crate::config::Isolation::Thread), ..config.clone() };
    let model = LoadedModel::load(&config, server).await?;
    model.warmed().await;
    model.embed(Arc::new(Inputs::Texts(texts[..texts.len().min(64)].to_vec())), None).await?;
    let bar = progress(label, texts.len());
    let before = snapshot(&model);
    let rows_before = model.stats().rows.load(Ordering::Relaxed);
    let started = Instant::now();
    let job = model.embed(Arc::new(Inputs::Texts(texts.to_vec())), None);
    tokio::pin!(job);
    let result = loop {
        tokio::select! {
            r = &mut job => break r?,
            _ = tokio::time::sleep(Duration::from_millis(200)) => bar.set_position(model.stats().rows.load(Ordering::Relaxed) - rows_before),
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let (engine_batches, padding) = engine_delta(before, snapshot(&model));
    let phase = Phase {
        name,
        texts_per_s: texts.len() as f64 / seconds,
        tokens_per_s: result.tokens as f64 / seconds,
        p50_ms: None,
        p99_ms: None,
        padding,
        engine_batches,
    };
    Ok((phase, result.tokens))
}

/// Texts/s of the model's tokenizer over `texts`: in requests of a few texts
/// (each on one thread), then as one request of them all (on every core).
async fn tokenizer_rates(config: &ModelConfig, texts: &Arc<Vec<String>>) -> Result<(f64, f64), BenchError> {
    let (config, texts) = (config.clone(), texts.clone());
    let rates = tokio::task::spawn_blocking(move || -> Result<(f64, f64), crate::tokenize::TokenizeError> {
        let tokenizer = TextTokenizer::from_config(&config)?;
        let started = Instant::now();
        for few in texts.chunks(8) {
            tokenizer.encode(&Inputs::Texts(few.to_vec()))?;
        }
        let one_thread = texts.len() as f64 / started.elapsed().as_secs_f64();
        let all = Inputs::Texts(texts.to_vec());
        let started = Instant::now();
        tokenizer.encode(&all)?;
        Ok((one_thread, texts.len() as f64 / started.elapsed().as_secs_f64()))
    })
    .await
    .map_err(|e| BenchError::Config(format!("tokenizer: {e}")))?;
    rates.map_err(|e| BenchError::Config(format!("tokenizer: {e}")))
}

/// The server a phase over HTTP talks to, and the model it asks for.
struct HttpTarget<'a> {
    url: &'a str,
    model: &'a str,
    service: &'a Service,
}

/// Phases 2 and 3: `clients` tasks send `per_request` texts per request until the corpus is done.
async fn over_http(
    label: &'static str,
    name: &'static str,
    target: &HttpTarget<'_>,
    texts: &Arc<Vec<String>>,
    per_request: usize,
    clients: usize,
    tokens: usize,
) -> Result<Phase, BenchError> {
    let HttpTarget { url, model, service } = *target;
    let chunks: Arc<Vec<Vec<String>>> = Arc::new(texts.chunks(per_request).map(<[String]>::to_vec).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let bar = progress(label, texts.len());
    let client = reqwest::Client::new();
    let slot_model = service.loaded_model(model);
    let before = slot_model.as_deref().map(snapshot);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (chunks, next, client, bar) = (chunks.clone(), next.clone(), client.clone(), bar.clone());
            let (url, model) = (format!("{url}/v1/embeddings"), model.to_string());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(chunk) = chunks.get(i) else { break };
                    let sent = Instant::now();
                    let body = json!({"input": chunk, "model": model, "encoding_format": "base64"});
                    let response = client.post(&url).json(&body).send().await?;
                    if !response.status().is_success() {
                        return Err(BenchError::Http(format!("HTTP {}: {}", response.status(), response.text().await.unwrap_or_default())));
                    }
                    response.bytes().await?;
                    latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                    bar.inc(chunk.len() as u64);
                }
                Ok::<_, BenchError>(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    latencies.sort_by(f64::total_cmp);
    let (engine_batches, padding) = match (slot_model.as_deref(), before) {
        (Some(m), Some(b)) => engine_delta(b, snapshot(m)),
        _ => (0, 0.0),
    };
    Ok(Phase {
        name,
        texts_per_s: texts.len() as f64 / seconds,
        tokens_per_s: tokens as f64 / seconds,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        padding,
        engine_batches,
    })
}

/// The server, in this process, serving only `model` (resident, batches of
/// `batch`), on a free loopback port; coalescing off so that repeated corpus
/// texts are not answered for free. Returns its base URL, service and task.
async fn serve_only(
    mut config: Config,
    model: &ModelConfig,
    batch: usize,
) -> Result<(String, Arc<Service>, tokio::task::JoinHandle<std::io::Result<()>>), BenchError> {
    config.models = vec![ModelConfig { load_policy: Some(LoadPolicy::Resident), max_batch: batch, ..model.clone() }];
    config.server.coalesce_requests = false;
    config.server.api_key = None;
    let service = Arc::new(Service::new(config, None, Default::default()));
    service.preflight().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = router(AppState { service: service.clone() }).into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, service, server))
}

pub async fn run(config: Config, options: BenchOptions) -> Result<Report, BenchError> {
    let model = match &options.model {
        Some(name) => {
            config.models.iter().find(|m| m.names().any(|n| n == name)).ok_or_else(|| BenchError::Config(format!("no model {name:?} in the config")))?
        }
        None => {
            config.models.iter().find(|m| m.policy(&config.server) != LoadPolicy::Disabled).ok_or_else(|| BenchError::Config("no servable model".into()))?
        }
    }
    .clone();
    // precision = "auto": every phase runs the variant the server would serve.
    let model = crate::variants::chosen_entry(&model, &config).await?;
    let texts = Arc::new(match &options.corpus {
        Some(path) => corpus_file(path, options.texts)?,
        None => corpus(options.texts, options.seed),
    });
    eprintln!("eeane bench: model {}, {} texts (seed {}), batches of {}", model.id, texts.len(), options.seed, options.batch);

    let device_memory = || crate::engines::find(&model.engine).and_then(|e| e.device_memory(&model.device));
    let at_rest = device_memory();
    let (tokenizer_one_thread_per_s, tokenizer_all_cores_per_s) = tokenizer_rates(&model, &texts).await?;
    let sorted = ModelConfig { max_batch: options.batch, ..model.clone() };
    let (engine, tokens) = in_process("1 engine in-process, sorted", "engine in-process (sorted, bucketed)", &sorted, &config, &texts).await?;
    let arrival = ModelConfig { batch_order: BatchOrder::Arrival, buckets: Vec::new(), max_batch: options.batch, ..model.clone() };
    let (padded, _) = in_process("4 engine in-process, arrival order", "engine in-process (arrival order, pad to longest)", &arrival, &config, &texts).await?;

    let (url, service, server) = serve_only(config, &model, options.batch).await?;
    let warm = Arc::new(texts[..texts.len().min(64)].to_vec());
    let target = HttpTarget { url: &url, model: &model.id, service: &service };
    over_http("warm-up", "warm-up", &target, &warm, 8, 2, 0).await?;
    let bulk = over_http("2 server, bulk", "server over HTTP, bulk", &target, &texts, options.batch, options.clients, tokens).await?;
    let single = over_http("3 server, one text per request", "server over HTTP, one text per request", &target, &texts, 1, options.parallel, tokens).await?;
    let lone = Arc::new(texts[..texts.len().min(200)].to_vec());
    let idle = over_http("idle, one request at a time", "idle", &target, &lone, 1, 1, 0).await?;
    let loaded = device_memory();
    server.abort();
    let _ = server.await;
    drop(service);
    // The engine processes give the device back as they exit, which takes
    // a CUDA context a moment: wait up to 15 s for the floor (within 64 MiB).
    let mut after = device_memory();
    for _ in 0..60 {
        match (&at_rest, &after) {
            (Some(rest), Some(now)) if now.used_mib > rest.used_mib + 64 => {
                tokio::time::sleep(Duration::from_millis(250)).await;
                after = device_memory();
            }
            _ => break,
        }
    }
    let device_memory = match (at_rest, loaded, after) {
        (Some(rest), Some(loaded), Some(after)) => Some(DeviceMemoryReport {
            device: rest.name,
            total_mib: rest.total_mib,
            at_rest_mib: rest.used_mib,
            loaded_mib: loaded.used_mib,
            after_mib: after.used_mib,
        }),
        _ => None,
    };

    let report = Report {
        model: model.id.clone(),
        engine: model.engine.clone(),
        texts: texts.len(),
        tokens,
        mean_tokens: tokens as f64 / texts.len() as f64,
        idle_p50_ms: idle.p50_ms,
        idle_p99_ms: idle.p99_ms,
        tokenizer_one_thread_per_s,
        tokenizer_all_cores_per_s,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        device_memory,
        server_bulk_over_engine: bulk.texts_per_s / engine.texts_per_s,
        one_per_request_over_bulk: single.texts_per_s / bulk.texts_per_s,
        sorted_over_pad_to_longest: engine.texts_per_s / padded.texts_per_s,
        phases: vec![engine, bulk, single, padded],
    };
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&report).expect("report serializes"))?;
    }
    Ok(report)
}

/// The first `limit` texts of a JSON array of strings.
fn corpus_file(path: &std::path::Path, limit: usize) -> Result<Vec<String>, BenchError> {
    let texts: Vec<String> =
        serde_json::from_slice(&std::fs::read(path)?).map_err(|e| BenchError::Config(format!("{}: not a JSON array of strings: {e}", path.display())))?;
    if texts.is_empty() {
        return Err(BenchError::Config(format!("{}: no texts", path.display())));
    }
    Ok(texts.into_iter().take(limit).collect())
}

/// The report as a Markdown table, as docs/performance.md shows it.
pub fn table(report: &Report, options: &BenchOptions) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let mut out = format!(
        "model {} on {}, {} texts, {} tokens (mean {:.1})\n\n| # | phase | texts/s | tokens/s | p50 ms | p99 ms | padding | engine batches |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        report.model, report.engine, report.texts, report.tokens, report.mean_tokens
    );
    for (number, phase) in [1, 2, 3, 4].iter().zip(&report.phases) {
        let name = match number {
            2 => format!("{} ({} texts/request, {} clients)", phase.name, options.batch, options.clients),
            3 => format!("{} ({} in parallel)", phase.name, options.parallel),
            _ => phase.name.to_string(),
        };
        out += &format!(
            "| {number} | {name} | {:.1} | {:.0} | {} | {} | {:.1} % | {} |\n",
            phase.texts_per_s,
            phase.tokens_per_s,
            ms(phase.p50_ms),
            ms(phase.p99_ms),
            phase.padding * 100.0,
            phase.engine_batches
        );
    }
    if let (Some(p50), Some(p99)) = (report.idle_p50_ms, report.idle_p99_ms) {
        out += &format!("\nidle server, one text per request, one at a time: p50 {p50:.2} ms, p99 {p99:.2} ms\n");
    }
    if report.idle_p50_ms.is_none() {
        out.push('\n');
    }
    out += &format!(
        "tokenizer alone: {:.0} texts/s on one thread, {:.0} texts/s as one request on {} cores\n",
        report.tokenizer_one_thread_per_s, report.tokenizer_all_cores_per_s, report.cores
    );
    if let Some(m) = &report.device_memory {
        out += &format!(
            "{}: {} MiB in use at rest, {} MiB with the model loaded, {} MiB after the server stopped (of {} MiB)\n",
            m.device, m.at_rest_mib, m.loaded_mib, m.after_mib, m.total_mib
        );
    }
    out += &format!(
        "\n(2)/(1) server bulk / engine: {:.2}\n(3)/(2) one text per request / bulk: {:.2}\n(1)/(4) sorted + bucketed / pad-to-longest: {:.2}\n",
        report.server_bulk_over_engine, report.one_per_request_over_bulk, report.sorted_over_pad_to_longest
    );
    out
}
