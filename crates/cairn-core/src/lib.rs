//! # Cairn
//!
//! Deduplicating, compressed, encrypted backups whose restores run at the speed of the
//! hardware. This crate does all the work; the `cairn` binary is a thin front end.
//!
//! Two floors, each using only the floors below it (`scripts/floors` checks):
//!
//! - [`engine`]: storage, the repository (open, lock, keys, index), the one read path, the one
//!   pack writer, the tree loader and walker, memory budgets, the metadata cache. It reads and
//!   writes the objects of the format crate, `cairn_format`, below it (docs/FORMAT.md).
//! - [`commands`]: one module or folder per command, each a function of the engine.
//!
//! ```text
//! backup:  walk → read → chunk → store → packer → upload → commit   (commands/backup/)
//! reading: plan reads → fetch → decode/verify → a caller's sink     (engine/read/; engine/trees.rs)
//! restore: plan → compare → create → [read path] → write → finish   (commands/restore/)
//! copy:    select → plan → transfer ([read path] → pack writer) → rewrite → snapshots (commands/copy/)
//! ```
//!
//! Start with [`engine::repository::Repository::open`], then [`commands::backup::backup`] or
//! [`commands::restore::restore`].

#![warn(missing_docs)]

pub mod commands;
pub mod engine;
pub mod error;

pub use error::{Error, Result};
