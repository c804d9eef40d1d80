//! The agent's web server: the pages, the JSON API (`/api/…`, what `cairn agent status` and
//! `run-now` call) and `/metrics`. Every request but the login page and the assets needs the
//! session cookie the login sets, or the password as a bearer token (`Authorization: Bearer
//! …`, for scripts and Prometheus).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::profiles::JobKind;
use crate::{ui, Agent};

/// A response body: a page, or a download streamed as it is read from the repository.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// The session cookie's name.
const COOKIE: &str = "cairn_agent";
/// How long a login lasts, seconds.
const SESSION: i64 = 12 * 3600;
/// The largest request body read (a login or a restore form).
const MAX_FORM: usize = 64 * 1024;

/// Serves connections until the task is aborted.
pub async fn serve(agent: Arc<Agent>, listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let agent = agent.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let agent = agent.clone();
                async move { Ok::<_, Infallible>(handle(agent, req).await) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match acceptor {
                Some(a) => {
                    if let Ok(s) = a.accept(stream).await {
                        let _ = http.serve_connection(TokioIo::new(s), svc).await;
                    }
                }
                None => {
                    let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                }
            }
        });
    }
}

/// A request as the handlers see it.
pub struct Req {
    /// GET, POST…
    pub method: Method,
    /// The path's parts, decoded.
    pub parts: Vec<String>,
    /// The query string's (or a POSTed form's) fields.
    pub query: HashMap<String, String>,
}

impl Req {
    /// Field `k` of the query or form, or "".
    pub fn get(&self, k: &str) -> &str {
        self.query.get(k).map_or("", String::as_str)
    }
}

