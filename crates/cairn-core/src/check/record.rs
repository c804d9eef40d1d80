//! The record of which packs a data check read in full, and when: kept in the cache directory
//! (`<cache>/<repository ID>/check-verified`), so a nightly `--read-data-subset P% --resume`
//! reads every pack once before it reads any pack twice, and a check can say how long ago the
//! least recently read pack was read.
//!
//! The file is text, one `<pack ID hex> <Unix seconds>` line per pack, replaced whole (written
//! beside and renamed). It describes this machine's checks only, not the repository.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::id::{IdMap, PackId};

/// When each pack was last read in full.
#[derive(Debug, Default)]
pub struct Record {
    read: IdMap<PackId, u64>,
}

impl Record {
    /// Loads the record at `path` (empty if there is none yet; lines that do not parse are
    /// dropped: the record is only a schedule).
    pub fn load(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Record::default()),
            Err(e) => return Err(Error::io(path, "cannot read the check record", e)),
        };
        let read = text
            .lines()
            .filter_map(|l| {
                let (id, secs) = l.split_once(' ')?;
                Some((PackId::from_hex(id).ok()?, secs.trim().parse().ok()?))
            })
            .collect();
        Ok(Record { read })
    }

    /// Writes the record to `path` (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create the cache directory", e))?;
        let mut tmp =
            tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, "cannot write the check record", e))?;
        let mut lines: Vec<(&PackId, &u64)> = self.read.iter().collect();
        lines.sort_unstable();
        let mut text = String::with_capacity(lines.len() * 76);
        for (id, secs) in lines {
            text.push_str(&format!("{} {secs}\n", id.to_hex()));
        }
        tmp.write_all(text.as_bytes()).map_err(|e| Error::io(tmp.path(), "cannot write the check record", e))?;
        tmp.persist(path).map_err(|e| Error::io(path, "cannot write the check record", e.error))?;
        Ok(())
    }

    /// When `pack` was last read in full.
    pub fn last(&self, pack: &PackId) -> Option<u64> {
        self.read.get(pack).copied()
    }

    /// Records that `pack` was read in full at `secs`.
    pub fn mark(&mut self, pack: &PackId, secs: u64) {
        self.read.insert(*pack, secs);
    }

    /// Of `packs`: how many were never read, and how many seconds ago the least recently read
    /// of the others was.
    pub fn coverage(&self, packs: &[PackId]) -> (u64, Option<u64>) {
        let now = crate::platform::now_secs();
        let never = packs.iter().filter(|p| !self.read.contains_key(p)).count() as u64;
        let oldest = packs.iter().filter_map(|p| self.read.get(p)).min().map(|t| now.saturating_sub(*t));
        (never, oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_loads_and_reports_coverage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("repo/check-verified");
        let (a, b) = (PackId::hash_of(b"a"), PackId::hash_of(b"b"));
        let mut r = Record::load(&path).unwrap();
        r.mark(&a, crate::platform::now_secs() - 100);
        r.save(&path).unwrap();
        let r = Record::load(&path).unwrap();
        assert!(r.last(&a).is_some());
        let (never, oldest) = r.coverage(&[a, b]);
        assert_eq!(never, 1);
        assert!((100..110).contains(&oldest.unwrap()));
    }
}
