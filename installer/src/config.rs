//! Installer settings, read from the same environment variables as Linkerd's `install-cni.sh`.

use std::{
    fs,
    path::{Path, PathBuf},
};

use linkerd_cni_common::paths;

use crate::{
    conflist::{ConfKind, PLUGIN_TYPE},
    error::ConfigError,
    json::{Json, Object},
};

/// The placeholder in the config template that becomes the host path of the kubeconfig.
pub const KUBECONFIG_PLACEHOLDER: &str = "__KUBECONFIG_FILEPATH__";

/// Everything the installer needs to know. Fields are public so the agent can override any
/// of them after [`InstallerConfig::from_env`] (for example from its own flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallerConfig {
    /// `DEST_CNI_NET_DIR`: the CNI net dir as the *host* sees it (default `/etc/cni/net.d`).
    pub dest_cni_net_dir: PathBuf,
    /// `DEST_CNI_BIN_DIR`: the CNI bin dir as the host sees it (default `/opt/cni/bin`).
    pub dest_cni_bin_dir: PathBuf,
    /// `CONTAINER_MOUNT_PREFIX`: where the host's `/` is mounted in this container (default
    /// `/host`; empty when running directly on the host).
    pub container_mount_prefix: PathBuf,
    /// The plugin binary to copy: `CONTAINER_CNI_BIN_DIR` (default `/opt/cni/bin`) joined
    /// with `linkerd-cni`.
    pub plugin_source: PathBuf,
    /// `KUBECONFIG_FILE_NAME` (default `ZZZ-linkerd-cni-kubeconfig`).
    pub kubeconfig_file_name: String,
    /// `KUBECONFIG_MODE`: octal permission bits of the kubeconfig (default `600`).
    pub kubeconfig_mode: u32,
    /// The plugin entry template: the contents of `CNI_NETWORK_CONFIG_FILE` if that file
    /// exists, else `CNI_NETWORK_CONFIG`. May contain `__KUBECONFIG_FILEPATH__`.
    pub network_config_template: String,
    /// `SERVICEACCOUNT_PATH`: the service-account volume (default
    /// `/var/run/secrets/kubernetes.io/serviceaccount`). Watched for token rotation.
    pub service_account_dir: PathBuf,
    /// `KUBE_CA_FILE`: CA bundle put in the kubeconfig (default `<service account dir>/ca.crt`).
    pub kube_ca_file: PathBuf,
    /// `SKIP_TLS_VERIFY=true`: write `insecure-skip-tls-verify: true` instead of CA data.
    pub skip_tls_verify: bool,
    /// `KUBERNETES_SERVICE_PROTOCOL` (default `https`).
    pub kubernetes_service_protocol: String,
    /// `KUBERNETES_SERVICE_HOST` (required, set by the kubelet in every pod).
    pub kubernetes_service_host: String,
    /// `KUBERNETES_SERVICE_PORT` (required, set by the kubelet in every pod).
    pub kubernetes_service_port: String,
}

