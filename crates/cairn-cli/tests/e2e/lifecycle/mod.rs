//! A repository's life after its backups: `forget` and `tag` ([`forget`]), `prune`
//! ([`prune`]) and the keys that open it ([`keys`]).

mod forget;
mod keys;
mod prune;
