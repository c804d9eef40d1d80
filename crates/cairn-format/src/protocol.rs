//! The server protocol's requests (FORMAT.md §15), parsed with no I/O: the method and raw
//! request target to a route, the repository and object names it carries (strictly, per §1),
//! and the few headers the server reads (`Authorization`, `Range`, `Content-Length`).
//!
//! `cairn serve` calls these before it looks at a token or touches the storage, and the fuzz
//! target `serve_request` calls them with anything at all. A name that is not exactly what a
//! Cairn writer makes is refused, so no `..`, absolute path, empty component, NUL or
//! percent-encoded trick reaches the storage.

use crate::layout::{self, Dir};

/// The protocol version: the first component of every request path.
pub const VERSION: &str = "v1";
/// The revision of version 1 a server speaks (`GET /v1` says it): 2 added who stored each
/// snapshot to listings of `snapshots/` (FORMAT.md §15.4). Clients and servers of either revision
/// work together; only `--stored-by` and a backup's choice of parent need revision 2.
pub const REVISION: u32 = 2;
/// The header of a listing of `snapshots/` from a revision 2 server: the name of the token the
/// request came with (FORMAT.md §15.4). A listing without it is from a server that records
/// nothing.
pub const TOKEN_NAME_HEADER: &str = "cairn-token-name";
/// Longest object path accepted (the longest Cairn writes is a pack's, 72 bytes).
pub const MAX_OBJECT_PATH: usize = 128;
/// Longest repository name accepted.
pub const MAX_REPO_NAME: usize = 64;
/// The largest object accepted: a pack of the largest pack size (1 GiB) and its last blob.
pub const MAX_OBJECT_SIZE: u64 = 1280 << 20;
/// Longest bearer token accepted (Cairn's are 70 characters).
pub const MAX_TOKEN: usize = 256;

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
    /// Every kind.
    pub const ALL: [Kind; 8] =
        [Kind::Config, Kind::Hint, Kind::Key, Kind::Pack, Kind::Index, Kind::Snapshot, Kind::Deletion, Kind::Lock];

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

/// What a request asks to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read a whole object, part of one, or whether it exists.
    Read,
    /// List a directory.
    List,
    /// Store an object.
    Write,
    /// Delete an object.
    Delete,
    /// Make the repository's root (`init`).
    Create,
}

impl Op {
    /// The operation's name in the request log.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::List => "list",
            Op::Write => "write",
            Op::Delete => "delete",
            Op::Create => "create",
        }
    }
}

/// What a request's method and path ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// `GET /v1`: the protocol and server version.
    Version,
    /// `POST /v1/repos/NAME`.
    Create {
        /// The repository.
        repo: &'a str,
    },
    /// `GET|HEAD|PUT|DELETE /v1/repos/NAME/objects/PATH`.
    Object {
        /// The repository.
        repo: &'a str,
        /// Read (`GET`, `HEAD`), write (`PUT`) or delete (`DELETE`).
        op: Op,
        /// A `HEAD`: whether the object exists, no body.
        head: bool,
        /// The object's name, as §1 spells it.
        path: &'a str,
        /// Its kind.
        kind: Kind,
    },
    /// `GET /v1/repos/NAME/list/DIR`.
    List {
        /// The repository.
        repo: &'a str,
        /// The directory.
        dir: Dir,
    },
}

impl Route<'_> {
    /// The operation (none for [`Route::Version`]).
    pub fn op(&self) -> Option<Op> {
        match self {
            Route::Version => None,
            Route::Create { .. } => Some(Op::Create),
            Route::Object { op, .. } => Some(*op),
            Route::List { .. } => Some(Op::List),
        }
    }

    /// The kind of object named (none for a listing, a create or the version).
    pub fn kind(&self) -> Option<Kind> {
        match self {
            Route::Object { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// A request refused before anything is looked up: the HTTP status and one line saying why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 401, 404, 405 or 413.
    pub status: u16,
    /// Why, in one line.
    pub why: String,
}

fn refuse(status: u16, why: impl Into<String>) -> Refusal {
    Refusal { status, why: why.into() }
}

fn bad(why: impl Into<String>) -> Refusal {
    refuse(400, why)
}

/// A request's method and target parsed: its route, or why not, and the repository and object
/// (or directory) it named as far as it got, for the request log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The route, or why the request is refused.
    pub route: Result<Route<'a>, Refusal>,
    /// The repository named, once it parsed.
    pub repo: Option<&'a str>,
    /// The object or directory named (at most 80 characters of it), parsed or not.
    pub named: Option<&'a str>,
}

/// Parses a request's method and raw request target (the path and any query, never decoded:
/// no valid name needs percent-encoding).
pub fn parse_request<'a>(method: &str, target: &'a str) -> Request<'a> {
    let mut request = Request { route: Err(bad("")), repo: None, named: None };
    request.route = route(method, target, &mut request.repo, &mut request.named);
    request
}

