//! Test support: running the built `linkerd` binary, parsing its YAML into objects, the Go
//! reference renderer of the chart, `kubernetes-validate`, and a fake Kubernetes API server.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the support module"
)]

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

/// The `linkerd.io/created-by` annotations of the DaemonSet and its pod template.
pub const CREATED_BY: [&str; 2] = [
    "/metadata/annotations/linkerd.io~1created-by",
    "/spec/template/metadata/annotations/linkerd.io~1created-by",
];

/// Replaces the DaemonSet's `linkerd.io/created-by` annotations with a placeholder where they
/// say who rendered it (`linkerd/cli <version>` from the CLI, `linkerd/helm <image version>`
/// from Helm's default), so renders by different tools compare equal; a `cliVersion` the
/// values set is the same in both and stays.
pub fn normalize_created_by(objs: &mut std::collections::BTreeMap<String, Json>) {
    let cli = linkerd_cli::install_cni::created_by();
    for obj in objs.values_mut().filter(|o| o["kind"] == "DaemonSet") {
        for path in CREATED_BY {
            if let Some(v) = obj.pointer_mut(path)
                && (v.as_str() == Some(cli.as_str())
                    || v.as_str().is_some_and(|s| s.starts_with("linkerd/helm ")))
            {
                *v = Json::String("<created-by>".into());
            }
        }
    }
}

/// `helm template linkerd2-cni <chart> -n <namespace> <args>...` (`-f`, `--set`,
/// `--set-string`, as given); panics unless it succeeds.
pub fn helm_template_args(namespace: &str, args: &[String]) -> String {
    let chart = chart_dir().display().to_string();
    let mut all = vec!["template", "linkerd2-cni", &chart, "-n", namespace];
    all.extend(args.iter().map(String::as_str));
    let out = helm(&all);
    assert!(
        out.status.success(),
        "helm {all:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The API server's validation of a pod spec that a schema cannot express (Kubernetes'
/// `ValidatePodSpec`): volume names unique; container names unique across init containers and
/// containers; in each container, every mount names a volume, no two mounts share a
/// `mountPath`, and Bidirectional propagation only in a privileged container;
/// `allowPrivilegeEscalation: false` neither with `privileged: true` nor with `CAP_SYS_ADMIN`
/// added (the API compares the name as written: `SYS_ADMIN` passes). The violations, empty
/// when it would be admitted.
pub fn pod_spec_violations(spec: &Json) -> Vec<String> {
    let mut out = Vec::new();
    let list = |v: &Json, key: &str| v[key].as_array().cloned().unwrap_or_default();
    let mut volumes = std::collections::BTreeSet::new();
    for v in list(spec, "volumes") {
        let name = v["name"].as_str().unwrap_or("").to_string();
        if !volumes.insert(name.clone()) {
            out.push(format!("spec.volumes: duplicate name {name:?}"));
        }
    }
    let mut containers = std::collections::BTreeSet::new();
    for (kind, c) in list(spec, "initContainers")
        .into_iter()
        .map(|c| ("initContainers", c))
        .chain(
            list(spec, "containers")
                .into_iter()
                .map(|c| ("containers", c)),
        )
    {
        let cname = c["name"].as_str().unwrap_or("").to_string();
        if !containers.insert(cname.clone()) {
            out.push(format!("spec.{kind}: duplicate container name {cname:?}"));
        }
        if c.pointer("/securityContext/allowPrivilegeEscalation") == Some(&Json::Bool(false)) {
            if c.pointer("/securityContext/privileged") == Some(&Json::Bool(true)) {
                out.push(format!(
                    "{cname}: cannot set allowPrivilegeEscalation to false and privileged to true"
                ));
            }
            let added = c
                .pointer("/securityContext/capabilities/add")
                .and_then(Json::as_array)
                .cloned()
                .unwrap_or_default();
            if added.iter().any(|cap| cap == "CAP_SYS_ADMIN") {
                out.push(format!(
                    "{cname}: cannot set allowPrivilegeEscalation to false and capabilities.add \
                     CAP_SYS_ADMIN"
                ));
            }
        }
        let mut paths = std::collections::BTreeSet::new();
        for m in list(&c, "volumeMounts") {
            let (name, path) = (
                m["name"].as_str().unwrap_or(""),
                m["mountPath"].as_str().unwrap_or(""),
            );
            if !volumes.contains(name) {
                out.push(format!("{cname}: volumeMounts {name:?}: not found"));
            }
            if !paths.insert(path.to_string()) {
                out.push(format!(
                    "{cname}: volumeMounts mountPath {path:?}: must be unique"
                ));
            }
            if m["mountPropagation"] == "Bidirectional"
                && c.pointer("/securityContext/privileged") != Some(&Json::Bool(true))
            {
                out.push(format!(
                    "{cname}: Bidirectional mount propagation is available only to privileged containers"
                ));
            }
        }
    }
    out
}

/// Panics unless `obj`, when it is a DaemonSet, has a pod template the API server admits
/// ([`pod_spec_violations`]).
pub fn assert_pod_spec_admissible(what: &str, obj: &Json) {
    if obj["kind"] != "DaemonSet" {
        return;
    }
    let spec = obj
        .pointer("/spec/template/spec")
        .unwrap_or_else(|| panic!("{what}: no pod template"));
    let violations = pod_spec_violations(spec);
    assert!(
        violations.is_empty(),
        "{what}: the API server would refuse the DaemonSet: {violations:#?}"
    );
}

/// A small HTTP/1.1 server on 127.0.0.1 serving fixed bodies by path (404 elsewhere, a 302 for
/// paths mapped with [`LocalHttp::redirect`]); serves one request per connection. Stops on
/// drop.
pub struct LocalHttp {
    pub addr: std::net::SocketAddr,
    /// Each request's head (request line and headers), oldest first.
    pub heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LocalHttp {
    /// Serves `routes` (path -> (status line, extra header, body)).
    pub fn start(routes: Vec<(&str, &str, &str, &str)>) -> Self {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1");
        let addr = listener.local_addr().expect("local address");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let routes: Vec<(String, String, String, String)> = routes
            .into_iter()
            .map(|(p, s, h, b)| (p.into(), s.into(), h.into(), b.into()))
            .collect();
        let stopping = stop.clone();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = heads.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).is_err() {
                    continue;
                }
                let mut head = request_line.clone();
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line == "\r\n" => break,
                        Ok(_) => head.push_str(&line),
                    }
                }
                if let Ok(mut heads) = recorded.lock() {
                    heads.push(head);
                }
                let path = request_line.split_whitespace().nth(1).unwrap_or("");
                let (status, header, body) = routes
                    .iter()
                    .find(|(p, ..)| p == path)
                    .map(|(_, s, h, b)| (s.as_str(), h.as_str(), b.as_str()))
                    .unwrap_or(("404 Not Found", "", "no such file\n"));
                let header = if header.is_empty() {
                    String::new()
                } else {
                    format!("{header}\r\n")
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                     Connection: close\r\n{header}\r\n{body}",
                    body.len()
                );
            }
        });
        Self {
            addr,
            heads,
            stop,
            thread: Some(thread),
        }
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for LocalHttp {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = std::net::TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
