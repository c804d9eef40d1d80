//! What Cairn needs from the operating system: who and where we are, and reading a file
//! system entry's metadata (the restore side lives in `restore::meta`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// The cores this process may use (2 if the system cannot tell): the default count of the
/// threads that compress, decode and verify.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

use cairn_format::tree::{Node, NodeKind, Timestamp, Xattr};

/// This machine's host name.
pub fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// The current user's name (or numeric ID when it has none).
pub fn username() -> String {
    let uid = uzers::get_current_uid();
    uzers::get_user_by_uid(uid).map(|u| u.name().to_string_lossy().into_owned()).unwrap_or_else(|| uid.to_string())
}

/// The current time.
pub fn now() -> Timestamp {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() }
}

/// The current time in whole seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    now().secs.max(0) as u64
}

/// A byte size for a person, in the units [`parse_size`] reads: whole bytes below 1 KiB, else
/// one decimal of the largest binary unit up to TiB ("1.5 GiB").
pub fn format_size(bytes: u64) -> String {
    format_scaled(bytes, &["B", "KiB", "MiB", "GiB", "TiB"], 1)
}

/// `bytes` in the largest of `units` (each 1024 of the one before, the first bytes) it reaches,
/// with `decimals` decimals; whole bytes below the second unit.
pub fn format_scaled(bytes: u64, units: &[&str], decimals: usize) -> String {
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} {}", units[0])
    } else {
        format!("{v:.decimals$} {}", units[unit])
    }
}

/// Parses a byte size: a number with an optional K, M, G or T suffix (binary units).
pub fn parse_size(s: &str) -> crate::Result<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix("IB").or_else(|| t.strip_suffix('B')).unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let bad = || crate::Error::Usage(format!("invalid size {s:?}: use a number with K, M, G or T"));
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    n.checked_mul(mult).ok_or_else(|| crate::Error::Usage(format!("size {s:?} is too large")))
}

/// Parses a duration: a number with an s, m, h or d suffix (`90s`, `10m`, `2h`; seconds without).
pub fn parse_duration(s: &str) -> crate::Result<std::time::Duration> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.chars().last() {
        Some('s') => (&t[..t.len() - 1], 1.0),
        Some('m') => (&t[..t.len() - 1], 60.0),
        Some('h') => (&t[..t.len() - 1], 3600.0),
        Some('d') => (&t[..t.len() - 1], 86400.0),
        _ => (&t[..], 1.0),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| crate::Error::Usage(format!("invalid duration {s:?}: use e.g. 90s, 10m or 2h")))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(crate::Error::Usage(format!("invalid duration {s:?}: use e.g. 90s, 10m or 2h")));
    }
    Ok(std::time::Duration::from_secs_f64(n * mult))
}

/// The current time as RFC 3339 (UTC).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Formats a timestamp in local time, `YYYY-MM-DD HH:MM:SS`.
pub fn format_local(t: Timestamp) -> String {
    use chrono::TimeZone;
    match chrono::Local.timestamp_opt(t.secs, t.nanos) {
        chrono::LocalResult::Single(dt) => dt.format("%Y-%m-%d %H:%M:%S").to_string(),
        _ => format!("@{}", t.secs),
    }
}

/// Parses a local time written `YYYY-MM-DD HH:MM:SS` (as [`format_local`] writes it). A time
/// that occurs twice (when clocks go back) is the first of the two; one that never occurs (when
/// clocks go forward) is an error.
pub fn parse_local(s: &str) -> crate::Result<Timestamp> {
    use chrono::TimeZone;
    let naive = chrono::NaiveDateTime::parse_from_str(s.trim(), "%Y-%m-%d %H:%M:%S")
        .map_err(|_| crate::Error::Usage(format!("invalid time {s:?}: use YYYY-MM-DD HH:MM:SS (local time)")))?;
    let t = chrono::Local
        .from_local_datetime(&naive)
        .earliest()
        .ok_or_else(|| crate::Error::Usage(format!("time {s:?} does not exist here (clocks skip it)")))?;
    Ok(Timestamp { secs: t.timestamp(), nanos: 0 })
}

