//! What a request may name: a repository (one path component) and an object of it, parsed
//! strictly per FORMAT.md §1 from the raw (still percent-encoded) request path. A name that is
//! not exactly what a Cairn writer makes is refused, so no `..`, absolute path, empty
//! component, NUL or percent-encoded trick reaches the storage.

use cairn_format::layout::{self, Dir};

/// Longest object path accepted (the longest Cairn writes is a pack's, 72 bytes).
pub const MAX_OBJECT_PATH: usize = 128;
/// Longest repository name accepted.
pub const MAX_REPO_NAME: usize = 64;

/// The kinds of object in a repository (FORMAT.md §1); each has its own rule per role (§15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `config`.
    Config,
    /// `hint`: the start hint (§14).
    Hint,
    /// `keys/<id>`.
    Key,
    /// `data/<xx>/<id>`.
    Pack,
    /// `index/<id>`.
    Index,
    /// `snapshots/<id>`.
    Snapshot,
    /// `deletions/<id>`.
    Deletion,
    /// `locks/<id>`.
    Lock,
}

impl Kind {
    /// Whether the object's name is the BLAKE3 hash of its bytes.
    pub fn content_addressed(self) -> bool {
        !matches!(self, Kind::Config | Kind::Hint | Kind::Lock)
    }

    /// A short name for messages and the request log.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Config => "the config",
            Kind::Hint => "the start hint",
            Kind::Key => "a key file",
            Kind::Pack => "a pack",
            Kind::Index => "an index file",
            Kind::Snapshot => "a snapshot",
            Kind::Deletion => "a deletion manifest",
            Kind::Lock => "a lock",
        }
    }
}

/// Checks a repository name: 1 to 64 of `A-Z a-z 0-9 _ - .`, not starting with `.`.
pub fn check_repo(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_REPO_NAME {
        return Err(format!("a repository name has 1 to {MAX_REPO_NAME} characters"));
    }
    if name.starts_with('.') || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
        return Err("a repository name is letters, digits, '_', '-' and '.' (not first)".into());
    }
    Ok(())
}

/// The kind of the object at `path`, or why the path is not an object name of FORMAT.md §1.
pub fn classify(path: &str) -> Result<Kind, String> {
    if path.len() > MAX_OBJECT_PATH {
        return Err(format!("object name longer than {MAX_OBJECT_PATH} bytes"));
    }
    if !path.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'/') {
        return Err("an object name is lowercase letters, digits and '/' (FORMAT.md §1)".into());
    }
    let kind = match path {
        layout::CONFIG => Some(Kind::Config),
        cairn_format::hint::PATH => Some(Kind::Hint),
        _ if layout::parse_pack_path(path).is_some() => Some(Kind::Pack),
        _ if layout::parse_index_path(path).is_some() => Some(Kind::Index),
        _ if layout::parse_snapshot_path(path).is_some() => Some(Kind::Snapshot),
        _ if layout::parse_key_path(path).is_some() => Some(Kind::Key),
        _ if layout::parse_deletion_path(path).is_some() => Some(Kind::Deletion),
        _ => path.strip_prefix("locks/").filter(|id| is_lock_id(id)).map(|_| Kind::Lock),
    };
    kind.ok_or_else(|| format!("{path:?} is not an object name of FORMAT.md §1"))
}

/// A lock's name: 32 lowercase hex digits (FORMAT.md §12).
fn is_lock_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The directory a listing names: one of FORMAT.md §1's.
pub fn check_dir(dir: &str) -> Result<Dir, String> {
    Dir::ALL.into_iter().find(|d| d.name() == dir).ok_or_else(|| {
        let names: Vec<&str> = Dir::ALL.iter().map(|d| d.name()).collect();
        format!("{:?} is not a repository directory (one of {})", truncate(dir), names.join(", "))
    })
}

/// At most 80 characters of a name from a request, for messages.
pub fn truncate(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_object_kind_is_recognized() {
        let h = "0123456789abcdef".repeat(4);
        assert_eq!(classify("config"), Ok(Kind::Config));
        assert_eq!(classify("hint"), Ok(Kind::Hint));
        assert_eq!(classify(&format!("data/01/{h}")), Ok(Kind::Pack));
        assert_eq!(classify(&format!("index/{h}")), Ok(Kind::Index));
        assert_eq!(classify(&format!("snapshots/{h}")), Ok(Kind::Snapshot));
        assert_eq!(classify(&format!("keys/{h}")), Ok(Kind::Key));
        assert_eq!(classify(&format!("deletions/{h}")), Ok(Kind::Deletion));
        assert_eq!(classify(&format!("locks/{}", &h[..32])), Ok(Kind::Lock));
    }

    #[test]
    fn tricks_are_refused() {
        let h = "0123456789abcdef".repeat(4);
        for bad in [
            "",
            "/config",
            "../config",
            "snapshots/../config",
            &format!("snapshots//{h}"),
            &format!("snapshots/{h}/"),
            &format!("data/02/{h}"),
            &format!("data/{h}"),
            &format!("index/{}", h.to_uppercase()),
            "%2e%2e/config",
            "config\0",
            ".tmp/x",
            "locks/xyz",
            &format!("locks/{h}"),
            &"a/".repeat(100),
            "keys",
        ] {
            assert!(classify(bad).is_err(), "{bad:?} accepted");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a%2fb", "a b", &"x".repeat(65)] {
            assert!(check_repo(bad).is_err(), "{bad:?} accepted");
        }
        check_repo("laptop-01.example_com").unwrap();
        assert!(check_dir("../data").is_err());
        assert!(check_dir("data/01").is_err());
        assert!(check_dir("").is_err());
        assert_eq!(check_dir("snapshots"), Ok(Dir::Snapshots));
    }
}
