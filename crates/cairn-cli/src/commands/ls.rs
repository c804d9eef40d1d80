//! `cairn ls`: list the entries of a snapshot.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cairn_core::commands::json;
use cairn_format::tree::{Node, NodeKind};
use clap::Args as ClapArgs;

use super::{open, split_spec, FilterArgs, Global, WalkMemory};
use crate::output;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Snapshot (`latest` or an ID prefix), optionally with :PATH inside it
    #[arg(value_name = "SNAPSHOT[:PATH]")]
    pub snapshot: std::ffi::OsString,
    /// Long listing: mode (`-rw-r--r--`), owner, group, size in binary units, modification time
    #[arg(short, long)]
    pub long: bool,
    /// With --long, sizes in bytes instead of binary units
    #[arg(long, requires = "long")]
    pub bytes: bool,
    #[command(flatten)]
    pub memory: WalkMemory,
    #[command(flatten)]
    pub filters: FilterArgs,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let repo = open(g)?;
    repo.load_index()?;
    let (spec, path) = split_spec(&a.snapshot)?;
    let filter = a.filters.filter(&[]);
    let (id, snap) = filter.find(&repo, spec)?;
    let base = path.and_then(cairn_core::engine::trees::below_root).unwrap_or(Path::new("/"));
    let found = cairn_core::engine::trees::resolve(&repo, &snap.tree, base, &id.short());
    let start = match found.map_err(|e| filter.explain_not_found(&repo, spec, e))? {
        None => snap.tree,
        Some(node) if node.kind == NodeKind::Dir => node.subtree.context("directory without a subtree")?,
        Some(node) => {
            print_node(g, &a, base, &node);
            return Ok(ExitCode::SUCCESS);
        }
    };
    let threads = a.memory.shares(&repo, 0)?.threads;
    cairn_core::engine::trees::walk(&repo, start, base, threads, |path, node| {
        print_node(g, &a, path, node);
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn print_node(g: &Global, a: &Args, path: &Path, n: &Node) {
    if g.json {
        outln!("{}", json::line(&json::NodeEntry::new(path, n)));
    } else if a.long {
        let owner = if n.user.is_empty() { n.uid.to_string() } else { n.user.clone() };
        let group = if n.group.is_empty() { n.gid.to_string() } else { n.group.clone() };
        let size = if a.bytes { n.size.to_string() } else { output::bytes(n.size) };
        let mut line = format!(
            "{} {owner:>8} {group:>8} {size:>10} {} {}",
            json::mode_string(n.kind, n.mode),
            cairn_core::engine::platform::format_local(n.mtime),
            path.display()
        );
        if n.kind == NodeKind::Symlink {
            line.push_str(&format!(" -> {}", String::from_utf8_lossy(&n.target)));
        }
        outln!("{line}");
    } else {
        outln!("{}", path.display());
    }
}