impl InstallerConfig {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|key| std::env::var(key).ok())
    }

    /// Reads the configuration through `lookup` (tests pass a map instead of touching the
    /// process environment). Empty values count as unset, as in the shell script.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |key: &str| lookup(key).filter(|v| !v.is_empty());
        let path_or =
            |key: &str, default: &str| PathBuf::from(get(key).unwrap_or_else(|| default.into()));

        let service_account_dir = path_or("SERVICEACCOUNT_PATH", paths::SERVICE_ACCOUNT_DIR);
        let kube_ca_file = get("KUBE_CA_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| service_account_dir.join("ca.crt"));

        let network_config_template = match get("CNI_NETWORK_CONFIG_FILE").map(PathBuf::from) {
            // Like the script: the file wins when it exists, else the variable is used.
            Some(file) if file.exists() => fs::read_to_string(&file)
                .map_err(|source| ConfigError::TemplateRead { path: file, source })?,
            _ => get("CNI_NETWORK_CONFIG").ok_or(ConfigError::MissingTemplate)?,
        };

        let kubeconfig_mode = match get("KUBECONFIG_MODE") {
            None => 0o600,
            Some(v) => u32::from_str_radix(&v, 8)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or(ConfigError::Invalid {
                    var: "KUBECONFIG_MODE",
                    value: v,
                    reason: "expected octal permission bits such as 600",
                })?,
        };

        let skip_tls_verify = match get("SKIP_TLS_VERIFY").as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "SKIP_TLS_VERIFY",
                    value: other.into(),
                    reason: "expected true or false",
                });
            }
        };

        let config = Self {
            dest_cni_net_dir: path_or("DEST_CNI_NET_DIR", paths::CNI_NET_DIR),
            dest_cni_bin_dir: path_or("DEST_CNI_BIN_DIR", paths::CNI_BIN_DIR),
            // An explicitly empty prefix means "running on the host": keep it empty.
            container_mount_prefix: PathBuf::from(
                lookup("CONTAINER_MOUNT_PREFIX")
                    .unwrap_or_else(|| paths::CONTAINER_MOUNT_PREFIX.into()),
            ),
            plugin_source: path_or("CONTAINER_CNI_BIN_DIR", paths::CONTAINER_CNI_BIN_DIR)
                .join(PLUGIN_TYPE),
            kubeconfig_file_name: get("KUBECONFIG_FILE_NAME")
                .unwrap_or_else(|| paths::KUBECONFIG_FILE_NAME.into()),
            kubeconfig_mode,
            network_config_template,
            service_account_dir,
            kube_ca_file,
            skip_tls_verify,
            kubernetes_service_protocol: get("KUBERNETES_SERVICE_PROTOCOL")
                .unwrap_or_else(|| "https".into()),
            kubernetes_service_host: get("KUBERNETES_SERVICE_HOST").ok_or(
                ConfigError::Missing {
                    var: "KUBERNETES_SERVICE_HOST",
                },
            )?,
            kubernetes_service_port: get("KUBERNETES_SERVICE_PORT").ok_or(
                ConfigError::Missing {
                    var: "KUBERNETES_SERVICE_PORT",
                },
            )?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks what [`from_lookup`](Self::from_lookup) cannot: that the template is a plugin
    /// entry and the kubeconfig name cannot be mistaken for a CNI config.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.plugin_entry()?;
        let name = &self.kubeconfig_file_name;
        if name.contains('/') || ConfKind::of(Path::new(name)).is_some() {
            return Err(ConfigError::Invalid {
                var: "KUBECONFIG_FILE_NAME",
                value: name.clone(),
                reason: "must be a plain file name not ending in .conf or .conflist",
            });
        }
        Ok(())
    }

    /// The CNI net dir as this process sees it (mount prefix + `DEST_CNI_NET_DIR`).
    pub fn net_dir(&self) -> PathBuf {
        under_prefix(&self.container_mount_prefix, &self.dest_cni_net_dir)
    }

    /// The CNI bin dir as this process sees it (mount prefix + `DEST_CNI_BIN_DIR`).
    pub fn bin_dir(&self) -> PathBuf {
        under_prefix(&self.container_mount_prefix, &self.dest_cni_bin_dir)
    }

    /// Where the plugin binary is installed, as this process sees it.
    pub fn binary_path(&self) -> PathBuf {
        self.bin_dir().join(PLUGIN_TYPE)
    }

    /// Where the kubeconfig is written, as this process sees it.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.net_dir().join(&self.kubeconfig_file_name)
    }

    /// The kubeconfig path as the host (and so the plugin) sees it: what replaces
    /// `__KUBECONFIG_FILEPATH__`.
    pub fn kubeconfig_host_path(&self) -> PathBuf {
        self.dest_cni_net_dir.join(&self.kubeconfig_file_name)
    }

    /// The `linkerd-cni` entry appended to every conflist: the template with the kubeconfig
    /// path filled in, declaring the `cgroupPath` capability (the plugin reads
    /// `runtimeConfig.cgroupPath`) unless the template already says something about it.
    pub fn plugin_entry(&self) -> Result<Json, ConfigError> {
        plugin_entry(
            &self.network_config_template,
            &self.kubeconfig_host_path().to_string_lossy(),
        )
    }
}

