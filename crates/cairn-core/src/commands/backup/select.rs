//! Selection: which paths a backup covers and which entries below them it leaves out
//! (`--exclude`, `--iexclude`, `--exclude-file`, `--exclude-caches`, `--exclude-if-present`,
//! `--one-file-system`, `--files-from`).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::engine::platform::At;
use crate::error::{Error, Result};

/// The first bytes of a valid `CACHEDIR.TAG` (<https://bford.info/cachedir/>).
const CACHEDIR_SIGNATURE: &[u8] = b"Signature: 8a477f597d28d172789f06886806bc55";

/// What to leave out of a backup.
#[derive(Clone, Debug, Default)]
pub struct SelectOptions {
    /// Globs matched against each entry's absolute path and its name.
    pub exclude: Vec<String>,
    /// Like `exclude`, ignoring case.
    pub iexclude: Vec<String>,
    /// Files holding more `exclude` globs, one per line (`#` starts a comment).
    pub exclude_files: Vec<PathBuf>,
    /// Leave out directories holding a valid `CACHEDIR.TAG`.
    pub exclude_caches: bool,
    /// Leave out directories holding an entry with one of these names.
    pub exclude_if_present: Vec<String>,
    /// Do not descend into other file systems below the given paths: their mount points are
    /// recorded as empty directories.
    pub one_file_system: bool,
}

/// The compiled exclusion rules of one backup.
pub struct Filter {
    globs: Option<GlobSet>,
    markers: Vec<(String, Option<&'static [u8]>)>,
    one_file_system: bool,
}

fn compile(patterns: &[String], case_insensitive: bool, b: &mut GlobSetBuilder) -> Result<()> {
    for p in patterns {
        let glob = GlobBuilder::new(p)
            .case_insensitive(case_insensitive)
            .build()
            .map_err(|e| Error::Usage(format!("bad exclude pattern {p:?}: {e}")))?;
        b.add(glob);
    }
    Ok(())
}

/// Reads patterns from an `--exclude-file`: one per line, blank lines and `#` comments skipped.
fn read_patterns(path: &Path) -> Result<Vec<String>> {
    Ok(read_lines(path)?.into_iter().filter(|l| !l.starts_with('#')).collect())
}

/// The non-empty lines of a text file (`-` is standard input), trimmed at the end.
fn read_lines(path: &Path) -> Result<Vec<String>> {
    let mut text = String::new();
    if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map_err(|e| Error::io("standard input", "cannot read", e))?;
    } else {
        text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "cannot read", e))?;
    }
    Ok(text.lines().map(str::trim_end).filter(|l| !l.is_empty()).map(String::from).collect())
}

/// Reads `--files-from`: the paths to back up, one per line (`#` lines are comments).
pub fn read_files_from(path: &Path) -> Result<Vec<PathBuf>> {
    Ok(read_lines(path)?.into_iter().filter(|l| !l.starts_with('#')).map(PathBuf::from).collect())
}

