//! The NBD protocol's bytes: the fixed newstyle handshake, the options a client may send, the
//! transmission requests, and the simple and structured replies (the protocol's
//! `doc/proto.md`; docs/FORMAT.md §NBD lists what Cairn answers). Pure functions of bytes, with
//! no I/O, so the fuzz target `nbd` drives them directly.

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the handshake's second magic and the start of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The start of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The start of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// The start of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// The start of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags: fixed newstyle, and no 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
/// See [`FLAG_FIXED_NEWSTYLE`].
pub const FLAG_NO_ZEROES: u16 = 2;
/// The client's flag that it speaks fixed newstyle.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1;
/// The client's flag that it wants no zero padding.
pub const CLIENT_NO_ZEROES: u32 = 2;

/// Transmission flags.
pub mod tflag {
    /// The flags field is valid.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// Writes are refused.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is understood.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// The FUA command flag is understood.
    pub const SEND_FUA: u16 = 1 << 3;
    /// `NBD_CMD_WRITE_ZEROES` is understood.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// The DF command flag is understood.
    pub const SEND_DF: u16 = 1 << 7;
    /// Several connections to the export see one consistent disk.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Option codes.
pub mod opt {
    /// Choose an export, old style (no error reply possible).
    pub const EXPORT_NAME: u32 = 1;
    /// End the handshake.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade to TLS.
    pub const STARTTLS: u32 = 5;
    /// Describe an export.
    pub const INFO: u32 = 6;
    /// Describe an export and enter transmission.
    pub const GO: u32 = 7;
    /// Use structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Choose metadata contexts.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    /// Done.
    pub const ACK: u32 = 1;
    /// One export of a list.
    pub const SERVER: u32 = 2;
    /// One fact about an export.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    /// The option is not known.
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    /// Refused by policy.
    pub const ERR_POLICY: u32 = (1 << 31) + 2;
    /// Malformed.
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    /// No such export.
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    /// Too large.
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
}

/// `NBD_INFO_*` types.
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// Block size limits.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Command flags.
pub mod cflag {
    /// Force unit access: the write is durable before it is acknowledged.
    pub const FUA: u16 = 1 << 0;
    /// Write zeroes without punching a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// Do not fragment a structured read reply.
    pub const DF: u16 = 1 << 2;
    /// Return one block status descriptor only.
    pub const REQ_ONE: u16 = 1 << 3;
    /// Every flag this server understands.
    pub const KNOWN: u16 = FUA | NO_HOLE | DF | REQ_ONE;
}

/// Structured reply chunk types.
pub mod reply {
    /// Nothing (a final chunk).
    pub const NONE: u16 = 0;
    /// Data at an offset.
    pub const OFFSET_DATA: u16 = 1;
    /// Extents of `base:allocation`.
    pub const BLOCK_STATUS: u16 = 5;
    /// An error.
    pub const ERROR: u16 = (1 << 15) + 1;
    /// The chunk flag: the last chunk of this reply.
    pub const FLAG_DONE: u16 = 1;
}

/// The errors a reply carries (Linux values, as the protocol fixes them).
pub mod errno {
    /// Not permitted (a write to a read-only export).
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid request.
    pub const EINVAL: u32 = 22;
    /// Beyond the end of the export (writes).
    pub const ENOSPC: u32 = 28;
    /// A read too large for one reply without fragments.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported.
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// The metadata context of holes and zeros.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The ID the server gives `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation`: the extent is a hole (reads zeros, takes no space).
pub const STATE_HOLE: u32 = 1;
/// `base:allocation`: the extent reads as zeros.
pub const STATE_ZERO: u32 = 2;

/// Longest option the server reads (an export name is at most 4096 bytes; queries a few more).
pub const MAX_OPTION: u32 = 64 * 1024;
/// Largest read or write one request may ask for.
pub const MAX_REQUEST: u32 = 32 * 1024 * 1024;

/// What is wrong with bytes from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Malformed {}

/// A cursor over an option's data that fails instead of reading past its end.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed("an option's data is shorter than its fields"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    /// A string preceded by its 32-bit length.
    fn string(&mut self) -> Result<&'a [u8], Malformed> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn done(&self) -> Result<(), Malformed> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Malformed("an option's data is longer than its fields"))
        }
    }
}

/// One option of the handshake, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opt {
    /// `NBD_OPT_EXPORT_NAME`: the export, then straight into transmission.
    ExportName(Vec<u8>),
    /// `NBD_OPT_ABORT`.
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_INFO` (`go` false) or `NBD_OPT_GO`: the export and the info types asked for.
    Info { go: bool, name: Vec<u8>, requests: Vec<u16> },
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT` (`set` false) or `NBD_OPT_SET_META_CONTEXT`.
    MetaContext { set: bool, name: Vec<u8>, queries: Vec<Vec<u8>> },
    /// An option this server does not implement (`NBD_OPT_STARTTLS` among them).
    Unsupported,
}

