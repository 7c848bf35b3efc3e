//! Test support for running the real `linkerd-cni` binary: a temporary directory, a fake node
//! agent speaking the proto frames on a Unix socket, and a runner that captures stdout,
//! stderr and the exit code.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the support module"
)]

use std::{
    io::Write,
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use linkerd_cni_proto::wire::{self, Envelope, Request, Response};
use serde_json::Value;

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "linkerd-cni-plugin-test-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How the fake agent behaves on each connection.
#[derive(Clone)]
pub enum Behaviour {
    /// Answers each request with this function's response.
    Answer(Arc<dyn Fn(&Request) -> Response + Send + Sync>),
    /// Reads the request, then says nothing for this long (the plugin must time out).
    Silent(Duration),
    /// Reads the request, then sends a frame that is not a response.
    Garbage,
}

impl Behaviour {
    pub fn answer(f: impl Fn(&Request) -> Response + Send + Sync + 'static) -> Self {
        Behaviour::Answer(Arc::new(f))
    }

    /// Answers like a healthy agent.
    pub fn healthy() -> Self {
        Self::answer(healthy)
    }
}

/// What a healthy agent answers.
pub fn healthy(req: &Request) -> Response {
    match req {
        Request::Add(_) => Response::Added {
            redirected: true,
            reason: "pod has linkerd-proxy".into(),
        },
        Request::Del(_) => Response::Deleted { existed: true },
        Request::Check(_) => Response::Checked { redirected: true },
        Request::Gc(_) => Response::Collected {
            removed: vec!["stale".into()],
        },
        Request::Status => Response::Status {
            programs_loaded: true,
            pods: 2,
        },
    }
}

/// A node agent stand-in on a temporary Unix socket that records every request it reads.
pub struct FakeAgent {
    dir: TempDir,
    socket: PathBuf,
    seen: Arc<Mutex<Vec<Envelope>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeAgent {
    pub fn start(behaviour: Behaviour) -> Self {
        let dir = TempDir::new();
        let socket = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&socket)
            .unwrap_or_else(|e| panic!("binding {}: {e}", socket.display()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (seen, behaviour) = (seen.clone(), behaviour.clone());
                    // One thread per connection so a silent answer does not block the next.
                    thread::spawn(move || serve(conn, &seen, &behaviour));
                }
            })
        };
        Self {
            dir,
            socket,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The socket path, for `linkerd.agent-socket`.
    pub fn socket(&self) -> &str {
        self.socket
            .to_str()
            .unwrap_or_else(|| panic!("non-UTF-8 temp path {}", self.socket.display()))
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Envelope> {
        self.seen
            .lock()
            .unwrap_or_else(|e| panic!("fake agent lock poisoned: {e}"))
            .clone()
    }
}

fn serve(mut conn: UnixStream, seen: &Mutex<Vec<Envelope>>, behaviour: &Behaviour) {
    let Ok(envelope) = wire::read_frame::<Envelope>(&mut conn) else {
        return;
    };
    let request = envelope.request.clone();
    seen.lock()
        .unwrap_or_else(|e| panic!("fake agent lock poisoned: {e}"))
        .push(envelope);
    match behaviour {
        Behaviour::Answer(f) => {
            let _ = wire::write_frame(&mut conn, &f(&request));
        }
        Behaviour::Silent(d) => thread::sleep(*d),
        Behaviour::Garbage => {
            let _ = wire::write_frame(&mut conn, &serde_json::json!({"result": "no_such_thing"}));
        }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one plugin run produced.
#[derive(Debug)]
pub struct PluginRun {
    pub stdout: String,
    pub stderr: String,
    pub exit: i32,
}

impl PluginRun {
    /// stdout as JSON; asserts it is exactly one JSON document and nothing else.
    pub fn json(&self) -> Value {
        assert_eq!(
            self.stdout.lines().count(),
            1,
            "stdout must be one JSON line: {:?}",
            self.stdout
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout))
    }

    /// The CNI error code; asserts the run failed with a complete error object.
    pub fn code(&self) -> u64 {
        assert_ne!(self.exit, 0, "expected a failure: {self:?}");
        let json = self.json();
        for key in ["cniVersion", "msg", "details"] {
            assert!(json[key].is_string(), "error object lacks {key}: {json}");
        }
        json["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {json}"))
    }

    pub fn msg(&self) -> String {
        self.json()["msg"].as_str().unwrap_or_default().to_string()
    }
}

/// Runs the real binary with exactly `env` (nothing inherited) and `stdin`.
pub fn run_plugin(env: &[(&str, String)], stdin: &[u8]) -> PluginRun {
    let mut child = Command::new(env!("CARGO_BIN_EXE_linkerd-cni"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning linkerd-cni: {e}"));
    let mut input = child
        .stdin
        .take()
        .unwrap_or_else(|| panic!("no stdin pipe"));
    let data = stdin.to_vec();
    // The plugin may stop reading early (oversized input): a broken pipe is expected then.
    let writer = thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for linkerd-cni: {e}"));
    let _ = writer.join();
    let run = PluginRun {
        stdout: String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("stdout not UTF-8: {e}")),
        stderr: String::from_utf8(out.stderr).unwrap_or_else(|e| panic!("stderr not UTF-8: {e}")),
        exit: out
            .status
            .code()
            .unwrap_or_else(|| panic!("killed by a signal: {:?}", out.status)),
    };
    for line in run.stderr.lines() {
        assert!(
            line.starts_with("linkerd-cni: "),
            "stderr line without prefix: {line:?}\n{run:?}"
        );
    }
    run
}
