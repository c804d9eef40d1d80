//! # Cairn's repository format
//!
//! Every object Cairn keeps on storage, one module each, encoded, decoded and verified exactly
//! as `docs/FORMAT.md` specifies (each module cites its section). Nothing here does I/O: the
//! functions take and return bytes, so the fuzz targets (`fuzz/`) and the golden-vector tests
//! depend on this crate alone. `cairn-core` reads and writes these objects through storage.
//!
//! | module | what | FORMAT.md |
//! | --- | --- | --- |
//! | [`layout`] | where each kind of object lives, how names are parsed and checked | §1 |
//! | [`config`] | the repository's config | §6 |
//! | [`keyfile`] | key files: the master key wrapped under a password | §3 |
//! | [`crypto`] | keys, sealing, object keys | §3 |
//! | [`id`] | typed IDs (BLAKE3 of plaintext or of stored bytes) | §2 |
//! | [`compress`] | codecs (none, lz4, zstd) | §5 |
//! | [`pack`] | packs and their blob entries | §7 |
//! | [`index`] | index files | §8 |
//! | [`tree`] | trees (directories) and their nodes | §9 |
//! | [`snapshot`] | snapshots | §10 |
//! | [`sealed`] | sealed metadata files | §4 |
//! | [`deletion`] | deletion manifests (prune beside backups) | §13 |
//! | [`lock`] | lock objects | §12 |
//! | [`hint`] | the start hint | §14 |
//! | [`protocol`] | the server protocol's requests: routes, names, headers | §15 |
//! | [`sorted`] | the sorted index file a command keeps on this machine (not a repository object) | §17 |

#![warn(missing_docs)]

pub mod compress;
pub mod config;
pub mod crypto;
pub mod deletion;
pub mod error;
pub mod hint;
pub mod id;
pub mod index;
pub mod keyfile;
pub mod layout;
pub mod lock;
pub mod pack;
pub mod protocol;
pub mod sealed;
pub mod snapshot;
pub mod sorted;
pub mod tree;

pub use error::{Error, Result};
