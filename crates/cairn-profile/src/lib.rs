//! Cairn's configuration file: named profiles in TOML.
//!
//! ```toml
//! [profile.base]
//! repo = "sftp:backup@nas:/srv/cairn"
//! password-command = "pass show cairn"
//!
//! [profile.laptop]
//! inherit = "base"
//! [profile.laptop.backup]
//! paths = ["/home/me"]
//! exclude = ["/home/me/.cache"]
//! [profile.laptop.forget]
//! keep-daily = 7
//! ```
//!
//! The keys a profile may hold are given by a [`Schema`] (the `cairn` binary builds it from its
//! command line definition, so a profile can set exactly what a command line can). The file is
//! checked against it as a whole: an unknown key or a value of the wrong type is an [`Error`]
//! naming the file, the line, the key, what was expected and the closest valid key. Every value
//! keeps its [`Origin`] (file and line), through inheritance too.
//!
//! Hooks (`[profile.NAME.hooks]`, `[profile.NAME.COMMAND.hooks]`) have their schema here
//! ([`hooks_section`]) and are read out typed ([`Profile::hooks`]); running them is the
//! library's (cairn-core's `engine::hooks`).
//!
//! No I/O: the caller reads the file and passes its text.

mod error;
mod parse;
mod schema;
mod suggest;

pub use error::Error;
pub use parse::{parse_duration, Config, HookSettings, Origin, Profile, Setting, Value};
pub use schema::{hooks_section, Key, Kind, Schema, Section, HOOKS};
pub use suggest::closest;

/// The key of a profile naming the profile it inherits from.
pub const INHERIT: &str = "inherit";
