//! `cairn dump`: write a file or a directory (as tar) from a snapshot to stdout.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;

use cairn_core::engine::open::{self, Opened, OpenedSnapshot};

use super::{options, repository, split_spec, FilterArgs, Global};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Snapshot (`latest` or an ID prefix) and the absolute PATH inside it (`/` for everything)
    #[arg(value_name = "SNAPSHOT:PATH")]
    pub snapshot: std::ffi::OsString,
    /// Blobs fetched and decoded at once [default: as for restore]
    #[arg(long, value_name = "N")]
    pub fetch_concurrency: Option<usize>,
    /// Cap on the whole dump's memory, as for restore: the index, a batch of entries, the trees
    /// read ahead and the data in flight, e.g. 64M
    #[arg(long, value_name = "SIZE", default_value = "256M")]
    pub max_memory: String,
    #[command(flatten)]
    pub filters: FilterArgs,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let (name, path) = split_spec(&a.snapshot)?;
    let (storage, pw) = repository(g)?;
    let filter = a.filters.filter(&[]);
    let OpenedSnapshot { opened: Opened { repo, lock: _lock }, id, snapshot: snap } =
        open::open_snapshot(storage, &pw, name, &filter, options(g))?;
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        bail!("refusing to write a dump to a terminal: redirect stdout to a file or a pipe");
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let max_memory = super::parse_size(&a.max_memory)?;
    let path = path.unwrap_or(std::path::Path::new("/"));
    let written =
        cairn_core::commands::dump::dump(&repo, &snap, &id.short(), path, &mut out, a.fetch_concurrency, max_memory)
            .map_err(|e| anyhow::Error::from(filter.explain_not_found(&repo, name, e)))
            .and_then(|_| out.flush().context("cannot write to stdout"));
    match written {
        // `cairn dump … | tar -t` whose reader stopped: end as a filter would.
        Err(e) if crate::output::is_broken_pipe(&e) => crate::output::end_by_sigpipe(),
        Err(e) => Err(e),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}
