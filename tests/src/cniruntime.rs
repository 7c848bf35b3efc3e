//! A real CNI runtime for the end-to-end tests and the demo: `linkerd-cni-runtime`, a small Go
//! program (`tests/cniruntime/main.go`) that runs a conflist through libcni's
//! `AddNetworkList` / `CheckNetworkList` / `DelNetworkList`, as container runtimes do (result
//! cache, `prevResult`, capability arguments, DEL in reverse order).
//!
//! It is built offline in GOPATH mode against the libcni sources of Debian's
//! `golang-github-appc-cni-dev` (under [`GOCODE`]), once per source version, and cached next to
//! this crate's binaries in the target directory. libcni 1.1.2 has no GC or STATUS: those verbs
//! are tested by invoking the plugin directly.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    time::Duration,
};

use serde::Deserialize;
use serde_json::Value;

use crate::{
    child::ChildGuard,
    client::fnv1a64,
    error::{Error, IoContext, Result},
    names::{self, TempDir},
    netns::NetnsGuard,
};

/// The runtime's Go source, embedded so the tool can be built wherever the tests run.
pub const SOURCE: &str = include_str!("../cniruntime/main.go");
/// Where Debian's Go packages keep their sources (GOPATH layout).
pub const GOCODE: &str = "/usr/share/gocode";
/// The libcni package the runtime imports.
pub const LIBCNI: &str = "github.com/containernetworking/cni/libcni";
/// Name of the tool's package (and binary).
pub const TOOL: &str = "linkerd-cni-runtime";
/// Where Debian's `containernetworking-plugins` installs bridge, host-local, loopback, ...
pub const SYSTEM_PLUGIN_DIR: &str = "/usr/lib/cni";

/// The directory of this crate's binaries (`target/<profile>`), where the tool is cached.
fn cache_root() -> Result<PathBuf> {
    let exe = std::env::current_exe().ctx(|| "locating the running executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| Error::Missing(format!("{} has no parent directory", exe.display())))?;
    let dir = match dir.parent() {
        Some(up) if dir.ends_with("deps") => up,
        _ => dir,
    };
    Ok(dir.join("cniruntime"))
}

/// A runtime built elsewhere, used as is: `cargo xtask vmtest --arch` builds it for a guest of
/// another architecture with Go's cross compiler (the guest has no Go).
pub const PREBUILT_ENV: &str = "LINKERD_CNI_TEST_CNI_RUNTIME";

/// The runtime binary: `$LINKERD_CNI_TEST_CNI_RUNTIME`, else built on first use (per version
/// of [`SOURCE`]) and cached.
pub fn tool() -> Result<PathBuf> {
    if let Some(prebuilt) = std::env::var_os(PREBUILT_ENV) {
        return Ok(PathBuf::from(prebuilt));
    }
    let root = cache_root()?;
    let out = root.join(format!("{TOOL}-{}", fnv1a64(SOURCE.as_bytes())));
    if out.is_file() {
        return Ok(out);
    }
    build(&root, &out)?;
    Ok(out)
}

/// Builds the tool into `out` (atomically: concurrent builders each rename a complete binary).
fn build(root: &Path, out: &Path) -> Result<()> {
    if !Path::new(GOCODE).join("src").join(LIBCNI).is_dir() {
        return Err(Error::Missing(format!(
            "libcni sources not found under {GOCODE}/src/{LIBCNI}: install golang-go and \
             golang-github-appc-cni-dev (`cargo xtask setup`)"
        )));
    }
    fs::create_dir_all(root).ctx(|| format!("creating {}", root.display()))?;
    let gopath = TempDir::new()?;
    let pkg = gopath.path().join("src").join(TOOL);
    fs::create_dir_all(&pkg).ctx(|| format!("creating {}", pkg.display()))?;
    fs::write(pkg.join("main.go"), SOURCE).ctx(|| "writing main.go")?;
    let tmp = root.join(format!(".{TOOL}-{}.tmp", names::unique_name()));
    let result = names::run(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&tmp)
            .arg(TOOL)
            .current_dir(gopath.path())
            .env("GO111MODULE", "off")
            .env("GOPATH", format!("{}:{GOCODE}", gopath.path().display()))
            .env("GOCACHE", root.join("gocache"))
            .env("GOFLAGS", ""),
    );
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(match e {
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Error::Missing("`go` not found: install golang-go (`cargo xtask setup`)".into())
            }
            e => e,
        });
    }
    fs::rename(&tmp, out).ctx(|| format!("installing {}", out.display()))
}

/// A CNI verb libcni runs over a whole conflist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// `AddNetworkList`.
    Add,
    /// `CheckNetworkList`.
    Check,
    /// `DelNetworkList`.
    Del,
}

impl Verb {
    /// The tool's argument.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Add => "add",
            Verb::Check => "check",
            Verb::Del => "del",
        }
    }
}

