//! Tokens and the credentials file: the server's only state beside its storage.
//!
//! A token is 32 random bytes shown once (as `cairn_` and 64 hex digits); the file keeps only
//! its BLAKE3 hash, with a name, the repository it is for (or all), its role and when it
//! expires. The file is JSON, written whole to a temporary file and renamed (mode 0600), and
//! read again by a running server whenever it changes, so tokens added or removed take effect
//! without a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// What a token may do (FORMAT.md §15 gives the rule per object kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read and list everything; write and delete only its own locks.
    Read,
    /// Also store new objects; never overwrite or delete one that carries history.
    Append,
    /// Everything.
    Admin,
}

impl Role {
    /// Parses `read`, `append` or `admin`.
    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "read" => Ok(Role::Read),
            "append" => Ok(Role::Append),
            "admin" => Ok(Role::Admin),
            _ => bail!("unknown role {s:?}: expected read, append or admin"),
        }
    }

    /// The role's name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Append => "append",
            Role::Admin => "admin",
        }
    }
}

/// One token as the credentials file keeps it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TokenEntry {
    /// A name for lists and the request log (unique in the file).
    pub name: String,
    /// BLAKE3 of the token's text, hex.
    pub hash: String,
    /// The one repository it is for, or `None` for every repository.
    pub repo: Option<String>,
    /// What it may do.
    pub role: Role,
    /// Unix seconds when it was made.
    pub created: u64,
    /// Unix seconds after which it is refused, if it expires.
    pub expires: Option<u64>,
}

/// The credentials file's content.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Credentials {
    /// `1`.
    pub version: u32,
    /// Every token.
    pub tokens: Vec<TokenEntry>,
}

/// The prefix of every token's text.
pub const TOKEN_PREFIX: &str = "cairn_";

/// The hash under which a token's text is kept.
pub fn hash_token(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// Now, in Unix seconds.
pub fn now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Parses a duration such as `90d`, `12h`, `30m`, `45s`, `2w` or `1y` into seconds.
pub fn parse_duration(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().with_context(|| format!("bad duration {text:?}: expected e.g. 90d, 12h, 30m"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        "w" => 7 * 86400,
        "y" => 365 * 86400,
        _ => bail!("bad duration {text:?}: the unit is one of s, m, h, d, w, y"),
    };
    n.checked_mul(scale).filter(|&s| s > 0).with_context(|| format!("bad duration {text:?}: out of range"))
}

impl Credentials {
    /// Reads the file; a missing file holds no tokens.
    pub fn load(path: &Path) -> Result<Credentials> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Credentials { version: 1, tokens: Vec::new() })
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read the credentials file {}", path.display())),
        };
        let c: Credentials = serde_json::from_slice(&bytes)
            .with_context(|| format!("the credentials file {} does not parse", path.display()))?;
        if c.version != 1 {
            bail!("the credentials file {} has version {} (this cairn reads 1)", path.display(), c.version);
        }
        Ok(c)
    }

    /// Writes the file whole (temporary file, then rename), readable by its owner only; makes
    /// its directory.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
        }
        let tmp = tmp_beside(path);
        let json = serde_json::to_vec_pretty(self).expect("credentials serialize");
        write_private(&tmp, &json)?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
    }

    /// Adds a token and returns its text (to be shown once).
    pub fn add(
        &mut self,
        name: Option<&str>,
        repo: Option<&str>,
        role: Role,
        expires_in: Option<u64>,
    ) -> Result<(TokenEntry, String)> {
        if let Some(r) = repo {
            cairn_format::protocol::check_repo(r).map_err(anyhow::Error::msg)?;
        }
        let name = match name {
            Some(n) => {
                if n.is_empty() || n.len() > 64 || !n.bytes().all(|b| b.is_ascii_graphic()) {
                    bail!("a token name has 1 to 64 printable characters and no spaces");
                }
                n.to_string()
            }
            None => format!("{}-{}", repo.unwrap_or("all"), hex::encode(random::<4>())),
        };
        if self.tokens.iter().any(|t| t.name == name) {
            bail!("a token named {name:?} exists already");
        }
        let text = format!("{TOKEN_PREFIX}{}", hex::encode(random::<32>()));
        let created = now();
        let entry = TokenEntry {
            name,
            hash: hash_token(&text),
            repo: repo.map(str::to_string),
            role,
            created,
            expires: expires_in.map(|s| created.saturating_add(s)),
        };
        self.tokens.push(entry.clone());
        Ok((entry, text))
    }

    /// Removes the token named `name`.
    pub fn remove(&mut self, name: &str) -> Result<TokenEntry> {
        let Some(at) = self.tokens.iter().position(|t| t.name == name) else {
            bail!("no token named {name:?}");
        };
        Ok(self.tokens.remove(at))
    }
}

/// `cairn serve token add`: makes a token in the credentials file at `path` (made if missing)
/// and returns it with its text, to be shown once. `role` is a role's name and `expires_in` a
/// duration (`90d`, `12h`, …); a running server accepts the token at once.
pub fn add_token(
    path: &Path,
    name: Option<&str>,
    repo: Option<&str>,
    role: &str,
    expires_in: Option<&str>,
) -> Result<(TokenEntry, String)> {
    let role = Role::parse(role)?;
    let expires_in = expires_in.map(parse_duration).transpose()?;
    let mut creds = Credentials::load(path)?;
    let made = creds.add(name, repo, role, expires_in)?;
    creds.save(path)?;
    Ok(made)
}

