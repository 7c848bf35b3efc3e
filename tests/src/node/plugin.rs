//! Direct plugin invocations: the plugin binary run with an exact environment and stdin, no
//! libcni in between.

use std::{
    io::Write,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use serde_json::Value;

use super::{PLUGIN_BIN, workspace_bin};
use crate::{child::ChildGuard, error::Result, netns::NetnsGuard};

/// What one direct run of the plugin printed and how it ended.
#[derive(Clone, Debug)]
pub struct PluginOutcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl PluginOutcome {
    /// stdout as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(self.stdout.trim()).ok()
    }

    /// The CNI error code, when the plugin failed with a CNI error object.
    pub fn code(&self) -> Option<u64> {
        if self.status.success() {
            return None;
        }
        self.json()?.get("code")?.as_u64()
    }

    /// The error message, when the plugin failed.
    pub fn msg(&self) -> String {
        self.json()
            .and_then(|v| {
                let msg = v.get("msg")?.as_str()?.to_string();
                let details = v.get("details").and_then(Value::as_str).unwrap_or("");
                Some(format!("{msg}: {details}"))
            })
            .unwrap_or_default()
    }
}

/// Runs the plugin binary with exactly `env` (nothing inherited) and `stdin`, in `netns`.
pub fn run_plugin(
    netns: Option<&NetnsGuard>,
    env: &[(String, String)],
    stdin: &[u8],
    timeout: Duration,
) -> Result<PluginOutcome> {
    let bin = workspace_bin(PLUGIN_BIN)?;
    let mut cmd = match netns {
        Some(ns) => ns.command(&bin)?,
        None => std::process::Command::new(&bin),
    };
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(&mut cmd)?;
    if let Some(mut pipe) = child.child_mut().stdin.take() {
        let data = stdin.to_vec();
        // The plugin may stop reading early (oversized input): a broken pipe is expected then.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    }
    let out = child.wait_output(timeout)?;
    Ok(PluginOutcome {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
