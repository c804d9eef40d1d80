//! The top-level command line (restic's conventions) and the dispatch to `commands/`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::commands;

const AFTER_HELP: &str = "\
Environment:
  CAIRN_REPOSITORY      repository location (instead of -r)
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION   S3 credentials and region
  CAIRN_SFTP_KEY, CAIRN_SFTP_KNOWN_HOSTS, CAIRN_CACHE_DIR   instead of the options of those names
  CAIRN_SERVER_TOKEN    the token for a cairn+https:// repository (instead of --server-token-file)
  CAIRN_PASSWORD        repository password
  CAIRN_PASSWORD_FILE   file whose first line is the password (instead of --password-file)
  CAIRN_NEW_PASSWORD    new password for `key add` and `key passwd`
  CAIRN_FROM_REPOSITORY, CAIRN_FROM_PASSWORD, CAIRN_FROM_PASSWORD_FILE   the source repository of
                        `copy` and `init --copy-chunker-params` (instead of --from-repo, --from-password-file)
  CAIRN_INJECT_FAULTS   fault injection for tests, e.g. latency=50ms (see docs/DESIGN.md)
  CAIRN_INJECT_WRITE_LATENCY   fault injection for tests: `restore` waits this long (e.g. 20ms)
                        before each write into the target, as a network file system would
  CAIRN_TEST_LOCAL_SCANNED_HOOK   for tests: a shell command `restore` runs between finding
                        local copies of chunks and copying them, beside the fetches (see
                        docs/DESIGN.md)
  CAIRN_LOCAL_COST      for tests: `local` or `repository` makes `restore` copy every chunk found
                        locally, or fetch every one, whatever its cost model measures
  CAIRN_INDEX           for tests: `disk` or `memory` keeps the index in a sorted file in the cache
                        directory, or in memory, whatever its size (see docs/DESIGN.md)
  CAIRN_PASSWORD_COMMAND, CAIRN_REPOSITORY_FILE, CAIRN_PROFILE, CAIRN_CONFIG,
  CAIRN_LIMIT_UPLOAD, CAIRN_LIMIT_DOWNLOAD   instead of the options of those names
Without a password from the environment, a command or a file, cairn asks for it on the terminal.

Configuration file: profiles in TOML ([profile.NAME], `inherit = OTHER`); a profile's keys are
the global options' long names, [profile.NAME.COMMAND] holds a command's options (see README,
Unattended). Precedence: flag > environment variable > profile > default; `cairn -p NAME config
show` prints the effective settings and where each came from.

Hooks: [profile.NAME.hooks] (every command) and [profile.NAME.COMMAND.hooks] hold `before`,
`after` (on success), `failure` and `finally` shell commands, `timeout` (default 5m, then the hook
and what it started are killed) and `before-failure = \"continue\"` (a failing `before` hook
otherwise stops the command). They are told CAIRN_HOOK, CAIRN_PROFILE, CAIRN_COMMAND and, after
the command, CAIRN_EXIT_CODE, CAIRN_ERROR, CAIRN_SNAPSHOT_ID, CAIRN_BYTES_ADDED, CAIRN_DURATION;
their output goes to stderr.

