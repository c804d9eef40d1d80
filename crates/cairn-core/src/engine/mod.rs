//! The engine: what every command is built from. Storage and the repository at the bottom, then
//! the one read path, the one pack writer, the tree loader and walker; memory budgets and the
//! metadata cache beside them.

pub mod blobset;
pub mod cache;
pub mod chunker;
pub mod hooks;
pub mod lock;
pub mod memory;
pub mod open;
pub mod packwrite;
pub(crate) mod parallel;
pub mod platform;
pub mod preload;
pub mod profile;
pub mod read;
pub mod repository;
pub mod select;
pub mod signal;
pub mod snapshot_name;
pub mod sorted_index;
pub mod storage;
pub mod trees;
pub mod unreadable;
