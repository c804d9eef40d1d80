//! The HTTP side: connections (TLS, timeouts, a cap on their number), the routes of FORMAT.md
//! §15, and each request's way from its raw path to the storage.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_core::engine::storage::{Location, OpendalStorage, RemoteOptions, Storage};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use cairn_format::protocol::{self, Kind, Op, Route, MAX_OBJECT_SIZE, VERSION as PROTOCOL};

use crate::log::{Entry, Log};
use crate::policy::{self, Rule};
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
    connections: Arc<tokio::sync::Semaphore>,
}

impl State {
    pub(crate) fn new(storage: Location, remote: RemoteOptions, tokens: TokenStore, log: Log) -> State {
        State {
            storage,
            remote,
            tokens,
            log,
            repos: Mutex::new(HashMap::new()),
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
}

impl Reply {
    fn new(status: StatusCode, body: impl Into<Bytes>) -> Reply {
        Reply { status, body: body.into(), content_range: None }
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
            let v = serde_json::json!({ "protocol": PROTOCOL, "server": concat!("cairn ", env!("CARGO_PKG_VERSION")) });
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
            let dir = dir.name().to_string();
            let listed = blocking(move || storage.list(&dir)).await?;
            let json: Vec<serde_json::Value> =
                listed.into_iter().map(|o| serde_json::json!({ "path": o.path, "size": o.size })).collect();
            let body = serde_json::to_vec(&json).expect("listings serialize");
            entry.bytes = body.len() as u64;
            Ok(Reply::new(StatusCode::OK, body))
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
            let body = body.take().expect("the body is read once");
            let bytes = read_body(&parts.headers, body).await?;
            entry.bytes = bytes.len() as u64;
            if kind.content_addressed() {
                cairn_format::layout::check_name(path, &bytes).map_err(|_| {
                    bad(format!("{path}: the content does not match its name (its BLAKE3 hash); nothing was stored"))
                })?;
            }
            write(storage, path.to_string(), kind, rule, token.name, bytes).await
        }
        Route::Object { op: Op::Delete, path, kind, .. } => {
            delete(storage, path.to_string(), kind, rule, token.name).await
        }
        Route::Object { op: Op::List | Op::Create, .. } => unreachable!("objects are read, written or deleted"),
    }
}

async fn write(
    storage: Arc<dyn Storage>,
    path: String,
    kind: Kind,
    rule: Rule,
    token: String,
    bytes: Bytes,
) -> Result<Reply, Fail> {
    blocking(move || -> Result<Result<Reply, Fail>, cairn_core::Error> {
        match rule {
            Rule::IfAbsentElseDone if storage.exists(&path)? => {
                return Ok(Ok(Reply::new(StatusCode::OK, "already stored")));
            }
            Rule::IfAbsent | Rule::NewLock if storage.exists(&path)? => {
                return Ok(Err(forbidden(format!("{path} exists and {} may not be overwritten", kind.describe()))));
            }
            Rule::NewLock => storage.write(&owner_path(&path), token.into_bytes())?,
            _ => {}
        }
        storage.write(&path, bytes.into())?;
        Ok(Ok(Reply::new(StatusCode::CREATED, "")))
    })
    .await?
}

async fn delete(storage: Arc<dyn Storage>, path: String, kind: Kind, rule: Rule, token: String) -> Result<Reply, Fail> {
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
        if kind == Kind::Lock {
            storage.delete(&owner_path(&path))?;
        }
        Ok(Ok(Reply::new(StatusCode::NO_CONTENT, "")))
    })
    .await?
}

/// Where the owner of the lock at `locks/<id>` is recorded.
fn owner_path(lock: &str) -> String {
    format!("{LOCK_OWNERS}{}", cairn_format::layout::file_name(lock))
}

/// Reads a request body of at most [`MAX_OBJECT_SIZE`] bytes within [`BODY_TIMEOUT`].
async fn read_body(headers: &hyper::HeaderMap, body: Incoming) -> Result<Bytes, Fail> {
    let too_big = || Fail::new(StatusCode::PAYLOAD_TOO_LARGE, format!("an object is at most {MAX_OBJECT_SIZE} bytes"));
    if let Some(len) = headers.get(CONTENT_LENGTH) {
        protocol::parse_content_length(len.as_bytes()).map_err(refusal)?;
    }
    let collected = tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_OBJECT_SIZE as usize).collect()).await;
    match collected {
        Err(_) => Err(Fail::new(StatusCode::REQUEST_TIMEOUT, "the body did not arrive in time")),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_big()),
        Ok(Err(e)) => Err(bad(format!("the body did not arrive whole: {e}"))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
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

/// Runs a storage call on the blocking pool (the storage's own runtime blocks), mapping its
/// errors to statuses: missing 404, short 416, anything else 503 (the client tries again).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, cairn_core::Error> + Send + 'static,
) -> Result<T, Fail> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(cairn_core::Error::NotFound(p))) => Err(Fail::new(StatusCode::NOT_FOUND, format!("{p} does not exist"))),
        Ok(Err(e @ cairn_core::Error::Corrupt { .. })) => {
            Err(Fail::new(StatusCode::RANGE_NOT_SATISFIABLE, e.to_string()))
        }
        Ok(Err(e)) => Err(Fail::new(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}"))),
        Err(_) => Err(Fail::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error: a storage call panicked")),
    }
}