/// The plugin entry made from `template` (the `CNI_NETWORK_CONFIG` text), with
/// `__KUBECONFIG_FILEPATH__` replaced by `kubeconfig` in its string values.
///
/// The template is parsed first and the path goes in as data: whatever the path holds (`"`,
/// `\`, control characters) stays inside the string and cannot add keys to the entry. A
/// pure function, for tests and fuzzing.
pub fn plugin_entry(template: &str, kubeconfig: &str) -> Result<Json, ConfigError> {
    let mut entry =
        Json::parse(template.as_bytes()).map_err(|source| ConfigError::TemplateJson { source })?;
    replace_in_strings(&mut entry, KUBECONFIG_PLACEHOLDER, kubeconfig);
    let Json::Object(fields) = &mut entry else {
        return Err(ConfigError::TemplateShape {
            reason: "not a JSON object",
        });
    };
    if fields.get("type").and_then(Json::as_str).is_none() {
        return Err(ConfigError::TemplateShape {
            reason: "no string \"type\"",
        });
    }
    match fields.get_mut("capabilities") {
        None => {
            let caps = Object::from_iter([("cgroupPath".into(), Json::Bool(true))]);
            fields.insert("capabilities".into(), Json::Object(caps));
        }
        Some(Json::Object(caps)) => {
            if !caps.contains_key("cgroupPath") {
                caps.insert("cgroupPath".into(), Json::Bool(true));
            }
        }
        Some(_) => {
            return Err(ConfigError::TemplateShape {
                reason: "\"capabilities\" is not an object",
            });
        }
    }
    Ok(entry)
}

/// Replaces `from` by `to` in every string value of `doc` (keys are left as they are). The
/// recursion is bounded by the parser's nesting limit.
fn replace_in_strings(doc: &mut Json, from: &str, to: &str) {
    match doc {
        Json::String(s) if s.contains(from) => *s = s.replace(from, to),
        Json::Array(items) => items
            .iter_mut()
            .for_each(|item| replace_in_strings(item, from, to)),
        Json::Object(entries) => entries
            .values_mut()
            .for_each(|value| replace_in_strings(value, from, to)),
        _ => {}
    }
}