/// One attachment, as a runtime describes it to libcni.
#[derive(Clone, Debug)]
pub struct Invocation {
    /// The conflist file.
    pub conflist: PathBuf,
    /// Plugin directories (`CNI_PATH`).
    pub plugin_dirs: Vec<PathBuf>,
    /// libcni's result cache.
    pub cache_dir: PathBuf,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`; `None` sends an empty one (containerd's second DEL).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS` pairs (the tool shuffles them on every call).
    pub args: Vec<(String, String)>,
    /// The `cgroupPath` capability argument.
    pub cgroup_path: Option<String>,
}

impl Invocation {
    fn to_args(&self, verb: Verb) -> Vec<String> {
        let dirs: Vec<String> = self
            .plugin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let mut args = vec![
            "-conflist".to_string(),
            self.conflist.display().to_string(),
            "-path".into(),
            dirs.join(":"),
            "-cache-dir".into(),
            self.cache_dir.display().to_string(),
            "-container-id".into(),
            self.container_id.clone(),
            "-netns".into(),
            self.netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            "-ifname".into(),
            self.ifname.clone(),
        ];
        for (k, v) in &self.args {
            args.extend(["-arg".to_string(), format!("{k}={v}")]);
        }
        if let Some(cg) = &self.cgroup_path {
            args.extend(["-cgroup-path".to_string(), cg.clone()]);
        }
        args.push(verb.as_str().into());
        args
    }
}

/// A CNI error as the runtime reports it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct CniError {
    /// The CNI error code (999: the failure was not a plugin's).
    pub code: u32,
    /// The plugin's message.
    pub msg: String,
    /// The plugin's details.
    #[serde(default)]
    pub details: String,
    /// libcni's account of where it failed.
    #[serde(default)]
    pub context: String,
}

/// What one runtime call printed and how it ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The verb.
    pub verb: Verb,
    /// Exit status of the runtime.
    pub status: ExitStatus,
    /// Its stdout (the result, or the error object).
    pub stdout: String,
    /// Its stderr (the plugins' logs).
    pub stderr: String,
}

impl Outcome {
    /// The call succeeded.
    pub fn ok(&self) -> bool {
        self.status.success()
    }

    /// The error, when the call failed.
    pub fn error(&self) -> Option<CniError> {
        if self.ok() {
            return None;
        }
        serde_json::from_str(self.stdout.trim()).ok()
    }

    /// The ADD result, when the call succeeded and printed one.
    pub fn result(&self) -> Option<Value> {
        if !self.ok() {
            return None;
        }
        serde_json::from_str(self.stdout.trim()).ok()
    }

    /// Fails with everything the runtime said unless the call succeeded.
    pub fn expect_ok(self) -> Result<Self> {
        if self.ok() {
            Ok(self)
        } else {
            Err(Error::Missing(format!(
                "CNI {} failed ({}): {}\nplugin logs:\n{}",
                self.verb.as_str(),
                self.status,
                self.stdout.trim(),
                self.stderr.trim()
            )))
        }
    }
}

/// Runs `verb` for `inv` through libcni, inside `netns` when given (the node's network
/// namespace: the bridge plugin then builds the node side there), waiting up to `timeout`.
pub fn run(
    netns: Option<&NetnsGuard>,
    verb: Verb,
    inv: &Invocation,
    timeout: Duration,
) -> Result<Outcome> {
    let tool = tool()?;
    let mut cmd = match netns {
        Some(ns) => ns.command(&tool)?,
        None => Command::new(&tool),
    };
    cmd.args(inv.to_args(verb))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = ChildGuard::spawn(&mut cmd)?.wait_output(timeout)?;
    Ok(Outcome {
        verb,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_becomes_the_tools_command_line() {
        let mut inv = Invocation {
            conflist: "/c/net.conflist".into(),
            plugin_dirs: vec!["/usr/lib/cni".into(), "/b".into()],
            cache_dir: "/cache".into(),
            container_id: "abc".into(),
            netns: Some("/run/netns/x".into()),
            ifname: "eth0".into(),
            args: vec![("K8S_POD_NAME".into(), "p".into())],
            cgroup_path: Some("/pod".into()),
        };
        let args = inv.to_args(Verb::Add);
        assert_eq!(
            args.join(" "),
            "-conflist /c/net.conflist -path /usr/lib/cni:/b -cache-dir /cache -container-id abc \
             -netns /run/netns/x -ifname eth0 -arg K8S_POD_NAME=p -cgroup-path /pod add"
        );
        inv.netns = None;
        inv.cgroup_path = None;
        let args = inv.to_args(Verb::Del);
        let netns_at = args.iter().position(|a| a == "-netns").expect("-netns");
        assert_eq!(
            args[netns_at + 1],
            "",
            "an empty CNI_NETNS, as containerd's second DEL"
        );
        assert_eq!(args.last().map(String::as_str), Some("del"));
        assert!(!args.contains(&"-cgroup-path".to_string()), "{args:?}");
    }
}
