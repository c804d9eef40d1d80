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
mod hooks;
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
    // A repository object a command skips (it cannot be read) is said once, on stderr.
    cairn_core::engine::unreadable::set_handler(|text| eprintln!("warning: {text}"));
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let json = argv.iter().any(|a| a == "--json");
    let argv = match profile::apply(argv) {
        Ok(argv) => argv,
        Err(e) => {
            report(&output::one_line(&e), 2, json);
            return ExitCode::from(2);
        }
    };
    let args = cli::Cli::parse_from(argv);
    let (json, verbose) = (args.json(), args.verbose());
    let hooks = hooks::Run::for_command();
    let result = match hooks.as_ref().map(hooks::Run::before) {
        Some(Err(e)) => Err(e.into()),
        _ => cli::run(args),
    };
    let failed = result.as_ref().err().map(|e| (exit_code(e), error_line(e, verbose)));
    if let Some(h) = &hooks {
        let code = match (&result, &failed) {
            (Ok(code), _) => output::exit_code_number(*code),
            (Err(_), Some((code, _))) => *code,
            (Err(_), None) => 1,
        };
        h.after(code, failed.as_ref().map(|(_, line)| line.clone()));
    }
    match (result, failed) {
        (Ok(code), _) => code,
        (Err(_), Some((code, line))) => {
            report(&line, code, json);
            ExitCode::from(code)
        }
        (Err(_), None) => ExitCode::FAILURE,
    }
}

/// The line a fatal error is shown as. The library names no flags: where the location came from
/// is the CLI's to say. Without `verbose`, a storage error is its one line saying what is wrong,
/// without the backend's context.
fn error_line(e: &anyhow::Error, verbose: bool) -> String {
    let mut line = if verbose { output::one_line(e) } else { output::short_line(e) };
    if let Some(cairn_core::Error::NoRepository(_)) = e.downcast_ref::<cairn_core::Error>() {
        line.push_str(" (the location comes from -r/--repo or CAIRN_REPOSITORY)");
    }
    line
}

/// Prints a fatal error on stderr: `cairn: LINE`, or with `--json` the one JSON object of
/// docs/JSON.md's `error` schema.
fn report(line: &str, code: u8, json: bool) {
    if json {
        use cairn_core::commands::json;
        eprintln!("{}", json::line(&json::ErrorLine::new(code, line)));
    } else {
        eprintln!("cairn: {line}");
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
