//! The cost of one small file, in CPU-microseconds, each way a restore could pay it:
//!
//! ```text
//!   create        openat(O_CREAT | O_EXCL) + write + close, one call each (as tar -x, and cairn)
//!   create-uring  the same three as linked io_uring requests (a direct descriptor), BATCH files
//!                 per io_uring_enter
//!   read          openat + pread + close (as cairn's copy of a local file)
//!   read-uring    the same through io_uring, BATCH files per io_uring_enter
//!   fresh-page    one page mapped, written and unmapped per file, nothing else: what memory
//!                 the process has not touched before costs it on this machine
//!   null-call     one getppid per file: a system call's entry and exit alone
//! ```
//!
//! usage: per-file-calls MODE DIR FILES [SIZE] [BATCH]   (create before read; DIR empty for create)
//! Prints "MODE <files> <µs of CPU per file> <µs of wall per file>"; CPU is the process's user +
//! system time, io_uring's kernel workers included (they are the process's threads).

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::time::Instant;

use io_uring::{opcode, squeue, types, IoUring};

fn cpu_seconds() -> f64 {
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(r.ru_utime) + s(r.ru_stime)
}

fn check(what: &str, ret: isize, want: isize) {
    if ret != want {
        eprintln!("per-file-calls: {what} returned {ret} ({}), wanted {want}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
}

/// An io_uring completion's result: a negative one is an error number.
fn check_cqe(what: &str, ret: i32, want: i32) {
    if ret != want {
        let why = if ret < 0 { std::io::Error::from_raw_os_error(-ret).to_string() } else { "short".into() };
        eprintln!("per-file-calls: {what} gave {ret} ({why}), wanted {want}");
        std::process::exit(1);
    }
}

const CREATE: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;

/// One call per step.
fn by_calls(dir: i32, names: &[CString], create: bool, buf: &mut [u8]) {
    for name in names {
        // SAFETY: plain system calls on a valid descriptor, name and buffer.
        unsafe {
            let flags = if create { CREATE } else { libc::O_RDONLY } | libc::O_CLOEXEC;
            let fd = libc::openat(dir, name.as_ptr(), flags, 0o644);
            check("openat", (fd >= 0) as isize, 1);
            let n = if create {
                libc::write(fd, buf.as_ptr().cast(), buf.len())
            } else {
                libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0)
            };
            check(if create { "write" } else { "pread" }, n, buf.len() as isize);
            libc::close(fd);
        }
    }
}

/// A ring with `batch` direct descriptors, and a buffer of `len` bytes for each, filled with
/// `fill`: made (and every page touched) before the clock starts, as the plain calls' buffer.
fn uring_setup(batch: usize, len: usize, fill: &[u8]) -> (IoUring, Vec<u8>) {
    let ring = IoUring::new((batch * 3).next_power_of_two() as u32).expect("io_uring_setup");
    ring.submitter().register_files_sparse(batch as u32).expect("register direct descriptors");
    let mut bufs = vec![0u8; len * batch];
    for b in bufs.chunks_mut(len) {
        b.copy_from_slice(fill);
    }
    (ring, bufs)
}

/// Each file's open, write (or read) and close linked in one io_uring chain on a direct
/// descriptor; `batch` files per submission, each with its own part of `bufs`.
fn by_uring(dir: i32, names: &[CString], create: bool, (ring, bufs): &mut (IoUring, Vec<u8>), batch: usize) {
    let len = bufs.len() / batch;
    let base = bufs.as_mut_ptr();
    for group in names.chunks(batch) {
        {
            let mut sq = ring.submission();
            for (i, name) in group.iter().enumerate() {
                let slot = types::DestinationSlot::try_from_slot_target(i as u32).expect("slot");
                let flags = if create { CREATE } else { libc::O_RDONLY };
                let open = opcode::OpenAt::new(types::Fd(dir), name.as_ptr()).flags(flags).mode(0o644);
                // SAFETY: inside `bufs`, which has `batch` parts of `len` bytes.
                let data = unsafe { base.add(i * len) };
                let io = if create {
                    opcode::Write::new(types::Fixed(i as u32), data, len as u32).build()
                } else {
                    opcode::Read::new(types::Fixed(i as u32), data, len as u32).offset(0).build()
                };
                let close = opcode::Close::new(types::Fixed(i as u32)).build();
                // SAFETY: the name, the buffer and the ring outlive the submission (waited below).
                unsafe {
                    sq.push(&open.file_index(Some(slot)).build().flags(squeue::Flags::IO_LINK)).expect("room");
                    sq.push(&io.flags(squeue::Flags::IO_LINK).user_data(1)).expect("room");
                    sq.push(&close).expect("room");
                }
            }
        }
        ring.submit_and_wait(group.len() * 3).expect("io_uring_enter");
        for cqe in ring.completion() {
            let want = if cqe.user_data() == 1 { len as i32 } else { 0 };
            check_cqe("an io_uring request", cqe.result(), want);
        }
    }
}

/// A page mapped, written and unmapped, `n` times.
fn fresh_pages(n: usize) {
    for _ in 0..n {
        // SAFETY: an anonymous private mapping of one page, written inside it, then unmapped.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            check("mmap", (p != libc::MAP_FAILED) as isize, 1);
            p.cast::<u8>().write_volatile(1);
            libc::munmap(p, 4096);
        }
    }
}

/// `n` system calls that do nothing.
fn null_calls(n: usize) {
    for _ in 0..n {
        // SAFETY: getppid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!(
            "usage: per-file-calls create|create-uring|read|read-uring|fresh-page|null-call DIR FILES [SIZE] [BATCH]"
        );
        std::process::exit(2);
    }
    let (mode, files) = (args[1].as_str(), args[3].parse::<usize>().expect("FILES: a number"));
    let size = args.get(4).map_or(2048, |s| s.parse().expect("SIZE: a number of bytes"));
    let batch = args.get(5).map_or(64, |s| s.parse().expect("BATCH: a number"));
    let dir = std::fs::File::open(&args[2]).expect("DIR: a directory");
    let names: Vec<CString> = (0..files).map(|i| CString::new(format!("f{i}")).expect("name")).collect();
    let mut buf = vec![7u8; size];
    let mut uring = mode.ends_with("-uring").then(|| uring_setup(batch, size, &buf));
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    match (mode, uring.as_mut()) {
        ("create", _) => by_calls(dir.as_raw_fd(), &names, true, &mut buf),
        ("read", _) => by_calls(dir.as_raw_fd(), &names, false, &mut buf),
        ("create-uring", Some(u)) => by_uring(dir.as_raw_fd(), &names, true, u, batch),
        ("read-uring", Some(u)) => by_uring(dir.as_raw_fd(), &names, false, u, batch),
        ("fresh-page", _) => fresh_pages(files),
        ("null-call", _) => null_calls(files),
        _ => {
            eprintln!("per-file-calls: unknown mode {mode}");
            std::process::exit(2);
        }
    }
    let per = |s: f64| s / files as f64 * 1e6;
    println!("{mode} {files} {:.2} {:.2}", per(cpu_seconds() - cpu), per(wall.elapsed().as_secs_f64()));
}