/// Whether `path` is on a file system where reserving a file's blocks before writing them
/// costs little and changes nothing else: ext4 or XFS (false when that cannot be told).
pub fn reserves_cheaply(path: &Path) -> bool {
    const XFS_SUPER_MAGIC: u64 = 0x5846_5342;
    let Ok(s) = rustix::fs::statfs(path) else { return false };
    let kind = s.f_type as u64;
    kind == libc::EXT4_SUPER_MAGIC as u64 || kind == XFS_SUPER_MAGIC
}

/// Makes the allocator hand large freed buffers back to the system at once, for the maintenance
/// commands (check, prune, recompress), whose resident memory users compare with their peers'.
/// glibc raises its mmap threshold to the size of every large buffer freed (up to 32 MiB): after
/// the first pack-sized buffer, pack-sized buffers come from the heap, whose freed pages it keeps,
/// and a prune's peak RSS grew phase by phase to 1.1x restic's (135-146 MB). Fixing the threshold
/// at glibc's default, 128 KiB, turns that off (110-116 MB; docs/BENCHMARKS.md); the cost, a page
/// fault for each 4 KiB of a large buffer, the read path's buffer pool avoids where it counts.
/// Restores keep the default: there the page faults cost more than the memory.
pub fn keep_heap_small() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes glibc's allocator; any value is valid and a failure changes
    // nothing but memory use.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// CPU time (user and system) this process has used so far, all threads summed.
pub fn process_cpu_time() -> std::time::Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0;
    if !ok {
        return std::time::Duration::ZERO;
    }
    // SAFETY: zeroed is a valid rusage, and getrusage succeeded.
    let u = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time used so far: the machine's, where Linux's `/proc/stat` says, and this process's.
#[derive(Clone, Copy, Debug)]
pub struct CpuTimes {
    /// The machine's busy and total clock ticks, summed over its CPUs.
    machine: Option<(u64, u64)>,
    /// This process's CPU time.
    process: std::time::Duration,
}

impl CpuTimes {
    /// The times now.
    pub fn now() -> Self {
        CpuTimes { machine: machine_cpu_ticks(), process: process_cpu_time() }
    }

    /// The share of the cores' time busy since `before`, taken `elapsed` earlier: the
    /// machine's where known (a storage server on this machine counts too), else this
    /// process's CPU time over `cores`. `None` if no tick passed.
    pub fn busy_since(&self, before: &CpuTimes, elapsed: std::time::Duration, cores: usize) -> Option<f64> {
        match (self.machine, before.machine) {
            (Some((busy, total)), Some((busy0, total0))) => {
                let total = total.checked_sub(total0).filter(|&t| t > 0)?;
                Some(busy.saturating_sub(busy0) as f64 / total as f64)
            }
            _ => {
                let of = elapsed.as_secs_f64() * cores as f64;
                (of > 0.0).then(|| self.process.saturating_sub(before.process).as_secs_f64() / of)
            }
        }
    }
}

/// The machine's CPU time so far, summed over its CPUs, in clock ticks: `(busy, total)`, from the
/// first line of Linux's `/proc/stat` (user, nice, system, idle, iowait, irq, softirq, steal;
/// idle and iowait are not busy). `None` where there is no such file or it reads otherwise.
fn machine_cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_ticks(stat.lines().next()?)
}

/// The `(busy, total)` ticks of `/proc/stat`'s aggregate `cpu` line.
fn parse_cpu_ticks(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_ascii_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // Guest time is counted in user time already: only the first eight fields.
    let ticks: Vec<u64> = fields.take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
    if ticks.len() < 5 {
        return None;
    }
    let total: u64 = ticks.iter().sum();
    Some((total - ticks[3] - ticks[4], total))
}

/// Whether the process runs as root (and so may restore ownership and device nodes).
pub fn is_root() -> bool {
    uzers::get_effective_uid() == 0
}

/// The process umask (read by setting it and putting it back, as POSIX offers no getter).
pub fn umask() -> u32 {
    // SAFETY: umask cannot fail; the old mask is restored at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old as u32
    }
}

