//! [`Storage`] on a `cairn serve` repository server: the client side of the protocol of
//! FORMAT.md §15, over HTTPS (rustls with ring) with a bearer token.
//!
//! Every [`Storage`] call is one HTTP request, sent on the shared I/O runtime; many threads may
//! call at once (the read path does), each waiting for its own request, over a pool of
//! keep-alive connections. Requests that fail in transit or with a 5xx status are tried again
//! with backoff; a refusal (401, 403, 413, and 507: over the quota) is reported at once, with the
//! server's reason.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::opendal_backend::runtime;
use super::{explain, Location, ObjectInfo, Provenance, Storage, StoredBy};
use crate::error::{Error, Result};
use futures_util::future::BoxFuture;

/// The protocol version this client speaks (FORMAT.md §15): the first path component of every
/// request.
pub const PROTOCOL: &str = "v1";

/// How to reach and authenticate to a repository server.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// The bearer token (`--server-token-file`, `CAIRN_SERVER_TOKEN`).
    pub token: Option<String>,
    /// The SHA-256 of the server certificate's DER bytes (hex), to pin a self-signed server.
    pub fingerprint: Option<String>,
    /// A PEM file of CA certificates the server's certificate must chain to.
    pub ca_file: Option<PathBuf>,
}

/// Requests in flight by default: as for S3, many hide the round trips.
const CONCURRENCY: usize = 32;
/// Transient failures are tried this many times in all, with exponential backoff from 200 ms.
const ATTEMPTS: u32 = 6;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A repository on a `cairn serve` server.
pub struct ServerStorage {
    client: reqwest::Client,
    /// `https://HOST:PORT/v1/repos/NAME`.
    base: String,
    token: Option<String>,
    location: String,
    /// Who stored each snapshot, from the last listing of `snapshots/`.
    provenance: std::sync::Mutex<Provenance>,
    // Dropped after the client whose connections it drives.
    runtime: Arc<tokio::runtime::Runtime>,
}

impl ServerStorage {
    /// Opens the repository a [`Location::Server`] names. Nothing is sent yet.
    pub fn open(location: &Location, options: &ServerOptions) -> Result<Self> {
        let Location::Server { base, name } = location else {
            return Err(Error::Usage(format!("{location} is not a repository server location")));
        };
        let shown = location.to_string();
        // reqwest needs a process-wide crypto provider even for plain HTTP; fails only if one
        // is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .pool_max_idle_per_host(64)
            .http1_only();
        if base.starts_with("https://") {
            builder = builder.tls_backend_preconfigured(tls_config(&shown, options)?);
        }
        let client = builder.build().map_err(|e| Error::Usage(format!("{shown}: cannot set up HTTPS: {e}")))?;
        Ok(Self {
            client,
            base: format!("{base}/{PROTOCOL}/repos/{name}"),
            token: options.token.clone(),
            location: shown,
            provenance: std::sync::Mutex::new(Provenance::NotRecorded),
            runtime: runtime()?,
        })
    }

