//! One client connection: the handshake (options until `NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`),
//! then transmission — requests read in order by one thread and answered by a pool of workers,
//! so a slow read (a blob fetched from a remote repository) does not hold up the requests
//! behind it; each reply is written whole under the writer's lock, in the order they finish.
//!
//! Generic over the byte streams, so the fuzz target drives it from memory.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

use crate::proto::{self, errno, opt, rep, tflag, Command, Extent, Opt, Request};

/// A block device the server exports.
pub trait Export: Send + Sync {
    /// Its size in bytes.
    fn size(&self) -> u64;

    /// Whether it takes writes.
    fn writable(&self) -> bool {
        false
    }

    /// Fills `buf` from `offset` (the request is within the export).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Writes `data` at `offset` (within the export); with `fua` durably before returning.
    fn write_at(&self, _offset: u64, _data: &[u8], _fua: bool) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(errno::EPERM as i32))
    }

    /// Writes `length` zeros at `offset`.
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> io::Result<()> {
        let zeros = vec![0u8; length.min(1 << 20) as usize];
        let mut at = offset;
        while at < offset + length {
            let n = (offset + length - at).min(zeros.len() as u64) as usize;
            self.write_at(at, &zeros[..n], fua)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Makes every acknowledged write durable.
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    /// The range around `offset` that one read costs as much as the byte at `offset` alone (the
    /// stored chunk holding it), for a reader that keeps what it reads (a live restore writes it
    /// into its target); empty where nothing is gained (the default).
    fn read_unit(&self, offset: u64) -> std::ops::Range<u64> {
        offset..offset
    }

    /// The extents of `base:allocation` from `offset` on, covering at least one byte and at
    /// most `length` bytes (more are cut).
    fn extents(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>>;
}

/// What a connection is told and allowed.
#[derive(Clone, Debug)]
pub struct Config {
    /// The export's name (the empty name is accepted too: it asks for the default export).
    pub name: String,
    /// Requests answered at once per connection.
    pub workers: usize,
}

/// What the handshake settled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Session {
    /// Replies are structured.
    pub structured: bool,
    /// `base:allocation` was chosen: block status requests are answered.
    pub block_status: bool,
}

/// The transmission flags of `export`.
pub fn transmission_flags(export: &dyn Export) -> u16 {
    let mut f = tflag::HAS_FLAGS | tflag::SEND_FLUSH | tflag::SEND_FUA | tflag::SEND_DF | tflag::CAN_MULTI_CONN;
    if export.writable() {
        f |= tflag::SEND_WRITE_ZEROES;
    } else {
        f |= tflag::READ_ONLY;
    }
    f
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn protocol_error(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Serves one connection from handshake to disconnect. An error is the connection's end (a
/// client out of step or gone); the export is untouched by it.
pub fn serve_connection<R: Read, W: Write + Send>(
    mut input: R,
    mut output: W,
    export: &dyn Export,
    config: &Config,
) -> io::Result<()> {
    match handshake(&mut input, &mut output, export, config)? {
        Some(session) => transmit(input, output, export, session, config.workers),
        None => Ok(()),
    }
}

/// The handshake: `None` if the client aborted it.
pub fn handshake<R: Read, W: Write>(
    input: &mut R,
    output: &mut W,
    export: &dyn Export,
    config: &Config,
) -> io::Result<Option<Session>> {
    let mut hello = proto::NBD_MAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    output.write_all(&hello)?;
    output.flush()?;
    let client = read_u32(input)?;
    if client & proto::CLIENT_FIXED_NEWSTYLE == 0
        || client & !(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES) != 0
    {
        return Err(protocol_error("the client does not speak the fixed newstyle handshake"));
    }
    let no_zeroes = client & proto::CLIENT_NO_ZEROES != 0;
    let mut session = Session::default();
    let known = |name: &[u8]| name.is_empty() || name == config.name.as_bytes();
    loop {
        let mut head = [0u8; 16];
        input.read_exact(&mut head)?;
        if u64::from_be_bytes(head[0..8].try_into().expect("8 bytes")) != proto::IHAVEOPT {
            return Err(protocol_error("an option does not start with IHAVEOPT"));
        }
        let code = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
        let length = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
        if length > proto::MAX_OPTION {
            return Err(protocol_error("an option longer than 64 KiB"));
        }
        let mut data = vec![0u8; length as usize];
        input.read_exact(&mut data)?;
        let reply = |out: &mut W, kind: u32, d: &[u8]| out.write_all(&proto::option_reply(code, kind, d));
        let parsed = match proto::parse_option(code, &data) {
            Ok(p) => p,
            Err(_) if code == opt::EXPORT_NAME => unreachable!("any bytes name an export"),
            Err(e) => {
                reply(output, rep::ERR_INVALID, e.0.as_bytes())?;
                output.flush()?;
                continue;
            }
        };
        match parsed {
            Opt::ExportName(name) => {
                if !known(&name) {
                    return Err(protocol_error("the client asked for an export that does not exist"));
                }
                output.write_all(&export.size().to_be_bytes())?;
                output.write_all(&transmission_flags(export).to_be_bytes())?;
                if !no_zeroes {
                    output.write_all(&[0u8; 124])?;
                }
                output.flush()?;
                return Ok(Some(session));
            }
            Opt::Abort => {
                reply(output, rep::ACK, &[])?;
                output.flush()?;
                return Ok(None);
            }
            Opt::List => {
                let mut d = (config.name.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(config.name.as_bytes());
                reply(output, rep::SERVER, &d)?;
                reply(output, rep::ACK, &[])?;
            }
            Opt::Info { go, name, .. } => {
                if !known(&name) {
                    reply(output, rep::ERR_UNKNOWN, b"no such export")?;
                } else {
                    reply(output, rep::INFO, &proto::info_export(export.size(), transmission_flags(export)))?;
                    reply(output, rep::INFO, &proto::info_block_size(1, 4096, proto::MAX_REQUEST))?;
                    reply(output, rep::ACK, &[])?;
                    if go {
                        output.flush()?;
                        return Ok(Some(session));
                    }
                }
            }
            Opt::StructuredReply => {
                session.structured = true;
                reply(output, rep::ACK, &[])?;
            }
            Opt::MetaContext { set, name, queries } => {
                if !session.structured {
                    reply(output, rep::ERR_INVALID, b"negotiate structured replies first")?;
                } else if !known(&name) {
                    reply(output, rep::ERR_UNKNOWN, b"no such export")?;
                } else {
                    let serves = proto::serves_base_allocation(&queries, !set);
                    if set {
                        session.block_status = serves;
                    }
                    if serves {
                        let mut d = proto::BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                        d.extend_from_slice(proto::BASE_ALLOCATION.as_bytes());
                        reply(output, rep::META_CONTEXT, &d)?;
                    }
                    reply(output, rep::ACK, &[])?;
                }
            }
            Opt::Unsupported => reply(output, rep::ERR_UNSUP, b"not supported by this server")?,
        }
        output.flush()?;
    }
}

/// One request to answer, with a write's data.
struct Job {
    request: Request,
    data: Vec<u8>,
}

/// Most bytes of data (writes' and reads' buffers) one connection's requests hold at once: a
/// client sending many large requests waits for replies instead of filling the memory.
pub const CONNECTION_BYTES: u64 = 64 * 1024 * 1024;

/// The bytes a connection's requests in hand hold.
#[derive(Default)]
struct Held {
    bytes: Mutex<u64>,
    freed: std::sync::Condvar,
}

impl Held {
    /// Waits until `n` more bytes fit [`CONNECTION_BYTES`] (a request alone always fits).
    fn acquire(&self, n: u64) {
        let mut b = self.bytes.lock().expect("held lock");
        while *b > 0 && *b + n > CONNECTION_BYTES {
            b = self.freed.wait(b).expect("held lock");
        }
        *b += n;
    }

    fn release(&self, n: u64) {
        *self.bytes.lock().expect("held lock") -= n;
        self.freed.notify_all();
    }
}

impl Job {
    /// The bytes answering it holds: a write's data, or a read's reply (its data twice, as the
    /// export may copy it).
    fn cost(&self) -> u64 {
        match self.request.command {
            Command::Read => 2 * u64::from(self.request.length.min(proto::MAX_REQUEST)),
            _ => self.data.len() as u64,
        }
    }
}

/// Transmission: reads requests until the client disconnects (or goes), answering each with
/// `workers` at once.
pub fn transmit<R: Read, W: Write + Send>(
    mut input: R,
    output: W,
    export: &dyn Export,
    session: Session,
    workers: usize,
) -> io::Result<()> {
    let output = Mutex::new(output);
    let broken = AtomicBool::new(false);
    let held = Held::default();
    let answer = |job: Job| {
        let bytes = answer(export, session, &job);
        let mut out = output.lock().expect("writer lock");
        if out.write_all(&bytes).and_then(|_| out.flush()).is_err() {
            broken.store(true, Ordering::Relaxed);
        }
        drop(out);
        held.release(job.cost());
    };
    if workers <= 1 {
        while let Some(job) = next_job(&mut input)? {
            held.acquire(job.cost());
            answer(job);
            if broken.load(Ordering::Relaxed) {
                break;
            }
        }
        return Ok(());
    }
    std::thread::scope(|s| {
        let (tx, rx) = sync_channel::<Job>(workers);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..workers {
            let rx = rx.clone();
            let answer = &answer;
            std::thread::Builder::new()
                .name("cairn-nbd".into())
                .spawn_scoped(s, move || loop {
                    let job = match rx.lock().expect("jobs lock").recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    };
                    answer(job);
                })
                .expect("cannot start an NBD worker thread");
        }
        let read = loop {
            match next_job(&mut input) {
                Ok(Some(job)) if !broken.load(Ordering::Relaxed) => {
                    held.acquire(job.cost());
                    if tx.send(job).is_err() {
                        break Ok(());
                    }
                }
                Ok(_) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        drop(tx); // the workers finish what was sent, then end
        read
    })
}

/// The next request that needs an answer; `None` when the client disconnects or closes.
fn next_job(input: &mut impl Read) -> io::Result<Option<Job>> {
    let mut head = [0u8; proto::REQUEST_LEN];
    match input.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let request = proto::parse_request(&head).map_err(protocol_error)?;
    if proto::must_close(&request) {
        return Err(protocol_error("a write larger than 32 MiB"));
    }
    if request.command == Command::Disconnect {
        return Ok(None);
    }
    let mut data = Vec::new();
    if request.command == Command::Write {
        data = vec![0u8; request.length as usize];
        input.read_exact(&mut data)?;
    }
    Ok(Some(Job { request, data }))
}

/// The errno a failed call of the export is reported as.
fn errno_of(e: &io::Error) -> u32 {
    match e.raw_os_error().map(|n| n as u32) {
        Some(n @ (errno::EPERM | errno::EIO | errno::ENOMEM | errno::EINVAL | errno::ENOSPC | errno::EOVERFLOW)) => n,
        Some(n @ (errno::ENOTSUP | errno::ESHUTDOWN)) => n,
        _ => errno::EIO,
    }
}

/// The whole reply to one request.
fn answer(export: &dyn Export, session: Session, job: &Job) -> Vec<u8> {
    let r = &job.request;
    let failed = |error: u32, message: &str| {
        if session.structured {
            proto::error_chunk(r.cookie, error, message)
        } else {
            proto::simple_reply(r.cookie, error).to_vec()
        }
    };
    let done = || {
        if session.structured {
            proto::chunk_header(r.cookie, proto::reply::FLAG_DONE, proto::reply::NONE, 0).to_vec()
        } else {
            proto::simple_reply(r.cookie, 0).to_vec()
        }
    };
    if let Some(error) = proto::check(r, export.size(), export.writable(), session.block_status) {
        return failed(error, "refused: out of range, too large, unknown or not allowed");
    }
    let fua = r.flags & proto::cflag::FUA != 0;
    let outcome = match r.command {
        Command::Read => {
            let len = r.length as usize;
            let head = if session.structured { 20 + 8 } else { 16 };
            let mut out = vec![0u8; head + len];
            match export.read_at(r.offset, &mut out[head..]) {
                Ok(()) if session.structured => {
                    out[..20].copy_from_slice(&proto::chunk_header(
                        r.cookie,
                        proto::reply::FLAG_DONE,
                        proto::reply::OFFSET_DATA,
                        8 + r.length,
                    ));
                    out[20..28].copy_from_slice(&r.offset.to_be_bytes());
                    return out;
                }
                Ok(()) => {
                    out[..16].copy_from_slice(&proto::simple_reply(r.cookie, 0));
                    return out;
                }
                Err(e) => Err(e),
            }
        }
        Command::Write => export.write_at(r.offset, &job.data, fua),
        Command::WriteZeroes => export.write_zeroes(r.offset, u64::from(r.length), fua),
        Command::Flush => export.flush(),
        Command::Cache => Ok(()),
        Command::BlockStatus => match export.extents(r.offset, u64::from(r.length)) {
            Ok(extents) => return proto::block_status_chunk(r.cookie, &clip(extents, r)),
            Err(e) => Err(e),
        },
        Command::Trim | Command::Disconnect | Command::Unknown(_) => {
            Err(io::Error::from_raw_os_error(errno::EINVAL as i32))
        }
    };
    match outcome {
        Ok(()) => done(),
        Err(e) => failed(errno_of(&e), &e.to_string()),
    }
}

/// The extents within the request (at least one byte), one only if the client asked for that.
fn clip(extents: Vec<Extent>, r: &Request) -> Vec<Extent> {
    let mut left = u64::from(r.length);
    let mut out = Vec::new();
    for e in extents.into_iter().filter(|e| e.length > 0) {
        if left == 0 {
            break;
        }
        let length = e.length.min(left);
        left -= length;
        match out.last_mut() {
            Some(Extent { length: l, state }) if *state == e.state => *l += length,
            _ => out.push(Extent { length, state: e.state }),
        }
    }
    if out.is_empty() {
        // The export said nothing: call the range allocated data.
        out.push(Extent { length: u64::from(r.length), state: 0 });
    }
    if r.flags & proto::cflag::REQ_ONE != 0 {
        out.truncate(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1 MiB export whose bytes are their offset's low byte; the second half a hole.
    struct Pattern;

    impl Export for Pattern {
        fn size(&self) -> u64 {
            1 << 20
        }

        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            if offset == 4096 {
                return Err(io::Error::from_raw_os_error(errno::EIO as i32));
            }
            for (i, b) in buf.iter_mut().enumerate() {
                *b = if offset + i as u64 >= 1 << 19 { 0 } else { (offset + i as u64) as u8 };
            }
            Ok(())
        }

        fn extents(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
            let half = 1 << 19;
            Ok(if offset < half {
                vec![Extent { length: half - offset, state: 0 }, Extent { length, state: 3 }]
            } else {
                vec![Extent { length, state: 3 }]
            })
        }
    }

    fn option(code: u32, data: &[u8]) -> Vec<u8> {
        let mut o = proto::IHAVEOPT.to_be_bytes().to_vec();
        o.extend_from_slice(&code.to_be_bytes());
        o.extend_from_slice(&(data.len() as u32).to_be_bytes());
        o.extend_from_slice(data);
        o
    }

    fn request(command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
        let mut b = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&command.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&length.to_be_bytes());
        b
    }

    fn run(input: &[u8], workers: usize) -> (io::Result<()>, Vec<u8>) {
        let mut out = Vec::new();
        let config = Config { name: "disk".into(), workers };
        let r = serve_connection(input, &mut out, &Pattern, &config);
        (r, out)
    }

    fn go() -> Vec<u8> {
        let mut d = 4u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"disk");
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    }

    #[test]
    fn a_client_negotiates_structured_replies_and_reads_data_holes_and_errors() {
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(option(opt::STRUCTURED_REPLY, &[]));
        let mut meta = 4u32.to_be_bytes().to_vec();
        meta.extend_from_slice(b"disk");
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&15u32.to_be_bytes());
        meta.extend_from_slice(b"base:allocation");
        input.extend(option(opt::SET_META_CONTEXT, &meta));
        input.extend(option(opt::GO, &go()));
        input.extend(request(0, 1, 10, 4));
        input.extend(request(7, 2, 0, 1 << 20));
        input.extend(request(0, 3, 4096, 10));
        input.extend(request(0, 4, (1 << 20) - 1, 2));
        input.extend(request(1, 5, 0, 1));
        input.push(0); // a write's data, refused (read-only)
        input.extend(request(2, 6, 0, 0));
        let (r, out) = run(&input, 1);
        r.unwrap();
        let find = |needle: &[u8]| out.windows(needle.len()).position(|w| w == needle);
        // The read of 4 bytes at 10, in one data chunk.
        let mut data = proto::chunk_header(1, 1, proto::reply::OFFSET_DATA, 12).to_vec();
        data.extend_from_slice(&10u64.to_be_bytes());
        data.extend_from_slice(&[10, 11, 12, 13]);
        assert!(find(&data).is_some(), "the read's reply");
        let status =
            proto::block_status_chunk(2, &[Extent { length: 1 << 19, state: 0 }, Extent { length: 1 << 19, state: 3 }]);
        assert!(find(&status).is_some(), "the block status reply");
        assert!(find(&proto::chunk_header(3, 1, proto::reply::ERROR, 6 + 43)[..8]).is_some(), "EIO for one read");
        let mut eio = proto::chunk_header(3, 1, proto::reply::ERROR, 0)[..16].to_vec();
        eio.truncate(16);
        assert!(find(&eio).is_some());
        let range = &proto::chunk_header(4, 1, proto::reply::ERROR, 0)[..16];
        let at = find(range).expect("out of range refused");
        assert_eq!(&out[at + 20..at + 24], &errno::EINVAL.to_be_bytes());
        let write = &proto::chunk_header(5, 1, proto::reply::ERROR, 0)[..16];
        let at = find(write).expect("a write refused");
        assert_eq!(&out[at + 20..at + 24], &errno::EPERM.to_be_bytes());
    }

    #[test]
    fn half_handshakes_bad_magics_and_huge_lengths_end_the_connection() {
        assert!(run(&[], 1).0.is_err(), "nothing at all");
        assert!(run(&1u32.to_be_bytes()[..2], 1).0.is_err(), "half the client flags");
        assert!(run(&0u32.to_be_bytes(), 1).0.is_err(), "old-style client");
        let mut huge = 1u32.to_be_bytes().to_vec();
        huge.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        huge.extend_from_slice(&opt::GO.to_be_bytes());
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(run(&huge, 1).0.is_err(), "an option of 4 GiB");
        let mut input = 1u32.to_be_bytes().to_vec();
        input.extend(option(opt::GO, &go()));
        let mut write = request(1, 1, 0, u32::MAX);
        assert!(run(&[input.clone(), write.clone()].concat(), 4).0.is_err(), "a write of 4 GiB");
        write[0] = 0;
        assert!(run(&[input.clone(), write].concat(), 4).0.is_err(), "bad request magic");
        // An unknown option and an unknown export are answered; the client may go on.
        let mut input = 1u32.to_be_bytes().to_vec();
        input.extend(option(99, b"x"));
        let mut other = 5u32.to_be_bytes().to_vec();
        other.extend_from_slice(b"other\0\0");
        input.extend(option(opt::GO, &other));
        input.extend(option(opt::GO, &go()));
        input.extend(request(0, 1, 0, 1));
        let (r, out) = run(&input, 4);
        r.unwrap();
        let unsup = &proto::option_reply(99, rep::ERR_UNSUP, &[])[..16];
        assert!(out.windows(16).any(|w| w == unsup));
        let unknown = &proto::option_reply(opt::GO, rep::ERR_UNKNOWN, &[])[..16];
        assert!(out.windows(16).any(|w| w == unknown));
        assert!(out.ends_with(&[proto::simple_reply(1, 0).as_slice(), &[0]].concat()));
    }
}
