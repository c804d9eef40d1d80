//! A Network Block Device server for Cairn's exports (`cairn nbd`, `cairn restore --live`).
//!
//! - [`proto`]: the protocol's bytes (handshake options, requests, replies), pure functions
//!   the fuzz target drives;
//! - [`server`]: one connection — the fixed newstyle handshake (`NBD_OPT_GO`, `NBD_OPT_INFO`,
//!   structured replies, `base:allocation`), then requests answered by a pool of workers, over
//!   any [`server::Export`];
//! - [`overlay`]: writes kept in a sparse copy-on-write file over a read-only export, and the
//!   copy of an export into a plain image file;
//! - [`live`]: a live restore's target served while the restore fills it, with the blocks
//!   present tracked in a state file beside it;
//! - [`net`]: the TCP or Unix socket listener.
//!
//! It depends on nothing but `std`: what serves the bytes (a file in a snapshot, read through
//! Cairn's read path) is the caller's [`server::Export`].

pub mod live;
pub mod net;
pub mod overlay;
pub mod proto;
pub mod server;

pub use live::Live;
pub use net::{Listen, Server, Stopper};
pub use overlay::{copy_to_file, Overlay};
pub use proto::Extent;
pub use server::{Config, Export};
