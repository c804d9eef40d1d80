//! Restoring: exact round trips of generated trees ([`roundtrip`]), the restore engine's
//! choices and failures ([`engine`]), and restores that reuse the data of local files
//! ([`local_data`]).

mod disk_index;
mod engine;
mod local_data;
mod roundtrip;
