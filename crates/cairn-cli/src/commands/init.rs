//! `cairn init`: create a new repository.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use cairn_core::commands::json;
use cairn_core::engine::repository::{InitOptions, Repository};
use cairn_format::keyfile::KdfParams;
use clap::Args as ClapArgs;

use super::{parse_codec, storage, Global};
use crate::password;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Default compression for new data: auto, none, lz4, zstd or zstd:LEVEL
    #[arg(long, default_value = "auto", value_name = "CODEC")]
    pub compression: String,
    /// Target pack size in MiB
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pub pack_size: u32,
    /// Content-defined chunk sizes in bytes: MIN,AVG,MAX (not with --copy-chunker-params, which
    /// takes the source's)
    #[arg(
        long,
        default_value = "524288,1048576,8388608",
        value_name = "MIN,AVG,MAX",
        conflicts_with = "copy_chunker_params"
    )]
    pub chunk_sizes: String,
    /// Argon2id memory cost of the key file, in KiB
    #[arg(long, default_value_t = KdfParams::default().memory_kib, value_name = "KIB")]
    pub kdf_memory: u32,
    /// Argon2id passes of the key file
    #[arg(long, default_value_t = KdfParams::default().iterations, value_name = "N")]
    pub kdf_iterations: u32,
    /// Argon2id lanes of the key file (computed on all cores at once)
    #[arg(long, default_value_t = KdfParams::default().parallelism, value_name = "N")]
    pub kdf_parallelism: u32,
    /// Use the chunker parameters and blob-ID key of the --from-repo repository, so that
    /// `cairn copy` from it deduplicates against this repository's own backups
    #[arg(long, requires = "from_repo")]
    pub copy_chunker_params: bool,
    #[command(flatten)]
    pub from: super::copy::FromRepoArgs,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let sizes: Vec<u32> = a
        .chunk_sizes
        .split(',')
        .map(|s| s.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .context("--chunk-sizes wants three byte counts MIN,AVG,MAX")?;
    let [min, avg, max] = sizes[..] else { bail!("--chunk-sizes wants three byte counts MIN,AVG,MAX") };
    let opts = InitOptions {
        kdf: KdfParams { memory_kib: a.kdf_memory, iterations: a.kdf_iterations, parallelism: a.kdf_parallelism },
        chunk_sizes: (min, avg, max),
        pack_size: a.pack_size.checked_mul(1024 * 1024).context("--pack-size is too large")?,
        compression: parse_codec(&a.compression)?,
        chunking: None,
    };
    let opts = if a.copy_chunker_params {
        InitOptions { chunking: Some(a.from.open(g, "--copy-chunker-params", None)?.0.chunking()), ..opts }
    } else {
        if a.from.repo.is_some() {
            bail!("--from-repo is only used with --copy-chunker-params; add it, or leave --from-repo out");
        }
        opts
    };
    let storage = storage(g)?;
    let pw = password::get(g.password_file.as_deref(), "CAIRN_PASSWORD", "new repository password", true)?;
    let repo = Repository::init(storage.clone(), &pw, &opts)?;
    if g.json {
        outln!("{}", json::line(&json::Initialized::new(&repo.config().id, storage.location())));
    } else {
        outln!("created cairn repository {} at {}", &repo.config().id[..8], storage.location());
        outln!("Keep the password safe: without it the data cannot be read.");
    }
    Ok(ExitCode::SUCCESS)
}
