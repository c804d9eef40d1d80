//! The commands: one module or folder per command, each a function of the engine that the CLI
//! calls with options and whose report it prints.

pub mod backup;
pub mod check;
pub mod copy;
pub mod diff;
pub mod dump;
pub mod find;
pub mod forget;
pub mod json;
pub mod prune;
pub mod repair;
pub mod restore;
pub mod stats;
pub mod tag;