fn route<'a>(
    method: &str,
    target: &'a str,
    repo_seen: &mut Option<&'a str>,
    named: &mut Option<&'a str>,
) -> Result<Route<'a>, Refusal> {
    if target.contains('?') {
        return Err(bad("a request of this protocol has no query string"));
    }
    if target.contains('%') {
        return Err(bad("percent-encoding is not allowed in request paths (no object name needs it)"));
    }
    if let Some(c) = target.chars().find(|c| c.is_control() || *c == ' ' || *c == '\\') {
        return Err(bad(format!("the request path holds {c:?}, which no name has")));
    }
    let Some(rest) = target.strip_prefix("/v1") else {
        return Err(refuse(404, format!("unknown route: this server speaks protocol {VERSION} (/{VERSION}/...)")));
    };
    let not_allowed = || refuse(405, format!("{method} is not allowed on {}", truncate(target)));
    if rest.is_empty() || rest == "/" {
        return match method {
            "GET" | "HEAD" => Ok(Route::Version),
            _ => Err(not_allowed()),
        };
    }
    let Some(rest) = rest.strip_prefix("/repos/") else {
        return Err(refuse(404, "unknown route (expected /v1/repos/NAME/...)"));
    };
    let (repo, tail) = match rest.split_once('/') {
        Some((r, t)) => (r, Some(t)),
        None => (rest, None),
    };
    check_repo(repo).map_err(bad)?;
    *repo_seen = Some(repo);
    let Some(tail) = tail else {
        return match method {
            "POST" => Ok(Route::Create { repo }),
            _ => Err(not_allowed()),
        };
    };
    if let Some(path) = tail.strip_prefix("objects/") {
        *named = Some(truncate(path));
        let kind = classify(path).map_err(bad)?;
        let (op, head) = match method {
            "GET" => (Op::Read, false),
            "HEAD" => (Op::Read, true),
            "PUT" => (Op::Write, false),
            "DELETE" => (Op::Delete, false),
            _ => return Err(not_allowed()),
        };
        Ok(Route::Object { repo, op, head, path, kind })
    } else if let Some(dir) = tail.strip_prefix("list/") {
        *named = Some(truncate(dir));
        let dir = check_dir(dir).map_err(bad)?;
        match method {
            "GET" => Ok(Route::List { repo, dir }),
            _ => Err(not_allowed()),
        }
    } else {
        Err(refuse(404, "unknown route (expected .../objects/PATH or .../list/DIR)"))
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
        crate::hint::PATH => Some(Kind::Hint),
        _ if layout::parse_pack_path(path).is_some() => Some(Kind::Pack),
        _ if layout::parse_index_path(path).is_some() => Some(Kind::Index),
        _ if layout::parse_snapshot_path(path).is_some() => Some(Kind::Snapshot),
        _ if layout::parse_key_path(path).is_some() => Some(Kind::Key),
        _ if layout::parse_deletion_path(path).is_some() => Some(Kind::Deletion),
        _ => path.strip_prefix("locks/").filter(|id| is_lock_id(id)).map(|_| Kind::Lock),
    };
    kind.ok_or_else(|| format!("{:?} is not an object name of FORMAT.md §1", truncate(path)))
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