/// Caches user and group names by ID.
#[derive(Default)]
pub struct NameCache {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl NameCache {
    /// The name of user `uid`, or "" if it has none.
    pub fn user(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                uzers::get_user_by_uid(uid).map(|u| u.name().to_string_lossy().into_owned()).unwrap_or_default()
            })
            .clone()
    }

    /// The name of group `gid`, or "" if it has none.
    pub fn group(&mut self, gid: u32) -> String {
        self.groups
            .entry(gid)
            .or_insert_with(|| {
                uzers::get_group_by_gid(gid).map(|g| g.name().to_string_lossy().into_owned()).unwrap_or_default()
            })
            .clone()
    }
}

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Reads `path`'s metadata (without following a final symlink) into a node named `name`.
/// Returns `Ok(None)` for sockets, which cannot be backed up.
pub fn read_node(path: &Path, name: Vec<u8>, names: &mut NameCache) -> io::Result<Option<Node>> {
    let at = At::new(path)?;
    read_node_at(at.dir(), at.name(), path, name, names)
}

/// [`read_node`] for the entry `at` (a name) in the open directory `dir`, whose path is
/// `path`: status and symlink target are read relative to the directory, so the kernel does
/// not walk the whole path again (extended attributes have no such call and use `path`, or
/// when that is too long for the kernel, the directory's `/proc/self/fd` entry: [`short_path`]).
pub fn read_node_at(
    dir: impl std::os::fd::AsFd,
    at: &Path,
    path: &Path,
    name: Vec<u8>,
    names: &mut NameCache,
) -> io::Result<Option<Node>> {
    use rustix::fs::{AtFlags, FileType};
    let st = rustix::fs::statat(&dir, at, AtFlags::SYMLINK_NOFOLLOW)?;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => NodeKind::File,
        FileType::Directory => NodeKind::Dir,
        FileType::Symlink => NodeKind::Symlink,
        FileType::CharacterDevice => NodeKind::CharDevice,
        FileType::BlockDevice => NodeKind::BlockDevice,
        FileType::Fifo => NodeKind::Fifo,
        _ => return Ok(None),
    };
    let time = |secs: i64, nanos: u64| Timestamp { secs, nanos: nanos as u32 };
    let mut node = Node::new(name, kind);
    node.mode = st.st_mode & 0o7777;
    node.uid = st.st_uid;
    node.gid = st.st_gid;
    node.user = names.user(st.st_uid);
    node.group = names.group(st.st_gid);
    node.atime = time(st.st_atime, st.st_atime_nsec);
    node.mtime = time(st.st_mtime, st.st_mtime_nsec);
    node.ctime = time(st.st_ctime, st.st_ctime_nsec);
    node.inode = st.st_ino;
    node.device_id = st.st_dev;
    node.links = st.st_nlink;
    match kind {
        NodeKind::File => node.size = st.st_size as u64,
        NodeKind::Symlink => {
            node.target = rustix::fs::readlinkat(&dir, at, Vec::new())?.into_bytes();
            node.size = node.target.len() as u64;
        }
        NodeKind::CharDevice | NodeKind::BlockDevice => node.rdev = st.st_rdev,
        _ => {}
    }
    read_xattrs(&short_path(dir.as_fd(), at, path), &mut node)?;
    Ok(Some(node))
}

fn read_xattrs(path: &Path, node: &mut Node) -> io::Result<()> {
    let names = match xattr::list(path) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in names {
        let Some(value) = xattr::get(path, &name)? else {
            continue;
        };
        match name.as_bytes() {
            ACL_ACCESS => node.acl_access = Some(value),
            ACL_DEFAULT => node.acl_default = Some(value),
            n => node.xattrs.push(Xattr { name: n.to_vec(), value }),
        }
    }
    node.xattrs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(())
}

