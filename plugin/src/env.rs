//! The `CNI_*` environment variables: which verb, which container, which pod.

use linkerd_cni_proto::wire::PodRef;

use crate::{error::PluginError, version::Command};

/// Whether `CNI_CONTAINERID` and `CNI_IFNAME` are required.
const fn needs_attachment(command: Command) -> bool {
    matches!(command, Command::Add | Command::Del | Command::Check)
}

/// Whether a non-empty `CNI_NETNS` is required (not on DEL: the netns may be gone).
const fn needs_netns(command: Command) -> bool {
    matches!(command, Command::Add | Command::Check)
}

/// The Kubernetes keys of `CNI_ARGS`. Empty values count as absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub infra_container_id: Option<String>,
}

impl CniArgs {
    /// Parses `K=V;K=V`. Keys come in any order. A key this plugin does not know is an error
    /// unless `IgnoreUnknown` is true (`1`, `true`, `True`), wherever it appears in the list.
    pub fn parse(s: &str) -> Result<Self, PluginError> {
        let invalid = |reason: String| PluginError::InvalidEnv {
            var: "CNI_ARGS",
            reason,
        };
        let mut args = CniArgs::default();
        let mut ignore_unknown = false;
        let mut unknown = Vec::new();
        for item in s.split(';').filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(invalid(format!("{item:?} is not KEY=VALUE")));
            };
            let value = Some(value.to_string()).filter(|v| !v.is_empty());
            match key {
                "IgnoreUnknown" => {
                    ignore_unknown = match value.as_deref() {
                        Some("1" | "true" | "True") => true,
                        Some("0" | "false" | "False") | None => false,
                        Some(other) => {
                            return Err(invalid(format!(
                                "IgnoreUnknown={other:?} is not a boolean"
                            )));
                        }
                    }
                }
                "K8S_POD_NAMESPACE" => args.pod_namespace = value,
                "K8S_POD_NAME" => args.pod_name = value,
                "K8S_POD_UID" => args.pod_uid = value,
                "K8S_POD_INFRA_CONTAINER_ID" => args.infra_container_id = value,
                other => unknown.push(other.to_string()),
            }
        }
        if !ignore_unknown && let Some(key) = unknown.first() {
            return Err(invalid(format!(
                "unknown key {key:?} (and IgnoreUnknown is not set)"
            )));
        }
        Ok(args)
    }

    /// The pod, when both its namespace and name are known.
    pub fn pod(&self) -> Option<PodRef> {
        Some(PodRef {
            namespace: self.pod_namespace.clone()?,
            name: self.pod_name.clone()?,
            uid: self.pod_uid.clone(),
        })
    }
}

/// The invocation's environment, validated for its verb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    /// Empty for verbs that do not need it.
    pub container_id: String,
    /// May be empty on DEL, GC, STATUS.
    pub netns: String,
    /// Empty for verbs that do not need it.
    pub ifname: String,
    pub args: CniArgs,
    pub path: Option<String>,
}

/// Reads `CNI_COMMAND` alone (the verb decides what else is required).
pub fn command(get: &dyn Fn(&str) -> Option<String>) -> Result<Command, PluginError> {
    let raw = get("CNI_COMMAND").unwrap_or_default();
    if raw.is_empty() {
        return Err(PluginError::InvalidEnv {
            var: "CNI_COMMAND",
            reason: "not set".into(),
        });
    }
    Command::parse(&raw).ok_or_else(|| PluginError::InvalidEnv {
        var: "CNI_COMMAND",
        reason: format!(
            "unknown command {raw:?} (expected ADD, DEL, CHECK, VERSION, GC or STATUS)"
        ),
    })
}

impl Env {
    /// Reads and validates every variable `command` needs, through `get` (the process
    /// environment in production, a table in tests).
    pub fn load(
        command: Command,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, PluginError> {
        let get = |var: &str| get(var).filter(|v| !v.is_empty());
        let required = |var: &'static str, needed: bool| -> Result<String, PluginError> {
            match get(var) {
                Some(v) => Ok(v),
                None if needed => Err(PluginError::InvalidEnv {
                    var,
                    reason: "not set".into(),
                }),
                None => Ok(String::new()),
            }
        };
        let container_id = required("CNI_CONTAINERID", needs_attachment(command))?;
        if !container_id.is_empty() {
            validate_container_id(&container_id)?;
        }
        let netns = required("CNI_NETNS", needs_netns(command))?;
        let ifname = required("CNI_IFNAME", needs_attachment(command))?;
        if !ifname.is_empty() {
            validate_ifname(&ifname)?;
        }
        let args = CniArgs::parse(&get("CNI_ARGS").unwrap_or_default())?;
        let path = get("CNI_PATH");
        if command == Command::Gc && path.is_none() {
            return Err(PluginError::InvalidEnv {
                var: "CNI_PATH",
                reason: "not set (required for GC)".into(),
            });
        }
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

/// The spec's rule: starts with an alphanumeric, then alphanumerics, `_`, `.`, `-`.
fn validate_container_id(id: &str) -> Result<(), PluginError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err(PluginError::InvalidEnv {
            var: "CNI_CONTAINERID",
            reason: format!(
                "{id:?} must start with a letter or digit and hold only letters, digits, '_', '.', '-'"
            ),
        })
    }
}

