//! `cairn`: a thin front end to cairn-core. It parses arguments, finds the password, prints
//! results and maps errors to exit codes (0 success, 1 fatal error, 2 invalid arguments, 3 some files unreadable,
//! 10 no repository, 11 locked, 12 wrong password, 130 interrupted).

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
mod profile;
mod progress;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // SIGPIPE stays ignored (Rust's default): a write to a pipe whose reader is gone — an `ssh`
    // process of an SFTP connection that exited — is then an error the storage layer reports
    // or retries, not the silent end of the process. Only stdout's reader going away ends
    // cairn by SIGPIPE, as it would a Unix filter (`output::line`).
    limit_malloc_arenas();
    let argv = match profile::apply(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("cairn: {}", output::one_line(&e));
            return ExitCode::from(2);
        }
    };
    let args = cli::Cli::parse_from(argv);
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            let mut line = output::one_line(&e);
            // The library names no flags; where the location came from is the CLI's to say.
            if let Some(cairn_core::Error::NoRepository(_)) = e.downcast_ref::<cairn_core::Error>() {
                line.push_str(" (the location comes from -r/--repo or CAIRN_REPOSITORY)");
            }
            eprintln!("cairn: {line}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The exit code of a failed command: restic's for the failures scripts test for (10 no
/// repository at the location, 11 the lock could not be taken, 12 wrong password), else 1.
fn exit_code(e: &anyhow::Error) -> u8 {
    use cairn_core::Error as E;
    match e.chain().find_map(|c| c.downcast_ref::<E>()) {
        Some(E::NoRepository(_)) => 10,
        Some(E::Locked { .. }) => 11,
        Some(E::WrongPassword { .. } | E::WrongPasswordOrDamagedKey { .. }) => 12,
        _ => 1,
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
