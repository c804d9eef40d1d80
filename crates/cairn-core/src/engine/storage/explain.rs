//! Backends' failures of the location itself (the host cannot be reached, no such bucket, the
//! credentials or the SSH key refused, an unknown host key) as one line a person can act on:
//! what is wrong, where, and what to do. The backend's full context (OpenDAL's request, response
//! headers and body) stays the error's source, for `--verbose` and the log
//! ([`Error::Unreachable`]).

use crate::error::Error;

/// Every message of `e` and its causes, with their debug forms (where a backend keeps the
/// server's error code), for matching.
pub(crate) fn full_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("{e} {e:?}");
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(&format!(" | {c} {c:?}"));
        cause = c.source();
    }
    out
}

/// Whether `e` says the storage is out of space: a full disk or quota of a local or SFTP
/// directory (ENOSPC, EDQUOT), or an S3 server out of drive space (MinIO's
/// `XMinioStorageFull`, HTTP 507).
pub fn storage_full(e: &Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
                || io.kind() == std::io::ErrorKind::StorageFull
            {
                return true;
            }
        }
        cause = c.source();
    }
    let text = full_text(e);
    ["No space left on device", "Disk quota exceeded", "StorageFull", "Insufficient Storage"]
        .iter()
        .any(|w| text.contains(w))
}

/// A failure to reach `host_port` at all (refused, no such host, unreachable, timed out); `what`
/// names the server for the advice (`the S3 server`, `sshd`).
pub(crate) fn connection(text: &str, host: &str, host_port: &str, what: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    if lower.contains("connection refused") {
        return Some(format!(
            "cannot connect to {host_port}: connection refused: check that {what} runs there and the port is right"
        ));
    }
    let no_such_host = [
        "failed to lookup address",
        "name or service not known",
        "could not resolve hostname",
        "no address associated",
        "temporary failure in name resolution",
        "nodename nor servname",
        "dns error",
    ];
    if no_such_host.iter().any(|s| lower.contains(s)) {
        return Some(format!("no such host `{host}`: check the name in the location"));
    }
    if lower.contains("no route to host") || lower.contains("network is unreachable") {
        return Some(format!("cannot connect to {host_port}: no route to the host: check the address and the network"));
    }
    if lower.contains("connection timed out") || lower.contains("operation timed out") {
        return Some(format!("cannot connect to {host_port}: timed out: check the address, the network and firewalls"));
    }
    None
}

/// The S3 failures of the bucket and credentials at `endpoint`.
pub(crate) fn s3(text: &str, endpoint: &str, bucket: &str) -> Option<String> {
    if text.contains("NoSuchBucket") {
        return Some(format!("no bucket `{bucket}` at {endpoint}: create it first, or correct the bucket's name"));
    }
    if text.contains("InvalidBucketName") {
        let why = bucket_name_problem(bucket).unwrap_or("the server does not accept it");
        return Some(format!("`{bucket}` is not a valid bucket name: {why}"));
    }
    let credentials = ["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "status: 403"];
    if credentials.iter().any(|c| text.contains(c)) {
        let code = credentials[..3].iter().find(|c| text.contains(**c)).map(|c| format!(", {c}")).unwrap_or_default();
        return Some(format!(
            "S3 at {endpoint} refused the credentials (403{code}): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
             and that they may use bucket `{bucket}`"
        ));
    }
    None
}

/// Why `bucket` breaks S3's naming rules, if it does: 3 to 63 characters of lowercase letters,
/// digits, dots and hyphens, beginning and ending with a letter or digit, not an IP address.
pub fn bucket_name_problem(bucket: &str) -> Option<&'static str> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if bucket.len() < 3 {
        return Some("bucket names are at least 3 characters long");
    }
    if bucket.len() > 63 {
        return Some("bucket names are at most 63 characters long");
    }
    if bucket.chars().any(|c| c.is_ascii_uppercase()) {
        return Some("bucket names have no uppercase letters");
    }
    if !bucket.chars().all(|c| alnum(c) || c == '.' || c == '-') {
        return Some("bucket names hold only lowercase letters, digits, dots and hyphens");
    }
    if !bucket.starts_with(alnum) || !bucket.ends_with(alnum) {
        return Some("bucket names begin and end with a letter or a digit");
    }
    if bucket.contains("..") {
        return Some("bucket names have no two dots in a row");
    }
    if bucket.parse::<std::net::Ipv4Addr>().is_ok() {
        return Some("a bucket name is not an IP address");
    }
    None
}

/// The SSH failures of the host key and the login.
pub(crate) fn sftp(text: &str, login: &str, host: &str) -> Option<String> {
    if text.contains("Host key verification failed") || text.contains("REMOTE HOST IDENTIFICATION HAS CHANGED") {
        return Some(format!(
            "the host key of {host} is not one known_hosts trusts: check its fingerprint and add it to \
             ~/.ssh/known_hosts (ssh-keyscan), or trust it on first use with --sftp-known-hosts add"
        ));
    }
    if text.contains("Permission denied (") || text.contains("Too many authentication failures") {
        return Some(format!(
            "{login} refused the SSH key: check --sftp-key (or the SSH agent's keys) and the server's authorized_keys"
        ));
    }
    None
}

/// The failure of a location as a whole, with `why` the line to show and `source` the
/// backend's error.
pub(crate) fn unreachable(
    location: &str,
    why: String,
    source: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::Unreachable { location: location.to_string(), why, source: Box::new(source) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_say_what_is_wrong() {
        assert_eq!(bucket_name_problem("backups-2024.eu"), None);
        assert_eq!(bucket_name_problem("ab"), Some("bucket names are at least 3 characters long"));
        assert_eq!(bucket_name_problem("Backups"), Some("bucket names have no uppercase letters"));
        assert_eq!(
            bucket_name_problem("my_bucket"),
            Some("bucket names hold only lowercase letters, digits, dots and hyphens")
        );
        assert_eq!(bucket_name_problem("-abc"), Some("bucket names begin and end with a letter or a digit"));
        assert_eq!(bucket_name_problem("a..b"), Some("bucket names have no two dots in a row"));
        assert_eq!(bucket_name_problem("192.168.1.1"), Some("a bucket name is not an IP address"));
    }

    #[test]
    fn connection_failures() {
        let refused =
            "error sending request | client error (Connect) | tcp connect error: Connection refused (os error 111)";
        assert_eq!(
            connection(refused, "127.0.0.1", "127.0.0.1:9", "the S3 server").unwrap(),
            "cannot connect to 127.0.0.1:9: connection refused: check that the S3 server runs there and the port is right"
        );
        let dns = "ssh: Could not resolve hostname nohost.invalid: Name or service not known";
        assert_eq!(
            connection(dns, "nohost.invalid", "nohost.invalid:22", "sshd").unwrap(),
            "no such host `nohost.invalid`: check the name in the location"
        );
        assert_eq!(connection("500 Internal Server Error", "h", "h:1", "x"), None);
    }
}