/// The data regions `(offset, length)` of `[start, end)` of an open file, found with
/// SEEK_DATA / SEEK_HOLE; everything else is a hole. Backup and restore both use this, with one
/// rule: when in doubt, it is data (and gets read). Only ENXIO — "no data after this offset" —
/// makes the rest a hole; any other SEEK_DATA failure (a file system without it answers EINVAL
/// or EOPNOTSUPP) makes the rest one data region, and a failed SEEK_HOLE makes data run to `end`.
pub fn data_regions(file: &File, start: u64, end: u64) -> Vec<(u64, u64)> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut pos = start;
    while pos < end {
        // SAFETY: lseek on a file descriptor we own; no memory is passed.
        let found = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        let seek = if found < 0 { Err(io::Error::last_os_error()) } else { Ok(found as u64) };
        let Some(data) = data_after(seek, pos) else { break };
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        let hole = if hole < 0 { end } else { (hole as u64).clamp(data + 1, end) };
        out.push((data, hole - data));
        pos = hole;
    }
    out
}

/// Where data begins at or after `pos`, given what `lseek(pos, SEEK_DATA)` returned: `None`
/// only when it said ENXIO (nothing but holes after `pos`); on any other error, `pos` itself
/// (see [`data_regions`]).
fn data_after(seek: io::Result<u64>, pos: u64) -> Option<u64> {
    match seek {
        Ok(data) => Some(data.max(pos)),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => None,
        Err(_) => Some(pos),
    }
}

/// Opens a file for reading, never through a symlink, without updating its access time where
/// that is permitted (O_NOATIME needs the file's owner or root). `path` may be of any length
/// ([`At`]).
pub fn open_noatime(path: &Path) -> io::Result<File> {
    let at = At::new(path)?;
    open_noatime_at(at.dir(), at.name())
}

/// [`open_noatime`] for `name` relative to the open directory `dir`.
pub fn open_noatime_at<P: rustix::path::Arg + Copy>(dir: impl std::os::fd::AsFd, name: P) -> io::Result<File> {
    Ok(File::from(openat_noatime(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC)?))
}

/// Opens `name` (relative to `dir`) with `flags` plus O_NOATIME, or without it where it is not
/// permitted (EPERM: neither the file's owner nor root).
pub fn openat_noatime<P: rustix::path::Arg + Copy>(
    dir: impl std::os::fd::AsFd,
    name: P,
    flags: rustix::fs::OFlags,
) -> io::Result<std::os::fd::OwnedFd> {
    match rustix::fs::openat(&dir, name, flags | OFlags::NOATIME, Mode::empty()) {
        Err(rustix::io::Errno::PERM) => Ok(rustix::fs::openat(&dir, name, flags, Mode::empty())?),
        other => Ok(other?),
    }
}

/// Paths of this many bytes or more are not given to the kernel whole: it refuses a path of
/// `PATH_MAX` (4096) bytes or more, counting the final NUL, with ENAMETOOLONG.
pub const LONG_PATH: usize = 4000;

/// An entry named by a directory and a path relative to it that the kernel accepts, for the
/// `*at` calls (`openat`, `fstatat`, `mkdirat`, `unlinkat`, `linkat`, …). A path shorter than
/// [`LONG_PATH`] is used as it is, relative to the current directory, at no cost; a longer one
/// is opened a piece at a time — whole components, each piece under [`LONG_PATH`] bytes,
/// relative to the directory the piece before it opened (`O_PATH`) — and the entry is named
/// by the last piece in the last directory. So a tree of any depth is reachable, while no
/// walk holds a descriptor per level.
#[derive(Debug)]
pub struct At {
    dir: Option<OwnedFd>,
    name: PathBuf,
}

impl At {
    /// The entry at `path`, of any length.
    pub fn new(path: &Path) -> io::Result<At> {
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() < LONG_PATH {
            return Ok(At { dir: None, name: path.to_path_buf() });
        }
        let too_long = || io::Error::from_raw_os_error(libc::ENAMETOOLONG);
        let mut dir: Option<OwnedFd> = None;
        let mut rest = bytes;
        while rest.len() >= LONG_PATH {
            // Cut after the last whole component that fits (a component has at most 255 bytes).
            let cut = rest[..LONG_PATH].iter().rposition(|&b| b == b'/').filter(|&c| c > 0).ok_or_else(too_long)?;
            let piece = Path::new(OsStr::from_bytes(&rest[..cut]));
            let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let base = dir.as_ref().map_or(rustix::fs::CWD, |d| d.as_fd());
            dir = Some(rustix::fs::openat(base, piece, flags, Mode::empty())?);
            rest = &rest[cut..];
            while rest.first() == Some(&b'/') {
                rest = &rest[1..];
            }
        }
        let name = if rest.is_empty() { PathBuf::from(".") } else { PathBuf::from(OsStr::from_bytes(rest)) };
        Ok(At { dir, name })
    }

