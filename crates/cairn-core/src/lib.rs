//! # Cairn
//!
//! Deduplicating, compressed, encrypted backups whose restores run at the speed of the
//! hardware. This crate does all the work; the `cairn` binary is a thin front end.
//!
//! The on-storage format is specified byte by byte in `docs/FORMAT.md`; each module that reads
//! or writes it cites its section.
//!
//! ```text
//! backup:  walk → read → chunk → store → packer → upload → commit   (backup/)
//! reading: plan reads → fetch → decode/verify → a caller's sink     (read/; trees.rs loads trees)
//! restore: plan → compare → create → [read path] → write → finish   (restore/)
//! copy:    select → plan → transfer ([read path] → pack writer) → rewrite → snapshots (copy/)
//! ```
//!
//! Start with [`repository::Repository::open`], then [`backup::backup`] or
//! [`restore::restore`].

#![warn(missing_docs)]

pub mod backup;
pub mod blobset;
pub mod cache;
pub mod check;
pub mod chunker;
pub mod compress;
pub mod config;
pub mod copy;
pub mod crypto;
pub mod deletion;
pub mod diff;
pub mod error;
pub mod find;
pub mod forget;
pub mod hint;
pub mod id;
pub mod index;
pub mod keyfile;
pub mod layout;
pub mod lock;
pub mod memory;
pub mod pack;
pub mod packwrite;
pub(crate) mod parallel;
pub mod platform;
pub mod preload;
pub mod profile;
pub mod prune;
pub mod read;
pub mod repair;
pub mod repository;
pub mod restore;
pub mod sealed;
pub mod select;
pub mod signal;
pub mod snapshot;
pub mod stats;
pub mod storage;
pub mod tag;
pub mod tree;
pub mod trees;

pub use error::{Error, Result};

/// Internals that the fuzz targets (`fuzz/`) and property tests exercise directly. Not a stable
/// interface.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::restore::chunk_offsets;
}
