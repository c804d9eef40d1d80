//! The HTTP side: connections (TLS, timeouts, a cap on their number), the routes of FORMAT.md
//! §15, and each request's way from its raw path to the storage.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_core::engine::storage::{Location, OpendalStorage, RemoteOptions, Storage};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use cairn_format::layout::Dir;
use cairn_format::protocol::{
    self, Kind, Op, Route, MAX_OBJECT_SIZE, REVISION, TOKEN_NAME_HEADER, VERSION as PROTOCOL,
};

use crate::log::{Entry, Log};
use crate::policy::{self, Rule};
use crate::quota::{Quotas, Usage};
use crate::stored_by::Records;
use crate::tokens::{Denied, TokenStore};

/// How long a client may take to send a request's head (or finish the TLS handshake).
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client may take to send a request's body.
const BODY_TIMEOUT: Duration = Duration::from_secs(600);
/// Connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 4096;
/// Where the server records which token wrote each lock (FORMAT.md §15), inside each
/// repository, where no client request can name it.
const LOCK_OWNERS: &str = ".serve/lock-owners/";

/// What every connection shares.
pub struct State {
    storage: Location,
    remote: RemoteOptions,
    tokens: TokenStore,
    log: Log,
    repos: Mutex<HashMap<String, Arc<dyn Storage>>>,
    quotas: Quotas,
    usage: Usage,
    /// Who stored each snapshot (FORMAT.md §15.4), as read or written so far.
    stored_by: Records,
    connections: Arc<tokio::sync::Semaphore>,
}

impl State {
    pub(crate) fn new(storage: Location, remote: RemoteOptions, tokens: TokenStore, log: Log, quotas: Quotas) -> State {
        State {
            storage,
            remote,
            tokens,
            log,
            repos: Mutex::new(HashMap::new()),
            quotas,
            usage: Usage::default(),
            stored_by: Records::default(),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        }
    }

    /// The storage of repository `name` (opened on first use; its stale temporaries are then
    /// removed in the background, as a backup would).
    fn repo(&self, name: &str) -> Result<Arc<dyn Storage>, Fail> {
        let mut repos = self.repos.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = repos.get(name) {
            return Ok(s.clone());
        }
        let storage: Arc<dyn Storage> = Arc::new(
            OpendalStorage::open(&self.storage.child(name), &self.remote)
                .map_err(|e| Fail::new(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")))?,
        );
        repos.insert(name.to_string(), storage.clone());
        let cleanup = storage.clone();
        std::thread::spawn(move || {
            let _ = cleanup.remove_stale_temporaries(cairn_core::engine::storage::STALE_TEMPORARY_AGE);
        });
        Ok(storage)
    }
}

/// Accepts connections until the process ends.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: State,
) -> anyhow::Result<()> {
    let state = Arc::new(state);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let permit = state.connections.clone().acquire_owned().await.expect("the semaphore is never closed");
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors, a connection reset before it was accepted: go on.
                eprintln!("cairn serve: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (state, acceptor) = (state.clone(), acceptor.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match acceptor {
                Some(a) => {
                    if let Ok(Ok(tls)) = tokio::time::timeout(HEAD_TIMEOUT, a.accept(tcp)).await {
                        connection(TokioIo::new(tls), peer, state).await;
                    }
                }
                None => connection(TokioIo::new(tcp), peer, state).await,
            }
        });
    }
}

async fn connection<I>(io: I, peer: SocketAddr, state: Arc<State>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(&state, req, peer).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(64 << 10)
        .serve_connection(io, service)
        .await;
}

/// A request answered.
struct Reply {
    status: StatusCode,
    body: Bytes,
    content_range: Option<String>,
    /// A listing of `snapshots/`: the requesting token's name ([`TOKEN_NAME_HEADER`]).
    token_name: Option<String>,
}

impl Reply {
    fn new(status: StatusCode, body: impl Into<Bytes>) -> Reply {
        Reply { status, body: body.into(), content_range: None, token_name: None }
    }
}

/// A request refused or failed, with the one line that says why.
#[derive(Debug)]
struct Fail {
    status: StatusCode,
    why: String,
}

impl Fail {
    fn new(status: StatusCode, why: impl Into<String>) -> Fail {
        Fail { status, why: why.into() }
    }
}

fn bad(why: impl Into<String>) -> Fail {
    Fail::new(StatusCode::BAD_REQUEST, why)
}

fn forbidden(why: impl Into<String>) -> Fail {
    Fail::new(StatusCode::FORBIDDEN, why)
}

/// A request the protocol's parser refused.
fn refusal(r: protocol::Refusal) -> Fail {
    Fail::new(StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_REQUEST), r.why)
}

