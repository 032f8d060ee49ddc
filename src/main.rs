use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use eeane::config::{find_file, CliOverrides, Config};
use eeane::http::{router, AppState};
use eeane::registry::Registry;

/// Exit status for a bad config or a model that fails its preflight.
const EXIT_PREFLIGHT: u8 = 2;

#[derive(Parser)]
#[command(name = "eeane", version, about = "Serve text-embedding models over an OpenAI-compatible API")]
struct Cli {
    /// Config file (default: ./eeane.toml, then ~/.config/eeane/eeane.toml, then built-in defaults).
    #[arg(long, global = true, env = "EEANE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EEANE_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let overrides = match &cli.command {
        Command::Serve { host, port } => CliOverrides { host: host.clone(), port: *port },
        Command::CheckConfig => CliOverrides::default(),
    };
    let config = match find_file(cli.config.as_deref()).and_then(|file| Config::load(file.as_deref(), &overrides)) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("eeane: invalid config: {e}");
            return ExitCode::from(EXIT_PREFLIGHT);
        }
    };
    match cli.command {
        Command::CheckConfig => check_config(&config),
        Command::Serve { .. } => {
            let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
            runtime.block_on(serve(config))
        }
    }
}

fn check_config(config: &Config) -> ExitCode {
    for m in &config.models {
        for (what, path) in [("model", m.model.path()), ("tokenizer", m.tokenizer.path())] {
            if !path.exists() {
                eprintln!("eeane: warning: models {:?}: {what} file {} does not exist yet", m.id, path.display());
            }
        }
    }
    print!("{}", toml::to_string_pretty(config).expect("config serializes"));
    ExitCode::SUCCESS
}

async fn serve(config: Config) -> ExitCode {
    let config = Arc::new(config);
    let registry = Arc::new(Registry::new(&config));
    // Preflight: every model loads and answers before the port is bound.
    for slot in registry.slots() {
        if let Err(reason) = slot.get_or_load(&config).await {
            eprintln!("eeane: model {:?}: {reason}", slot.config.id);
            return ExitCode::from(EXIT_PREFLIGHT);
        }
    }
    let address = format!("{}:{}", config.server.host, config.server.port);
    let listener = match tokio::net::TcpListener::bind(&address).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("eeane: cannot bind {address}: {e}");
            return ExitCode::from(EXIT_PREFLIGHT);
        }
    };
    let local = listener.local_addr().expect("bound address");
    if config.server.api_key.is_none() && !local.ip().is_loopback() {
        tracing::warn!("listening on a non-loopback address without an API key");
    }
    // Tests and scripts read this line to learn the port.
    println!("eeane: listening on http://{local}");
    let app = router(AppState { config: config.clone(), registry });
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await {
        eprintln!("eeane: server error: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
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
    tracing::info!("shutting down: finishing in-flight requests");
}