/// The spec's rule (Linux interface names): at most 15 bytes, no `/`, `:` or whitespace,
/// not `.` or `..`.
fn validate_ifname(name: &str) -> Result<(), PluginError> {
    let bad = name.len() > 15
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    if bad {
        Err(PluginError::InvalidEnv {
            var: "CNI_IFNAME",
            reason: format!("{name:?} is not a valid interface name"),
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::error::cni_code;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn cni_args_in_any_order_with_ignore_unknown() {
        let want = CniArgs {
            pod_namespace: Some("ns".into()),
            pod_name: Some("web-0".into()),
            pod_uid: Some("u-1".into()),
            infra_container_id: Some("abc".into()),
        };
        let items = [
            "K8S_POD_NAMESPACE=ns",
            "K8S_POD_NAME=web-0",
            "K8S_POD_UID=u-1",
            "K8S_POD_INFRA_CONTAINER_ID=abc",
            "IgnoreUnknown=1",
            "SomethingElse=x",
        ];
        // Every rotation and its reverse: IgnoreUnknown before and after the unknown key.
        for shift in 0..items.len() {
            let mut v = items.to_vec();
            v.rotate_left(shift);
            assert_eq!(
                CniArgs::parse(&v.join(";")).expect("parses"),
                want,
                "order {v:?}"
            );
            v.reverse();
            assert_eq!(
                CniArgs::parse(&v.join(";")).expect("parses"),
                want,
                "order {v:?}"
            );
        }
    }

    #[test]
    fn cni_args_edge_cases() {
        let ok: &[(&str, Option<(&str, &str)>)] = &[
            ("", None),
            ("IgnoreUnknown=1", None),
            ("IgnoreUnknown=true;K8S_POD_NAME=p", None),
            ("IgnoreUnknown=1;K8S_POD_NAME=p", None),
            ("K8S_POD_NAME=p;K8S_POD_NAMESPACE=n;", Some(("n", "p"))),
            (";;K8S_POD_NAMESPACE=n;K8S_POD_NAME=p", Some(("n", "p"))),
            ("K8S_POD_NAMESPACE=;K8S_POD_NAME=p", None),
            (
                "IgnoreUnknown=True;X=1;K8S_POD_NAMESPACE=n;K8S_POD_NAME=p",
                Some(("n", "p")),
            ),
        ];
        for (s, pod) in ok {
            let args = CniArgs::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
            let got = args.pod().map(|p| (p.namespace, p.name));
            let want = pod.map(|(n, p)| (n.to_string(), p.to_string()));
            assert_eq!(got, want, "pod of {s:?}");
        }
        for bad in [
            "X=1",
            "IgnoreUnknown=0;X=1",
            "K8S_POD_NAME",
            "IgnoreUnknown=maybe",
        ] {
            let err = CniArgs::parse(bad).expect_err(bad);
            assert_eq!(cni_code(&err), 4, "{bad:?}: {err}");
            assert!(
                err.to_string().contains("CNI_ARGS"),
                "names the variable: {err}"
            );
        }
    }

    #[test]
    fn command_parsing() {
        for c in Command::ALL {
            assert_eq!(
                command(&lookup(&[("CNI_COMMAND", c.as_str())])).expect("parses"),
                c
            );
        }
        for bad in ["", "add", "FOO"] {
            let err = command(&lookup(&[("CNI_COMMAND", bad)])).expect_err(bad);
            assert!(
                matches!(
                    err,
                    PluginError::InvalidEnv {
                        var: "CNI_COMMAND",
                        ..
                    }
                ),
                "{err}"
            );
        }
        let err = command(&lookup(&[])).expect_err("unset");
        assert!(
            matches!(
                err,
                PluginError::InvalidEnv {
                    var: "CNI_COMMAND",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn required_variables_per_verb() {
        let full = [
            ("CNI_CONTAINERID", "abc"),
            ("CNI_NETNS", "/proc/self/ns/net"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        // (verb, variables whose absence is an error)
        let table: &[(Command, &[&str])] = &[
            (
                Command::Add,
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
            ),
            (
                Command::Check,
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
            ),
            (Command::Del, &["CNI_CONTAINERID", "CNI_IFNAME"]),
            (Command::Gc, &["CNI_PATH"]),
            (Command::Status, &[]),
        ];
        for (cmd, needed) in table {
            Env::load(*cmd, &lookup(&full))
                .unwrap_or_else(|e| panic!("{cmd} with everything: {e}"));
            for (var, _) in full {
                let rest: Vec<_> = full.iter().copied().filter(|(k, _)| *k != var).collect();
                let res = Env::load(*cmd, &lookup(&rest));
                if needed.contains(&var) {
                    match res {
                        Err(PluginError::InvalidEnv { var: v, .. }) => assert_eq!(v, var, "{cmd}"),
                        other => panic!("{cmd} without {var}: expected InvalidEnv, got {other:?}"),
                    }
                } else {
                    res.unwrap_or_else(|e| panic!("{cmd} without {var} must work: {e}"));
                }
            }
        }
    }

    #[test]
    fn malformed_ids_and_names() {
        let base = [
            ("CNI_NETNS", "/n"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ];
        for (var, value) in [
            ("CNI_CONTAINERID", "-abc"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_IFNAME", "a-very-long-interface"),
            ("CNI_IFNAME", "eth/0"),
            ("CNI_IFNAME", ".."),
            ("CNI_IFNAME", "eth 0"),
        ] {
            let mut vars = base.to_vec();
            vars.retain(|(k, _)| *k != var);
            vars.push((var, value));
            match Env::load(Command::Add, &lookup(&vars)) {
                Err(PluginError::InvalidEnv { var: v, .. }) => assert_eq!(v, var),
                other => panic!("{var}={value:?}: expected InvalidEnv, got {other:?}"),
            }
        }
    }
}