async fn handle(state: &Arc<State>, req: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
    let start = Instant::now();
    let mut entry = Entry {
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        peer: peer.to_string(),
        op: req.method().as_str().to_ascii_lowercase(),
        ..Entry::default()
    };
    let head = req.method() == Method::HEAD;
    let put = req.method() == Method::PUT;
    let (parts, body) = req.into_parts();
    let mut body = Some(body);
    let outcome = process(state, parts, &mut body, &mut entry).await;
    if let (Err(_), Some(body), true) = (&outcome, body, put) {
        // Read what a refused upload sends, so that its client reads the answer rather than
        // a connection closed under it.
        drain(body).await;
    }
    let mut response = match outcome {
        Ok(reply) => {
            entry.result = "ok".into();
            let mut r = Response::new(Full::new(reply.body));
            *r.status_mut() = reply.status;
            if let Some(range) = reply.content_range.and_then(|c| HeaderValue::from_str(&c).ok()) {
                r.headers_mut().insert(CONTENT_RANGE, range);
            }
            // A token's name is printable ASCII without spaces (`tokens`), a valid header value.
            if let Some(name) = reply.token_name.and_then(|n| HeaderValue::from_str(&n).ok()) {
                r.headers_mut().insert(TOKEN_NAME_HEADER, name);
            }
            r
        }
        Err(fail) => {
            entry.result = fail.why.clone();
            let mut r =
                Response::new(Full::new(if head { Bytes::new() } else { Bytes::from(format!("{}\n", fail.why)) }));
            *r.status_mut() = fail.status;
            if fail.status == StatusCode::UNAUTHORIZED {
                r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            r
        }
    };
    entry.status = response.status().as_u16();
    entry.ms = start.elapsed().as_millis() as u64;
    state.log.write(&entry);
    if !response.headers().contains_key(CONTENT_TYPE) {
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    }
    response
}

async fn process(
    state: &Arc<State>,
    parts: hyper::http::request::Parts,
    body: &mut Option<Incoming>,
    entry: &mut Entry,
) -> Result<Reply, Fail> {
    let target = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    let request = protocol::parse_request(parts.method.as_str(), target);
    entry.repo = request.repo.map(str::to_string);
    entry.object = request.named.map(str::to_string);
    let route = request.route.map_err(refusal)?;
    let (repo, op, kind) = match route {
        Route::Version => {
            let v = serde_json::json!({
                "protocol": PROTOCOL,
                "revision": REVISION,
                "server": concat!("cairn ", env!("CARGO_PKG_VERSION")),
            });
            return Ok(Reply::new(StatusCode::OK, v.to_string()));
        }
        Route::Create { repo } | Route::Object { repo, .. } | Route::List { repo, .. } => {
            (repo, route.op().expect("a repository's route has an operation"), route.kind())
        }
    };
    entry.op = op.name().to_string();
    let token = protocol::bearer(parts.headers.get(AUTHORIZATION).map(|v| v.as_bytes())).map_err(refusal)?;
    let token = state.tokens.authenticate(token, repo).map_err(|d| match d {
        Denied::Unauthorized(why) => Fail::new(StatusCode::UNAUTHORIZED, why),
        Denied::Forbidden(why) => forbidden(why),
    })?;
    entry.token = Some(token.name.clone());
    let rule = policy::rule(token.role, op, kind);
    if let Rule::Deny(why) = rule {
        let what = entry.object.as_deref().map(|o| format!(" ({o})")).unwrap_or_default();
        return Err(forbidden(format!("{why}{what}")));
    }
    let storage = state.repo(repo)?;
    match route {
        Route::Version => unreachable!("answered above"),
        Route::Create { .. } => {
            blocking(move || storage.create()).await?;
            Ok(Reply::new(StatusCode::OK, ""))
        }
        Route::List { dir, .. } => {
            let (st, r) = (state.clone(), repo.to_string());
            let listed = blocking(move || {
                let listed = storage.list(dir.name())?;
                let mut out: Vec<protocol::Listed> = listed
                    .into_iter()
                    .map(|o| protocol::Listed { path: o.path, size: o.size, stored_by: None })
                    .collect();
                if dir == Dir::Snapshots {
                    let paths: Vec<String> = out.iter().map(|l| l.path.clone()).collect();
                    for (l, by) in out.iter_mut().zip(st.stored_by.of(storage.as_ref(), &r, &paths)?) {
                        l.stored_by = by;
                    }
                }
                Ok(out)
            })
            .await?;
            let body = protocol::encode_listing(&listed);
            entry.bytes = body.len() as u64;
            let mut reply = Reply::new(StatusCode::OK, body);
            if dir == Dir::Snapshots {
                reply.token_name = Some(token.name);
            }
            Ok(reply)
        }
        Route::Object { op: Op::Read, head: true, path, .. } => {
            let p = path.to_string();
            match blocking(move || storage.exists(&p)).await? {
                true => Ok(Reply::new(StatusCode::OK, "")),
                false => Err(Fail::new(StatusCode::NOT_FOUND, format!("{path} does not exist"))),
            }
        }
        Route::Object { op: Op::Read, path, .. } => {
            let range =
                parts.headers.get(RANGE).map(|v| protocol::parse_range(v.as_bytes())).transpose().map_err(refusal)?;
            let p = path.to_string();
            let reply = match range {
                None => Reply::new(StatusCode::OK, blocking(move || storage.read(&p)).await?),
                Some((start, len)) => {
                    let bytes = blocking(move || storage.read_range(&p, start, len)).await?;
                    let mut r = Reply::new(StatusCode::PARTIAL_CONTENT, bytes);
                    r.content_range = Some(format!("bytes {start}-{}/*", start + len - 1));
                    r
                }
            };
            entry.bytes = reply.body.len() as u64;
            Ok(reply)
        }
        Route::Object { op: Op::Write, path, kind, .. } => {
            let announced = match parts.headers.get(CONTENT_LENGTH) {
                Some(len) => protocol::parse_content_length(len.as_bytes()).map_err(refusal)?,
                None => 0,
            };
            let quota = state.quotas.of(repo).filter(|_| Quotas::counts(token.role, kind));
            let upload = Upload {
                storage,
                path: path.to_string(),
                kind,
                rule,
                token: token.name,
                state: state.clone(),
                repo: repo.to_string(),
            };
            upload.run(body, entry, quota.map(|q| (q, announced))).await
        }
        Route::Object { op: Op::Delete, path, kind, .. } => {
            let (st, r) = (state.clone(), repo.to_string());
            delete(storage, path.to_string(), kind, rule, token.name, move |s, p| st.stored_by.remove(s, &r, p)).await
        }
        Route::Object { op: Op::List | Op::Create, .. } => unreachable!("objects are read, written or deleted"),
    }
}

/// One object arriving in a PUT: checked against what exists, streamed to the storage as it
/// arrives (never held whole in memory), and committed only once all of it has come and, for a
/// content-addressed object, its BLAKE3 hash matches its name.
struct Upload {
    storage: Arc<dyn Storage>,
    path: String,
    kind: Kind,
    rule: Rule,
    token: String,
    state: Arc<State>,
    repo: String,
}

/// What the receiving side hands the storage writer.
enum Part {
    Data(Bytes),
    /// The whole body has come.
    End,
    /// The body did not come whole: store nothing, answer this.
    Fail(Fail),
}

/// Body parts waiting for the storage writer (hyper's frames are at most 64 KiB).
const UPLOAD_QUEUE: usize = 8;

impl Upload {
    /// Runs the upload; with `quota` (the repository's quota and the announced length), a new
    /// object that would pass the quota is refused with 507. A new snapshot's record of who
    /// stored it (FORMAT.md §15.4) is written before the snapshot.
    async fn run(
        self,
        body: &mut Option<Incoming>,
        entry: &mut Entry,
        quota: Option<(u64, u64)>,
    ) -> Result<Reply, Fail> {
        let Upload { storage, path, kind, rule, token, state, repo } = self;
        let absent_checked = matches!(rule, Rule::IfAbsentElseDone | Rule::IfAbsent | Rule::NewLock);
        if absent_checked {
            let (s, p) = (storage.clone(), path.clone());
            if blocking(move || s.exists(&p)).await? {
                if rule != Rule::IfAbsentElseDone {
                    return Err(forbidden(format!("{path} exists and {} may not be overwritten", kind.describe())));
                }
                // A content-addressed object of that name holds the same bytes; other bytes
                // are refused all the same.
                let same = drain_hashing(body.take().expect("the body is read once"), entry).await;
                if same.to_hex().as_str() != path.rsplit('/').next().unwrap_or_default() {
                    return Err(bad(format!(
                        "{path}: the content does not match its name (its BLAKE3 hash); nothing was stored"
                    )));
                }
                return Ok(Reply::new(StatusCode::OK, "already stored"));
            }
        }
        // An admin may store a snapshot again (the same bytes): its first record stays.
        let record = kind == Kind::Snapshot && {
            let (s, p) = (storage.clone(), path.clone());
            absent_checked || !blocking(move || s.exists(&p)).await?
        };
        // With a quota, the upload's share of it, and the most its body may bring.
        let mut limit = Limit { bytes: MAX_OBJECT_SIZE, over_quota: None };
        let mut reservation = match quota {
            None => None,
            Some((quota, adding)) => {
                let (st, s, r) = (state.clone(), storage.clone(), repo.clone());
                let allowed = blocking(move || st.usage.reserve(&r, s.as_ref(), quota, adding))
                    .await?
                    .map_err(|why| Fail::new(StatusCode::INSUFFICIENT_STORAGE, why))?;
                if allowed < limit.bytes {
                    limit = Limit { bytes: allowed, over_quota: Some((repo.clone(), quota)) };
                }
                Some(Reservation { state: state.clone(), repo: repo.clone(), reserved: adding, stored: 0 })
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(UPLOAD_QUEUE);
        let hash = kind.content_addressed().then(blake3::Hasher::new);
        let writer = tokio::task::spawn_blocking(move || -> Result<Result<Reply, Fail>, cairn_core::Error> {
            if rule == Rule::NewLock {
                storage.write(&owner_path(&path), token.into_bytes())?;
            } else if record {
                state.stored_by.write(storage.as_ref(), &repo, &path, &token)?;
            }
            let mut parts = Parts { rx, hash, path: &path, refused: None, ended: false };
            let stored = storage.write_parts(&path, &mut parts);
            match (parts.refused, stored) {
                (Some(fail), _) => Ok(Err(fail)),
                (None, Err(e)) => Err(e),
                (None, Ok(())) => Ok(Ok(Reply::new(StatusCode::CREATED, ""))),
            }
        });
        let received = receive(body.as_mut().expect("the body is read once"), &tx, entry, &limit).await;
        // If the writer already stopped (a storage error), its error is the answer.
        let _ = tx.send(received.map_or_else(Part::Fail, |()| Part::End)).await;
        drop(tx);
        match writer.await {
            Ok(Ok(outcome)) => {
                if let (Some(r), Ok(_)) = (reservation.as_mut(), &outcome) {
                    r.stored = entry.bytes;
                }
                outcome
            }
            Ok(Err(e)) => Err(storage_fail(e)),
            Err(_) => Err(Fail::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error: a storage call panicked")),
        }
    }
}

/// An upload's share of its repository's quota: reserved before the body is read, given back
/// (with what was stored, if anything) when the upload ends, however it ends.
struct Reservation {
    state: Arc<State>,
    repo: String,
    reserved: u64,
    stored: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.state.usage.settle(&self.repo, self.reserved, self.stored);
    }
}

/// The most bytes a body may bring: [`MAX_OBJECT_SIZE`], or less when the repository's quota
/// (its name and size) leaves less.
struct Limit {
    bytes: u64,
    over_quota: Option<(String, u64)>,
}

/// Reads a request body of at most `limit` bytes within [`BODY_TIMEOUT`] into `tx`, counting
/// its bytes into `entry`.
async fn receive(
    body: &mut Incoming,
    tx: &tokio::sync::mpsc::Sender<Part>,
    entry: &mut Entry,
    limit: &Limit,
) -> Result<(), Fail> {
    let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(Fail::new(StatusCode::REQUEST_TIMEOUT, "the body did not arrive in time")),
            Ok(None) => return Ok(()),
            Ok(Some(Err(e))) => return Err(bad(format!("the body did not arrive whole: {e}"))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        entry.bytes += data.len() as u64;
        if entry.bytes > limit.bytes {
            return Err(match &limit.over_quota {
                Some((repo, quota)) => Fail::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    crate::quota::over_quota(repo, *quota, quota - limit.bytes, entry.bytes),
                ),
                None => {
                    Fail::new(StatusCode::PAYLOAD_TOO_LARGE, format!("an object is at most {MAX_OBJECT_SIZE} bytes"))
                }
            });
        }
        if tx.send(Part::Data(data)).await.is_err() {
            return Ok(());
        }
    }
}

/// The parts of an upload as the storage writer takes them: the data until [`Part::End`], then,
/// for a content-addressed object, an error instead of the end if the hash does not match.
/// A body that stops without [`Part::End`] (the request was dropped) is an error too, so
/// nothing partial is ever committed.
struct Parts<'a> {
    rx: tokio::sync::mpsc::Receiver<Part>,
    hash: Option<blake3::Hasher>,
    path: &'a str,
    /// Why the upload was refused, if it was.
    refused: Option<Fail>,
    ended: bool,
}

impl Iterator for Parts<'_> {
    type Item = Result<Bytes, cairn_core::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        let refuse = |this: &mut Self, fail: Fail| {
            this.ended = true;
            let e = cairn_core::Error::Usage(fail.why.clone());
            this.refused = Some(fail);
            Some(Err(e))
        };
        match self.rx.blocking_recv() {
            Some(Part::Data(data)) => {
                if let Some(h) = &mut self.hash {
                    h.update(&data);
                }
                Some(Ok(data))
            }
            Some(Part::Fail(fail)) => refuse(self, fail),
            None => refuse(self, bad("the request ended before its body")),
            Some(Part::End) => {
                let name = self.path.rsplit('/').next().unwrap_or_default();
                match self.hash.take() {
                    Some(h) if h.finalize().to_hex().as_str() != name => refuse(
                        self,
                        bad(format!(
                            "{}: the content does not match its name (its BLAKE3 hash); nothing was stored",
                            self.path
                        )),
                    ),
                    _ => {
                        self.ended = true;
                        None
                    }
                }
            }
        }
    }
}