/// Parses option `code` with its `data`.
pub fn parse_option(code: u32, data: &[u8]) -> Result<Opt, Malformed> {
    let mut b = Bytes(data);
    let parsed = match code {
        opt::EXPORT_NAME => return Ok(Opt::ExportName(data.to_vec())),
        opt::ABORT => Opt::Abort,
        opt::LIST => Opt::List,
        opt::INFO | opt::GO => {
            let name = b.string()?.to_vec();
            let n = b.u16()?;
            let requests = (0..n).map(|_| b.u16()).collect::<Result<_, _>>()?;
            Opt::Info { go: code == opt::GO, name, requests }
        }
        opt::STRUCTURED_REPLY => Opt::StructuredReply,
        opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
            let name = b.string()?.to_vec();
            let n = b.u32()?;
            // Each query takes at least its 4-byte length: a count beyond that is a lie.
            if n as usize > b.0.len() / 4 {
                return Err(Malformed("a metadata context option counts more queries than it holds"));
            }
            let queries = (0..n).map(|_| b.string().map(<[u8]>::to_vec)).collect::<Result<_, _>>()?;
            Opt::MetaContext { set: code == opt::SET_META_CONTEXT, name, queries }
        }
        _ => return Ok(Opt::Unsupported),
    };
    b.done()?;
    Ok(parsed)
}

/// The metadata contexts of `queries` this server serves: `base:allocation` when asked for it
/// or for everything under `base:` (a list with no queries asks for all).
pub fn serves_base_allocation(queries: &[Vec<u8>], listing: bool) -> bool {
    (listing && queries.is_empty())
        || queries.iter().any(|q| q == BASE_ALLOCATION.as_bytes() || (listing && q == b"base:"))
}

/// An option reply: its header and `data`.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// `NBD_INFO_EXPORT`: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut d = info::EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&size.to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    d
}

/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and largest request.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut d = info::BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [min, preferred, max] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    d
}

/// Transmission commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE` (its data follows the request).
    Write,
    /// `NBD_CMD_DISC`: the client is leaving.
    Disconnect,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
    /// `NBD_CMD_CACHE`.
    Cache,
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS`.
    BlockStatus,
    /// Any other number.
    Unknown(u16),
}

impl Command {
    fn from_code(c: u16) -> Command {
        match c {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disconnect,
            3 => Command::Flush,
            4 => Command::Trim,
            5 => Command::Cache,
            6 => Command::WriteZeroes,
            7 => Command::BlockStatus,
            n => Command::Unknown(n),
        }
    }
}

/// Length of a request header.
pub const REQUEST_LEN: usize = 28;

/// One transmission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags ([`cflag`]).
    pub flags: u16,
    /// What is asked.
    pub command: Command,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    /// Where on the export.
    pub offset: u64,
    /// How many bytes.
    pub length: u32,
}

/// Parses a request header; a wrong magic is a client out of step (the connection closes).
pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Result<Request, Malformed> {
    let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    if u32::from_be_bytes(b[0..4].try_into().expect("4 bytes")) != REQUEST_MAGIC {
        return Err(Malformed("a request does not start with the request magic"));
    }
    Ok(Request {
        flags: u16_at(4),
        command: Command::from_code(u16_at(6)),
        cookie: u64_at(8),
        offset: u64_at(16),
        length: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
    })
}

/// Whether a request with data that follows it (a write) must end the connection instead of
/// being answered: its data is too large to read and drop.
pub fn must_close(r: &Request) -> bool {
    r.command == Command::Write && r.length > MAX_REQUEST
}

/// The error a request gets before anything is done for it, if any: out of range, too large,
/// unknown command or flag, a write to a read-only export, block status not negotiated.
pub fn check(r: &Request, size: u64, writable: bool, block_status: bool) -> Option<u32> {
    if r.flags & !cflag::KNOWN != 0 {
        return Some(errno::EINVAL);
    }
    let in_range = r.offset.checked_add(u64::from(r.length)).is_some_and(|end| end <= size);
    let writes = matches!(r.command, Command::Write | Command::WriteZeroes | Command::Trim);
    match r.command {
        Command::Unknown(_) => Some(errno::EINVAL),
        Command::Disconnect | Command::Flush => None,
        _ if writes && !writable => Some(errno::EPERM),
        Command::Trim => Some(errno::EINVAL),
        Command::BlockStatus if !block_status => Some(errno::EINVAL),
        _ if r.length > MAX_REQUEST && r.command != Command::BlockStatus && r.command != Command::WriteZeroes => {
            Some(errno::EINVAL)
        }
        _ if !in_range => Some(if writes { errno::ENOSPC } else { errno::EINVAL }),
        Command::BlockStatus | Command::Read | Command::Cache if r.length == 0 => Some(errno::EINVAL),
        _ => None,
    }
}

/// A simple reply's header (a read's data follows it).
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk's header for `length` bytes of payload.
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, length: u32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&length.to_be_bytes());
    out
}

/// A final `NBD_REPLY_TYPE_ERROR` chunk with a message (cut to what fits the field).
pub fn error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut out = chunk_header(cookie, reply::FLAG_DONE, reply::ERROR, 6 + msg.len() as u32).to_vec();
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// One extent of `base:allocation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes.
    pub length: u64,
    /// [`STATE_HOLE`] | [`STATE_ZERO`] bits.
    pub state: u32,
}