/// One entry of a listing (`GET /v1/repos/NAME/list/DIR`): `{"path": "…", "size": N}`, and in a
/// listing of `snapshots/` from a revision 2 server, `"stored_by": "TOKEN NAME"` where the server
/// recorded who stored the snapshot (FORMAT.md §15.4).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Listed {
    /// The object's name (§1).
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The name of the token that stored it, as the server recorded it; absent where there is
    /// no record (an object stored before the server kept them, or put into its storage directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_by: Option<String>,
}

/// A listing's body, as a server sends it.
pub fn encode_listing(listed: &[Listed]) -> Vec<u8> {
    serde_json::to_vec(listed).expect("listings serialize")
}

/// A listing's body, as a client reads it (fields it does not know are ignored).
pub fn decode_listing(body: &[u8]) -> Result<Vec<Listed>, String> {
    serde_json::from_slice(body).map_err(|e| format!("the server sent a listing that does not parse: {e}"))
}

/// At most 80 characters of a name from a request, for messages.
pub fn truncate(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The token of an `Authorization` header's value: `Bearer TOKEN` (401 when there is none).
pub fn bearer(header: Option<&[u8]>) -> Result<&str, Refusal> {
    let Some(header) = header else {
        return Err(refuse(401, "no token (send Authorization: Bearer TOKEN)"));
    };
    let not_bearer = || refuse(401, "the Authorization header is not \"Bearer TOKEN\"");
    let text = std::str::from_utf8(header).map_err(|_| not_bearer())?;
    let token = text.strip_prefix("Bearer ").map(str::trim).ok_or_else(not_bearer)?;
    if token.is_empty() || token.len() > MAX_TOKEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(refuse(401, "the token is not one a server makes (cairn_ and 64 hex digits)"));
    }
    Ok(token)
}

/// Parses a `Range` header: `bytes=START-END` (one range, both ends given, inclusive); returns
/// the first byte and how many.
pub fn parse_range(value: &[u8]) -> Result<(u64, u64), Refusal> {
    let text = String::from_utf8_lossy(value);
    let bad_range = || bad(format!("unsupported Range {:?}: expected bytes=START-END", truncate(&text)));
    let spec = text.strip_prefix("bytes=").ok_or_else(bad_range)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad_range)?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(a) || !digits(b) {
        return Err(bad_range());
    }
    let start: u64 = a.parse().map_err(|_| bad_range())?;
    let end: u64 = b.parse().map_err(|_| bad_range())?;
    if end < start || end - start >= MAX_OBJECT_SIZE {
        return Err(bad_range());
    }
    Ok((start, end - start + 1))
}

