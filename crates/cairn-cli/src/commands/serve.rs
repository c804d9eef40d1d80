//! `cairn serve`: run the repository server (crates/cairn-server), and `cairn serve token
//! add|list|remove` to manage its credentials file; also the client side's options (a
//! `cairn+https://` repository).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use cairn_core::commands::json;
use cairn_core::engine::storage::{Location, RemoteOptions, ServerOptions};
use cairn_server::tls::Certificate;
use cairn_server::tokens::{self, Credentials};
use clap::{Args as ClapArgs, Subcommand};

use super::Global;

#[derive(ClapArgs, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<TokenCommand>,
    #[command(flatten)]
    run: RunArgs,
    /// The credentials file: the tokens, as hashes (default:
    /// $XDG_CONFIG_HOME/cairn/serve/credentials.json); a self-signed certificate is kept beside it
    #[arg(long, env = "CAIRN_SERVE_CREDENTIALS", global = true, value_name = "FILE")]
    credentials: Option<PathBuf>,
}

#[derive(ClapArgs, Debug)]
struct RunArgs {
    /// Where the repositories are kept, one per name below it: a directory, s3:… or sftp:…
    #[arg(long, value_name = "LOCATION")]
    storage: Option<String>,
    /// The address to listen on (port 0: a free port, printed)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8443")]
    listen: SocketAddr,
    /// The certificate chain (PEM) to serve; without it a self-signed certificate is made on
    /// first start and its fingerprint printed
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS (only on a loopback address)
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    plain_http: bool,
    /// Append the request log (JSON lines) to FILE; `-` for stderr
    #[arg(long, value_name = "FILE", default_value = "-")]
    log: PathBuf,
    /// The most bytes a repository may hold: SIZE for every repository, NAME=SIZE for one
    /// (repeatable; e.g. --quota 500G --quota laptop=1T)
    #[arg(long, value_name = "[NAME=]SIZE")]
    quota: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Manage the tokens clients authenticate with
    #[command(subcommand)]
    Token(Token),
}

#[derive(Subcommand, Debug)]
enum Token {
    /// Make a token; it is printed once and kept only as a hash
    Add(AddArgs),
    /// List the tokens (names, repositories, roles, expiry; never the tokens)
    List,
    /// Remove a token by name (a running server refuses it at once)
    Remove {
        /// The token's name
        name: String,
    },
}

#[derive(ClapArgs, Debug)]
struct AddArgs {
    /// The repository the token is for
    // This shares its id with the global -r/--repo, so a client's repository given there (or in
    // CAIRN_REPOSITORY) fills it too: `--all` therefore wins over any value it holds.
    #[arg(long, value_name = "NAME", required_unless_present = "all")]
    repo: Option<String>,
    /// The token is for every repository of the server
    #[arg(long)]
    all: bool,
    /// read (restore, check, …), append (also backup; never delete or overwrite), admin (all)
    #[arg(long, value_name = "ROLE")]
    role: String,
    /// The token stops working after this long (e.g. 90d, 12h, 30m)
    #[arg(long, value_name = "DURATION")]
    expires: Option<String>,
    /// A name for lists and the request log (default: REPO-RANDOM)
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let credentials = match a.credentials {
        Some(c) => c,
        None => default_credentials()?,
    };
    match a.command {
        Some(TokenCommand::Token(t)) => token(&credentials, t, g.json),
        None => serve(g, &credentials, a.run),
    }
}

fn default_credentials() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context("no HOME: give --credentials")?).join(".config"),
    };
    Ok(base.join("cairn").join("serve").join("credentials.json"))
}

