//! The plugin as a runtime runs it: any environment and any stdin, with an agent and a
//! Kubernetes API that answer as the input says.
//!
//! Input: `KEY=VALUE` lines (the environment), a NUL byte, then stdin. Two variables steer
//! the fakes: `FUZZ_AGENT` is the agent's answer as wire JSON (an `error` answer is a
//! refusal, `down` an unreachable agent; absent: what a healthy agent says) and `FUZZ_API`
//! the Kubernetes API's (`meshed`, `unmeshed`, anything else an error).
//!
//! Properties: the plugin never panics; it exits 0 or 1; on 1 it prints one line holding a
//! CNI error object (`code`, `msg`), on 0 nothing or one line of JSON; every line it logs is
//! one `linkerd-cni: ` record with no control character in it (outside input cannot forge a
//! record). `CNI_NETNS` is only ever a path from a fixed list: the plugin opens it, and a
//! fuzzed path could name a device whose opening has effects.

#![no_main]

use std::{
    io::{self, Write},
    sync::{Arc, Mutex},
    time::Duration,
};

use libfuzzer_sys::fuzz_target;
use linkerd_cni_plugin::{
    agent::AgentClient,
    apiserver::{ApiError, PodLookup},
    cmd,
    error::AgentError,
    log::Logger,
};
use linkerd_cni_proto::wire::{Request, Response};

/// The netns paths the plugin may be given: a real network namespace, another kind of
/// namespace, a regular file, a directory and a missing path.
const NETNS_PATHS: [&str; 5] = [
    "/proc/self/ns/net",
    "/proc/self/ns/mnt",
    "/proc/self/stat",
    "/proc/self",
    "/nonexistent/netns",
];

struct Agent(Option<String>);

impl AgentClient for Agent {
    fn call(
        &self,
        socket: &str,
        _timeout: Duration,
        request: Request,
    ) -> Result<Response, AgentError> {
        let answer = match self.0.as_deref() {
            Some("down") => {
                return Err(AgentError::Unreachable {
                    socket: socket.into(),
                    source: io::Error::from(io::ErrorKind::ConnectionRefused),
                });
            }
            Some(json) => serde_json::from_str(json).map_err(|e| AgentError::Protocol {
                socket: socket.into(),
                detail: e.to_string(),
            })?,
            None => match request {
                Request::Add(_) => Response::Added {
                    redirected: true,
                    reason: "linkerd-proxy present".into(),
                },
                Request::Del(_) => Response::Deleted { existed: true },
                Request::Check(_) => Response::Checked { redirected: true },
                Request::Gc(_) => Response::Collected { removed: vec![] },
                Request::Status => Response::Status {
                    programs_loaded: true,
                    pods: 1,
                },
            },
        };
        match answer {
            Response::Error { kind, message } => Err(AgentError::Refused { kind, message }),
            answer => Ok(answer),
        }
    }
}

struct Api(Option<String>);

impl PodLookup for Api {
    fn is_meshed(
        &self,
        _kubeconfig: &str,
        _namespace: &str,
        _name: &str,
    ) -> Result<bool, ApiError> {
        match self.0.as_deref() {
            Some("meshed") => Ok(true),
            Some("unmeshed") => Ok(false),
            other => Err(ApiError::Request {
                url: "https://127.0.0.1:6443/api/v1/namespaces/ns/pods/p".into(),
                reason: format!("{other:?}"),
            }),
        }
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let (env_part, mut stdin) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let env_text = String::from_utf8_lossy(env_part);
    let mut env: Vec<(String, String)> = env_text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in &mut env {
        if k == "CNI_NETNS" && !v.is_empty() && !NETNS_PATHS.contains(&v.as_str()) {
            let pick = v
                .bytes()
                .fold(0usize, |a, b| a.wrapping_add(usize::from(b)));
            *v = NETNS_PATHS[pick % NETNS_PATHS.len()].to_string();
        }
    }
    let lookup = |key: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let agent = Agent(lookup("FUZZ_AGENT"));
    let api = Api(lookup("FUZZ_API"));
    let captured = Captured::default();
    let mut log = Logger::new(Box::new(captured.clone()));
    let outcome = cmd::run(&lookup, &mut stdin, &agent, &api, &mut log);

    match outcome.exit_code {
        0 => {
            if !outcome.stdout.is_empty() {
                let line = outcome.stdout.strip_suffix('\n').expect("one line");
                assert!(!line.contains('\n'), "one line: {:?}", outcome.stdout);
                serde_json::from_str::<serde_json::Value>(line).expect("a JSON result");
            }
        }
        1 => {
            let line = outcome.stdout.strip_suffix('\n').expect("one line");
            assert!(!line.contains('\n'), "one line: {:?}", outcome.stdout);
            let body: serde_json::Value = serde_json::from_str(line).expect("a JSON error");
            assert!(body["code"].is_u64(), "an error code: {line}");
            assert!(body["msg"].is_string(), "an error message: {line}");
        }
        code => panic!("exit code {code}"),
    }
    let logged = captured.0.lock().expect("log buffer").clone();
    let logged = String::from_utf8(logged).expect("the log is UTF-8");
    for line in logged.lines() {
        assert!(
            line.starts_with("linkerd-cni: "),
            "a forged record: {line:?}"
        );
        assert!(
            !line.chars().any(|c| c.is_control()),
            "a control character in a record: {line:?}"
        );
    }
    assert!(logged.is_empty() || logged.ends_with('\n'));
});
