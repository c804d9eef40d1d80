//! Repository locations as users write them: a local path, `s3:http[s]://HOST[:PORT]/BUCKET[/PREFIX]`
//! `sftp:[USER@]HOST[:PORT]:/PATH`, or a repository on a `cairn serve` server,
//! `cairn+https://HOST:PORT/NAME` (`cairn+http://` only to a loopback address).

use std::fmt;

use crate::error::{Error, Result};

/// Where a repository lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A directory on this machine.
    Local(String),
    /// A bucket (and optional prefix) on an S3-compatible server, addressed path-style.
    S3 {
        /// `http://HOST[:PORT]` or `https://HOST[:PORT]`.
        endpoint: String,
        /// The bucket, which must exist.
        bucket: String,
        /// The prefix inside the bucket (no leading or trailing `/`; may be empty).
        prefix: String,
    },
    /// A directory on an SSH server, reached through SFTP.
    Sftp {
        /// The login name, if given (otherwise ssh's default).
        user: Option<String>,
        /// The host name or address.
        host: String,
        /// The port, if given (otherwise ssh's default).
        port: Option<u16>,
        /// The absolute directory on the server.
        path: String,
    },
    /// A repository on a `cairn serve` server (FORMAT.md §15).
    Server {
        /// `https://HOST:PORT`, or `http://HOST:PORT` for a loopback HOST.
        base: String,
        /// The repository's name on the server.
        name: String,
    },
}

impl Location {
    /// Parses a location; errors name the part that is wrong and show the expected form.
    pub fn parse(spec: &str) -> Result<Self> {
        if let Some(rest) = spec.strip_prefix("s3:") {
            return parse_s3(spec, rest);
        }
        if let Some(rest) = spec.strip_prefix("sftp:") {
            return parse_sftp(spec, rest);
        }
        if let Some(rest) = spec.strip_prefix("cairn+") {
            return parse_server(spec, rest);
        }
        if spec.is_empty() {
            return Err(Error::Usage("empty repository location".into()));
        }
        Ok(Location::Local(spec.to_string()))
    }

    /// The location of the repository named `name` below this one: a subdirectory, or a
    /// prefix inside the bucket (what `cairn serve` serves under each repository name).
    pub fn child(&self, name: &str) -> Location {
        let join = |base: &str| match base.trim_end_matches('/') {
            "" if base.starts_with('/') => format!("/{name}"),
            "" => name.to_string(),
            b => format!("{b}/{name}"),
        };
        match self {
            Location::Local(p) => Location::Local(join(p)),
            Location::S3 { endpoint, bucket, prefix } => {
                Location::S3 { endpoint: endpoint.clone(), bucket: bucket.clone(), prefix: join(prefix) }
            }
            Location::Sftp { user, host, port, path } => {
                Location::Sftp { user: user.clone(), host: host.clone(), port: *port, path: join(path) }
            }
            Location::Server { base, name: parent } => Location::Server { base: base.clone(), name: join(parent) },
        }
    }

    /// Whether the repository is on another machine (requests have latency).
    pub fn is_remote(&self) -> bool {
        !matches!(self, Location::Local(_))
    }
}

fn parse_s3(spec: &str, rest: &str) -> Result<Location> {
    let bad = |why: &str| {
        Error::Usage(format!("bad S3 location {spec:?}: {why} (expected s3:http[s]://HOST[:PORT]/BUCKET[/PREFIX])"))
    };
    let (scheme, after) = rest.split_once("://").ok_or_else(|| bad("no http:// or https://"))?;
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be http or https"));
    }
    let (host, path) = after.split_once('/').ok_or_else(|| bad("no bucket"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let path = path.trim_matches('/');
    let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket"));
    }
    Ok(Location::S3 {
        endpoint: format!("{scheme}://{host}"),
        bucket: bucket.to_string(),
        prefix: prefix.trim_matches('/').to_string(),
    })
}

/// Whether `host` (as in a URL, IPv6 in brackets) names this machine's loopback interface.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn parse_server(spec: &str, rest: &str) -> Result<Location> {
    let bad = |why: &str| {
        Error::Usage(format!("bad server location {spec:?}: {why} (expected cairn+https://HOST:PORT/NAME)"))
    };
    let (scheme, after) = rest.split_once("://").ok_or_else(|| bad("no https://"))?;
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be cairn+https (or cairn+http to a loopback address)"));
    }
    let (hostport, name) = after.split_once('/').ok_or_else(|| bad("no repository name"))?;
    let name = name.trim_end_matches('/');
    if name.is_empty() || name.contains('/') {
        return Err(bad("the repository name must be one path component"));
    }
    let host = match hostport.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => {
            p.parse::<u16>().map_err(|_| bad("the port is not a number"))?;
            h
        }
        _ => hostport,
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if scheme == "http" && !is_loopback_host(host) {
        return Err(bad("plain cairn+http is only allowed to a loopback address; use cairn+https"));
    }
    Ok(Location::Server { base: format!("{scheme}://{hostport}"), name: name.to_string() })
}