/// Deletes the object at `path`, and with it the server's record about it: a lock's owner, or
/// (`unrecord`) who stored a snapshot.
async fn delete(
    storage: Arc<dyn Storage>,
    path: String,
    kind: Kind,
    rule: Rule,
    token: String,
    unrecord: impl FnOnce(&dyn Storage, &str) -> cairn_core::Result<()> + Send + 'static,
) -> Result<Reply, Fail> {
    blocking(move || -> Result<Result<Reply, Fail>, cairn_core::Error> {
        if rule == Rule::OwnLock {
            let owner = match storage.read(&owner_path(&path)) {
                Ok(o) => Some(o),
                Err(cairn_core::Error::NotFound(_)) => None,
                Err(e) => return Err(e),
            };
            if owner.as_deref() != Some(token.as_bytes()) {
                if owner.is_none() && !storage.exists(&path)? {
                    return Ok(Ok(Reply::new(StatusCode::NO_CONTENT, "")));
                }
                return Ok(Err(forbidden(format!("{path} is not a lock this token wrote"))));
            }
        }
        storage.delete(&path)?;
        match kind {
            Kind::Lock => storage.delete(&owner_path(&path))?,
            Kind::Snapshot => unrecord(storage.as_ref(), &path)?,
            _ => {}
        }
        Ok(Ok(Reply::new(StatusCode::NO_CONTENT, "")))
    })
    .await?
}