/// A final `NBD_REPLY_TYPE_BLOCK_STATUS` chunk for `extents` (each at most 4 GiB - 4 KiB long;
/// longer ones are cut, as the descriptor's length is 32 bits).
pub fn block_status_chunk(cookie: u64, extents: &[Extent]) -> Vec<u8> {
    const MAX: u64 = u32::MAX as u64 - 4095;
    let mut payload = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
    for e in extents {
        let mut left = e.length;
        while left > 0 {
            let n = left.min(MAX);
            payload.extend_from_slice(&(n as u32).to_be_bytes());
            payload.extend_from_slice(&e.state.to_be_bytes());
            left -= n;
        }
    }
    let mut out = chunk_header(cookie, reply::FLAG_DONE, reply::BLOCK_STATUS, payload.len() as u32).to_vec();
    out.extend_from_slice(&payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: u16, offset: u64, length: u32) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[6..8].copy_from_slice(&command.to_be_bytes());
        b[8..16].copy_from_slice(&7u64.to_be_bytes());
        b[16..24].copy_from_slice(&offset.to_be_bytes());
        b[24..28].copy_from_slice(&length.to_be_bytes());
        b
    }

    #[test]
    fn requests_out_of_range_too_large_or_unknown_get_errors() {
        let size = 1 << 20;
        let r = |c, o, l| parse_request(&request(c, o, l)).unwrap();
        assert_eq!(check(&r(0, 0, 4096), size, false, true), None);
        assert_eq!(check(&r(0, size - 1, 2), size, false, true), Some(errno::EINVAL));
        assert_eq!(check(&r(0, u64::MAX, 2), size, false, true), Some(errno::EINVAL), "the end overflows");
        assert_eq!(check(&r(0, 0, u32::MAX), u64::MAX, false, true), Some(errno::EINVAL));
        assert_eq!(check(&r(1, 0, 10), size, false, true), Some(errno::EPERM));
        assert_eq!(check(&r(1, size, 10), size, true, true), Some(errno::ENOSPC));
        assert_eq!(check(&r(99, 0, 0), size, true, true), Some(errno::EINVAL));
        assert_eq!(check(&r(7, 0, 10), size, true, false), Some(errno::EINVAL), "block status not negotiated");
        let mut flagged = r(0, 0, 1);
        flagged.flags = 1 << 12;
        assert_eq!(check(&flagged, size, true, true), Some(errno::EINVAL));
        assert!(must_close(&r(1, 0, u32::MAX)));
        let mut bad = request(0, 0, 1);
        bad[0] = 0;
        assert!(parse_request(&bad).is_err());
    }

    #[test]
    fn options_are_parsed_whole_and_lies_about_lengths_are_refused() {
        let mut go = 4u32.to_be_bytes().to_vec();
        go.extend_from_slice(b"disk");
        go.extend_from_slice(&1u16.to_be_bytes());
        go.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
        assert_eq!(
            parse_option(opt::GO, &go),
            Ok(Opt::Info { go: true, name: b"disk".to_vec(), requests: vec![info::BLOCK_SIZE] })
        );
        assert!(parse_option(opt::GO, &go[..go.len() - 1]).is_err());
        let mut long = go.clone();
        long.push(0);
        assert!(parse_option(opt::INFO, &long).is_err());
        let mut meta = 0u32.to_be_bytes().to_vec();
        meta.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_option(opt::SET_META_CONTEXT, &meta).is_err());
        let mut meta = 0u32.to_be_bytes().to_vec();
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&15u32.to_be_bytes());
        meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
        let parsed = parse_option(opt::SET_META_CONTEXT, &meta).unwrap();
        let Opt::MetaContext { queries, set: true, .. } = parsed else { panic!("{parsed:?}") };
        assert!(serves_base_allocation(&queries, false));
        assert_eq!(parse_option(opt::STARTTLS, &[]), Ok(Opt::Unsupported));
    }

    #[test]
    fn long_extents_are_cut_into_descriptors_that_fit_32_bits() {
        let out = block_status_chunk(1, &[Extent { length: 5 << 30, state: 3 }]);
        let payload = &out[20..];
        assert_eq!(payload.len(), 4 + 2 * 8);
        let first = u32::from_be_bytes(payload[4..8].try_into().unwrap()) as u64;
        let second = u32::from_be_bytes(payload[12..16].try_into().unwrap()) as u64;
        assert_eq!(first + second, 5 << 30);
        assert_eq!(first % 4096, 0);
    }
}