async fn handle(agent: Arc<Agent>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let parts: Vec<String> = req.uri().path().split('/').filter(|p| !p.is_empty()).map(decode).collect();
    let mut query = parse_form(req.uri().query().unwrap_or(""));
    let authed = authorized(&agent, &req);
    let secure_cookie = agent.https;
    if method == Method::POST {
        let body = match http_body_util::Limited::new(req.into_body(), MAX_FORM).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"),
        };
        query.extend(parse_form(&String::from_utf8_lossy(&body)));
    }
    let r = Req { method, parts, query };
    let p: Vec<&str> = r.parts.iter().map(String::as_str).collect();
    match (&r.method, p.as_slice()) {
        (&Method::GET, ["assets", name]) => asset(name),
        (&Method::GET, ["login"]) => html(StatusCode::OK, ui::login(false)),
        (&Method::POST, ["login"]) => login(&agent, &r, secure_cookie),
        _ if !authed => {
            if p.first() == Some(&"api") || p.first() == Some(&"metrics") {
                text(StatusCode::UNAUTHORIZED, "log in first: give the agent's password as a bearer token")
            } else {
                redirect("/login")
            }
        }
        (&Method::GET, ["metrics"]) => {
            let mut resp = text(StatusCode::OK, &crate::metrics::render(&agent));
            resp.headers_mut().insert("content-type", "text/plain; version=0.0.4".parse().unwrap());
            resp
        }
        (&Method::GET, []) => html(StatusCode::OK, ui::dashboard(&agent)),
        (&Method::GET, ["api", "status"]) => json(&ui::status(&agent)),
        (&Method::POST, ["api", "run", profile]) | (&Method::POST, ["run", profile]) => {
            let job = if r.get("job").is_empty() { "backup" } else { r.get("job") };
            let (Some(i), Ok(job)) = (agent.profile_index(profile), JobKind::parse(job)) else {
                return text(
                    StatusCode::NOT_FOUND,
                    &format!("no profile {profile:?} with a job {job:?} in this agent"),
                );
            };
            let queued = agent.run_now(i, job);
            if p[0] == "api" {
                json(&serde_json::json!({ "profile": profile, "job": job.name(), "queued": queued }))
            } else {
                redirect("/")
            }
        }
        (&Method::GET, ["runs", id, "log"]) => match id.parse::<u64>() {
            Ok(id) => html(StatusCode::OK, ui::log(&agent, id)),
            Err(_) => text(StatusCode::NOT_FOUND, "no such run"),
        },
        (&Method::GET, ["restores", n]) => html(StatusCode::OK, ui::restore_page(&agent, n.parse().unwrap_or(0))),
        (&Method::GET, ["api", "restores", n]) => json(&ui::restore_status(&agent, n.parse().unwrap_or(0))),
        (_, ["p", profile, ..]) if agent.profile_index(profile).is_none() => {
            text(StatusCode::NOT_FOUND, &format!("no profile {profile:?} in this agent"))
        }
        (&Method::GET, ["p", _, "s", _, "download"]) => download(agent, &r).await,
        (&Method::POST, ["p", profile, "s", snap, "restore"]) => {
            let path = PathBuf::from(if r.get("path").is_empty() { "/" } else { r.get("path") });
            let n = start_restore(&agent, profile, snap, path, PathBuf::from(r.get("target")));
            redirect(&format!("/restores/{n}"))
        }
        (&Method::GET, ["p", ..]) => {
            let agent2 = agent.clone();
            let page = tokio::task::spawn_blocking(move || ui::profile_page(&agent2, &r)).await;
            match page {
                Ok(Ok(body)) => html(StatusCode::OK, body),
                Ok(Err(e)) => html(StatusCode::BAD_REQUEST, ui::error_page(&format!("{e:#}"))),
                Err(e) => html(StatusCode::INTERNAL_SERVER_ERROR, ui::error_page(&e.to_string())),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

fn authorized(agent: &Agent, req: &Request<Incoming>) -> bool {
    let h = req.headers();
    if let Some(token) = h.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")) {
        return same(token.trim(), &agent.password);
    }
    let now = chrono::Utc::now().timestamp();
    let mut sessions = agent.sessions.lock().unwrap();
    sessions.retain(|_, until| *until > now);
    h.get_all("cookie").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).any(|c| {
        c.trim().strip_prefix(COOKIE).and_then(|c| c.strip_prefix('=')).is_some_and(|s| sessions.contains_key(s))
    })
}

/// Compares two secrets by their hashes, so the time taken says nothing of where they differ.
fn same(a: &str, b: &str) -> bool {
    use ring::digest::{digest, SHA256};
    !b.is_empty() && digest(&SHA256, a.as_bytes()).as_ref() == digest(&SHA256, b.as_bytes()).as_ref()
}

fn login(agent: &Agent, r: &Req, secure: bool) -> Response<Body> {
    if !same(r.get("password"), &agent.password) {
        return html(StatusCode::UNAUTHORIZED, ui::login(true));
    }
    let mut b = [0u8; 24];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    let id = hex::encode(b);
    agent.sessions.lock().unwrap().insert(id.clone(), chrono::Utc::now().timestamp() + SESSION);
    let mut resp = redirect("/");
    let cookie = format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION}{}",
        if secure { "; Secure" } else { "" }
    );
    resp.headers_mut().insert("set-cookie", cookie.parse().unwrap());
    resp
}

fn start_restore(agent: &Arc<Agent>, profile: &str, snap: &str, path: PathBuf, target: PathBuf) -> usize {
    let task = {
        let mut list = agent.restores.lock().unwrap();
        let t = Arc::new(crate::browse::RestoreTask::new(list.len() + 1, profile, snap, &path, &target));
        list.push(t.clone());
        t
    };
    let n = task.id;
    let agent = agent.clone();
    let profile = profile.to_string();
    tokio::task::spawn_blocking(move || match agent.repository(&profile) {
        Ok(repo) => task.run(&repo),
        Err(e) => *task.outcome.lock().unwrap() = Some(Err(format!("{e:#}"))),
    });
    n
}