/// Where the owner of the lock at `locks/<id>` is recorded.
fn owner_path(lock: &str) -> String {
    format!("{LOCK_OWNERS}{}", cairn_format::layout::file_name(lock))
}

/// Reads and drops a body (at most [`MAX_OBJECT_SIZE`] bytes, within [`BODY_TIMEOUT`]),
/// returning its BLAKE3 hash (of what arrived) and counting its bytes into `entry`.
async fn drain_hashing(mut body: Incoming, entry: &mut Entry) -> blake3::Hash {
    let mut hash = blake3::Hasher::new();
    let _ = tokio::time::timeout(BODY_TIMEOUT, async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(d) = frame.data_ref() {
                entry.bytes += d.len() as u64;
                hash.update(d);
            }
            if entry.bytes > MAX_OBJECT_SIZE {
                break;
            }
        }
    })
    .await;
    hash.finalize()
}

/// Reads and drops a body (at most [`MAX_OBJECT_SIZE`] bytes, for at most [`HEAD_TIMEOUT`]).
async fn drain(mut body: Incoming) {
    let mut seen = 0u64;
    let _ = tokio::time::timeout(HEAD_TIMEOUT, async {
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len() as u64);
            if seen > MAX_OBJECT_SIZE {
                break;
            }
        }
    })
    .await;
}

/// Runs a storage call on the blocking pool (the storage's own runtime blocks), its errors
/// mapped by [`storage_fail`].
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, cairn_core::Error> + Send + 'static,
) -> Result<T, Fail> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(storage_fail(e)),
        Err(_) => Err(Fail::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error: a storage call panicked")),
    }
}

/// The status of a failed storage call: missing 404, short 416, anything else 503 (the client
/// tries again).
fn storage_fail(e: cairn_core::Error) -> Fail {
    match e {
        cairn_core::Error::NotFound(p) => Fail::new(StatusCode::NOT_FOUND, format!("{p} does not exist")),
        e @ cairn_core::Error::Corrupt { .. } => Fail::new(StatusCode::RANGE_NOT_SATISFIABLE, e.to_string()),
        e if cairn_core::engine::storage::storage_full(&e) => Fail::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "the server's storage is full: nothing was stored; ask the server's admin to free space, then run the \
             command again (what is already stored is kept)",
        ),
        e => Fail::new(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
    }
}