    /// The directory [`At::name`] is relative to (the current directory for a short path).
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_ref().map_or(rustix::fs::CWD, |d| d.as_fd())
    }

    /// The entry's path relative to [`At::dir`]: shorter than [`LONG_PATH`].
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// A path to the entry for calls that have no `*at` form (extended attributes): the
    /// path itself when short, else through the open directory ([`short_path`]).
    pub fn path(&self) -> Cow<'_, Path> {
        match &self.dir {
            None => Cow::Borrowed(&self.name),
            Some(dir) => Cow::Owned(proc_path(dir.as_fd(), &self.name)),
        }
    }
}

/// The path of the entry `name` in the open directory `dir`, whose full path is `full`, for
/// calls that have no `*at` form: `full` when the kernel accepts it, else
/// `/proc/self/fd/DIR/NAME`, which the kernel resolves from the open directory (the final name
/// is not followed by the `l*` calls), however deep it lies.
pub fn short_path<'p>(dir: BorrowedFd<'_>, name: &'p Path, full: &'p Path) -> Cow<'p, Path> {
    if full.as_os_str().len() < LONG_PATH || dir.as_raw_fd() == libc::AT_FDCWD {
        Cow::Borrowed(full)
    } else {
        Cow::Owned(proc_path(dir, name))
    }
}