    /// Sends the request `make` builds (again for each attempt) and returns the response of a
    /// successful status; other statuses become errors about `path`.
    fn send(
        &self,
        op: &'static str,
        path: &str,
        make: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Answer> {
        self.runtime.block_on(self.send_async(op, path, make))
    }

    /// [`ServerStorage::send`] as a future, polled inside the I/O runtime.
    async fn send_async(
        &self,
        op: &'static str,
        path: &str,
        make: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Answer> {
        let mut delay = Duration::from_millis(200);
        let mut attempt = 1;
        loop {
            let mut request = make(&self.client);
            if let Some(t) = &self.token {
                request = request.bearer_auth(t);
            }
            let outcome = async {
                let response = request.send().await?;
                let status = response.status();
                let token_name = response
                    .headers()
                    .get(cairn_format::protocol::TOKEN_NAME_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let body = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, body, token_name))
            }
            .await;
            let retry_why = match outcome {
                Ok((status, body, token_name)) if status.is_success() => {
                    return Ok(Answer { status, body, token_name })
                }
                Ok((status, body, _)) if status == reqwest::StatusCode::INSUFFICIENT_STORAGE => {
                    return Err(self.refused(op, path, status, &body))
                }
                Ok((status, body, _)) if status.is_server_error() => {
                    format!("{status}: {}", String::from_utf8_lossy(&body).trim())
                }
                Ok((status, body, _)) => return Err(self.refused(op, path, status, &body)),
                Err(e) if is_tls_refusal(&e) => return Err(self.tls_refused(error_chain(&e))),
                Err(e) => error_chain(&e),
            };
            // The client's TLS layers may box rustls's error where no downcast finds it: its
            // words still say that trying again would not help.
            if TLS_REFUSALS.iter().any(|w| retry_why.contains(w)) {
                return Err(self.tls_refused(retry_why));
            }
            if attempt >= ATTEMPTS {
                let host_port = self.location.split_once("://").map_or("", |(_, r)| r.split('/').next().unwrap_or(r));
                let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
                if let Some(why) = explain::connection(&retry_why, host, host_port, "`cairn serve`") {
                    return Err(explain::unreachable(&self.location, why, std::io::Error::other(retry_why)));
                }
                return Err(Error::Storage { op, path: path.to_string(), source: retry_why.into() });
            }
            tracing::debug!("{op} {path} on {}: {retry_why}; trying again", self.location);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
            attempt += 1;
        }
    }

    /// The error for a refusal (a 4xx status, or 507) with the server's one-line reason.
    fn refused(&self, op: &'static str, path: &str, status: reqwest::StatusCode, body: &[u8]) -> Error {
        let why = String::from_utf8_lossy(body).trim().to_string();
        match status.as_u16() {
            404 => Error::NotFound(path.to_string()),
            416 => Error::corrupt(path, format!("truncated ({why})")),
            401 => explain::unreachable(
                &self.location,
                format!(
                    "the server refused the token ({status}): check --server-token-file or CAIRN_SERVER_TOKEN \
                     (a token `cairn serve` made for this repository)"
                ),
                std::io::Error::other(format!("{op} {path}: {why}")),
            ),
            403 => Error::Refused(format!("{op} {path}: the server {} refused it ({status}): {why}", self.location)),
            // Over the repository's quota: the server's line says so and what to do.
            507 => Error::Refused(format!("{}: {why}", self.location)),
            _ => Error::Storage { op, path: path.to_string(), source: format!("{status}: {why}").into() },
        }
    }

    /// TLS refused the server: its certificate is not the pinned one, or does not chain to the
    /// CA given.
    fn tls_refused(&self, text: String) -> Error {
        let why = match text.split_once("the server's certificate has fingerprint ") {
            Some((_, rest)) => format!(
                "the server's certificate has fingerprint {}, not the one given: check --server-fingerprint \
                 against what `cairn serve` printed",
                rest.split(',').next().unwrap_or(rest)
            ),
            None => "TLS refused the server's certificate: check --server-ca or --server-fingerprint".to_string(),
        };
        explain::unreachable(&self.location, why, std::io::Error::other(text))
    }

    fn object_url(&self, path: &str) -> String {
        format!("{}/objects/{}", self.base, path.trim_start_matches('/'))
    }
}

/// Words of rustls's refusals of a server's certificate (the pinned fingerprint's, then a CA's).
const TLS_REFUSALS: [&str; 2] = ["not the pinned one", "invalid peer certificate"];

/// Whether TLS refused the server (a certificate that is not the pinned one, or does not chain
/// to the CA): trying again would not help.
fn is_tls_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        let tls = c.downcast_ref::<rustls::Error>().or_else(|| {
            c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>())
        });
        if tls.is_some() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// An error and its causes on one line (reqwest's own message names only the outermost).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// The TLS setup for an https server (`shown` names it in errors): its certificate pinned by
/// fingerprint, or checked against a CA file.
pub fn tls_config(shown: &str, options: &ServerOptions) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Usage(format!("{shown}: TLS: {e}")))?;
    if let Some(pin) = &options.fingerprint {
        let pin = parse_fingerprint(pin)?;
        let verifier = Arc::new(Pinned { pin, provider });
        return Ok(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth());
    }
    if let Some(ca) = &options.ca_file {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(ca)
            .map_err(|e| Error::Usage(format!("--server-ca {}: {e}", ca.display())))?;
        for cert in certs {
            let cert = cert.map_err(|e| Error::Usage(format!("--server-ca {}: {e}", ca.display())))?;
            roots.add(cert).map_err(|e| Error::Usage(format!("--server-ca {}: {e}", ca.display())))?;
        }
        if roots.is_empty() {
            return Err(Error::Usage(format!("--server-ca {}: no certificate in it", ca.display())));
        }
        return Ok(builder.with_root_certificates(roots).with_no_client_auth());
    }
    Err(Error::Usage(format!(
        "{shown}: give the server's certificate fingerprint (--server-fingerprint, printed by `cairn serve`) \
         or its CA (--server-ca FILE)"
    )))
}

/// A SHA-256 fingerprint as `cairn serve` prints it: 64 hex digits, colons allowed.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32]> {
    let hex_only: String = text.trim().chars().filter(|c| *c != ':').collect::<String>().to_ascii_lowercase();
    let bytes = hex::decode(&hex_only).ok().filter(|b| b.len() == 32);
    bytes.map(|b| b.try_into().expect("32 bytes")).ok_or_else(|| {
        Error::Usage(format!("bad server fingerprint {text:?}: expected the 64 hex digits of a SHA-256"))
    })
}

