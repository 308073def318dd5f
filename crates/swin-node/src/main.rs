//! `swin-node`: parses the command line, loads config, sets up tracing, runs the node.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use swin_node::config::Config;
use swin_node::node::{migrate_all, Daemon, Signals};

/// mimalloc instead of the system allocator: a request allocates and frees a few dozen
/// small blocks (hyper's buffers, axum's boxed futures, the JSON answer) across tokio's
/// worker threads, and glibc's malloc took 37 % of the instructions of a `/hit`
/// (callgrind; see BENCHMARKS-HISTORY.md, "Modes"). mimalloc's thread-local free lists make that
/// a few percent.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `--version`: the package's version and the commit it was built from (see build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SWIN_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "swin-node",
    version = VERSION,
    about = "Clustered sliding-window rate-limit counters"
)]
struct Cli {
    /// TOML config; without it, the embedded config/swin.toml (SQLite under ./data).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides the config and SWIN_LISTEN).
    #[arg(long)]
    listen: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the SQL schema to every PostgreSQL and SQLite store of the config.
    Migrate,
    /// Validate a config file (`--config PATH`, or PATH) and exit.
    CheckConfig { path: Option<PathBuf> },
    /// Read a token on stdin and print its SHA-256, for `[[auth.tokens]] sha256`.
    HashToken,
}

fn load(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    Ok(match path {
        Some(p) => Config::load(p)?,
        None => Config::embedded_default()?,
    })
}

/// The listening socket, with a backlog of 4,096 (tokio's default is 128): a burst of
/// connections waits in the kernel rather than having its SYNs dropped and retried a
/// second later.
fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// Errors end the process with their chain of causes on one line and exit status 1, not
/// with a debug dump or a backtrace.
fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("swin-node: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(Cli::parse())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swin-node: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::HashToken) => {
            let mut token = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut token)
                .context("read the token from stdin")?;
            // one line: the newline a shell or a file adds is not part of the token
            let token = token.strip_suffix('\n').unwrap_or(&token);
            let token = token.strip_suffix('\r').unwrap_or(token);
            if token.is_empty() {
                anyhow::bail!("hash-token needs a token on stdin");
            }
            println!("{}", swin_node::http::hash_token(token.as_bytes()));
            Ok(())
        }
        Some(Command::CheckConfig { path }) => {
            let Some(path) = path.or(cli.config) else {
                anyhow::bail!("check-config needs a file: --config PATH or PATH");
            };
            let c = Config::load(&path)?;
            eprintln!(
                "{}: ok ({} stores, {} namespaces)",
                path.display(),
                c.limiter().stores().len(),
                c.limiter().namespaces().len()
            );
            Ok(())
        }
        Some(Command::Migrate) => {
            let config = load(cli.config.as_ref())?;
            let _logs = swin_node::telemetry::init(config.log_format, None)?;
            migrate_all(config.limiter()).await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        None => {
            let mut config = load(cli.config.as_ref())?;
            if let Some(l) = cli.listen {
                config.listen = l
                    .parse()
                    .with_context(|| format!("--listen {l:?} is not an address"))?;
            }
            let telemetry =
                swin_node::telemetry::init(config.log_format, config.telemetry.as_ref())?;
            let signals = Signals::install()?;
            let listener =
                listen(config.listen).with_context(|| format!("listen on {}", config.listen))?;
            let node = Daemon::start(config).await?;
            let served = node.serve(listener, cli.config, signals).await;
            telemetry.shutdown().await;
            served
        }
    }
}