fn serve(g: &Global, credentials: &std::path::Path, a: RunArgs) -> Result<ExitCode> {
    let Some(storage) = a.storage else { bail!("cairn serve needs --storage LOCATION (where the repositories are)") };
    let transport = if a.plain_http {
        cairn_server::Transport::PlainHttp
    } else if let (Some(cert), Some(key)) = (a.tls_cert, a.tls_key) {
        cairn_server::Transport::Tls(Certificate::Files { cert, key })
    } else {
        let dir = credentials.parent().map(PathBuf::from).unwrap_or_default();
        cairn_server::Transport::Tls(Certificate::SelfSigned { dir, names: cairn_server::certificate_names(&a.listen) })
    };
    let mut quotas = cairn_server::quota::Quotas::default();
    for q in &a.quota {
        quotas.add(q)?;
    }
    let config = cairn_server::Config {
        storage: Location::parse(&storage)?,
        remote: RemoteOptions {
            sftp_key: g.sftp_key.as_ref().map(|p| p.to_string_lossy().into_owned()),
            sftp_known_hosts: Some(g.sftp_known_hosts.clone()),
            ..RemoteOptions::default()
        },
        listen: a.listen,
        credentials: credentials.to_path_buf(),
        transport,
        log: a.log,
        quotas,
    };
    let shown_storage = storage.clone();
    cairn_server::run(config, |s| {
        outln!("cairn serve: serving the repositories in {shown_storage} at {}://{}", s.scheme, s.address);
        if let (Some(fp), Some(cert)) = (&s.fingerprint, &s.certificate) {
            outln!("certificate: {cert}");
            outln!("fingerprint (SHA-256): {fp}");
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

fn token(credentials: &std::path::Path, t: Token, json: bool) -> Result<ExitCode> {
    match t {
        Token::Add(a) => {
            let (entry, text) = tokens::add_token(
                credentials,
                a.name.as_deref(),
                a.repo.as_deref().filter(|_| !a.all),
                &a.role,
                a.expires.as_deref(),
            )?;
            if json {
                let (repo, role) = (entry.repo.as_deref(), entry.role.name());
                outln!("{}", json::line(&json::TokenAdded::new(&entry.name, &text, repo, role, entry.expires)));
            } else {
                outln!(
                    "token {:?} ({} on {}), shown only now:",
                    entry.name,
                    entry.role.name(),
                    repo_shown(&entry.repo)
                );
                outln!("{text}");
            }
        }
        Token::List => {
            let creds = Credentials::load(credentials)?;
            if json {
                let list: Vec<_> = creds
                    .tokens
                    .iter()
                    .map(|t| json::TokenListed::new(&t.name, t.repo.as_deref(), t.role.name(), t.created, t.expires))
                    .collect();
                outln!("{}", json::line(&list));
            } else {
                let now = tokens::now();
                for t in &creds.tokens {
                    let expires = match t.expires {
                        None => "never expires".to_string(),
                        Some(e) if e <= now => "expired".to_string(),
                        Some(e) => format!("expires in {}", human_secs(e - now)),
                    };
                    outln!("{}\t{}\t{}\t{expires}", t.name, t.role.name(), repo_shown(&t.repo));
                }
            }
        }
        Token::Remove { name } => {
            let removed = tokens::remove_token(credentials, &name)?;
            outln!("removed token {:?}", removed.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn repo_shown(repo: &Option<String>) -> String {
    repo.as_deref().map_or("every repository".into(), |r| format!("repository {r}"))
}

fn human_secs(s: u64) -> String {
    match s {
        s if s >= 2 * 86400 => format!("{} days", s / 86400),
        s if s >= 2 * 3600 => format!("{} hours", s / 3600),
        s => format!("{} minutes", s.div_ceil(60)),
    }
}

/// How to reach a `cairn+https://` (or loopback `cairn+http://`) repository: the global options'
/// token (`CAIRN_SERVER_TOKEN` or the first line of `--server-token-file`) and certificate check.
pub(crate) fn server_options(global: &Global) -> Result<ServerOptions> {
    let token = match (&global.server_token_file, std::env::var("CAIRN_SERVER_TOKEN")) {
        (_, Ok(t)) if !t.trim().is_empty() => Some(t.trim().to_string()),
        (Some(file), _) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the server token file {}", file.display()))?;
            let Some(first) = text.lines().next().map(str::trim).filter(|l| !l.is_empty()) else {
                bail!("the server token file {} is empty", file.display());
            };
            Some(first.to_string())
        }
        (None, _) => None,
    };
    Ok(ServerOptions { token, fingerprint: global.server_fingerprint.clone(), ca_file: global.server_ca.clone() })
}
