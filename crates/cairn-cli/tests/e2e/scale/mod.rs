//! Many files: a restore ([`restore`]) and a backup ([`backup`]) of hundreds of thousands of
//! files, their peak memory and their batches.

mod backup;
mod restore;
