//! The plugin's own Kubernetes lookup, used only when the node agent is unreachable: is the pod
//! meshed? An unmeshed pod then starts without the agent; a meshed one fails closed.
//!
//! Reads the kubeconfig the installer writes (`kubernetes.kubeconfig` in the conflist: server,
//! `certificate-authority-data` or `insecure-skip-tls-verify`, a bearer token), GETs the pod
//! with a small blocking HTTPS client (ureq on rustls) and applies Linkerd's rule
//! ([`linkerd_cni_proto::config::wants_redirect`]), the same the agent applies. No cache, no
//! retries: the runtime retries the ADD.

use std::{fs, time::Duration};

use base64::Engine as _;
use linkerd_cni_proto::config::wants_redirect;
use serde::Deserialize;
use serde_json::Value;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

/// The bound on the whole lookup (connect, TLS, request, body).
pub const API_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest pod object read.
const MAX_BODY: u64 = 4 << 20;

/// Asks the Kubernetes API whether a pod is meshed. A trait so the command logic can be
/// tested without a server.
pub trait PodLookup {
    /// Whether pod `namespace/name` is meshed, per the kubeconfig at `kubeconfig`.
    fn is_meshed(&self, kubeconfig: &str, namespace: &str, name: &str) -> Result<bool, ApiError>;
}

/// A failed lookup: the plugin cannot know whether the pod is meshed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The conflist names no kubeconfig.
    #[error("the network config has no kubernetes.kubeconfig")]
    NoKubeconfig,
    /// The kubeconfig cannot be read or lacks what is needed.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    /// The request failed (connect, TLS, timeout).
    #[error("GET {url}: {reason}")]
    Request { url: String, reason: String },
    /// The API answered something other than the pod.
    #[error("GET {url}: {reason}")]
    Answer { url: String, reason: String },
    /// The API rejects the kubeconfig's credentials: 401 (the token's ServiceAccount is gone)
    /// or 403 (its RBAC is gone). After an uninstall that left the conflist patched, this is
    /// what every lookup gets.
    #[error("GET {url}: status {status} (the API rejects linkerd-cni's credentials): {reason}")]
    Rejected {
        url: String,
        status: u16,
        reason: String,
    },
}

/// The real lookup.
#[derive(Clone, Copy, Debug, Default)]
pub struct KubeApi;

impl PodLookup for KubeApi {
    fn is_meshed(&self, kubeconfig: &str, namespace: &str, name: &str) -> Result<bool, ApiError> {
        let target = Target::load(kubeconfig)?;
        let pod = target.get_pod(namespace, name)?;
        Ok(pod_is_meshed(&pod))
    }
}

/// Linkerd's rule on a pod object (only container names count).
pub fn pod_is_meshed(pod: &Value) -> bool {
    let names = |key: &str| -> Vec<&str> {
        pod.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default()
    };
    wants_redirect(names("containers"), names("initContainers"))
}

/// Where and how to reach the API, from a kubeconfig.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub server: String,
    /// PEM bundle; `None` with `insecure` or when the kubeconfig names none (then the
    /// built-in web roots apply).
    pub ca_pem: Option<Vec<u8>>,
    pub insecure: bool,
    pub token: Option<String>,
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(rename = "current-context", default)]
    current_context: Option<String>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    item: Option<T>,
}

#[derive(Deserialize)]
struct Cluster {
    server: String,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
    #[serde(rename = "certificate-authority")]
    ca_file: Option<String>,
    #[serde(rename = "insecure-skip-tls-verify", default)]
    insecure: bool,
}

#[derive(Deserialize, Default)]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    user: Option<String>,
}

impl Target {
    /// Reads the kubeconfig at `path`.
    pub fn load(path: &str) -> Result<Self, ApiError> {
        let bad = |reason: String| ApiError::Kubeconfig {
            path: path.into(),
            reason,
        };
        let text = fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        Self::parse(&text).map_err(bad)
    }

