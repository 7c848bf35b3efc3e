//! TLS for the webhook: generating the CA and serving certificate `linkerd install` ships in
//! a Secret (and whose CA goes into the webhook's `caBundle`), and loading the serving
//! certificate into rustls, re-reading the files when they change (cert-manager rotation).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

/// How long generated certificates are valid.
pub const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How often the serving certificate files are checked for changes.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// TLS failures.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificate generation failed.
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// PEM contents are unusable.
    #[error("{what}: {reason}")]
    Pem {
        /// Which PEM.
        what: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A generated CA and the serving certificate it signed, all PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsMaterial {
    /// The CA certificate (the webhook's `caBundle`, the Secret's `ca.crt`).
    pub ca_pem: String,
    /// The serving certificate (`tls.crt`).
    pub cert_pem: String,
    /// The serving key (`tls.key`, PKCS#8).
    pub key_pem: String,
}

/// The DNS names the API server may use to reach `service` in `namespace`.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Generates a fresh CA and a serving certificate for `dns_names` (ECDSA P-256), valid for
/// [`VALIDITY`] from an hour ago (clock skew).
pub fn generate(dns_names: &[String]) -> Result<TlsMaterial, TlsError> {
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::hours(1);
    let not_after = now + time::Duration::seconds(VALIDITY.as_secs() as i64);

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "linkerd-proxy-injector webhook CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(dns_names.to_vec())?;
    if let Some(cn) = dns_names.get(2).or(dns_names.first()) {
        params
            .distinguished_name
            .push(DnType::CommonName, cn.as_str());
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(TlsMaterial {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain and private key into a rustls [`CertifiedKey`].
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let pem_err = |what: &str, reason: String| TlsError::Pem {
        what: what.into(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err("certificate", e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err("certificate", "no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| pem_err("private key", e.to_string()))?;
    Ok(CertifiedKey::from_der(certs, key, &provider())?)
}

/// A rustls server configuration (HTTP/1.1) that always presents `key`.
pub fn server_config_with(
    resolver: Arc<dyn ResolvesServerCert>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A server configuration presenting a fixed certificate (from PEM in memory).
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let key = Arc::new(certified_key(cert_pem, key_pem)?);
    server_config_with(Arc::new(FixedCert(key)))
}

#[derive(Debug)]
struct FixedCert(Arc<CertifiedKey>);

impl ResolvesServerCert for FixedCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Serves the certificate in two PEM files, re-reading them (at most every
/// [`RELOAD_CHECK_INTERVAL`]) when their modification time changes. A rotation that does not
/// parse is logged and the previous certificate kept.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    state: Mutex<ReloadState>,
}

#[derive(Debug)]
struct ReloadState {
    key: Arc<CertifiedKey>,
    mtimes: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl ReloadingCert {
    /// Loads the files once (errors here are fatal: the webhook cannot serve without them).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let key = certified_key(&read(cert_path)?, &read(key_path)?)?;
        Ok(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            state: Mutex::new(ReloadState {
                key: Arc::new(key),
                mtimes: (mtime(cert_path), mtime(key_path)),
                checked: Instant::now(),
            }),
        })
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().ok()?;
        if state.checked.elapsed() >= RELOAD_CHECK_INTERVAL {
            state.checked = Instant::now();
            let mtimes = (mtime(&self.cert_path), mtime(&self.key_path));
            if mtimes != state.mtimes {
                match read(&self.cert_path).and_then(|c| certified_key(&c, &read(&self.key_path)?))
                {
                    Ok(key) => {
                        tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                        state.key = Arc::new(key);
                        state.mtimes = mtimes;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "serving certificate changed but cannot be loaded; keeping the previous one")
                    }
                }
            }
        }
        Some(state.key.clone())
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_material_loads_into_rustls() {
        let names = service_dns_names("linkerd-proxy-injector", "linkerd");
        assert_eq!(names[2], "linkerd-proxy-injector.linkerd.svc");
        let m = generate(&names).expect("generate");
        assert!(
            m.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"),
            "{}",
            m.ca_pem
        );
        assert_ne!(m.ca_pem, m.cert_pem);
        server_config(m.cert_pem.as_bytes(), m.key_pem.as_bytes()).expect("server config");
        let other = generate(&names).expect("generate again");
        let err = certified_key(m.cert_pem.as_bytes(), other.key_pem.as_bytes())
            .expect_err("mismatched key");
        assert!(err.to_string().contains("TLS"), "{err}");
        let err = certified_key(b"", m.key_pem.as_bytes()).expect_err("no cert");
        assert!(err.to_string().contains("certificate"), "{err}");
    }
}
