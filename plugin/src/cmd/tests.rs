//! Unit tests of the CNI verbs: every verb in every spec version against a mock agent and a
//! mock Kubernetes API.

use std::{cell::RefCell, collections::HashMap, io};

use linkerd_cni_proto::wire::ErrorKind;

use super::*;
use crate::{apiserver::ApiError, log::tests::Captured};

type Answer = dyn Fn(&Request) -> Result<Response, AgentError>;

/// A table row: name, environment, stdin, expected code, text the message must hold.
type Case<'a> = (&'a str, Vec<(&'static str, String)>, &'a [u8], u64, &'a str);

/// An agent that records requests and answers from a function.
struct MockAgent {
    seen: RefCell<Vec<(String, Request)>>,
    answer: Box<Answer>,
}

impl MockAgent {
    /// Answers every request with what a healthy agent says.
    fn healthy() -> Self {
        Self::with(|req| Ok(natural_answer(req)))
    }

    fn with(answer: impl Fn(&Request) -> Result<Response, AgentError> + 'static) -> Self {
        Self {
            seen: RefCell::new(Vec::new()),
            answer: Box::new(answer),
        }
    }

    fn requests(&self) -> Vec<Request> {
        self.seen.borrow().iter().map(|(_, r)| r.clone()).collect()
    }
}

impl AgentClient for MockAgent {
    fn call(
        &self,
        socket: &str,
        _timeout: Duration,
        request: Request,
    ) -> Result<Response, AgentError> {
        let answer = (self.answer)(&request);
        self.seen.borrow_mut().push((socket.to_string(), request));
        answer
    }
}

fn natural_answer(req: &Request) -> Response {
    match req {
        Request::Add(_) => Response::Added {
            redirected: true,
            reason: "has linkerd-proxy".into(),
        },
        Request::Del(_) => Response::Deleted { existed: true },
        Request::Check(_) => Response::Checked { redirected: true },
        Request::Gc(_) => Response::Collected {
            removed: vec!["gone".into()],
        },
        Request::Status => Response::Status {
            programs_loaded: true,
            pods: 1,
        },
    }
}

struct Run {
    outcome: Outcome,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.outcome.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.outcome.stdout))
    }
    fn code(&self) -> u64 {
        assert_ne!(
            self.outcome.exit_code, 0,
            "expected failure, stderr: {}",
            self.stderr
        );
        self.json()["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {}", self.outcome.stdout))
    }
}

fn base_env(cmd: Command) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", cmd.as_str().into()),
        ("CNI_CONTAINERID", "c0ffee".into()),
        ("CNI_NETNS", "/proc/self/ns/net".into()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_PATH", "/opt/cni/bin".into()),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=shop;K8S_POD_UID=u1".into(),
        ),
    ]
}

