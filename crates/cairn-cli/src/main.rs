//! `cairn`: a thin front end to cairn-core. It parses arguments, finds the password, prints
//! results and maps errors to exit codes (0 success, 1 fatal error, 2 invalid arguments, 3 some files unreadable).

/// `println!` for what cairn prints on stdout: a closed pipe ends the process as it would a
/// Unix filter (see [`output::line`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

mod cli;
mod commands;
mod output;
mod password;
mod progress;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // SIGPIPE stays ignored (Rust's default): a write to a pipe whose reader is gone — an `ssh`
    // process of an SFTP connection that exited — is then an error the storage layer reports
    // or retries, not the silent end of the process. Only stdout's reader going away ends
    // cairn by SIGPIPE, as it would a Unix filter (`output::line`).
    limit_malloc_arenas();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            let mut line = output::one_line(&e);
            // The library names no flags; where the location came from is the CLI's to say.
            if let Some(cairn_core::Error::NoRepository(_)) = e.downcast_ref::<cairn_core::Error>() {
                line.push_str(" (the location comes from -r/--repo or CAIRN_REPOSITORY)");
            }
            eprintln!("cairn: {line}");
            ExitCode::from(1)
        }
    }
}

/// glibc gives each thread that allocates its own arena and keeps freed memory in it, so a
/// restore's peak RSS grew far past `--max-memory` (small data set, `--max-memory 16M`: 97 MiB
/// with the default, 59 MiB with two arenas, at the same CPU time; docs/DESIGN.md).
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: a malloc tunable, set before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