/// Parses a `Content-Length` header of an upload: decimal digits, at most [`MAX_OBJECT_SIZE`]
/// (413 above it).
pub fn parse_content_length(value: &[u8]) -> Result<u64, Refusal> {
    let digits = !value.is_empty() && value.len() <= 20 && value.iter().all(u8::is_ascii_digit);
    let len = std::str::from_utf8(value).ok().filter(|_| digits).and_then(|v| v.parse::<u64>().ok());
    match len {
        None => Err(bad("bad Content-Length: expected the body's length in decimal")),
        Some(n) if n > MAX_OBJECT_SIZE => Err(refuse(413, format!("an object is at most {MAX_OBJECT_SIZE} bytes"))),
        Some(n) => Ok(n),
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
    fn routes_parse() {
        let h = "0123456789abcdef".repeat(4);
        let path = format!("/v1/repos/laptop/objects/index/{h}");
        let r = parse_request("PUT", &path);
        let object = &path["/v1/repos/laptop/objects/".len()..];
        assert_eq!(
            r.route,
            Ok(Route::Object { repo: "laptop", op: Op::Write, head: false, path: object, kind: Kind::Index })
        );
        assert_eq!((r.repo, r.named), (Some("laptop"), Some(object)));
        assert_eq!(parse_request("GET", "/v1").route, Ok(Route::Version));
        assert_eq!(parse_request("POST", "/v1/repos/a").route, Ok(Route::Create { repo: "a" }));
        assert_eq!(parse_request("GET", "/v1/repos/a/list/data").route, Ok(Route::List { repo: "a", dir: Dir::Data }));
        let status = |m: &str, p: &str| parse_request(m, p).route.unwrap_err().status;
        assert_eq!(status("PATCH", &path), 405);
        assert_eq!(status("PUT", "/v1/repos/a/list/data"), 405);
        assert_eq!(status("GET", "/v1/repos/a"), 405);
        assert_eq!(status("GET", "/v2/repos/a/list/data"), 404);
        assert_eq!(status("GET", "/v1/repos/a/other/data"), 404);
        // The repository is known for the log even when the object is refused.
        let r = parse_request("GET", "/v1/repos/a/objects/../x");
        assert_eq!((r.repo, r.named, r.route.unwrap_err().status), (Some("a"), Some("../x"), 400));
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
            let target = format!("/v1/repos/a/objects/{bad}");
            assert_eq!(parse_request("GET", &target).route.unwrap_err().status, 400, "{bad:?}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a%2fb", "a b", &"x".repeat(65)] {
            assert!(check_repo(bad).is_err(), "{bad:?} accepted");
        }
        for target in ["/v1/repos/a/objects/config?x", "/v1/repos/%61/list/data", "/v1/repos/a\0/list/data"] {
            assert_eq!(parse_request("GET", target).route.unwrap_err().status, 400, "{target:?}");
        }
        check_repo("laptop-01.example_com").unwrap();
        assert!(check_dir("../data").is_err());
        assert!(check_dir("data/01").is_err());
        assert!(check_dir("").is_err());
        assert_eq!(check_dir("snapshots"), Ok(Dir::Snapshots));
    }

    /// Golden vectors of listings (FORMAT.md §15.4): revision 2's, with a record and without
    /// one, and revision 1's, which a revision 2 client still reads.
    #[test]
    fn listings_encode_and_decode_exactly() {
        let h = "0123456789abcdef".repeat(4);
        let listed = vec![
            Listed { path: format!("snapshots/{h}"), size: 301, stored_by: Some("laptop-append".into()) },
            Listed { path: format!("snapshots/{}", h.replace('0', "f")), size: 7, stored_by: None },
        ];
        let golden = format!(
            r#"[{{"path":"snapshots/{h}","size":301,"stored_by":"laptop-append"}},{{"path":"snapshots/{}","size":7}}]"#,
            h.replace('0', "f")
        );
        assert_eq!(String::from_utf8(encode_listing(&listed)).unwrap(), golden);
        assert_eq!(decode_listing(golden.as_bytes()).unwrap(), listed);
        let revision1 = format!(r#"[{{"path":"data/01/{h}","size":5}}]"#);
        let old = decode_listing(revision1.as_bytes()).unwrap();
        assert_eq!(old, vec![Listed { path: format!("data/01/{h}"), size: 5, stored_by: None }]);
        // A later revision's fields are ignored.
        let later = r#"[{"path":"keys/x","size":1,"stored_by":"a","more":true}]"#;
        assert_eq!(decode_listing(later.as_bytes()).unwrap()[0].stored_by.as_deref(), Some("a"));
        assert!(decode_listing(b"{").unwrap_err().contains("does not parse"));
    }

    #[test]
    fn headers_parse() {
        assert_eq!(parse_range(b"bytes=0-9").unwrap(), (0, 10));
        for bad in ["bytes=9-0", "bytes=-5", "bytes=5-", "items=0-1", "bytes=0-1,3-4", "bytes=a-b", "", "bytes=+1-2"] {
            assert!(parse_range(bad.as_bytes()).is_err(), "{bad}");
        }
        assert_eq!(parse_content_length(b"123"), Ok(123));
        assert_eq!(parse_content_length(b"99999999999").unwrap_err().status, 413);
        for bad in ["", "x", "-1", "+5", "1 2", "99999999999999999999999"] {
            assert_eq!(parse_content_length(bad.as_bytes()).unwrap_err().status, 400, "{bad}");
        }
        assert_eq!(bearer(Some(b"Bearer cairn_ab")), Ok("cairn_ab"));
        for bad in [&b"Basic x"[..], b"Bearer ", b"Bearer a b", b"Bearer \xff"] {
            assert_eq!(bearer(Some(bad)).unwrap_err().status, 401, "{bad:?}");
        }
        assert_eq!(bearer(None).unwrap_err().status, 401);
    }
}