/// `prefix` + `path`, treating `path` as relative to `prefix` even when it is absolute
/// (`Path::join` would drop the prefix).
fn under_prefix(prefix: &Path, path: &Path) -> PathBuf {
    let relative = path.strip_prefix("/").unwrap_or(path);
    if prefix.as_os_str().is_empty() {
        Path::new("/").join(relative)
    } else {
        prefix.join(relative)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const TEMPLATE: &str = r#"{"name":"linkerd-cni","type":"linkerd-cni","kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__"}}"#;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn base() -> Vec<(&'static str, &'static str)> {
        vec![
            ("CNI_NETWORK_CONFIG", TEMPLATE),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ]
    }

    #[test]
    fn defaults_match_linkerd() {
        let c = InstallerConfig::from_lookup(lookup(&base())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.net_dir(), PathBuf::from("/host/etc/cni/net.d"));
        assert_eq!(c.bin_dir(), PathBuf::from("/host/opt/cni/bin"));
        assert_eq!(
            c.binary_path(),
            PathBuf::from("/host/opt/cni/bin/linkerd-cni")
        );
        assert_eq!(c.plugin_source, PathBuf::from("/opt/cni/bin/linkerd-cni"));
        assert_eq!(
            c.kubeconfig_path(),
            PathBuf::from("/host/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig")
        );
        assert_eq!(
            c.kubeconfig_host_path(),
            PathBuf::from("/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig")
        );
        assert_eq!(c.kubeconfig_mode, 0o600);
        assert_eq!(
            c.kube_ca_file,
            PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
        );
        assert_eq!(c.kubernetes_service_protocol, "https");
        assert!(!c.skip_tls_verify);
    }

    #[test]
    fn overrides_are_honoured() {
        let mut env = base();
        env.extend([
            ("DEST_CNI_NET_DIR", "/etc/kubernetes/cni/net.d"),
            ("DEST_CNI_BIN_DIR", "/var/lib/cni/bin"),
            ("CONTAINER_MOUNT_PREFIX", ""),
            ("CONTAINER_CNI_BIN_DIR", "/linkerd/bin"),
            ("KUBECONFIG_FILE_NAME", "linkerd-kubeconfig"),
            ("KUBECONFIG_MODE", "640"),
            ("SKIP_TLS_VERIFY", "true"),
            ("KUBERNETES_SERVICE_PROTOCOL", "http"),
            ("SERVICEACCOUNT_PATH", "/sa"),
        ]);
        let c = InstallerConfig::from_lookup(lookup(&env)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.net_dir(), PathBuf::from("/etc/kubernetes/cni/net.d"));
        assert_eq!(
            c.binary_path(),
            PathBuf::from("/var/lib/cni/bin/linkerd-cni")
        );
        assert_eq!(c.plugin_source, PathBuf::from("/linkerd/bin/linkerd-cni"));
        assert_eq!(
            c.kubeconfig_host_path(),
            PathBuf::from("/etc/kubernetes/cni/net.d/linkerd-kubeconfig")
        );
        assert_eq!(c.kubeconfig_mode, 0o640);
        assert_eq!(c.kube_ca_file, PathBuf::from("/sa/ca.crt"));
        assert!(c.skip_tls_verify);
        assert_eq!(c.kubernetes_service_protocol, "http");
    }

    #[test]
    fn bad_settings_are_named() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("KUBECONFIG_MODE", "rw")], "KUBECONFIG_MODE"),
            (&[("SKIP_TLS_VERIFY", "yes")], "SKIP_TLS_VERIFY"),
            (
                &[("KUBECONFIG_FILE_NAME", "x.conflist")],
                "KUBECONFIG_FILE_NAME",
            ),
            (&[("CNI_NETWORK_CONFIG", "{not json")], "template"),
            (&[("CNI_NETWORK_CONFIG", "[1]")], "template"),
            (&[("CNI_NETWORK_CONFIG", r#"{"name":"x"}"#)], "template"),
            (
                &[(
                    "CNI_NETWORK_CONFIG",
                    r#"{"type":"linkerd-cni","capabilities":3}"#,
                )],
                "capabilities",
            ),
            (
                &[("KUBERNETES_SERVICE_HOST", "")],
                "KUBERNETES_SERVICE_HOST",
            ),
        ];
        for (overrides, needle) in cases {
            let mut env: HashMap<&str, &str> = base().into_iter().collect();
            env.extend(overrides.iter().copied());
            let pairs: Vec<_> = env.into_iter().collect();
            let err = InstallerConfig::from_lookup(lookup(&pairs))
                .err()
                .unwrap_or_else(|| panic!("{overrides:?} accepted"));
            assert!(
                err.to_string().contains(needle),
                "{overrides:?}: error {err:?} does not mention {needle}"
            );
        }
    }

    #[test]
    fn no_template_at_all_is_an_error() {
        let env = [
            ("KUBERNETES_SERVICE_HOST", "h"),
            ("KUBERNETES_SERVICE_PORT", "1"),
        ];
        let err = InstallerConfig::from_lookup(lookup(&env)).err();
        assert!(
            matches!(err, Some(ConfigError::MissingTemplate)),
            "got {err:?}"
        );
    }

    #[test]
    fn template_file_wins_over_variable() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let file = dir.path().join("tpl.json");
        fs::write(&file, r#"{"type":"linkerd-cni","from":"file"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let file_str = file.to_string_lossy().into_owned();
        let mut env = base();
        env.push(("CNI_NETWORK_CONFIG_FILE", &file_str));
        let c = InstallerConfig::from_lookup(lookup(&env)).unwrap_or_else(|e| panic!("{e}"));
        let entry = c.plugin_entry().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(entry.get("from").and_then(Json::as_str), Some("file"));
    }

    #[test]
    fn plugin_entry_fills_path_and_capability() {
        let cases: &[(&str, &str)] = &[
            (
                TEMPLATE,
                r#"{"name":"linkerd-cni","type":"linkerd-cni","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},"capabilities":{"cgroupPath":true}}"#,
            ),
            (
                r#"{"type":"linkerd-cni","capabilities":{"portMappings":true}}"#,
                r#"{"type":"linkerd-cni","capabilities":{"portMappings":true,"cgroupPath":true}}"#,
            ),
            (
                r#"{"type":"linkerd-cni","capabilities":{"cgroupPath":false}}"#,
                r#"{"type":"linkerd-cni","capabilities":{"cgroupPath":false}}"#,
            ),
        ];
        for (template, want) in cases {
            let mut env = base();
            env[0] = ("CNI_NETWORK_CONFIG", template);
            let c = InstallerConfig::from_lookup(lookup(&env))
                .unwrap_or_else(|e| panic!("{template}: {e}"));
            let entry = c
                .plugin_entry()
                .unwrap_or_else(|e| panic!("{template}: {e}"));
            assert_eq!(entry.to_compact_string(), *want, "entry from {template}");
        }
    }
}