/// `cairn serve token remove`: removes the token named `name` from the credentials file at
/// `path`; a running server refuses it at once.
pub fn remove_token(path: &Path, name: &str) -> Result<TokenEntry> {
    let mut creds = Credentials::load(path)?;
    let removed = creds.remove(name)?;
    creds.save(path)?;
    Ok(removed)
}

fn tmp_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp.{}", hex::encode(random::<6>())));
    path.with_file_name(name)
}

/// Writes a new file readable and writable by its owner only.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).with_context(|| format!("cannot write {}", path.display()))
}

/// `N` bytes from the OS's CSPRNG.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).expect("OS random numbers");
    b
}

/// Why a request's credential is refused: 401 (who are you) or 403 (not allowed).
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    /// No, an unknown, or an expired token.
    Unauthorized(String),
    /// A known token that may not do this.
    Forbidden(String),
}

/// The credentials a running server checks, read again from the file when it changes.
pub struct TokenStore {
    path: PathBuf,
    state: std::sync::Mutex<Loaded>,
}

struct Loaded {
    /// Modification time and length of the file when it was read.
    stamp: Option<(SystemTime, u64)>,
    by_hash: HashMap<String, TokenEntry>,
}

impl TokenStore {
    /// Reads the credentials file at `path` (which must parse).
    pub fn open(path: &Path) -> Result<TokenStore> {
        let store = TokenStore {
            path: path.to_path_buf(),
            state: std::sync::Mutex::new(Loaded { stamp: None, by_hash: HashMap::new() }),
        };
        store.reload()?;
        Ok(store)
    }

    fn stamp(&self) -> Option<(SystemTime, u64)> {
        let m = std::fs::metadata(&self.path).ok()?;
        Some((m.modified().ok()?, m.len()))
    }

    fn reload(&self) -> Result<()> {
        let stamp = self.stamp();
        let creds = Credentials::load(&self.path)?;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.by_hash = creds.tokens.into_iter().map(|t| (t.hash.clone(), t)).collect();
        state.stamp = stamp;
        Ok(())
    }

    /// The entry of `token` (the text of an `Authorization: Bearer` header), if it may use
    /// `repo`.
    pub fn authenticate(&self, token: &str, repo: &str) -> Result<TokenEntry, Denied> {
        if self.stamp() != self.state.lock().unwrap_or_else(|p| p.into_inner()).stamp {
            if let Err(e) = self.reload() {
                // Keep serving with the tokens read before; say why once per change.
                tracing::warn!("{e:#}; still using the tokens read before");
                self.state.lock().unwrap_or_else(|p| p.into_inner()).stamp = self.stamp();
            }
        }
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = state.by_hash.get(&hash_token(token)) else {
            return Err(Denied::Unauthorized("unknown token".into()));
        };
        if entry.expires.is_some_and(|e| now() >= e) {
            return Err(Denied::Unauthorized(format!("token {:?} has expired", entry.name)));
        }
        if entry.repo.as_deref().is_some_and(|r| r != repo) {
            return Err(Denied::Forbidden(format!("token {:?} is not for repository {repo:?}", entry.name)));
        }
        Ok(entry.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_as_hashes_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds.json");
        let mut c = Credentials::load(&path).unwrap();
        let (a, text_a) = c.add(Some("a"), Some("laptop"), Role::Append, None).unwrap();
        let (_, text_old) = c.add(Some("old"), None, Role::Admin, Some(1)).unwrap();
        assert!(c.add(Some("a"), None, Role::Read, None).is_err(), "names are unique");
        c.tokens[1].expires = Some(1);
        c.save(&path).unwrap();
        let raw = std::fs::read_to_string(&path).unwrap();
        assert!(!raw.contains(&text_a) && raw.contains(&a.hash));

        let store = TokenStore::open(&path).unwrap();
        assert_eq!(store.authenticate(&text_a, "laptop").unwrap().name, "a");
        assert!(matches!(store.authenticate(&text_a, "other"), Err(Denied::Forbidden(_))));
        assert!(matches!(store.authenticate("cairn_nope", "laptop"), Err(Denied::Unauthorized(_))));
        let expired = store.authenticate(&text_old, "laptop").unwrap_err();
        assert!(matches!(&expired, Denied::Unauthorized(w) if w.contains("expired")), "{expired:?}");

        // Removing a token takes effect in a running store.
        let mut c = Credentials::load(&path).unwrap();
        c.remove("a").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.save(&path).unwrap();
        assert!(matches!(store.authenticate(&text_a, "laptop"), Err(Denied::Unauthorized(_))));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90d").unwrap(), 90 * 86400);
        assert_eq!(parse_duration("12h").unwrap(), 12 * 3600);
        assert_eq!(parse_duration("1s").unwrap(), 1);
        for bad in ["", "d", "10", "10x", "-1d", "0s", "99999999999999999999y"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