    /// Parses a kubeconfig: the current context's (or the only) cluster and user.
    pub fn parse(text: &str) -> Result<Self, String> {
        let kc: Kubeconfig = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let context = match &kc.current_context {
            Some(name) => kc
                .contexts
                .iter()
                .find(|c| &c.name == name)
                .and_then(|c| c.item.as_ref())
                .ok_or_else(|| format!("current-context {name:?} not found"))
                .map(Some)?,
            None => kc.contexts.first().and_then(|c| c.item.as_ref()),
        };
        let cluster = match context {
            Some(ctx) => kc.clusters.iter().find(|c| c.name == ctx.cluster),
            None => kc.clusters.first(),
        }
        .and_then(|c| c.item.as_ref())
        .ok_or("no cluster")?;
        let user = match context.and_then(|c| c.user.as_ref()) {
            Some(name) => kc.users.iter().find(|u| &u.name == name),
            None => kc.users.first(),
        }
        .and_then(|u| u.item.as_ref());
        let ca_pem = match (&cluster.ca_data, &cluster.ca_file) {
            (Some(data), _) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .map_err(|e| format!("certificate-authority-data: {e}"))?,
            ),
            (None, Some(file)) => {
                Some(fs::read(file).map_err(|e| format!("certificate-authority {file}: {e}"))?)
            }
            (None, None) => None,
        };
        let token = match user {
            Some(User { token: Some(t), .. }) => Some(t.trim().to_string()),
            Some(User {
                token_file: Some(f),
                ..
            }) => Some(
                fs::read_to_string(f)
                    .map_err(|e| format!("tokenFile {f}: {e}"))?
                    .trim()
                    .to_string(),
            ),
            _ => None,
        };
        Ok(Self {
            server: cluster.server.trim_end_matches('/').to_string(),
            ca_pem,
            insecure: cluster.insecure,
            token,
        })
    }

    /// GETs the pod object.
    pub fn get_pod(&self, namespace: &str, name: &str) -> Result<Value, ApiError> {
        // Names are DNS labels/subdomains: anything else would change the URL's meaning.
        let valid = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        let url = format!("{}/api/v1/namespaces/{namespace}/pods/{name}", self.server);
        let answer = |reason: String| ApiError::Answer {
            url: url.clone(),
            reason,
        };
        if !valid(namespace) || !valid(name) {
            return Err(answer("not a valid pod namespace/name".into()));
        }
        let request_err = |reason: String| ApiError::Request {
            url: url.clone(),
            reason,
        };
        let mut tls = TlsConfig::builder().disable_verification(self.insecure);
        if let Some(pem) = &self.ca_pem {
            let certs = ureq::tls::parse_pem(pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<Vec<Certificate<'static>>, _>>()
                .map_err(|e| request_err(format!("CA bundle: {e}")))?;
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(API_TIMEOUT))
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .tls_config(tls.build())
            .build()
            .into();
        let mut request = agent.get(&url).header("Accept", "application/json");
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let mut response = request.call().map_err(|e| request_err(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| request_err(format!("reading the answer: {e}")))?;
        if status != 200 {
            let text: String = String::from_utf8_lossy(&body).chars().take(200).collect();
            if status == 401 || status == 403 {
                return Err(ApiError::Rejected {
                    url: url.clone(),
                    status,
                    reason: text,
                });
            }
            return Err(answer(format!("status {status}: {text}")));
        }
        serde_json::from_slice(&body).map_err(|e| answer(format!("not a pod object: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpListener,
        thread,
    };

    use serde_json::json;

    use super::*;

    #[test]
    fn parses_the_installers_kubeconfig() {
        let ca = base64::engine::general_purpose::STANDARD.encode("PEM");
        let text = format!(
            "# Kubeconfig of the linkerd-cni plugin, kept up to date by its installer.\n\
             apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    \
             server: \"https://10.96.0.1:443\"\n    certificate-authority-data: \"{ca}\"\n\
             users:\n- name: linkerd-cni\n  user:\n    token: \"tok\"\n\
             contexts:\n- name: linkerd-cni-context\n  context:\n    cluster: local\n    \
             user: linkerd-cni\ncurrent-context: linkerd-cni-context\n"
        );
        let t = Target::parse(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.server, "https://10.96.0.1:443");
        assert_eq!(t.ca_pem.as_deref(), Some(&b"PEM"[..]));
        assert_eq!(t.token.as_deref(), Some("tok"));
        assert!(!t.insecure);
        let insecure = text.replace(
            &format!("certificate-authority-data: \"{ca}\""),
            "insecure-skip-tls-verify: true",
        );
        let t = Target::parse(&insecure).unwrap_or_else(|e| panic!("{e}"));
        assert!(t.insecure && t.ca_pem.is_none());
        assert!(Target::parse("clusters: []").is_err());
        assert!(Target::parse("current-context: nope\ncontexts: []").is_err());
    }

    #[test]
    fn meshed_rule_on_pod_objects() {
        let pod = |c: &[&str], i: &[&str]| {
            let list = |n: &[&str]| n.iter().map(|n| json!({"name": n})).collect::<Vec<_>>();
            json!({"spec": {"containers": list(c), "initContainers": list(i)}})
        };
        assert!(pod_is_meshed(&pod(&["app", "linkerd-proxy"], &[])));
        assert!(pod_is_meshed(&pod(&["app"], &["linkerd-proxy"])));
        assert!(!pod_is_meshed(&pod(&["app"], &[])));
        assert!(!pod_is_meshed(&pod(&["linkerd-proxy"], &["linkerd-init"])));
        assert!(!pod_is_meshed(&json!({})));
    }

    /// Serves one HTTP answer on loopback; returns the URL and the request it saw.
    fn serve_once(status: &str, body: &str) -> (String, thread::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        let h = thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            let mut buf = [0u8; 4096];
            let n = c.read(&mut buf).expect("read");
            c.write_all(reply.as_bytes()).expect("write");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (url, h)
    }

    #[test]
    fn gets_the_pod_with_the_token() {
        let body = json!({"spec": {"containers": [{"name": "linkerd-proxy"}]}}).to_string();
        let (server, h) = serve_once("200 OK", &body);
        let t = Target {
            server,
            ca_pem: None,
            insecure: false,
            token: Some("tok".into()),
        };
        let pod = t.get_pod("shop", "web-0").unwrap_or_else(|e| panic!("{e}"));
        assert!(pod_is_meshed(&pod));
        let seen = h.join().expect("server");
        assert!(
            seen.starts_with("GET /api/v1/namespaces/shop/pods/web-0 HTTP/1.1"),
            "{seen}"
        );
        assert!(
            seen.contains("authorization: Bearer tok")
                || seen.contains("Authorization: Bearer tok"),
            "{seen}"
        );

        let (server, h) = serve_once("404 Not Found", "{}");
        let t = Target { server, ..t };
        let err = t.get_pod("shop", "web-0").expect_err("404");
        assert!(err.to_string().contains("404"), "{err}");
        h.join().expect("server");
        assert!(t.get_pod("shop", "../x").is_err());

        // Credentials rejected: told apart from other answers.
        for status in ["401 Unauthorized", "403 Forbidden"] {
            let (server, h) = serve_once(status, r#"{"kind":"Status"}"#);
            let t = Target {
                server,
                ..t.clone()
            };
            let err = t.get_pod("shop", "web-0").expect_err(status);
            let code: u16 = status[..3].parse().expect("code");
            assert!(
                matches!(err, ApiError::Rejected { status, .. } if status == code),
                "{err:?}"
            );
            h.join().expect("server");
        }
    }
}
