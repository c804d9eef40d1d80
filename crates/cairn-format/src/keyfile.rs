//! Key files: the master secret wrapped by a key derived from a password (FORMAT.md §3.2).
//! Several key files may exist side by side; any one of them opens the repository.

use argon2::{Algorithm, Argon2, Params, Version};
use serde::{Deserialize, Serialize};

use crate::crypto::{random_salt, MasterKey, ObjectKey};
use crate::error::{Error, Result};

const WRAP_AAD: &[u8] = b"cairn key file v1";

/// Argon2id cost parameters, stored in each key file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Number of passes.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Default for KdfParams {
    /// 64 MiB, 3 passes, 4 lanes: RFC 9106's second recommended option. The lanes are filled
    /// on all cores at once (the `parallel` feature), so opening a repository takes about
    /// 0.09 s on this project's 2-core machine instead of the 0.13 s of one lane
    /// (docs/DESIGN.md, "Key derivation").
    fn default() -> Self {
        KdfParams { memory_kib: 64 * 1024, iterations: 3, parallelism: 4 }
    }
}

impl KdfParams {
    /// Refuses costs no key file may have: more than 4 GiB, 100 passes or 64 lanes (a key file
    /// asking for more is treated as damaged, so none is ever written).
    fn check(&self) -> std::result::Result<(), String> {
        if self.memory_kib > 4 * 1024 * 1024 || self.iterations > 100 || self.parallelism > 64 {
            return Err(format!(
                "Argon2id parameters are implausibly large (memory {} KiB, {} passes, {} lanes; at most 4 GiB, 100, 64)",
                self.memory_kib, self.iterations, self.parallelism
            ));
        }
        Ok(())
    }
}

/// The JSON content of a key file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyFile {
    /// Key file format version (1).
    pub version: u32,
    /// When the key was made, RFC 3339.
    pub created: String,
    /// Host that made it.
    pub hostname: String,
    /// User that made it.
    pub username: String,
    /// Always "argon2id".
    pub kdf: String,
    /// Argon2id costs.
    pub argon2: KdfParams,
    /// 32-byte random salt, hex.
    pub salt: String,
    /// nonce | AES-256-GCM(master secret) | tag, hex.
    pub data: String,
}

fn derive_kek(password: &[u8], salt: &[u8], params: KdfParams) -> Result<ObjectKey> {
    let p = Params::new(params.memory_kib, params.iterations, params.parallelism, Some(32))
        .map_err(|e| Error::Usage(format!("invalid Argon2id parameters: {e}")))?;
    let mut kek = [0u8; 32];
    Argon2::new(Algorithm::Argon2id, Version::V0x13, p)
        .hash_password_into(password, salt, &mut kek)
        .map_err(|e| Error::Usage(format!("Argon2id failed: {e}")))?;
    Ok(ObjectKey::new(&kek))
}

impl KeyFile {
    /// Wraps `master` under `password`; `created`, `hostname` and `username` say when, where
    /// and by whom.
    pub fn create(
        master: &MasterKey,
        password: &[u8],
        params: KdfParams,
        created: String,
        hostname: String,
        username: String,
    ) -> Result<Self> {
        params.check().map_err(Error::Usage)?;
        let salt = random_salt();
        let kek = derive_kek(password, &salt, params)?;
        let data = kek.seal(WRAP_AAD, master.secret());
        Ok(KeyFile {
            version: 1,
            created,
            hostname,
            username,
            kdf: "argon2id".into(),
            argon2: params,
            salt: hex::encode(salt),
            data: hex::encode(data),
        })
    }

    /// Parses a key file; `name` is its path, for errors.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Self> {
        let kf: KeyFile =
            serde_json::from_slice(bytes).map_err(|e| Error::corrupt(name, format!("not a key file: {e}")))?;
        if kf.version != 1 || kf.kdf != "argon2id" {
            return Err(Error::corrupt(name, format!("unsupported key file version {} / kdf {}", kf.version, kf.kdf)));
        }
        Ok(kf)
    }

    /// Unwraps the master key; `Ok(None)` when the password is not the one this key was made with.
    pub fn unwrap_key(&self, name: &str, password: &[u8]) -> Result<Option<MasterKey>> {
        let salt = hex::decode(&self.salt).map_err(|_| Error::corrupt(name, "salt is not hex"))?;
        let data = hex::decode(&self.data).map_err(|_| Error::corrupt(name, "data is not hex"))?;
        let p = self.argon2;
        p.check().map_err(|why| Error::corrupt(name, why))?;
        let kek = derive_kek(password, &salt, p).map_err(|e| Error::corrupt(name, e.to_string()))?;
        let Some(secret) = kek.open(WRAP_AAD, &data) else {
            return Ok(None);
        };
        let secret: [u8; 32] =
            secret.try_into().map_err(|_| Error::corrupt(name, "wrapped master secret has the wrong length"))?;
        Ok(Some(MasterKey::from_secret(secret)))
    }

    /// The bytes stored in `keys/`.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("key file serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_unwrap() {
        let mk = MasterKey::generate();
        let params = KdfParams { memory_kib: 64, iterations: 1, parallelism: 1 };
        let kf = KeyFile::create(&mk, b"pw", params, "now".into(), "host".into(), "user".into()).unwrap();
        let parsed = KeyFile::parse("k", &kf.to_bytes()).unwrap();
        let back = parsed.unwrap_key("k", b"pw").unwrap().unwrap();
        assert_eq!(back.secret(), mk.secret());
        assert!(parsed.unwrap_key("k", b"wrong").unwrap().is_none());
    }

    #[test]
    fn default_key_files_use_four_lanes_and_unwrap() {
        assert_eq!(KdfParams::default().parallelism, 4);
        let mk = MasterKey::generate();
        let params = KdfParams { memory_kib: 256, iterations: 1, parallelism: 4 };
        let kf = KeyFile::create(&mk, b"pw", params, "now".into(), "host".into(), "user".into()).unwrap();
        let back = KeyFile::parse("k", &kf.to_bytes()).unwrap().unwrap_key("k", b"pw").unwrap().unwrap();
        assert_eq!(back.secret(), mk.secret());
        // Costs no key file may have are refused when the key is made, not when it is opened.
        let lanes = KdfParams { memory_kib: 1024, iterations: 1, parallelism: 65 };
        let err =
            KeyFile::create(&mk, b"pw", lanes, "now".into(), "host".into(), "user".into()).unwrap_err().to_string();
        assert!(err.contains("65 lanes"), "{err}");
    }

    /// Lanes filled in parallel still give standard Argon2id: RFC 9106 §5.3's test vector
    /// (m = 32 KiB, t = 3, p = 4, with secret and associated data).
    #[test]
    fn parallel_lanes_match_rfc_9106() {
        let params = argon2::ParamsBuilder::new()
            .m_cost(32)
            .t_cost(3)
            .p_cost(4)
            .data(argon2::AssociatedData::new(&[4u8; 12]).unwrap())
            .output_len(32)
            .build()
            .unwrap();
        let a = Argon2::new_with_secret(&[3u8; 8], Algorithm::Argon2id, Version::V0x13, params).unwrap();
        let mut tag = [0u8; 32];
        a.hash_password_into(&[1u8; 32], &[2u8; 16], &mut tag).unwrap();
        assert_eq!(hex::encode(tag), "0d640df58d78766c08c037a34a8b53c9d01ef0452d75b65eb52520e96b01e659");
    }
}
