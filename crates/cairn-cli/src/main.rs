//! `cairn`: a thin front end to cairn-core. It parses arguments, finds the password, prints
//! results and maps errors to exit codes (0 success, 1 fatal error, 3 some files unreadable).

mod cli;
mod output;
mod password;
mod progress;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Like every Unix filter: a closed pipe (`cairn ls … | head`) ends the process quietly
    // instead of failing the next write with EPIPE.
    // SAFETY: resetting a signal disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn: {}", output::one_line(&e));
            ExitCode::from(1)
        }
    }
}
