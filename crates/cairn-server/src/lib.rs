//! `cairn serve`: one repository server for many hosts (docs/FORMAT.md §15 is the protocol and
//! the rules; docs/DESIGN.md "Repository server" says why the roles are safe).
//!
//! The server keeps repositories in any location Cairn supports, one per name below it, and has
//! no state of its own beside that storage and the credentials file (tokens, kept as hashes).
//! Every request names a repository and an object of it; both are parsed strictly
//! ([`cairn_format::protocol`], which the fuzz target `serve_request` feeds anything), the
//! bearer token is checked ([`tokens`]), the role's rule for that kind of object applied
//! ([`policy`]), and only then is the storage touched. Every request is logged ([`log`]).

pub mod log;
pub mod policy;
pub mod quota;
mod stored_by;
pub mod tls;
pub mod tokens;

mod http;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use cairn_core::engine::storage::{is_loopback_host, Location, RemoteOptions};

pub use cairn_format::protocol::{MAX_OBJECT_SIZE, VERSION as PROTOCOL};

/// How the server talks to clients.
#[derive(Clone, Debug)]
pub enum Transport {
    /// HTTPS with this certificate.
    Tls(tls::Certificate),
    /// Plain HTTP: only on a loopback address.
    PlainHttp,
}

/// Everything `cairn serve` is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the repositories are: one per name below it.
    pub storage: Location,
    /// How to reach remote storage.
    pub remote: RemoteOptions,
    /// The address to listen on (port 0: any free port, printed at start).
    pub listen: SocketAddr,
    /// The credentials file.
    pub credentials: PathBuf,
    /// HTTPS or plain HTTP.
    pub transport: Transport,
    /// The request log: a file, or `-` for stderr.
    pub log: PathBuf,
    /// The per-repository quotas.
    pub quotas: quota::Quotas,
}

/// What a started server tells its caller (printed by `cairn serve`).
#[derive(Clone, Debug)]
pub struct Started {
    /// The address it listens on.
    pub address: SocketAddr,
    /// `https` or `http`.
    pub scheme: &'static str,
    /// The certificate's SHA-256 fingerprint (hex), over HTTPS.
    pub fingerprint: Option<String>,
    /// Where the certificate came from.
    pub certificate: Option<String>,
}

/// Runs the server until the process is stopped; `started` is called once it listens.
pub fn run(config: Config, started: impl FnOnce(&Started)) -> Result<()> {
    if matches!(config.transport, Transport::PlainHttp) && !config.listen.ip().is_loopback() {
        bail!(
            "plain HTTP is only allowed on a loopback address, not {}: drop --plain-http to serve HTTPS",
            config.listen
        );
    }
    if let Location::Server { .. } = config.storage {
        bail!("--storage {} is itself a repository server: give a directory, s3: or sftp: location", config.storage);
    }
    let tls = match &config.transport {
        Transport::Tls(cert) => Some(tls::load(cert)?),
        Transport::PlainHttp => None,
    };
    let tokens = tokens::TokenStore::open(&config.credentials)?;
    let log = log::Log::open(&config.log)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("cairn-serve")
        .enable_all()
        .build()
        .context("cannot start the server's runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let address = listener.local_addr().context("the listening address")?;
        started(&Started {
            address,
            scheme: if tls.is_some() { "https" } else { "http" },
            fingerprint: tls.as_ref().map(|t| t.fingerprint.clone()),
            certificate: tls.as_ref().map(|t| t.source.clone()),
        });
        let state = http::State::new(config.storage, config.remote, tokens, log, config.quotas);
        http::serve(listener, tls.map(|t| t.config), state).await
    })
}

/// The names a self-signed certificate for `listen` carries: `localhost`, the address itself
/// (unless it is the unspecified one) and this host's name.
pub fn certificate_names(listen: &SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string()];
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() && !is_loopback_host(host) && !names.iter().any(|n| n == host) {
            names.push(host.to_string());
        }
    }
    names
}