fn bridge_prev(version: SpecVersion) -> Value {
    let v4 = version.ip_version_field();
    let mut ip = json!({"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 1});
    if v4 {
        ip["version"] = json!("4");
    }
    json!({
        "cniVersion": version.as_str(),
        "interfaces": [{"name": "veth1"}, {"name": "eth0", "sandbox": "/proc/self/ns/net"}],
        "ips": [ip],
        "dns": {}
    })
}

fn base_conf(version: SpecVersion) -> Value {
    json!({
        "cniVersion": version.as_str(),
        "name": "k8s-pod-network",
        "type": "linkerd-cni",
        "log_level": "debug",
        "linkerd": {"agent-socket": "/test/agent.sock", "agent-timeout-ms": 1000},
        "runtimeConfig": {"cgroupPath": "/kubepods/pod-u1"},
        "prevResult": bridge_prev(version),
        "cni.dev/valid-attachments": [{"containerID": "c0ffee", "ifname": "eth0"}]
    })
}

/// A Kubernetes API that answers from a function and counts lookups.
struct MockApi {
    seen: RefCell<Vec<(String, String, String)>>,
    answer: fn(&str) -> Result<bool, ApiError>,
}

impl MockApi {
    fn with(answer: fn(&str) -> Result<bool, ApiError>) -> Self {
        Self {
            seen: RefCell::new(Vec::new()),
            answer,
        }
    }
}

impl PodLookup for MockApi {
    fn is_meshed(&self, kubeconfig: &str, ns: &str, name: &str) -> Result<bool, ApiError> {
        self.seen
            .borrow_mut()
            .push((kubeconfig.into(), ns.into(), name.into()));
        (self.answer)(name)
    }
}

fn run_with(env: &[(&'static str, String)], stdin: &[u8], agent: &MockAgent) -> Run {
    let api = MockApi::with(|_| {
        Err(ApiError::Request {
            url: "u".into(),
            reason: "no API in this test".into(),
        })
    });
    run_with_api(env, stdin, agent, &api)
}

fn run_with_api(
    env: &[(&'static str, String)],
    stdin: &[u8],
    agent: &MockAgent,
    api: &MockApi,
) -> Run {
    let map: HashMap<&str, String> = env.iter().cloned().collect();
    let get = |k: &str| map.get(k).cloned();
    let sink = Captured::default();
    let mut log = Logger::new(Box::new(sink.clone()));
    let outcome = run(&get, &mut &stdin[..], agent, api, &mut log);
    let stderr = sink.text();
    for line in stderr.lines() {
        assert!(
            line.starts_with("linkerd-cni: "),
            "unprefixed log line {line:?}"
        );
    }
    Run { outcome, stderr }
}

fn run_conf(cmd: Command, conf: &Value, agent: &MockAgent) -> Run {
    run_with(&base_env(cmd), conf.to_string().as_bytes(), agent)
}

#[test]
fn every_verb_in_every_version() {
    for cmd in Command::ALL {
        for version in SpecVersion::ALL {
            let agent = MockAgent::healthy();
            let r = run_conf(cmd, &base_conf(version), &agent);
            let what = format!("{cmd} @ {version}");
            if version < cmd.since() {
                assert_eq!(r.code(), 1, "{what}: {}", r.outcome.stdout);
                assert_eq!(r.json()["cniVersion"], version.as_str(), "{what}");
                assert!(
                    agent.requests().is_empty(),
                    "{what}: agent must not be asked"
                );
                continue;
            }
            assert_eq!(
                r.outcome.exit_code, 0,
                "{what}: {} / {}",
                r.outcome.stdout, r.stderr
            );
            let requests = agent.requests();
            match cmd {
                Command::Add => {
                    assert_eq!(
                        r.json(),
                        bridge_prev(version),
                        "{what}: prevResult passed through"
                    );
                    assert!(
                        matches!(requests.as_slice(), [Request::Add(_)]),
                        "{what}: {requests:?}"
                    );
                }
                Command::Version => {
                    assert_eq!(
                        r.json(),
                        version_info(Some(base_conf(version).to_string().as_bytes()))
                    );
                    assert_eq!(r.json()["cniVersion"], version.as_str(), "{what}");
                    assert!(requests.is_empty(), "{what}");
                }
                Command::Del => assert!(
                    matches!(requests.as_slice(), [Request::Del(_)]),
                    "{what}: {requests:?}"
                ),
                Command::Check => assert!(
                    matches!(requests.as_slice(), [Request::Check(_)]),
                    "{what}: {requests:?}"
                ),
                Command::Gc => assert!(
                    matches!(requests.as_slice(), [Request::Gc(_)]),
                    "{what}: {requests:?}"
                ),
                Command::Status => assert!(
                    matches!(requests.as_slice(), [Request::Status]),
                    "{what}: {requests:?}"
                ),
            }
            if cmd != Command::Add && cmd != Command::Version {
                assert_eq!(r.outcome.stdout, "", "{what}: prints nothing on success");
            }
        }
    }
}

#[test]
fn add_sends_the_pod_and_converts_the_result() {
    let agent = MockAgent::healthy();
    let mut conf = base_conf(SpecVersion::V1_0_0);
    conf["prevResult"] = bridge_prev(SpecVersion::V0_4_0);
    conf["linkerd"]["proxy-uid"] = json!(7);
    let r = run_conf(Command::Add, &conf, &agent);
    assert_eq!(r.outcome.exit_code, 0, "{}", r.stderr);
    assert_eq!(
        r.json(),
        bridge_prev(SpecVersion::V1_0_0),
        "0.4.0 prevResult printed as 1.0.0"
    );
    let seen = agent.seen.borrow();
    let [(socket, Request::Add(add))] = seen.as_slice() else {
        panic!("one Add expected: {seen:?}")
    };
    assert_eq!(socket, "/test/agent.sock");
    assert_eq!(add.attachment.container_id, "c0ffee");
    assert_eq!(add.attachment.ifname, "eth0");
    assert_eq!(add.attachment.netns, "/proc/self/ns/net");
    assert_eq!(
        (add.pod.namespace.as_str(), add.pod.name.as_str()),
        ("shop", "web-0")
    );
    assert_eq!(add.pod.uid.as_deref(), Some("u1"));
    assert_eq!(add.cgroup_path.as_deref(), Some("/kubepods/pod-u1"));
    assert_eq!(
        add.pod_ips,
        ["10.22.0.5".parse::<std::net::IpAddr>().expect("ip")]
    );
    assert_eq!(add.config.proxy_uid(), Some(7));
    assert!(
        r.stderr
            .contains("container=c0ffee namespace=shop pod=web-0"),
        "{}",
        r.stderr
    );
}

#[test]
fn add_without_prev_result_prints_a_minimal_result() {
    for version in SpecVersion::ALL {
        let agent = MockAgent::healthy();
        let mut conf = base_conf(version);
        conf.as_object_mut().expect("object").remove("prevResult");
        let r = run_conf(Command::Add, &conf, &agent);
        assert_eq!(r.outcome.exit_code, 0, "{version}: {}", r.stderr);
        assert_eq!(
            r.json(),
            json!({"cniVersion": version.as_str()}),
            "{version}"
        );
        let requests = agent.requests();
        let [Request::Add(add)] = requests.as_slice() else {
            panic!("one Add: {requests:?}")
        };
        assert!(add.pod_ips.is_empty(), "{version}");
    }
}

#[test]
fn pods_without_identity_and_simulate_contact_nobody() {
    let no_pod = [
        "",
        "IgnoreUnknown=1",
        "IgnoreUnknown=1;K8S_POD_NAME=p",
        "K8S_POD_NAMESPACE=n",
    ];
    for cmd in [Command::Add, Command::Del, Command::Check] {
        for args in no_pod {
            let agent = MockAgent::healthy();
            let mut env = base_env(cmd);
            env.retain(|(k, _)| *k != "CNI_ARGS");
            env.push(("CNI_ARGS", args.into()));
            let r = run_with(
                &env,
                base_conf(SpecVersion::V1_1_0).to_string().as_bytes(),
                &agent,
            );
            assert_eq!(r.outcome.exit_code, 0, "{cmd} {args:?}: {}", r.stderr);
            assert!(
                agent.requests().is_empty(),
                "{cmd} {args:?}: agent contacted"
            );
            if cmd == Command::Add {
                assert_eq!(r.json(), bridge_prev(SpecVersion::V1_1_0), "{args:?}");
            }
        }
        let agent = MockAgent::healthy();
        let mut conf = base_conf(SpecVersion::V1_1_0);
        conf["linkerd"]["simulate"] = json!(true);
        let r = run_conf(cmd, &conf, &agent);
        assert_eq!(r.outcome.exit_code, 0, "simulate {cmd}: {}", r.stderr);
        assert!(
            agent.requests().is_empty(),
            "simulate {cmd}: agent contacted"
        );
        assert!(
            r.stderr.contains("simulate: would"),
            "simulate {cmd} logs: {}",
            r.stderr
        );
    }
    let agent = MockAgent::healthy();
    let mut conf = base_conf(SpecVersion::V1_1_0);
    conf["linkerd"]["simulate"] = json!(true);
    let r = run_conf(Command::Gc, &conf, &agent);
    assert_eq!(r.outcome.exit_code, 0, "simulate GC: {}", r.stderr);
    assert!(agent.requests().is_empty(), "simulate GC: agent contacted");
}

#[test]
fn del_works_without_netns() {
    let agent = MockAgent::healthy();
    let mut env = base_env(Command::Del);
    env.retain(|(k, _)| *k != "CNI_NETNS");
    let r = run_with(
        &env,
        base_conf(SpecVersion::V1_0_0).to_string().as_bytes(),
        &agent,
    );
    assert_eq!(r.outcome.exit_code, 0, "{}", r.stderr);
    let requests = agent.requests();
    let [Request::Del(att)] = requests.as_slice() else {
        panic!("one Del: {requests:?}")
    };
    assert_eq!(
        (att.container_id.as_str(), att.netns.as_str()),
        ("c0ffee", "")
    );
}

#[test]
fn gc_sends_valid_attachments_from_either_key() {
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let agent = MockAgent::healthy();
        let mut conf = base_conf(SpecVersion::V1_1_0);
        let obj = conf.as_object_mut().expect("object");
        obj.remove("cni.dev/valid-attachments");
        obj.insert(key.into(), json!([{"containerID": "a1", "ifname": "eth0"}, {"containerID": "b2", "ifname": "net1"}]));
        let r = run_conf(Command::Gc, &conf, &agent);
        assert_eq!(r.outcome.exit_code, 0, "{key}: {}", r.stderr);
        let requests = agent.requests();
        let [Request::Gc(gc)] = requests.as_slice() else {
            panic!("one Gc: {requests:?}")
        };
        let ids: Vec<_> = gc
            .valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        assert_eq!(ids, [("a1", "eth0"), ("b2", "net1")], "{key}");
    }
    let agent = MockAgent::healthy();
    let mut conf = base_conf(SpecVersion::V1_1_0);
    conf.as_object_mut()
        .expect("object")
        .remove("cni.dev/valid-attachments");
    let r = run_conf(Command::Gc, &conf, &agent);
    assert_eq!(r.code(), 7, "GC without a valid list");
    assert!(
        agent.requests().is_empty(),
        "GC without a list must not unregister anything"
    );
}

#[test]
fn agent_failures_map_to_codes_for_every_verb() {
    type Make = fn() -> AgentError;
    let failures: Vec<(&str, Make, u64)> = vec![
        (
            "unreachable",
            || AgentError::Unreachable {
                socket: "s".into(),
                source: io::Error::from(io::ErrorKind::NotFound),
            },
            11,
        ),
        (
            "timeout",
            || AgentError::Timeout {
                socket: "s".into(),
                timeout_ms: 5,
            },
            11,
        ),
        (
            "reset",
            || AgentError::Connection {
                socket: "s".into(),
                source: io::Error::from(io::ErrorKind::ConnectionReset),
            },
            11,
        ),
        (
            "protocol",
            || AgentError::Protocol {
                socket: "s".into(),
                detail: "junk".into(),
            },
            102,
        ),
        (
            "unknown",
            || AgentError::Refused {
                kind: ErrorKind::UnknownContainer,
                message: "m".into(),
            },
            3,
        ),
        (
            "bad request",
            || AgentError::Refused {
                kind: ErrorKind::BadRequest,
                message: "m".into(),
            },
            7,
        ),
        (
            "k8s",
            || AgentError::Refused {
                kind: ErrorKind::KubernetesApi,
                message: "m".into(),
            },
            11,
        ),
        (
            "unavailable",
            || AgentError::Refused {
                kind: ErrorKind::Unavailable,
                message: "m".into(),
            },
            11,
        ),
        (
            "version",
            || AgentError::Refused {
                kind: ErrorKind::VersionMismatch,
                message: "m".into(),
            },
            11,
        ),
        (
            "not in force",
            || AgentError::Refused {
                kind: ErrorKind::NotInForce,
                message: "m".into(),
            },
            100,
        ),
        (
            "internal",
            || AgentError::Refused {
                kind: ErrorKind::Internal,
                message: "m".into(),
            },
            101,
        ),
    ];
    for cmd in [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Gc,
        Command::Status,
    ] {
        for &(name, make, code) in &failures {
            let agent = MockAgent::with(move |_| Err(make()));
            let r = run_conf(cmd, &base_conf(SpecVersion::V1_1_0), &agent);
            if cmd == Command::Del && agent_unavailable(&make()) {
                assert_eq!(
                    r.outcome,
                    Outcome {
                        stdout: String::new(),
                        exit_code: 0
                    },
                    "DEL with agent {name} succeeds: {}",
                    r.stderr
                );
                assert_eq!(agent.requests().len(), 1, "DEL {name}: one request");
                continue;
            }
            let want = if cmd == Command::Status { 50 } else { code };
            assert_eq!(
                r.code(),
                want,
                "{cmd} with agent {name}: {}",
                r.outcome.stdout
            );
            assert_eq!(
                agent.requests().len(),
                1,
                "{cmd} {name}: exactly one request"
            );
            assert!(
                r.stderr.contains(&format!("code {want}")),
                "{cmd} {name}: error logged: {}",
                r.stderr
            );
        }
        // An answer of the wrong kind breaks the protocol.
        let agent = MockAgent::with(|_| Ok(Response::Deleted { existed: false }));
        let r = run_conf(cmd, &base_conf(SpecVersion::V1_1_0), &agent);
        if cmd == Command::Del {
            assert_eq!(r.outcome.exit_code, 0, "DEL accepts Deleted");
        } else {
            assert_eq!(
                r.code(),
                if cmd == Command::Status { 50 } else { 102 },
                "{cmd} answered Deleted"
            );
        }
    }
}

/// The agent down on ADD: the API decides. Unmeshed starts (prevResult through), meshed
/// and unknown fail with 11 naming the socket; the agent refusing is never second-guessed.
#[test]
fn add_without_the_agent_asks_the_api() {
    let mut conf = base_conf(SpecVersion::V1_0_0);
    conf["kubernetes"] = json!({"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"});
    let down = || {
        MockAgent::with(|_| {
            Err(AgentError::Unreachable {
                socket: "/test/agent.sock".into(),
                source: io::Error::from(io::ErrorKind::ConnectionRefused),
            })
        })
    };
    let env = |pod: &str| {
        let mut e = base_env(Command::Add);
        e.retain(|(k, _)| *k != "CNI_ARGS");
        e.push((
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME={pod}"),
        ));
        e
    };
    let api = MockApi::with(|name| match name {
        "meshed" => Ok(true),
        "plain" => Ok(false),
        _ => Err(ApiError::Request {
            url: "u".into(),
            reason: "connection refused".into(),
        }),
    });
    let stdin = conf.to_string();

    let r = run_with_api(&env("plain"), stdin.as_bytes(), &down(), &api);
    assert_eq!(r.outcome.exit_code, 0, "unmeshed starts: {}", r.stderr);
    assert_eq!(
        r.json(),
        bridge_prev(SpecVersion::V1_0_0),
        "prevResult through"
    );

    let r = run_with_api(&env("meshed"), stdin.as_bytes(), &down(), &api);
    assert_eq!(r.code(), 11);
    let msg = r.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains("meshed") && msg.contains("/test/agent.sock") && msg.contains("retries"),
        "{msg}"
    );

    let r = run_with_api(&env("unknown"), stdin.as_bytes(), &down(), &api);
    assert_eq!(r.code(), 11);
    let body = r.json();
    assert!(
        body["msg"]
            .as_str()
            .is_some_and(|m| m.contains("cannot tell")),
        "{body}"
    );
    assert!(
        body["details"]
            .as_str()
            .is_some_and(|d| d.contains("connection refused")),
        "{body}"
    );
    assert_eq!(
        api.seen
            .borrow()
            .iter()
            .map(|(kc, ns, n)| format!("{kc} {ns}/{n}"))
            .collect::<Vec<_>>(),
        [
            "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig shop/plain",
            "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig shop/meshed",
            "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig shop/unknown",
        ]
    );

    // The agent answering (even refusing) is final: no API lookup.
    let refusing = MockAgent::with(|_| {
        Err(AgentError::Refused {
            kind: ErrorKind::Internal,
            message: "m".into(),
        })
    });
    let before = api.seen.borrow().len();
    let r = run_with_api(&env("plain"), stdin.as_bytes(), &refusing, &api);
    assert_eq!(r.code(), 101);
    assert_eq!(api.seen.borrow().len(), before);
}

/// Uninstalled with the entry left behind: no agent socket and the API rejecting the
/// plugin's token (401/403). Still fails closed (11), and the message says how to get out;
/// a slow agent (timeout) with the same API answer keeps the generic message.
#[test]
fn add_without_the_agent_and_rejected_credentials_says_how_to_uninstall() {
    let mut conf = base_conf(SpecVersion::V1_0_0);
    conf["kubernetes"] = json!({"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"});
    let mut env = base_env(Command::Add);
    env.retain(|(k, _)| *k != "CNI_ARGS");
    env.push(("CNI_ARGS", "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web".into()));
    let stdin = conf.to_string();
    for status in [401, 403] {
        let api = MockApi::with(if status == 401 {
            |_| {
                Err(ApiError::Rejected {
                    url: "u".into(),
                    status: 401,
                    reason: "Unauthorized".into(),
                })
            }
        } else {
            |_| {
                Err(ApiError::Rejected {
                    url: "u".into(),
                    status: 403,
                    reason: "Forbidden".into(),
                })
            }
        });
        let gone = MockAgent::with(|_| {
            Err(AgentError::Unreachable {
                socket: "/test/agent.sock".into(),
                source: io::Error::from(io::ErrorKind::NotFound),
            })
        });
        let r = run_with_api(&env, stdin.as_bytes(), &gone, &api);
        assert_eq!(r.code(), 11, "fail closed: {}", r.stderr);
        let msg = r.json()["msg"].as_str().unwrap_or_default().to_string();
        assert!(
            msg.contains("linkerd-cni-agent uninstall")
                && msg.contains("remove the linkerd-cni entry")
                && msg.contains(&format!("status {status}")),
            "{msg}"
        );

        let slow = MockAgent::with(|_| {
            Err(AgentError::Timeout {
                socket: "/test/agent.sock".into(),
                timeout_ms: 1,
            })
        });
        let r = run_with_api(&env, stdin.as_bytes(), &slow, &api);
        assert_eq!(r.code(), 11);
        let msg = r.json()["msg"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains("cannot tell"), "{msg}");
    }
}

/// Excluded namespaces never reach the agent, for any verb that would register or check.
#[test]
fn excluded_namespaces_never_reach_the_agent() {
    for ns in ["kube-system", "linkerd-cni", "infra"] {
        for cmd in [Command::Add, Command::Del, Command::Check] {
            let mut conf = base_conf(SpecVersion::V1_0_0);
            if ns == "infra" {
                conf["linkerd"]["excluded-namespaces"] = json!(["infra"]);
            }
            let mut env = base_env(cmd);
            env.retain(|(k, _)| *k != "CNI_ARGS" && *k != "CNI_NETNS");
            env.push(("CNI_ARGS", format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME=p")));
            // Not even the netns is looked at.
            env.push(("CNI_NETNS", "/nonexistent".into()));
            let agent = MockAgent::healthy();
            let r = run_conf_env(&env, &conf, &agent);
            assert_eq!(r.outcome.exit_code, 0, "{cmd} {ns}: {}", r.stderr);
            assert!(agent.requests().is_empty(), "{cmd} {ns}: sent to the agent");
            if cmd == Command::Add {
                assert_eq!(r.json(), bridge_prev(SpecVersion::V1_0_0));
            }
        }
    }
    // Configured otherwise, kube-system goes to the agent.
    let mut conf = base_conf(SpecVersion::V1_0_0);
    conf["linkerd"]["excluded-namespaces"] = json!([]);
    let mut env = base_env(Command::Add);
    env.retain(|(k, _)| *k != "CNI_ARGS");
    env.push((
        "CNI_ARGS",
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=p".into(),
    ));
    let agent = MockAgent::healthy();
    run_conf_env(&env, &conf, &agent);
    assert_eq!(agent.requests().len(), 1);
}

fn run_conf_env(env: &[(&'static str, String)], conf: &Value, agent: &MockAgent) -> Run {
    run_with(env, conf.to_string().as_bytes(), agent)
}

#[test]
fn status_not_loaded_is_50() {
    let agent = MockAgent::with(|_| {
        Ok(Response::Status {
            programs_loaded: false,
            pods: 0,
        })
    });
    let r = run_conf(Command::Status, &base_conf(SpecVersion::V1_1_0), &agent);
    assert_eq!(r.code(), 50);
    assert!(
        r.json()["msg"]
            .as_str()
            .is_some_and(|m| m.contains("eBPF programs")),
        "{}",
        r.outcome.stdout
    );
}

#[test]
fn local_error_paths() {
    let conf = base_conf(SpecVersion::V1_0_0).to_string();
    let with = |var: &'static str, value: Option<&str>| {
        let mut env = base_env(Command::Add);
        env.retain(|(k, _)| *k != var);
        if let Some(v) = value {
            env.push((var, v.to_string()));
        }
        env
    };
    let big = vec![b' '; netconf::MAX_CONFIG_BYTES + 1];
    let table: Vec<Case> = vec![
        (
            "no command",
            with("CNI_COMMAND", None),
            conf.as_bytes(),
            4,
            "CNI_COMMAND",
        ),
        (
            "bad command",
            with("CNI_COMMAND", Some("ATTACH")),
            conf.as_bytes(),
            4,
            "CNI_COMMAND",
        ),
        (
            "no container",
            with("CNI_CONTAINERID", None),
            conf.as_bytes(),
            4,
            "CNI_CONTAINERID",
        ),
        (
            "no netns",
            with("CNI_NETNS", None),
            conf.as_bytes(),
            4,
            "CNI_NETNS",
        ),
        (
            "no ifname",
            with("CNI_IFNAME", None),
            conf.as_bytes(),
            4,
            "CNI_IFNAME",
        ),
        (
            "unknown arg",
            with("CNI_ARGS", Some("K8S_POD_NAME=p;FOO=1")),
            conf.as_bytes(),
            4,
            "CNI_ARGS",
        ),
        (
            "broken json",
            base_env(Command::Add),
            b"{\"cniVersion\":",
            6,
            "decode",
        ),
        ("oversized", base_env(Command::Add), &big, 6, "exceeds"),
        (
            "wrong type",
            base_env(Command::Add),
            br#"{"cniVersion":"1.0.0","linkerd":{"ipv6":"yes"}}"#,
            7,
            "linkerd.ipv6",
        ),
        (
            "old version",
            base_env(Command::Add),
            br#"{"cniVersion":"0.2.0"}"#,
            1,
            "0.2.0",
        ),
        (
            "missing netns",
            with("CNI_NETNS", Some("/var/run/netns/cni-nope")),
            conf.as_bytes(),
            3,
            "not found",
        ),
        (
            "dir netns",
            with("CNI_NETNS", Some("/proc")),
            conf.as_bytes(),
            3,
            "a directory",
        ),
        (
            "file netns",
            with("CNI_NETNS", Some("/proc/self/status")),
            conf.as_bytes(),
            3,
            "a regular file",
        ),
        (
            "mnt netns",
            with("CNI_NETNS", Some("/proc/self/ns/mnt")),
            conf.as_bytes(),
            3,
            "a mount namespace",
        ),
        (
            "pre-0.3 prevResult",
            base_env(Command::Add),
            br#"{"cniVersion":"1.0.0","prevResult":{"ip4":{}}}"#,
            2,
            "prevResult.ip4",
        ),
        (
            "bad prevResult",
            base_env(Command::Add),
            br#"{"cniVersion":"1.0.0","prevResult":{"ips":[{}]}}"#,
            7,
            "prevResult.ips[0]",
        ),
    ];
    for (name, env, stdin, code, needle) in table {
        let agent = MockAgent::healthy();
        let r = run_with(&env, stdin, &agent);
        assert_eq!(r.code(), code, "{name}: {}", r.outcome.stdout);
        assert!(
            r.json()["msg"].as_str().is_some_and(|m| m.contains(needle)),
            "{name}: msg should say {needle}: {}",
            r.outcome.stdout
        );
        assert!(
            agent.requests().is_empty(),
            "{name}: agent must not be asked"
        );
    }
}

#[test]
fn version_never_fails() {
    let agent = MockAgent::healthy();
    let env = vec![("CNI_COMMAND", "VERSION".to_string())];
    let latest = SpecVersion::LATEST.as_str();
    for (stdin, want) in [
        (&b""[..], latest),
        (b"{\"cniVersion\":\"0.4.0\"}", "0.4.0"),
        (b"{\"cniVersion\":\"0.2.0\"}", latest),
        (b"garbage", latest),
    ] {
        let r = run_with(&env, stdin, &agent);
        assert_eq!(r.outcome.exit_code, 0, "{stdin:?}");
        assert_eq!(
            r.json(),
            json!({"cniVersion": want, "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}),
            "{stdin:?}"
        );
    }
    assert!(agent.requests().is_empty());
}
