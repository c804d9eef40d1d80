//! [`Storage`] on Apache OpenDAL. Only the `fs` service is wired up so far; other services are
//! a matter of building a different `opendal::Operator`.

use std::sync::{Arc, OnceLock};

use opendal::blocking;
use opendal::options::ReadOptions;
use opendal::{ErrorKind, Operator};

use super::{ObjectInfo, Storage};
use crate::error::{Error, Result};

/// OpenDAL needs a Tokio runtime to drive its (async) services; one is shared per process.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-io")
            .enable_all()
            .build()
            .expect("starting the I/O runtime")
    })
}

/// A repository stored through an OpenDAL operator.
#[derive(Clone)]
pub struct OpendalStorage {
    op: blocking::Operator,
    location: Arc<str>,
}

impl OpendalStorage {
    /// A repository in the local directory `root` (OpenDAL's `fs` service). Writes go to a
    /// temporary file under `root/.tmp` first and are renamed into place, so a crash never
    /// leaves a partial object behind.
    pub fn local(root: &str) -> Result<Self> {
        let tmp = format!("{}/.tmp", root.trim_end_matches('/'));
        let builder = opendal::services::Fs::default().root(root).atomic_write_dir(&tmp);
        let op = Operator::new(builder).map_err(|e| storage_err("open", root, e))?;
        let _guard = runtime().enter();
        let op = blocking::Operator::new(op).map_err(|e| storage_err("open", root, e))?;
        Ok(Self { op, location: root.into() })
    }
}

fn storage_err(op: &'static str, path: &str, source: opendal::Error) -> Error {
    if source.kind() == ErrorKind::NotFound {
        Error::NotFound(path.to_string())
    } else {
        Error::Storage { op, path: path.to_string(), source: Box::new(source) }
    }
}

impl Storage for OpendalStorage {
    fn location(&self) -> &str {
        &self.location
    }

    fn read(&self, path: &str) -> Result<Vec<u8>> {
        let buf = self.op.read(path).map_err(|e| storage_err("read", path, e))?;
        Ok(buf.to_vec())
    }

    fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let opts = ReadOptions { range: (offset..offset + len).into(), ..Default::default() };
        let buf = self.op.read_options(path, opts).map_err(|e| match e.kind() {
            ErrorKind::RangeNotSatisfied => Error::corrupt(path, "truncated (range past the end)"),
            _ => storage_err("read", path, e),
        })?;
        if buf.len() as u64 != len {
            return Err(Error::corrupt(
                path,
                format!("truncated: wanted {len} bytes at offset {offset}, got {}", buf.len()),
            ));
        }
        Ok(buf.to_vec())
    }

    fn write(&self, path: &str, data: Vec<u8>) -> Result<()> {
        self.op.write(path, data).map_err(|e| storage_err("write", path, e))?;
        Ok(())
    }

    fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        let dir = format!("{}/", dir.trim_end_matches('/'));
        let opts = opendal::options::ListOptions { recursive: true, ..Default::default() };
        let entries = match self.op.list_options(&dir, opts) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(storage_err("list", &dir, e)),
        };
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            if entry.metadata().is_dir() {
                continue;
            }
            out.push(ObjectInfo { path: entry.path().to_string(), size: entry.metadata().content_length() });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn delete(&self, path: &str) -> Result<()> {
        match self.op.delete(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(storage_err("delete", path, e)),
        }
    }

    fn exists(&self, path: &str) -> Result<bool> {
        self.op.exists(path).map_err(|e| storage_err("stat", path, e))
    }
}
