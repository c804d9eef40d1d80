//! The server's certificate: from PEM files, or a self-signed one made on first start and kept
//! beside the credentials file, whose SHA-256 fingerprint clients pin.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the certificate comes from.
#[derive(Clone, Debug)]
pub enum Certificate {
    /// PEM files given by the admin.
    Files {
        /// The certificate chain, leaf first.
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
    },
    /// `DIR/cert.pem` and `DIR/key.pem`, made (self-signed, for `names`) if missing.
    SelfSigned {
        /// The directory (the credentials file's).
        dir: PathBuf,
        /// Host names and addresses the certificate names.
        names: Vec<String>,
    },
}

/// The TLS setup and the fingerprint of the leaf certificate.
pub struct Loaded {
    /// For the acceptor.
    pub config: Arc<rustls::ServerConfig>,
    /// SHA-256 of the leaf certificate's DER bytes, hex.
    pub fingerprint: String,
    /// Where the certificate was read from (and, if it was made now, that it was).
    pub source: String,
}

/// The hex SHA-256 of a certificate's DER bytes.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, der).as_ref())
}

/// Reads (or first makes) the certificate and builds the TLS configuration.
pub fn load(cert: &Certificate) -> Result<Loaded> {
    let (cert_path, key_path, made) = match cert {
        Certificate::Files { cert, key } => (cert.clone(), key.clone(), false),
        Certificate::SelfSigned { dir, names } => {
            let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
            let made = !c.exists();
            if made {
                make_self_signed(dir, &c, &k, names)?;
            }
            (c, k, made)
        }
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .and_then(|it| it.collect::<Result<_, _>>())
        .with_context(|| format!("cannot read the certificate {}", cert_path.display()))?;
    let Some(leaf) = certs.first() else { bail!("no certificate in {}", cert_path.display()) };
    let fingerprint = fingerprint(leaf.as_ref());
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .with_context(|| format!("cannot read the private key {}", key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS setup")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| {
            format!("the certificate {} and key {} do not fit", cert_path.display(), key_path.display())
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let source = if made {
        format!("made a self-signed certificate {}", cert_path.display())
    } else {
        cert_path.display().to_string()
    };
    Ok(Loaded { config: Arc::new(config), fingerprint, source })
}

fn make_self_signed(dir: &Path, cert: &Path, key: &Path, names: &[String]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let made = rcgen::generate_simple_self_signed(names.to_vec()).context("cannot make a self-signed certificate")?;
    // The key first: a certificate without its key would be kept and fail every start. A key
    // without its certificate is what a start killed in between left.
    let _ = std::fs::remove_file(key);
    crate::tokens::write_private(key, made.key_pair.serialize_pem().as_bytes())?;
    crate::tokens::write_private(cert, made.cert.pem().as_bytes())
}
