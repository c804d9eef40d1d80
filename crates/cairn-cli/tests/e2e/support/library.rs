//! Every path into the library that the end-to-end tests use, in one place: the tests name
//! `crate::support::library::MODULE::ITEM`, so when a module of the library moves (to another
//! crate, or below another module) only these lines change.

pub use cairn_core::Result;
pub use cairn_core::{engine::platform, engine::repository, engine::storage};
pub use cairn_format::{compress, config, crypto, hint, id, index, keyfile, layout, pack, sealed, snapshot, tree};
