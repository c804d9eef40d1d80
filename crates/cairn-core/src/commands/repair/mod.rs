//! `cairn repair`: bring a damaged repository back to a state `check` finds whole, never
//! deleting anything that can still be read.
//!
//! - `index.rs`: rebuild the index from the pack headers, keeping what good index files say.
//! - `snapshots.rs`: new snapshots whose files needing missing blobs are cut to what can be read
//!   and whose unreadable directories are emptied.
//! - `packs.rs`: copy the readable blobs of damaged packs into new packs, then drop the packs.
//! - `unreadable.rs`: remove the snapshots, key files, hint and deletion manifests that cannot
//!   be read.

mod index;
mod packs;
mod snapshots;
mod unreadable;

pub use index::{repair_index, IndexRepair};
pub use packs::{find_packs, repair_packs, PackRepair};
pub use snapshots::{repair_snapshots, SnapshotRepair};
pub use unreadable::{may_delete, repair_unreadable, UnreadableRepair};