/// Accepts exactly the certificate whose SHA-256 is `pin` (names and dates are not checked:
/// the pin is the identity), and checks the handshake's signatures with it.
#[derive(Debug)]
struct Pinned {
    pin: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let got = ring::digest::digest(&ring::digest::SHA256, end_entity.as_ref());
        if got.as_ref() == self.pin {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server's certificate has fingerprint {}, not the pinned one",
                hex::encode(got.as_ref())
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A successful answer: its status, body and, on a listing of `snapshots/` from a server that
/// records who stored each snapshot, the name of this client's token (FORMAT.md §15.4).
struct Answer {
    status: reqwest::StatusCode,
    body: bytes::Bytes,
    token_name: Option<String>,
}

/// Who stored each snapshot of a listing of `snapshots/`: recorded when the server named this
/// client's token (a revision 2 server), else nothing recorded.
fn provenance(listed: &[cairn_format::protocol::Listed], token_name: Option<String>) -> Provenance {
    let Some(this_token) = token_name else { return Provenance::NotRecorded };
    let snapshots = listed
        .iter()
        .filter_map(|l| Some((cairn_format::layout::parse_snapshot_path(&l.path)?, l.stored_by.clone()?)))
        .collect();
    Provenance::Recorded(StoredBy { this_token, snapshots })
}

impl Storage for ServerStorage {
    fn location(&self) -> &str {
        &self.location
    }

    fn read(&self, path: &str) -> Result<Vec<u8>> {
        let url = self.object_url(path);
        Ok(self.send("read", path, |c| c.get(&url))?.body.into())
    }

    fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        let filled =
            self.runtime.block_on(self.read_range_async(path.to_string(), offset, len, std::mem::take(buf)))?;
        *buf = filled;
        Ok(())
    }

    fn read_range_async(
        &self,
        path: String,
        offset: u64,
        len: u64,
        mut buf: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            buf.clear();
            if len == 0 {
                return Ok(buf);
            }
            let url = self.object_url(&path);
            let range = format!("bytes={offset}-{}", offset + len - 1);
            let Answer { status, body, .. } =
                self.send_async("read", &path, |c| c.get(&url).header(reqwest::header::RANGE, &range)).await?;
            if status != reqwest::StatusCode::PARTIAL_CONTENT || body.len() as u64 != len {
                return Err(Error::corrupt(
                    &path,
                    format!("truncated: wanted {len} bytes at offset {offset}, got {} ({status})", body.len()),
                ));
            }
            buf.reserve_exact(body.len());
            buf.extend_from_slice(&body);
            Ok(buf)
        })
    }

    fn write(&self, path: &str, data: Vec<u8>) -> Result<()> {
        let url = self.object_url(path);
        let data = bytes::Bytes::from(data);
        self.send("write", path, |c| c.put(&url).body(data.clone())).map(drop)
    }

    fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        let url = format!("{}/list/{}", self.base, dir.trim_matches('/'));
        let answer = self.send("list", dir, |c| c.get(&url))?;
        let listed = cairn_format::protocol::decode_listing(&answer.body).map_err(|why| Error::Storage {
            op: "list",
            path: dir.to_string(),
            source: why.into(),
        })?;
        if dir.trim_matches('/') == cairn_format::layout::Dir::Snapshots.name() {
            *self.provenance.lock().unwrap_or_else(|p| p.into_inner()) = provenance(&listed, answer.token_name);
        }
        Ok(listed.into_iter().map(|l| ObjectInfo { path: l.path, size: l.size }).collect())
    }

    fn delete(&self, path: &str) -> Result<()> {
        let url = self.object_url(path);
        match self.send("delete", path, |c| c.delete(&url)) {
            Ok(_) | Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn exists(&self, path: &str) -> Result<bool> {
        let url = self.object_url(path);
        match self.send("stat", path, |c| c.head(&url)) {
            Ok(_) => Ok(true),
            Err(Error::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn create(&self) -> Result<()> {
        let url = self.base.clone();
        self.send("create", "", |c| c.post(&url)).map(drop)
    }

    fn default_concurrency(&self) -> usize {
        CONCURRENCY
    }

    fn provenance(&self) -> Provenance {
        self.provenance.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn is_remote(&self) -> bool {
        true
    }

    /// The server stages its own writes and removes what it left behind itself.
    fn remove_stale_temporaries(&self, _age: Duration) -> Result<usize> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A revision 2 server's listing of `snapshots/` names the listing's token in a header: the
    /// records count. A revision 1 server's has no header: nothing is recorded, whatever the body.
    #[test]
    fn records_count_only_with_the_servers_header() {
        let h = "ab".repeat(32);
        let body = format!(
            r#"[{{"path":"snapshots/{h}","size":3,"stored_by":"a"}},{{"path":"snapshots/{}","size":3}}]"#,
            "cd".repeat(32)
        );
        let listed = cairn_format::protocol::decode_listing(body.as_bytes()).unwrap();
        let Provenance::Recorded(r) = provenance(&listed, Some("me".into())) else { panic!("not recorded") };
        assert_eq!(r.this_token, "me");
        let id = cairn_format::layout::parse_snapshot_path(&format!("snapshots/{h}")).unwrap();
        assert_eq!(r.snapshots.len(), 1);
        assert_eq!(r.snapshots[&id], "a");
        assert_eq!(provenance(&listed, None), Provenance::NotRecorded);
    }

    #[test]
    fn fingerprints_parse_with_or_without_colons() {
        let hex = "ab".repeat(32);
        assert_eq!(parse_fingerprint(&hex).unwrap(), [0xab; 32]);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_fingerprint(&colons).unwrap(), [0xab; 32]);
        assert!(parse_fingerprint("abc").unwrap_err().to_string().contains("64 hex digits"));
    }
}