fn proc_path(dir: BorrowedFd<'_>, name: &Path) -> PathBuf {
    Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

// File-system calls on paths of any length: each names its entry through [`At`], so a path
// longer than the kernel takes is reached relative to an open directory, and a short one costs
// what the plain call costs.

/// The status of the entry at `path` (`lstat`: a symlink is not followed).
pub fn lstat(path: &Path) -> io::Result<rustix::fs::Stat> {
    let at = At::new(path)?;
    Ok(rustix::fs::statat(at.dir(), at.name(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?)
}

/// The target of the symlink at `path`.
pub fn read_link(path: &Path) -> io::Result<Vec<u8>> {
    let at = At::new(path)?;
    Ok(rustix::fs::readlinkat(at.dir(), at.name(), Vec::new())?.into_bytes())
}

/// Opens the entry at `path` with `flags` (and `mode`, for `O_CREAT`).
pub fn open_flags(path: &Path, flags: OFlags, mode: u32) -> io::Result<File> {
    let at = At::new(path)?;
    Ok(File::from(rustix::fs::openat(at.dir(), at.name(), flags | OFlags::CLOEXEC, Mode::from_raw_mode(mode))?))
}

/// Makes the directory `path` with permission bits `mode` (less the umask).
pub fn mkdir(path: &Path, mode: u32) -> io::Result<()> {
    let at = At::new(path)?;
    Ok(rustix::fs::mkdirat(at.dir(), at.name(), Mode::from_raw_mode(mode))?)
}

/// Makes a symlink at `path` pointing to `target`.
pub fn symlink(target: &[u8], path: &Path) -> io::Result<()> {
    let at = At::new(path)?;
    Ok(rustix::fs::symlinkat(OsStr::from_bytes(target), at.dir(), at.name())?)
}

/// Makes a special file (FIFO, device node) at `path`; `mode` holds its type and permissions.
pub fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let at = At::new(path)?;
    let c = cstring(at.name())?;
    // SAFETY: a valid descriptor (or AT_FDCWD) and a NUL-terminated name that outlives the call.
    let rc = unsafe { libc::mknodat(at.dir().as_raw_fd(), c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes the non-directory at `path`.
pub fn remove_file(path: &Path) -> io::Result<()> {
    let at = At::new(path)?;
    Ok(rustix::fs::unlinkat(at.dir(), at.name(), rustix::fs::AtFlags::empty())?)
}

/// Makes `link` a hard link to `existing` (neither followed if a symlink).
pub fn hard_link(existing: &Path, link: &Path) -> io::Result<()> {
    let (from, to) = (At::new(existing)?, At::new(link)?);
    Ok(rustix::fs::linkat(from.dir(), from.name(), to.dir(), to.name(), rustix::fs::AtFlags::empty())?)
}

/// The names in the directory at `path` (without `.` and `..`), unsorted.
pub fn list_names(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let dir = open_flags(path, OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
    names_in(dir.as_fd())
}

fn names_in(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// Removes the directory at `path` and everything in it, each entry relative to its open
/// directory (never through a symlink), so a tree of any depth goes. A name already gone is
/// not an error.
pub fn remove_dir_all(path: &Path) -> io::Result<()> {
    let at = At::new(path)?;
    remove_dir_all_at(at.dir(), at.name())
}

fn remove_dir_all_at(parent: BorrowedFd<'_>, name: &Path) -> io::Result<()> {
    use rustix::fs::AtFlags;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = rustix::fs::openat(parent, name, flags, Mode::empty())?;
    for child in names_in(dir.as_fd())? {
        let child = Path::new(OsStr::from_bytes(&child));
        let st = match rustix::fs::statat(&dir, child, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) => continue,
            other => other?,
        };
        let gone = if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory {
            remove_dir_all_at(dir.as_fd(), child)
        } else {
            rustix::fs::unlinkat(&dir, child, AtFlags::empty()).map_err(io::Error::from)
        };
        match gone {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?)
}

/// `path` as a C string.
pub fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_shown_in_one_decimal_of_binary_units() {
        assert_eq!(format_size(1536 << 20), "1.5 GiB");
        assert_eq!(format_size(10), "10 B");
        assert_eq!(format_size(200 << 10), "200.0 KiB");
        assert_eq!(format_size(3 << 40), "3.0 TiB");
    }

    #[test]
    fn cpu_ticks_are_read_from_the_aggregate_line() {
        let line = "cpu  100 5 50 800 40 3 2 0 7 0";
        assert_eq!(parse_cpu_ticks(line), Some((160, 1000)));
        assert_eq!(parse_cpu_ticks("cpu0 1 2 3 4 5 6 7 8"), None, "one CPU's line");
        assert_eq!(parse_cpu_ticks("cpu  1 2 3"), None, "too few fields");
        assert_eq!(parse_cpu_ticks("cpu  1 2 x 4 5"), None);
        assert_eq!(parse_cpu_ticks(""), None);
        #[cfg(target_os = "linux")]
        assert!(machine_cpu_ticks().is_some_and(|(busy, total)| busy <= total && total > 0));
        // The share: from the machine's ticks, else the process's time over its cores.
        let ms = std::time::Duration::from_millis;
        let at = |machine, process| CpuTimes { machine, process: ms(process) };
        let sec = ms(1000);
        assert_eq!(at(Some((60, 200)), 0).busy_since(&at(Some((10, 100)), 0), sec, 2), Some(0.5));
        assert_eq!(at(Some((10, 100)), 0).busy_since(&at(Some((10, 100)), 0), sec, 2), None, "no tick");
        assert_eq!(at(None, 1500).busy_since(&at(None, 500), sec, 2), Some(0.5));
        assert_eq!(at(Some((1, 2)), 1500).busy_since(&at(None, 500), sec, 4), Some(0.25));
    }

    #[test]
    fn local_times_parse_as_they_are_written() {
        for s in ["2019-09-01 11:00:00", "1999-12-31 23:59:59", "2024-02-29 00:00:00"] {
            assert_eq!(format_local(parse_local(s).unwrap()), s);
        }
        for bad in ["2019-09-01", "2019-09-01T11:00:00", "2019-02-30 11:00:00", "yesterday", ""] {
            let e = parse_local(bad).unwrap_err().to_string();
            assert!(e.contains("YYYY-MM-DD HH:MM:SS"), "{bad}: {e}");
        }
    }

    #[test]
    fn only_enxio_means_no_more_data() {
        let err = |code| Err(io::Error::from_raw_os_error(code));
        assert_eq!(data_after(Ok(8192), 100), Some(8192));
        assert_eq!(data_after(err(libc::ENXIO), 100), None);
        // Anything else is doubt, and doubt is data at `pos`: read it.
        for code in [libc::EINVAL, libc::EOPNOTSUPP, libc::EIO, libc::ESPIPE, libc::EBADF] {
            assert_eq!(data_after(err(code), 100), Some(100), "errno {code}");
        }
    }

    #[test]
    fn a_file_system_without_seek_data_is_all_data() {
        // procfs answers SEEK_DATA with EINVAL.
        let file = File::open("/proc/version").unwrap();
        // SAFETY: lseek on an open descriptor; no memory involved.
        let r = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_DATA) };
        assert!(r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO), "procfs has SEEK_DATA?");
        assert_eq!(data_regions(&file, 0, 50), vec![(0, 50)]);
        assert_eq!(data_regions(&file, 10, 50), vec![(10, 40)]);
    }

    #[test]
    fn paths_of_any_length_are_reached_through_open_directories() {
        let d = tempfile::tempdir().unwrap();
        let top = d.path().join(format!("00{}", "x".repeat(200)));
        let mut path = d.path().to_path_buf();
        for i in 0..40 {
            path.push(format!("{i:02}{}", "x".repeat(200)));
            mkdir(&path, 0o755).unwrap();
        }
        assert!(path.as_os_str().len() > 2 * LONG_PATH);
        let whole = std::fs::symlink_metadata(&path).unwrap_err();
        assert_eq!(whole.raw_os_error(), Some(libc::ENAMETOOLONG), "the kernel takes the whole path?");
        let file = path.join("f");
        drop(open_flags(&file, OFlags::WRONLY | OFlags::CREATE, 0o644).unwrap());
        symlink(b"elsewhere", &path.join("s")).unwrap();
        assert_eq!(read_link(&path.join("s")).unwrap(), b"elsewhere");
        hard_link(&file, &path.join("g")).unwrap();
        assert_eq!(lstat(&file).unwrap().st_nlink, 2);
        mknod(&path.join("p"), libc::S_IFIFO | 0o600, 0).unwrap();
        let mut names = list_names(&path).unwrap();
        names.sort();
        assert_eq!(names, [b"f".to_vec(), b"g".to_vec(), b"p".to_vec(), b"s".to_vec()]);
        let mut names = NameCache::default();
        let node = read_node(&file, b"f".to_vec(), &mut names).unwrap().unwrap();
        assert_eq!((node.kind, node.links), (NodeKind::File, 2));
        assert!(open_noatime(&file).is_ok());
        // The path for calls without an `*at` form is short and reaches the same entry.
        let at = At::new(&file).unwrap();
        assert!(at.path().as_os_str().len() < LONG_PATH && at.name().as_os_str().len() < LONG_PATH);
        assert_eq!(std::fs::symlink_metadata(at.path()).unwrap().len(), 0);
        remove_file(&path.join("g")).unwrap();
        assert_eq!(lstat(&file).unwrap().st_nlink, 1);
        remove_dir_all(&top).unwrap();
        assert!(list_names(d.path()).unwrap().is_empty());
    }

    #[test]
    fn holes_are_left_out() {
        use std::os::unix::fs::FileExt;
        let file = tempfile::tempfile().unwrap();
        file.set_len(3 << 20).unwrap();
        file.write_all_at(&[1; 4096], 1 << 20).unwrap();
        let regions = data_regions(&file, 0, 3 << 20);
        // tmpfs and most disks report the written block alone; a file system that cannot tell
        // reports more, never less.
        assert!(regions.iter().any(|&(o, l)| o <= 1 << 20 && o + l >= (1 << 20) + 4096), "{regions:?}");
        assert!(data_regions(&file, (2 << 20) + 1, 3 << 20).len() <= 1);
        assert_eq!(data_regions(&file, 5, 5), vec![]);
    }
}