/// A file's bytes, or a directory as a tar stream, sent as the repository is read.
async fn download(agent: Arc<Agent>, r: &Req) -> Response<Body> {
    let (profile, snap) = (r.parts[1].clone(), r.parts[3].clone());
    let path = PathBuf::from(if r.get("path").is_empty() { "/" } else { r.get("path") });
    let (a2, p2, s2, path2) = (agent.clone(), profile.clone(), snap.clone(), path.clone());
    let node = tokio::task::spawn_blocking(move || {
        let repo = a2.repository(&p2)?;
        crate::browse::node(&repo, &s2, &path2)
    })
    .await;
    let is_file = match node {
        Ok(Ok(n)) => n.is_some_and(|n| n.kind == cairn_format::tree::NodeKind::File),
        Ok(Err(e)) => return html(StatusCode::BAD_REQUEST, ui::error_page(&format!("{e:#}"))),
        Err(e) => return html(StatusCode::INTERNAL_SERVER_ERROR, ui::error_page(&e.to_string())),
    };
    let base = path.file_name().map_or("snapshot".to_string(), |n| n.to_string_lossy().into_owned());
    let (name, kind) =
        if is_file { (base, "application/octet-stream") } else { (format!("{base}.tar"), "application/x-tar") };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        let mut out = ChannelWriter { tx, buf: Vec::new() };
        let result = agent.repository(&profile).and_then(|repo| crate::browse::download(&repo, &snap, &path, &mut out));
        match result.and_then(|_| out.flush().map_err(Into::into)) {
            Ok(()) => {}
            // The client sees a broken transfer, not a short file it could take for whole.
            Err(e) => {
                let _ = out.tx.blocking_send(Err(std::io::Error::other(format!("{e:#}"))));
            }
        }
    });
    let mut resp = Response::new(BoxBody::new(ChannelBody(rx)));
    let h = resp.headers_mut();
    h.insert("content-type", kind.parse().unwrap());
    let quoted = name.replace(['"', '\\', '\r', '\n'], "_");
    if let Ok(v) = format!("attachment; filename=\"{quoted}\"").parse() {
        h.insert("content-disposition", v);
    }
    resp
}

/// Bytes written on a blocking thread, sent to the response in pieces.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 256 << 10 {
            self.flush()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::take(&mut self.buf));
        self.tx.blocking_send(Ok(piece)).map_err(|_| std::io::Error::other("the client went away"))
    }
}

struct ChannelBody(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never: Infallible| match never {}).boxed()
}

fn html(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert("content-type", "text/html; charset=utf-8".parse().unwrap());
    h.insert(
        "content-security-policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'".parse().unwrap(),
    );
    h.insert("x-frame-options", "DENY".parse().unwrap());
    r
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert("content-type", "text/plain; charset=utf-8".parse().unwrap());
    r
}

fn json(v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    r
}

fn redirect(to: &str) -> Response<Body> {
    let mut r = Response::new(full(""));
    *r.status_mut() = StatusCode::SEE_OTHER;
    r.headers_mut().insert("location", to.parse().unwrap());
    r
}

/// The embedded assets: a style sheet and the little script of the pages.
fn asset(name: &str) -> Response<Body> {
    let (body, kind) = match name {
        "app.js" => (include_str!("../assets/app.js"), "text/javascript"),
        "style.css" => (include_str!("../assets/style.css"), "text/css"),
        _ => return text(StatusCode::NOT_FOUND, "not found"),
    };
    let mut r = Response::new(full(body));
    r.headers_mut().insert("content-type", kind.parse().unwrap());
    r.headers_mut().insert("cache-control", "max-age=3600".parse().unwrap());
    r
}

/// `a=1&b=x+y%2F` as fields.
pub fn parse_form(s: &str) -> HashMap<String, String> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(&k.replace('+', " ")), decode(&v.replace('+', " ")))
        })
        .collect()
}

/// Percent-decoding (invalid escapes are kept as written; bytes that are not UTF-8 replaced).
pub fn decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encoding of a query value.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode() {
        let f = parse_form("password=a+b%2Fc&path=%2Fhome%2Fme&bad=%zz%4");
        assert_eq!(f["password"], "a b/c");
        assert_eq!(f["path"], "/home/me");
        assert_eq!(f["bad"], "%zz%4");
        assert_eq!(decode("%C3%BC%"), "ü%");
        assert_eq!(decode(&encode("/a b/ü?&")), "/a b/ü?&");
    }
}
