//! A `cairn serve` request as the server parses it before it looks at a token or the storage
//! (cairn_format::protocol, FORMAT.md §15).
//!
//! Input: `selector | method-byte | rest`; `rest` is split at its first `\n` into a request
//! target and a header value.
//! * The target is routed with one of the protocol's methods (or junk): a route never names an
//!   object that is not an object name of FORMAT.md §1, never a repository that does not pass
//!   `check_repo`, and its path is a suffix of the target (nothing decoded or made up).
//! * The header value is parsed as `Authorization`, `Range` and `Content-Length`: a range is
//!   non-empty and within the object limit, a length within it, a token printable ASCII.
#![no_main]

use cairn_format::protocol::{
    bearer, check_repo, classify, parse_content_length, parse_range, parse_request, Route, MAX_OBJECT_SIZE, MAX_TOKEN,
};
use libfuzzer_sys::fuzz_target;

const METHODS: [&str; 8] = ["GET", "HEAD", "PUT", "DELETE", "POST", "PATCH", "OPTIONS", "get"];

fuzz_target!(|data: &[u8]| {
    let Some((&method, rest)) = data.split_first() else { return };
    let method = METHODS[method as usize % METHODS.len()];
    let (target, header) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let target = String::from_utf8_lossy(target);
    let request = parse_request(method, &target);
    if let Some(repo) = request.repo {
        assert!(check_repo(repo).is_ok(), "a repository name that does not check: {repo:?}");
    }
    match request.route {
        Ok(Route::Object { repo, path, kind, .. }) => {
            assert_eq!(classify(path), Ok(kind));
            assert!(!path.contains("..") && !path.starts_with('/') && !path.contains("//"), "{path:?}");
            assert!(target.ends_with(path) && target.starts_with("/v1/repos/"));
            assert_eq!(request.repo, Some(repo));
        }
        Ok(Route::List { repo, dir }) => {
            assert!(target.ends_with(dir.name()));
            assert_eq!(request.repo, Some(repo));
        }
        Ok(Route::Create { repo }) => assert_eq!(&*target, format!("/v1/repos/{repo}")),
        Ok(Route::Version) => assert!(target == "/v1" || target == "/v1/"),
        Err(refusal) => {
            assert!((400..500).contains(&refusal.status), "{refusal:?}");
            assert!(!refusal.why.is_empty() && !refusal.why.contains('\n'), "{refusal:?}");
        }
    }
    if let Ok((_, len)) = parse_range(header) {
        assert!(len >= 1 && len <= MAX_OBJECT_SIZE);
    }
    if let Ok(len) = parse_content_length(header) {
        assert!(len <= MAX_OBJECT_SIZE);
    }
    if let Ok(token) = bearer(Some(header)) {
        assert!(!token.is_empty() && token.len() <= MAX_TOKEN && token.bytes().all(|b| b.is_ascii_graphic()));
    }
});