impl Filter {
    /// Compiles `opts`, reading any exclude files.
    pub fn new(opts: &SelectOptions) -> Result<Self> {
        let mut patterns = opts.exclude.clone();
        for f in &opts.exclude_files {
            patterns.extend(read_patterns(f)?);
        }
        let globs = if patterns.is_empty() && opts.iexclude.is_empty() {
            None
        } else {
            let mut b = GlobSetBuilder::new();
            compile(&patterns, false, &mut b)?;
            compile(&opts.iexclude, true, &mut b)?;
            Some(b.build().map_err(|e| Error::Usage(format!("bad exclude patterns: {e}")))?)
        };
        let mut markers: Vec<(String, Option<&'static [u8]>)> =
            opts.exclude_if_present.iter().map(|n| (n.clone(), None)).collect();
        if opts.exclude_caches {
            markers.push(("CACHEDIR.TAG".into(), Some(CACHEDIR_SIGNATURE)));
        }
        Ok(Filter { globs, markers, one_file_system: opts.one_file_system })
    }

    /// Whether the entry at absolute `path` matches an exclude pattern.
    pub fn excludes_path(&self, path: &Path) -> bool {
        self.globs.as_ref().is_some_and(|s| s.is_match(path) || path.file_name().is_some_and(|n| s.is_match(n)))
    }

    /// Whether directory `dir` holds a marker (`--exclude-if-present`, `--exclude-caches`).
    pub fn excludes_dir(&self, dir: &Path) -> bool {
        use rustix::fs::{AtFlags, Mode, OFlags};
        self.markers.iter().any(|(name, signature)| {
            // Relative to the directory when its path is too long for the kernel.
            let Ok(marker) = At::new(&dir.join(name)) else { return false };
            match signature {
                None => rustix::fs::statat(marker.dir(), marker.name(), AtFlags::SYMLINK_NOFOLLOW).is_ok(),
                Some(sig) => {
                    rustix::fs::openat(marker.dir(), marker.name(), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                        .map(std::fs::File::from)
                        .map_err(std::io::Error::from)
                        .and_then(|f| {
                            let mut head = Vec::with_capacity(sig.len());
                            f.take(sig.len() as u64).read_to_end(&mut head)?;
                            Ok(head == *sig)
                        })
                        .unwrap_or(false)
                }
            }
        })
    }

    /// Whether a directory on device `dev` below a path on `root_dev` is left empty.
    pub fn stops_at_device(&self, root_dev: u64, dev: u64) -> bool {
        self.one_file_system && dev != root_dev
    }
}

/// The part of the file system a backup covers: path components from `/` down.
#[derive(Default, Debug)]
pub struct Selection {
    /// The whole subtree below this point is backed up.
    pub whole: bool,
    /// Components below this point that lead to backed-up paths.
    pub children: BTreeMap<Vec<u8>, Selection>,
}

/// Makes `p` absolute and removes `.` and `..` without following symlinks.
pub fn absolute(p: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(p).map_err(|e| Error::io(p, "cannot make absolute", e))?;
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    Ok(out)
}

impl Selection {
    /// Builds the selection for absolute `paths`.
    pub fn new(paths: &[PathBuf]) -> Self {
        let mut root = Selection::default();
        for p in paths {
            let mut at = &mut root;
            for c in p.components() {
                if let Component::Normal(n) = c {
                    at = at.children.entry(n.as_bytes().to_vec()).or_default();
                }
            }
            at.whole = true;
        }
        root
    }
}

/// A listed directory: its entries' names, sorted, and the directory kept
/// open, so its entries can be looked up relative to it (`fstatat`) rather than by path.
#[derive(Default)]
pub struct Listing {
    /// The open directory (none if it could not be listed).
    pub dir: Option<OwnedFd>,
    /// The entries' names, sorted (paths are made one at a time: a directory of 250,000
    /// entries would hold 250,000 paths).
    pub names: Vec<Vec<u8>>,
}

/// Lists directory `dir`; a directory that cannot be listed is reported through `warn`.
pub fn list_dir(dir: &Path, mut warn: impl FnMut(String)) -> Listing {
    match read_names(dir) {
        Ok((fd, mut names)) => {
            names.sort_unstable();
            Listing { dir: Some(fd), names }
        }
        Err(e) => {
            warn(format!("cannot list directory: {e}"));
            Listing::default()
        }
    }
}

/// Opens directory `dir` (a path of any length: [`At`]) and reads the names in it. It is
/// opened with `O_NOATIME` where permitted: listing would otherwise change its access time
/// before the walker records it (the pre-scan lists directories ahead of the walker), and a
/// backup should leave the tree as it found it.
fn read_names(dir: &Path) -> std::io::Result<(OwnedFd, Vec<Vec<u8>>)> {
    use rustix::fs::OFlags;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let at = At::new(dir)?;
    let fd = crate::engine::platform::openat_noatime(at.dir(), at.name(), flags)?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&fd)? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    Ok((fd, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_paths_and_names() {
        let f = Filter::new(&SelectOptions {
            exclude: vec!["*.o".into(), "/src/build".into()],
            iexclude: vec!["*.TMP".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(f.excludes_path(Path::new("/src/a/x.o")));
        assert!(f.excludes_path(Path::new("/src/build")));
        assert!(!f.excludes_path(Path::new("/src/builder")));
        assert!(f.excludes_path(Path::new("/a/b.tmp")));
        assert!(!f.excludes_path(Path::new("/a/b.c")));
        assert!(Filter::new(&SelectOptions { exclude: vec!["a[".into()], ..Default::default() }).is_err());
    }

    #[test]
    fn markers_and_cache_tags() {
        let d = tempfile::tempdir().unwrap();
        let f = Filter::new(&SelectOptions {
            exclude_caches: true,
            exclude_if_present: vec![".nobackup".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(!f.excludes_dir(d.path()));
        std::fs::write(d.path().join("CACHEDIR.TAG"), b"not a tag").unwrap();
        assert!(!f.excludes_dir(d.path()), "a tag without the signature is ignored");
        std::fs::write(d.path().join("CACHEDIR.TAG"), [CACHEDIR_SIGNATURE, b"\n# x"].concat()).unwrap();
        assert!(f.excludes_dir(d.path()));
        std::fs::remove_file(d.path().join("CACHEDIR.TAG")).unwrap();
        std::fs::write(d.path().join(".nobackup"), b"").unwrap();
        assert!(f.excludes_dir(d.path()));
    }

    #[test]
    fn listing_keeps_the_access_time() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("b"), b"").unwrap();
        std::fs::write(d.path().join("a"), b"").unwrap();
        let old = filetime::FileTime::from_unix_time(1_000_000_000, 0);
        filetime::set_file_atime(d.path(), old).unwrap();
        let names: Vec<Vec<u8>> = list_dir(d.path(), |w| panic!("{w}")).names;
        assert_eq!(names, [b"a".to_vec(), b"b".to_vec()]);
        let md = std::fs::metadata(d.path()).unwrap();
        assert_eq!(filetime::FileTime::from_last_access_time(&md), old);
        let mut warned = None;
        assert!(list_dir(&d.path().join("missing"), |w| warned = Some(w)).names.is_empty());
        assert!(warned.unwrap().contains("cannot list directory"));
    }
}
