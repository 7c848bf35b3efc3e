//! The `kubernetes` Service as a pod on a node sees it: HTTPS at the Service's cluster IP
//! (`KUBERNETES_SERVICE_HOST`, on the node netns's loopback), with a serving certificate signed
//! by a cluster CA of the test's (the `ca.crt` of every projected service-account volume),
//! forwarding each connection to the plain-HTTP fake API server on this machine's loopback.
//!
//! In-cluster clients (kube's `Config::incluster`, the plugin's kubeconfig written by the
//! installer) verify the certificate against that CA and send their bearer token, as against a
//! real API server. The front records every token it saw ([`ApiFront::bearer_tokens`]), so a
//! test can tell that the projected token is the one the agent used.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr, TcpListener},
    sync::{Arc, Mutex},
    thread::JoinHandle,
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    error::{Error, IoContext, Result},
    netns::NetnsGuard,
};

/// The names the serving certificate holds besides the cluster IP (kube-apiserver's).
const DNS_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The HTTPS front of the fake API server inside a node's network namespace.
#[derive(Debug)]
pub struct ApiFront {
    addr: SocketAddr,
    ca_pem: String,
    tokens: Arc<Mutex<BTreeSet<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ApiFront {
    /// Adds `addr`'s IP to the loopback of `netns`, listens there with a fresh CA and serving
    /// certificate, and forwards every connection to `upstream` (plain HTTP on this machine's
    /// loopback).
    pub fn start(netns: &NetnsGuard, addr: SocketAddr, upstream: SocketAddr) -> Result<Self> {
        let ip = addr.ip();
        netns.exec("ip", ["addr", "add", &format!("{ip}/32"), "dev", "lo"])?;
        let (ca_pem, cert_pem, key_pem) = certificates(ip)?;
        let tls = server_config(&cert_pem, &key_pem)?;
        let listener = netns
            .run_in(|| TcpListener::bind(addr))?
            .ctx(|| format!("binding the API front on {addr} in the node netns"))?;
        listener
            .set_nonblocking(true)
            .ctx(|| "making the API front non-blocking")?;
        let tokens = Arc::new(Mutex::new(BTreeSet::new()));
        let seen = tokens.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ctx(|| "building the API front's runtime")?;
        let thread = std::thread::Builder::new()
            .name("api-front".into())
            .spawn(move || {
                rt.block_on(serve(listener, tls, upstream, seen, stopped));
            })
            .ctx(|| "spawning the API front")?;
        Ok(Self {
            addr,
            ca_pem,
            tokens,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens (inside the node netns).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The cluster CA (PEM): the `ca.crt` clients must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Every bearer token a client sent so far.
    pub fn bearer_tokens(&self) -> BTreeSet<String> {
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for ApiFront {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A CA and a serving certificate for `ip` and the `kubernetes` Service's names: (CA PEM,
/// certificate PEM, key PEM).
fn certificates(ip: IpAddr) -> Result<(String, String, String)> {
    let err = |e: rcgen::Error| Error::Missing(format!("generating the cluster CA: {e}"));
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.distinguished_name
        .push(DnType::CommonName, "linkerd-cni-tests cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().map_err(err)?;
    let mut names = vec![ip.to_string()];
    names.extend(DNS_NAMES.iter().map(|s| s.to_string()));
    let mut params = CertificateParams::new(names).map_err(err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    Ok((ca_cert.pem(), cert.pem(), key.serialize_pem()))
}

fn server_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>> {
    let bad = |what: &str, e: String| Error::Parse {
        what: what.into(),
        detail: e,
    };
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("the serving certificate", e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| bad("the serving key", e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("the TLS versions", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("the serving certificate", e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    upstream: SocketAddr,
    tokens: Arc<Mutex<BTreeSet<String>>>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            a = listener.accept() => a,
        };
        let Ok((conn, _)) = accepted else {
            continue;
        };
        let acceptor = acceptor.clone();
        let tokens = tokens.clone();
        tokio::spawn(async move {
            let Ok(client) = acceptor.accept(conn).await else {
                return;
            };
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let (mut client_rd, mut client_wr) = tokio::io::split(client);
            let (mut server_rd, mut server_wr) = server.into_split();
            let up = async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut tail = String::new();
                loop {
                    let n = match client_rd.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    tail.push_str(&String::from_utf8_lossy(&buf[..n]));
                    record_tokens(&mut tail, &tokens);
                    if server_wr.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = server_wr.shutdown().await;
            };
            let down = async move {
                let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
                let _ = client_wr.shutdown().await;
            };
            tokio::join!(up, down);
        });
    }
}

/// Records the bearer tokens of the complete header lines in `text`, keeping only its last,
/// unfinished line.
fn record_tokens(text: &mut String, tokens: &Mutex<BTreeSet<String>>) {
    let Some(end) = text.rfind('\n') else {
        if text.len() > 64 * 1024 {
            text.clear();
        }
        return;
    };
    for line in text[..end].lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("authorization")
            && let Some(token) = value.trim().strip_prefix("Bearer ")
        {
            tokens
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(token.trim().to_string());
        }
    }
    text.drain(..=end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_complete_header_lines() {
        let tokens = Mutex::new(BTreeSet::new());
        let mut text = String::from("GET / HTTP/1.1\r\nauthorization: Bearer abc\r\nAuthoriz");
        record_tokens(&mut text, &tokens);
        assert_eq!(text, "Authoriz");
        text.push_str("ation: Bearer def.ghi\r\n\r\n");
        record_tokens(&mut text, &tokens);
        let seen: Vec<String> = tokens.into_inner().unwrap().into_iter().collect();
        assert_eq!(seen, ["abc", "def.ghi"]);
    }
}
