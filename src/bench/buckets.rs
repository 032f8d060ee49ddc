//! `eeane bench --buckets`: each model's engine on full batches of every one of
//! its length buckets, in process, so that engines (and precisions) can be held
//! against each other shape by shape (batch x length), not only on a mix.

use super::BenchError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{Config, ModelConfig};
use crate::model::{batch_policy, Inputs, LoadedModel};
use crate::sync::Recover;

#[derive(Debug, Serialize)]
pub struct BucketFigure {
    pub batch: usize,
    pub seq: usize,
    pub us_per_text: f64,
    pub texts_per_s: f64,
    /// Microseconds of all the machine's cores per text: `us_per_text x cores`.
    pub core_us_per_text: f64,
}

#[derive(Debug, Serialize)]
pub struct ModelFigures {
    pub model: String,
    pub engine: String,
    pub device: String,
    pub precision: String,
    pub load_ms: u64,
    pub buckets: Vec<BucketFigure>,
}

/// Sequences of exactly `seq` tokens: `seq - 2` content ids (the model adds its
/// two special tokens). Dense compute does not depend on the ids' values.
fn full_batch(batch: usize, seq: usize) -> Inputs {
    Inputs::TokenIds((0..batch).map(|r| (0..seq as i64 - 2).map(|i| 1000 + (i * 7 + r as i64) % 500).collect()).collect())
}

pub async fn measure(model: &ModelConfig, server: &Config, min_seconds: f64) -> Result<ModelFigures, BenchError> {
    // In process, on a thread: the engine's own speed per bucket.
    let in_process = ModelConfig { isolation: Some(crate::config::Isolation::Thread), ..model.clone() };
    let loaded = Arc::new(crate::variants::load_chosen(&in_process, server).await.map_err(|source| BenchError::Load { model: model.id.clone(), source })?);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    // One batch in flight per session (eight CUDA sessions of one card run
    // eight at once), so that a figure is what the whole model does.
    let sessions = loaded.stats().device_batches.locked().len().max(1);
    // A GPU engine runs its batch shapes once while idle after a load (eight
    // sessions of all-MiniLM-L6-v2 on an H100 measured 125 µs a text at every
    // length meanwhile, against 21 µs in the server's bulk once warm).
    loaded.warmed().await;
    let mut buckets = Vec::new();
    for bucket in batch_policy(model).buckets {
        let (batch, seq) = (bucket.max_batch, bucket.max_tokens);
        let inputs = Arc::new(full_batch(batch, seq));
        // Warm-up: every session runs the shape once.
        on_every_session(&loaded, &inputs, batch * seq, sessions, 1, 0.0).await?;
        let started = Instant::now();
        let runs = on_every_session(&loaded, &inputs, batch * seq, sessions, 3, min_seconds).await?;
        let us_per_text = started.elapsed().as_secs_f64() * 1e6 / (runs * batch) as f64;
        eprintln!("  {} {batch:>3} x {seq:<4} {us_per_text:>9.0} us/text ({sessions} at once)", model.id);
        buckets.push(BucketFigure { batch, seq, us_per_text, texts_per_s: 1e6 / us_per_text, core_us_per_text: us_per_text * cores });
    }
    let info = loaded.engine_info();
    Ok(ModelFigures {
        model: model.id.clone(),
        engine: info.engine.clone(),
        device: info.device.clone(),
        precision: info.precision.clone(),
        load_ms: loaded.load_ms,
        buckets,
    })
}

/// Runs `inputs` (`tokens` in all) on `sessions` loops at once, each at
/// least `runs` times and for at least `seconds`; returns the runs of all.
async fn on_every_session(
    loaded: &Arc<LoadedModel>,
    inputs: &Arc<Inputs>,
    tokens: usize,
    sessions: usize,
    runs: usize,
    seconds: f64,
) -> Result<usize, BenchError> {
    let started = Instant::now();
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..sessions {
        let (loaded, inputs) = (loaded.clone(), inputs.clone());
        loops.spawn(async move {
            let mut done = 0usize;
            while done < runs || started.elapsed() < Duration::from_secs_f64(seconds) {
                let out = loaded.embed(inputs.clone(), None).await?;
                debug_assert_eq!(out.tokens, tokens);
                done += 1;
            }
            Ok::<_, crate::model::ModelError>(done)
        });
    }
    let mut total = 0;
    while let Some(done) = loops.join_next().await {
        total += done??;
    }
    Ok(total)
}

/// One row per bucket, one column group per model.
pub fn table(figures: &[ModelFigures]) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = format!("per bucket, full batches of exactly batch x seq tokens, {cores} cores\n\n| batch x seq |");
    for f in figures {
        out += &format!(" {} ({}, {}, {}) us/text | texts/s | core-us/text |", f.model, f.engine, f.device, f.precision);
    }
    out += "\n| --- |";
    out += &" ---: | ---: | ---: |".repeat(figures.len());
    out += "\n";
    let shapes: Vec<(usize, usize)> = figures.first().map(|f| f.buckets.iter().map(|b| (b.batch, b.seq)).collect()).unwrap_or_default();
    for (batch, seq) in shapes {
        out += &format!("| {batch} x {seq} |");
        for f in figures {
            match f.buckets.iter().find(|b| b.batch == batch && b.seq == seq) {
                Some(b) => out += &format!(" {:.0} | {:.1} | {:.0} |", b.us_per_text, b.texts_per_s, b.core_us_per_text),
                None => out += " - | - | - |",
            }
        }
        out += "\n";
    }
    out
}
