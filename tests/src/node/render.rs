//! The install manifests as an operator gets them: `linkerd install-cni --mode=ebpf` (the
//! workspace's `linkerd` CLI) or `helm template` of the chart in this checkout (real Helm),
//! each with a values file, parsed into objects.

use std::{
    fmt, fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use super::workspace_bin;
use crate::{
    error::{Error, IoContext, Result},
    names,
};

/// The namespace both renderers install into (`linkerd install-cni`'s, and `-n` for Helm).
pub const NAMESPACE: &str = "linkerd-cni";
/// The Helm release name.
const RELEASE: &str = "linkerd-cni";
/// Where `cargo xtask setup` installs Helm.
pub const HELM: &str = "/usr/local/bin/helm";

/// Who renders the manifests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renderer {
    /// `linkerd install-cni --mode=ebpf -f <values>`.
    Cli,
    /// `helm template linkerd-cni deploy/charts/linkerd2-cni -n linkerd-cni --set mode=ebpf
    /// -f <values>` (the chart's default mode is `auto`; the CLI's line names `ebpf`, so the
    /// two render the same DaemonSet).
    Helm,
}

impl fmt::Display for Renderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Renderer::Cli => "linkerd install-cni --mode=ebpf",
            Renderer::Helm => "helm template --set mode=ebpf",
        })
    }
}

/// The chart in this checkout.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/charts/linkerd2-cni")
}

/// Renders with `renderer` and `values` (YAML written to `work/values.yaml`); returns every
/// object, in the order rendered.
pub fn render(renderer: Renderer, values: &str, work: &Path) -> Result<Vec<Value>> {
    fs::create_dir_all(work).ctx(|| format!("creating {}", work.display()))?;
    let values_file = work.join("values.yaml");
    fs::write(&values_file, values).ctx(|| "writing the values file")?;
    let yaml = match renderer {
        Renderer::Cli => names::run(
            Command::new(workspace_bin("linkerd")?)
                .args(["install-cni", "--mode=ebpf", "-f"])
                .arg(&values_file)
                // No cluster: the CLI must not read one.
                .env("KUBECONFIG", work.join("no-kubeconfig")),
        )?,
        Renderer::Helm => {
            if !Path::new(HELM).is_file() {
                return Err(Error::Missing(format!(
                    "{HELM} not found: `cargo xtask setup` installs Helm"
                )));
            }
            names::run(
                Command::new(HELM)
                    .args(["template", RELEASE])
                    .arg(chart_dir())
                    .args(["--namespace", NAMESPACE, "--set", "mode=ebpf", "-f"])
                    .arg(&values_file)
                    .env("HELM_CACHE_HOME", work.join("helm/cache"))
                    .env("HELM_CONFIG_HOME", work.join("helm/config"))
                    .env("HELM_DATA_HOME", work.join("helm/data")),
            )?
        }
    };
    let out = work.join(match renderer {
        Renderer::Cli => "install-cni.yaml",
        Renderer::Helm => "helm-template.yaml",
    });
    fs::write(&out, &yaml).ctx(|| format!("writing {}", out.display()))?;
    linkerd_cni_fake_apiserver::read_manifest(&out).map_err(|e| Error::Parse {
        what: format!("the output of {renderer}"),
        detail: e.to_string(),
    })
}

/// The one object of `kind` named `name` among `objects`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o.pointer("/metadata/name") == Some(&Value::from(name)))
        .ok_or_else(|| Error::Missing(format!("no {kind} {name} in the rendered manifests")))
}
