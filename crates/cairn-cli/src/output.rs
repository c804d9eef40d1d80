//! Formatting for people: sizes, rates, one-line errors; and lines written to stdout.

use std::io::Write;

/// Writes one line to stdout (what [`outln!`] expands to). When stdout's reader has gone
/// (`cairn ls | head`), ends the process by SIGPIPE, quietly, as `ls` or `cat` would.
pub fn line(args: std::fmt::Arguments<'_>) {
    if let Err(e) = writeln!(std::io::stdout().lock(), "{args}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            end_by_sigpipe();
        }
        panic!("failed printing to stdout: {e}");
    }
}

/// Ends the process by SIGPIPE (the reader of stdout is gone).
pub fn end_by_sigpipe() -> ! {
    // SAFETY: restores the default disposition of one signal and raises it; the default action
    // ends the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

/// Whether an error comes from writing to a pipe whose reader is gone.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Formats a byte count with binary units, two decimals.
pub fn bytes(n: u64) -> String {
    cairn_core::engine::platform::format_scaled(n, &["B", "KiB", "MiB", "GiB", "TiB", "PiB"], 2)
}

/// Formats a rate in MiB/s.
pub fn rate(bytes: u64, secs: f64) -> String {
    format!("{:.0} MiB/s", bytes as f64 / (1024.0 * 1024.0) / secs.max(1e-6))
}

/// Groups digits by thousands: 78579 → "78,579".
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An error and its causes on one line.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ").replace('\n', " ")
}

/// An error on one line for a person: its causes down to a failure of the location itself,
/// whose backend context (every request and response detail of OpenDAL's) is left for
/// `--verbose`.
pub fn short_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        if matches!(cause.downcast_ref::<cairn_core::Error>(), Some(cairn_core::Error::Unreachable { .. })) {
            break;
        }
    }
    parts.join(": ").replace('\n', " ")
}

/// The number of an exit code (std's type keeps it to itself).
pub fn exit_code_number(code: std::process::ExitCode) -> u8 {
    (0..=u8::MAX).find(|&n| std::process::ExitCode::from(n) == code).unwrap_or(1)
}

/// How a child process ended: `exit status N` or `killed by signal N (NAME)`.
pub fn exit_status(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}
