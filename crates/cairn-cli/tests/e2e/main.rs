//! Cairn's end-to-end tests: one test binary that runs the `cairn` command (and, where a test
//! needs to look inside a repository, the library) against real repositories on disk, in MinIO
//! and behind sshd.
//!
//! Each module is named after what a user does; [`support`] holds what they share: one
//! [`support::Fixture`] (a temporary directory, a source directory, a repository and the `cairn`
//! binary), the tree builder, the scan-and-compare helpers and the private MinIO and sshd.
//!
//! Run one area with `cargo test -p cairn-cli --test e2e restore::`, one test by its name.

mod support;

mod agent;
mod backup;
mod bad_input;
mod browse;
mod check_repair;
mod choosing;
mod copy;
mod golden;
mod json_schema;
mod lifecycle;
mod limits;
mod live_restore;
mod mount;
mod nbd;
mod profiles;
mod remote;
mod restore;
mod scale;
mod serve;
mod startup_latency;
mod trust;
