//! The plugin's kubeconfig: API server address, CA and the service-account token, rendered from
//! the installer pod's own service-account volume.

use std::fs;

use base64::Engine as _;

use crate::{config::InstallerConfig, error::InstallError};

/// The context name Linkerd's plugin expects.
pub const CONTEXT: &str = "linkerd-cni-context";
/// The user name in the kubeconfig.
pub const USER: &str = "linkerd-cni";
/// The cluster name in the kubeconfig.
pub const CLUSTER: &str = "local";

/// The API server URL. An IPv6 host gets brackets (Linkerd brackets every host, which some URL
/// parsers reject for IPv4 and names).
pub fn server_url(cfg: &InstallerConfig) -> String {
    let host = &cfg.kubernetes_service_host;
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    format!(
        "{}://{}:{}",
        cfg.kubernetes_service_protocol, host, cfg.kubernetes_service_port
    )
}

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.into()).to_string()
}

/// Renders the kubeconfig from the current token and CA.
pub fn render(cfg: &InstallerConfig) -> Result<Vec<u8>, InstallError> {
    let token_path = cfg.service_account_dir.join("token");
    let token = fs::read_to_string(&token_path).map_err(|source| InstallError::Token {
        path: token_path,
        source,
    })?;
    let tls = if cfg.skip_tls_verify {
        "insecure-skip-tls-verify: true".to_owned()
    } else {
        let ca = fs::read(&cfg.kube_ca_file)
            .map_err(InstallError::io("reading the CA bundle", &cfg.kube_ca_file))?;
        format!(
            "certificate-authority-data: {}",
            quoted(&base64::engine::general_purpose::STANDARD.encode(ca))
        )
    };
    let text = format!(
        "# Kubeconfig of the linkerd-cni plugin, kept up to date by its installer.\n\
         apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {CLUSTER}\n  \
           cluster:\n    \
             server: {server}\n    \
             {tls}\n\
         users:\n\
         - name: {USER}\n  \
           user:\n    \
             token: {token}\n\
         contexts:\n\
         - name: {CONTEXT}\n  \
           context:\n    \
             cluster: {CLUSTER}\n    \
             user: {USER}\n\
         current-context: {CONTEXT}\n",
        server = quoted(&server_url(cfg)),
        token = quoted(token.trim()),
    );
    Ok(text.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(host: &str) -> InstallerConfig {
        InstallerConfig::from_lookup(|k| match k {
            "CNI_NETWORK_CONFIG" => Some(r#"{"type":"linkerd-cni"}"#.into()),
            "KUBERNETES_SERVICE_HOST" => Some(host.into()),
            "KUBERNETES_SERVICE_PORT" => Some("6443".into()),
            _ => None,
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn server_url_brackets_only_ipv6() {
        let cases = [
            ("10.96.0.1", "https://10.96.0.1:6443"),
            ("fd00::1", "https://[fd00::1]:6443"),
            ("[fd00::1]", "https://[fd00::1]:6443"),
            (
                "kubernetes.default.svc",
                "https://kubernetes.default.svc:6443",
            ),
        ];
        for (host, want) in cases {
            assert_eq!(server_url(&cfg(host)), want, "host {host}");
        }
    }
}
