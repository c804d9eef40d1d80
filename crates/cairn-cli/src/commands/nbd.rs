//! `cairn nbd`: serve one file of a snapshot (a disk image) as a Network Block Device export
//! until Ctrl-C or SIGTERM; or, with `--commit-to`, write it (and its overlay) to a plain image.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;

use cairn_core::engine::open::{self, Opened, OpenedSnapshot};

use super::{options, parse_size, repository, split_spec, FilterArgs, Global, NbdServer};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Snapshot (`latest` or an ID prefix) and the absolute PATH of a regular file inside it
    #[arg(value_name = "SNAPSHOT:PATH")]
    pub snapshot: std::ffi::OsString,
    /// TCP address to listen on [default: 127.0.0.1:10809 unless --socket]
    #[arg(long, value_name = "ADDR", conflicts_with = "socket")]
    pub listen: Option<String>,
    /// Unix socket to listen on instead of TCP
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Take writes, kept in the copy-on-write --overlay file (the snapshot is never changed)
    #[arg(long, requires = "overlay")]
    pub writable: bool,
    /// Overlay file of --writable (sparse; created if missing, reused if made for this export)
    #[arg(long, value_name = "FILE")]
    pub overlay: Option<PathBuf>,
    /// Write the file, with the --overlay's writes applied, to a new plain image FILE and exit
    #[arg(long, value_name = "FILE", conflicts_with_all = ["listen", "socket", "writable"])]
    pub commit_to: Option<PathBuf>,
    /// Reads in flight while reading ahead [default: as for mount]
    #[arg(long, value_name = "N")]
    pub fetch_concurrency: Option<usize>,
    /// Cap on decoded data held: half caches blobs, half is read ahead, e.g. 512M
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub max_memory: String,
    #[command(flatten)]
    pub filters: FilterArgs,
}

/// Requests one connection answers at once (a client's queue depth, up to this, is served in
/// parallel).
const WORKERS: usize = 32;

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let (name, path) = split_spec(&a.snapshot)?;
    let Some(path) = path else { bail!("give the file to export as SNAPSHOT:PATH, e.g. latest:/vm/disk.img") };
    if a.overlay.is_some() && !a.writable && a.commit_to.is_none() {
        bail!("--overlay is the file --writable writes to (or --commit-to reads): add --writable");
    }
    let max_memory = parse_size(&a.max_memory)?;
    let (storage, pw) = repository(g)?;
    let filter = a.filters.filter(&[]);
    let OpenedSnapshot { opened: Opened { repo, lock: _lock }, id, snapshot } =
        open::open_snapshot(storage, &pw, name, &filter, options(g))?;
    let opts = cairn_mount::DiskOptions {
        max_memory,
        fetch_concurrency: a.fetch_concurrency.unwrap_or(repo.storage().default_concurrency()).max(1),
        decode_threads: cairn_core::engine::platform::cores(),
    };
    let export = cairn_mount::nbd_export(repo, &id, &snapshot, path, &opts, a.overlay.as_deref())?;
    if let Some(out) = &a.commit_to {
        let written = cairn_nbd::copy_to_file(&*export, out, 4 << 20)
            .with_context(|| format!("cannot write the image {}", out.display()))?;
        eprintln!("cairn: wrote {} ({} bytes of data, the rest holes)", out.display(), written);
        return Ok(ExitCode::SUCCESS);
    }
    let nbd = NbdServer::bind(a.socket.clone(), a.listen.clone())?;
    let server = &nbd.server;
    let export_name = path.to_string_lossy().into_owned();
    eprintln!(
        "cairn: serving {} of snapshot {} ({} bytes, {}) at {}; Ctrl-C stops",
        path.display(),
        id.short(),
        export.size(),
        if export.writable() { "writes to the overlay" } else { "read-only" },
        server.uri()
    );
    let config = cairn_nbd::Config { name: export_name, workers: WORKERS };
    let served = server.run(&*export, &config, &|e| eprintln!("cairn nbd: a client's connection ended: {e}"));
    nbd.close();
    served.context("the NBD server failed")?;
    export.flush().context("cannot sync the overlay file")?;
    eprintln!("cairn: stopped serving {}", path.display());
    Ok(ExitCode::SUCCESS)
}