fn parse_sftp(spec: &str, rest: &str) -> Result<Location> {
    let bad =
        |why: &str| Error::Usage(format!("bad SFTP location {spec:?}: {why} (expected sftp:[USER@]HOST[:PORT]:/PATH)"));
    let (login, path) = rest.split_once(":/").ok_or_else(|| bad("no :/PATH"))?;
    let path = format!("/{}", path.trim_end_matches('/'));
    let (user, hostport) = match login.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() => (Some(u.to_string()), h),
        Some(_) => return Err(bad("empty user name")),
        None => (None, login),
    };
    let (host, port) = match hostport.split_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().map_err(|_| bad("the port is not a number"))?)),
        None => (hostport, None),
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok(Location::Sftp { user, host: host.to_string(), port, path })
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => f.write_str(p),
            Location::S3 { endpoint, bucket, prefix } if prefix.is_empty() => write!(f, "s3:{endpoint}/{bucket}"),
            Location::S3 { endpoint, bucket, prefix } => write!(f, "s3:{endpoint}/{bucket}/{prefix}"),
            Location::Sftp { user, host, port, path } => {
                f.write_str("sftp:")?;
                if let Some(u) = user {
                    write!(f, "{u}@")?;
                }
                f.write_str(host)?;
                if let Some(p) = port {
                    write!(f, ":{p}")?;
                }
                write!(f, ":{path}")
            }
            Location::Server { base, name } => write!(f, "cairn+{base}/{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind_and_prints_it_back() {
        let cases = [
            ("/srv/repo", Location::Local("/srv/repo".into())),
            ("relative/dir", Location::Local("relative/dir".into())),
            (
                "s3:http://127.0.0.1:9000/bucket/some/prefix",
                Location::S3 {
                    endpoint: "http://127.0.0.1:9000".into(),
                    bucket: "bucket".into(),
                    prefix: "some/prefix".into(),
                },
            ),
            (
                "s3:https://s3.example.com/b",
                Location::S3 { endpoint: "https://s3.example.com".into(), bucket: "b".into(), prefix: String::new() },
            ),
            (
                "sftp:me@host.example:2222:/srv/repo",
                Location::Sftp {
                    user: Some("me".into()),
                    host: "host.example".into(),
                    port: Some(2222),
                    path: "/srv/repo".into(),
                },
            ),
            ("sftp:host:/r", Location::Sftp { user: None, host: "host".into(), port: None, path: "/r".into() }),
            (
                "cairn+https://backup.example:8443/laptop",
                Location::Server { base: "https://backup.example:8443".into(), name: "laptop".into() },
            ),
            ("cairn+http://127.0.0.1:9/a", Location::Server { base: "http://127.0.0.1:9".into(), name: "a".into() }),
        ];
        for (spec, want) in cases {
            let got = Location::parse(spec).unwrap();
            assert_eq!(got, want, "{spec}");
            assert_eq!(got.to_string(), spec);
            assert_eq!(got.is_remote(), !matches!(want, Location::Local(_)));
        }
    }

    #[test]
    fn children_are_below_their_parent() {
        assert_eq!(Location::parse("/srv/r/").unwrap().child("a").to_string(), "/srv/r/a");
        assert_eq!(Location::parse("rel").unwrap().child("a").to_string(), "rel/a");
        assert_eq!(Location::parse("s3:http://h:9/b").unwrap().child("a").to_string(), "s3:http://h:9/b/a");
        assert_eq!(Location::parse("s3:http://h:9/b/p").unwrap().child("a").to_string(), "s3:http://h:9/b/p/a");
        assert_eq!(Location::parse("sftp:h:/srv").unwrap().child("a").to_string(), "sftp:h:/srv/a");
    }

    #[test]
    fn rejects_malformed_locations_naming_the_problem() {
        for (spec, why) in [
            ("s3:127.0.0.1:9000/bucket", "no http:// or https://"),
            ("s3:ftp://h/b", "scheme"),
            ("s3:http://h", "no bucket"),
            ("s3:http://h/", "no bucket"),
            ("s3:http:///b", "no host"),
            ("sftp:host/path", "no :/PATH"),
            ("sftp:host:22x:/p", "port"),
            ("sftp::/p", "no host"),
            ("sftp:@h:/p", "empty user"),
            ("", "empty"),
            ("cairn+http://backup.example:80/r", "loopback"),
            ("cairn+https://h:1/a/b", "one path component"),
            ("cairn+https://h:1/", "one path component"),
            ("cairn+ftp://h:1/a", "scheme"),
            ("cairn+https://h:x/a", "port"),
        ] {
            let e = Location::parse(spec).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
    }
}
