//! The record of which packs a data check read in full, and when: kept in the cache directory
//! (`<cache>/<repository ID>/check-verified`), so a nightly `--read-data-subset P% --resume`
//! reads every pack once before it reads any pack twice, and a check can say how long ago the
//! least recently read pack was read.
//!
//! A full `--read-data --resume` works in cycles: it reads the packs not read since the current
//! cycle began (least recently read first) and, once none is left, begins a new cycle; so a
//! full check stopped by `--max-duration` is finished by the next run instead of started over.
//!
//! The file is text: a `cycle <Unix seconds>` line, then one `<pack ID hex> <Unix seconds>`
//! line per pack; replaced whole (written beside and renamed). It describes this machine's
//! checks only, not the repository.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use cairn_format::id::{IdMap, PackId};

/// When each pack was last read in full.
#[derive(Debug, Default)]
pub struct Record {
    read: IdMap<PackId, u64>,
    /// When the current cycle of full checks began.
    cycle: u64,
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
        let mut cycle = 0;
        let read = text
            .lines()
            .filter_map(|l| {
                let (id, secs) = l.split_once(' ')?;
                if id == "cycle" {
                    cycle = secs.trim().parse().unwrap_or(0);
                    return None;
                }
                Some((PackId::from_hex(id).ok()?, secs.trim().parse().ok()?))
            })
            .collect();
        Ok(Record { read, cycle })
    }

    /// Writes the record to `path` (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create the cache directory", e))?;
        let mut tmp =
            tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, "cannot write the check record", e))?;
        let mut lines: Vec<(&PackId, &u64)> = self.read.iter().collect();
        lines.sort_unstable();
        let mut text = String::with_capacity(lines.len() * 76 + 20);
        text.push_str(&format!("cycle {}\n", self.cycle));
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

    /// Of `packs`, those not read in full since the current cycle began; if none is left, a
    /// new cycle begins now and all of them are.
    pub fn pending<'p, T>(&mut self, packs: &[&'p T], id: impl Fn(&T) -> PackId) -> Vec<&'p T> {
        let left: Vec<&T> =
            packs.iter().copied().filter(|p| self.read.get(&id(p)).is_none_or(|t| *t < self.cycle)).collect();
        if !left.is_empty() {
            return left;
        }
        self.cycle = crate::engine::platform::now_secs();
        packs.to_vec()
    }

    /// Records that `pack` was read in full at `secs`.
    pub fn mark(&mut self, pack: &PackId, secs: u64) {
        self.read.insert(*pack, secs);
    }

    /// Of `packs`: how many were never read, and how many seconds ago the least recently read
    /// of the others was.
    pub fn coverage(&self, packs: &[PackId]) -> (u64, Option<u64>) {
        let now = crate::engine::platform::now_secs();
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
        r.mark(&a, crate::engine::platform::now_secs() - 100);
        r.save(&path).unwrap();
        let r = Record::load(&path).unwrap();
        assert!(r.last(&a).is_some());
        let (never, oldest) = r.coverage(&[a, b]);
        assert_eq!(never, 1);
        assert!((100..110).contains(&oldest.unwrap()));
    }

    #[test]
    fn full_checks_go_in_cycles() {
        let (a, b) = (PackId::hash_of(b"a"), PackId::hash_of(b"b"));
        let packs = [&a, &b];
        let mut r = Record::default();
        // A first cycle: both pending; a is read, then the run stops.
        assert_eq!(r.pending(&packs, |p| *p).len(), 2);
        let now = crate::engine::platform::now_secs();
        r.mark(&a, now);
        assert_eq!(r.pending(&packs, |p| *p), [&b], "the next run finishes the cycle");
        r.mark(&b, now);
        // Nothing left: a new cycle begins, with both.
        let before = r.cycle;
        assert_eq!(r.pending(&packs, |p| *p).len(), 2);
        assert!(r.cycle >= before);
    }
}