With --json, a fatal error is one JSON line on stderr:
{\"code\":N,\"message\":\"...\",\"message_type\":\"error\"}.

Exit codes: 0 success; 1 fatal error, or some entries could not be restored (each named);
2 invalid arguments (see the usage message), or a configuration file that cannot be used;
3 a backup completed but some files could not be read (each named);
10 no repository at the location; 11 the lock could not be taken;
12 wrong password; 130 interrupted.";

/// Cairn: deduplicating, compressed, encrypted backups whose restores run at the speed of the
/// hardware.
#[derive(Parser, Debug)]
#[command(name = "cairn", version, max_term_width = 100, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
pub(crate) struct Global {
    /// Repository location: a local directory, s3:http[s]://HOST[:PORT]/BUCKET[/PREFIX],
    /// sftp:[USER@]HOST[:PORT]:/PATH or cairn+https://HOST:PORT/NAME (a `cairn serve` server)
    #[arg(short = 'r', long = "repo", env = "CAIRN_REPOSITORY", global = true, value_name = "REPO")]
    pub(crate) repo: Option<String>,
    /// SSH private key for sftp: repositories (default: the agent and ssh's default keys)
    #[arg(long, env = "CAIRN_SFTP_KEY", global = true, value_name = "FILE")]
    pub(crate) sftp_key: Option<PathBuf>,
    /// SSH host key check for sftp: repositories: strict (the host must be in known_hosts),
    /// add (trust a new host on first use), accept (trust any host key)
    #[arg(long, env = "CAIRN_SFTP_KNOWN_HOSTS", global = true, value_name = "POLICY", default_value = "strict")]
    pub(crate) sftp_known_hosts: String,
    /// Metadata cache directory (default for remote repositories: $XDG_CACHE_HOME/cairn or
    /// ~/.cache/cairn; local repositories are cached only when this is given)
    #[arg(long, env = "CAIRN_CACHE_DIR", global = true, value_name = "DIR")]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Do not use a metadata cache (even if --cache-dir or CAIRN_CACHE_DIR is set)
    #[arg(long, global = true)]
    pub(crate) no_cache: bool,
    /// Read the repository password from the first line of FILE (CAIRN_PASSWORD takes precedence)
    #[arg(long, env = "CAIRN_PASSWORD_FILE", global = true, value_name = "FILE")]
    pub(crate) password_file: Option<PathBuf>,
    /// Run CMD (with sh -c) and take the first line it prints as the repository password
    /// (CAIRN_PASSWORD takes precedence; before --password-file)
    #[arg(long, env = "CAIRN_PASSWORD_COMMAND", global = true, value_name = "CMD")]
    pub(crate) password_command: Option<String>,
    /// Read the repository location from the first line of FILE (when -r/--repo is not given)
    #[arg(long, env = "CAIRN_REPOSITORY_FILE", global = true, value_name = "FILE")]
    pub(crate) repository_file: Option<PathBuf>,
    /// Run with the settings of profile NAME from the configuration file (default: the
    /// profile named `default`, if the file has one)
    #[arg(short = 'p', long = "use-profile", env = "CAIRN_PROFILE", global = true, value_name = "NAME")]
    pub(crate) use_profile: Option<String>,
    /// Configuration file [default: $XDG_CONFIG_HOME/cairn/cairn.toml or
    /// ~/.config/cairn/cairn.toml, else /etc/cairn/cairn.toml]
    #[arg(long, env = "CAIRN_CONFIG", global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Print machine-readable JSON instead of text (and a fatal error as one JSON line on stderr)
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Show the full context of storage errors (every request and response detail), not only
    /// the one line saying what is wrong
    #[arg(short = 'v', long, global = true)]
    pub(crate) verbose: bool,
    /// Write to the repository at most RATE bytes per second, for every backend (e.g. 20M:
    /// 20 MiB/s; K, M, G binary)
    #[arg(long, env = "CAIRN_LIMIT_UPLOAD", global = true, value_name = "RATE", value_parser = parse_rate)]
    pub(crate) limit_upload: Option<u64>,
    /// Read from the repository at most RATE bytes per second (as --limit-upload)
    #[arg(long, env = "CAIRN_LIMIT_DOWNLOAD", global = true, value_name = "RATE", value_parser = parse_rate)]
    pub(crate) limit_download: Option<u64>,
    /// The token for a cairn+https:// repository, from the first line of FILE
    /// (CAIRN_SERVER_TOKEN takes precedence)
    #[arg(long, env = "CAIRN_SERVER_TOKEN_FILE", global = true, value_name = "FILE")]
    pub(crate) server_token_file: Option<PathBuf>,
    /// The SHA-256 fingerprint of a cairn+https:// server's certificate (as `cairn serve` prints it)
    #[arg(long, env = "CAIRN_SERVER_FINGERPRINT", global = true, value_name = "SHA256")]
    pub(crate) server_fingerprint: Option<String>,
    /// CA certificates (PEM) a cairn+https:// server's certificate must chain to
    #[arg(long, env = "CAIRN_SERVER_CA", global = true, value_name = "FILE")]
    pub(crate) server_ca: Option<PathBuf>,
}

/// A bandwidth limit: bytes per second, with K, M, G or T (binary units); not zero.
fn parse_rate(s: &str) -> Result<u64, String> {
    match cairn_core::engine::platform::parse_size(s) {
        Ok(0) => Err("a limit of 0 bytes per second would never finish".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new repository
    Init(commands::init::Args),
    /// Back up files and directories into a new snapshot
    Backup(commands::backup::Args),
    /// List snapshots (filtered by ID, host, tag or path; the newest N; in groups)
    Snapshots(commands::snapshots::Args),
    /// List the entries of a snapshot: SNAPSHOT[:PATH]
    Ls(commands::ls::Args),
    /// Restore a snapshot (or a path inside it) into a directory
    Restore(commands::restore::Args),
    /// Write a file (raw) or a directory (as a tar stream) from a snapshot to stdout
    Dump(commands::dump::Args),
    /// Manage the key files that unlock the repository
    #[command(subcommand)]
    Key(commands::key::Args),
    /// Remove snapshots by ID or by a retention policy (--keep-*), group by group
    Forget(commands::forget::Args),
    /// Add, remove or replace the tags of snapshots
    Tag(commands::tag::Args),
    /// Check the repository: structure, and with --read-data(-subset) the pack data
    Check(commands::check::Args),
    /// Repair the index, snapshots or damaged packs
    #[command(subcommand)]
    Repair(commands::repair::Args),
    /// Remove stale locks (of processes that are gone), or with --remove-all every lock
    Unlock(commands::unlock::Args),
    /// Delete data no snapshot needs (never blocks a backup)
    Prune(commands::prune::Args),
    /// Store data with another codec (e.g. lz4 for faster restores), removing the old packs
    Recompress(commands::recompress::Args),
    /// Show what was added, removed and changed between two snapshots (or paths in them)
    Diff(commands::diff::Args),
    /// Find files and directories by name or path pattern across snapshots
    Find(commands::find::Args),
    /// Show how big snapshots are: what a restore writes, or the unique data stored
    Stats(commands::stats::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(commands::completions::Args),
    /// Print the manual page, or write one page per command into a directory
    Man(commands::man::Args),
    /// Browse the snapshots as a read-only file system (FUSE) at MOUNTPOINT until Ctrl-C
    Mount(commands::mount::Args),
    /// Serve a file of a snapshot (a disk image) as a Network Block Device export until Ctrl-C
    Nbd(commands::nbd::Args),
    /// Copy snapshots from another repository (--from-repo) into this one
    Copy(commands::copy::Args),
    /// Show the configuration: `config show` prints the effective settings and where each came from
    #[command(subcommand)]
    Config(commands::config::Args),
    /// Serve repositories to many hosts over HTTPS, with tokens that may read, append or administer
    Serve(commands::serve::Args),
    /// Run the profiles' jobs on their schedules, with metrics, alerts and a web interface
    Agent(commands::agent::Args),
}

impl Cli {
    /// `--json` was given (or set by the profile).
    pub fn json(&self) -> bool {
        self.global.json
    }

    /// `--verbose` was given.
    pub fn verbose(&self) -> bool {
        self.global.verbose
    }
}

/// Runs the command; returns the exit code.
pub fn run(mut cli: Cli) -> Result<ExitCode> {
    crate::password::resolve(&mut cli.global)?;
    let g = &cli.global;
    match cli.command {
        Command::Init(a) => commands::init::run(g, a),
        Command::Backup(a) => commands::backup::run(g, a),
        Command::Snapshots(a) => commands::snapshots::run(g, a),
        Command::Ls(a) => commands::ls::run(g, a),
        Command::Restore(a) => commands::restore::run(g, a),
        Command::Dump(a) => commands::dump::run(g, a),
        Command::Key(a) => commands::key::run(g, a),
        Command::Unlock(a) => commands::unlock::run(g, a),
        Command::Forget(a) => commands::forget::run(g, a),
        Command::Tag(a) => commands::tag::run(g, a),
        Command::Check(a) => commands::check::run(g, a),
        Command::Repair(a) => commands::repair::run(g, a),
        Command::Prune(a) => commands::prune::run(g, a),
        Command::Recompress(a) => commands::recompress::run(g, a),
        Command::Diff(a) => commands::diff::run(g, a),
        Command::Find(a) => commands::find::run(g, a),
        Command::Stats(a) => commands::stats::run(g, a),
        Command::Completions(a) => commands::completions::run(a),
        Command::Man(a) => commands::man::run(a),
        Command::Mount(a) => commands::mount::run(g, a),
        Command::Nbd(a) => commands::nbd::run(g, a),
        Command::Copy(a) => commands::copy::run(g, a),
        Command::Config(a) => commands::config::run(g, a),
        Command::Serve(a) => commands::serve::run(g, a),
        Command::Agent(a) => commands::agent::run(g, a),
    }
}
