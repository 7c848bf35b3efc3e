//! Scenario 7: Kubernetes API load at scale. N simulated nodes (N real agent processes, each
//! with its own node name, pin root and socket) share one stand-in API server that records
//! every request; each node gets `pods_per_node` meshed pods (netns + cgroup) through the real
//! plugin, then churns (DEL, pod object deleted, a new pod object bound to the node, ADD).
//!
//! Reported: API requests per ADD and per node, by phase, and the watch connections each node
//! holds, against Linkerd's own plugin at the same churn. Linkerd's `linkerd-cni` (the
//! `cni-plugin` of linkerd2-proxy-init) builds a new client on every ADD, GETs the pod, and for
//! a meshed pod GETs the namespace once for each of the five `config.linkerd.io/*` overrides
//! (`skip-outbound-ports`, `skip-inbound-ports`, `skip-subnets`, `proxy-uid`, `proxy-gid`) the
//! pod does not carry itself (injected pods carry none of them unless their owner set them):
//! 6 GETs per meshed ADD (one more, of `default/kubernetes`, for control-plane pods), no watch,
//! nothing on DEL.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration, time::Instant};

use anyhow::{Context, bail};
use linkerd_cni_tests::{CgroupGuard, fake_apiserver::RecordedRequest};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::node::{AgentProc, Api, Bins, Cni, CniPod, K8S_NAMESPACE, fastns::LightPod};

/// Requests Linkerd's plugin makes per ADD of a meshed pod carrying no override annotation.
pub const LINKERD_REQUESTS_PER_ADD: f64 = 6.0;

/// How large the scenario is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiLoadConfig {
    pub nodes: usize,
    pub pods_per_node: usize,
    /// Churn rounds after the fill.
    pub churn_rounds: usize,
    /// Pods of each node replaced per churn round.
    pub churn_per_round: usize,
    /// Pods of each node replaced with ADD sent right after the pod object is created (the
    /// kubelet racing the agent's watch).
    pub racing_per_node: usize,
}

/// One phase's requests (all nodes).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub adds: usize,
    pub dels: usize,
    /// Requests other than watches (GET, LIST).
    pub requests: usize,
    /// Watches opened (new watch connections, reconnects included).
    pub watches_started: usize,
    /// Requests by kind (`GET pod`, `LIST namespaces`, `WATCH pods`, ...).
    pub by_kind: BTreeMap<String, usize>,
    pub secs: f64,
}

impl Phase {
    pub fn requests_per_add(&self) -> f64 {
        if self.adds == 0 {
            0.0
        } else {
            self.requests as f64 / self.adds as f64
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiLoadResults {
    pub config: ApiLoadConfig,
    /// Start-up (agents listing and watching), then fill, steady churn, racing churn.
    pub phases: Vec<Phase>,
    /// Watches open at the end, per node (all of them / nodes).
    pub watches_open_per_node: f64,
    /// Pod watches opened per node over the whole run, each scoped to its node
    /// (`spec.nodeName=<node>`): min and max over the nodes.
    pub pod_watches_per_node: (usize, usize),
    /// Every request over the whole run (watches included), per node.
    pub requests_per_node: f64,
    /// ADDs per node over the whole run.
    pub adds_per_node: f64,
    /// Linkerd's plugin at the same churn: [`LINKERD_REQUESTS_PER_ADD`] × ADDs, per node.
    pub linkerd_requests_per_node: f64,
}

impl ApiLoadResults {
    /// The phase named `name`.
    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

fn kind(r: &RecordedRequest) -> String {
    let segs: Vec<&str> = r
        .path
        .trim_start_matches("/api/v1/")
        .trim_end_matches('/')
        .split('/')
        .collect();
    let (collection, what) = match segs.as_slice() {
        ["namespaces", _] => (false, "namespace".to_string()),
        [plural] | ["namespaces", _, plural] => (true, (*plural).to_string()),
        ["namespaces", _, plural, _] => (false, plural.trim_end_matches('s').to_string()),
        _ => (false, r.path.clone()),
    };
    let verb = if r.is_watch() {
        "WATCH"
    } else if collection {
        "LIST"
    } else {
        r.method.as_str()
    };
    format!("{verb} {what}")
}

fn phase(name: &str, requests: &[RecordedRequest], adds: usize, dels: usize, secs: f64) -> Phase {
    let mut by_kind = BTreeMap::new();
    for r in requests {
        *by_kind.entry(kind(r)).or_insert(0) += 1;
    }
    Phase {
        name: name.into(),
        adds,
        dels,
        requests: requests.iter().filter(|r| !r.is_watch()).count(),
        watches_started: requests.iter().filter(|r| r.is_watch()).count(),
        by_kind,
        secs,
    }
}

/// One simulated node: its agent, its plugin configuration and its pods' sandboxes.
struct SimNode {
    name: String,
    agent: AgentProc,
    cni: Cni,
    /// Sandboxes and the pod each one holds now (name, uid).
    pods: Vec<(LightPod, String, String)>,
    _shared: CgroupGuard,
}

fn pod_object(node: &str, name: &str, uid: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": K8S_NAMESPACE, "uid": uid},
        "spec": {"nodeName": node, "containers": [
            {"name": "app", "image": "app"},
            {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy"}
        ]}
    })
}

fn cni_pod<'a>(sandbox: &'a LightPod, name: &'a str, uid: &'a str, n: usize) -> CniPod<'a> {
    CniPod {
        id: name,
        name,
        uid,
        netns: &sandbox.netns,
        cgroup: Some(&sandbox.cgroup),
        ip: std::net::Ipv4Addr::new(10, 246, (n / 250) as u8, (n % 250 + 2) as u8),
    }
}

/// Runs `f` for every node at once (a thread per node), failing if any failed.
fn each_node(
    nodes: &mut [SimNode],
    f: impl Fn(usize, &mut SimNode) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .iter_mut()
            .enumerate()
            .map(|(i, n)| {
                let f = &f;
                s.spawn(move || f(i, n))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("node thread panicked")))
            })
            .collect::<anyhow::Result<Vec<()>>>()
            .map(drop)
    })
}

/// Replaces `count` pods of every node (DEL, object deleted, new object, ADD); with
/// `wait_for_watch`, the ADDs wait until the agents' watches had time to deliver the new
/// objects, otherwise each ADD follows its object's creation at once.
fn churn(
    api: &Api,
    nodes: &mut [SimNode],
    round: usize,
    count: usize,
    wait_for_watch: bool,
) -> anyhow::Result<()> {
    let replace = |i: usize, node: &mut SimNode| -> anyhow::Result<Vec<usize>> {
        let mut replaced = Vec::new();
        for (j, (sandbox, name, uid)) in node.pods.iter_mut().enumerate().take(count) {
            node.cni
                .invoke("DEL", &cni_pod(sandbox, name, uid, j))
                .with_context(|| format!("DEL on {}", node.name))?;
            api.delete_pod(name)?;
            *name = format!("n{i}-p{j}-r{round}");
            *uid = format!("00000000-0000-4000-9{i:03}-{round:04}{j:08}");
            if !wait_for_watch {
                api.server
                    .apply(&pod_object(&node.name, name, uid))
                    .context("applying a pod")?;
                node.cni
                    .invoke("ADD", &cni_pod(sandbox, name, uid, j))
                    .with_context(|| format!("racing ADD on {}", node.name))?;
            }
            replaced.push(j);
        }
        Ok(replaced)
    };
    if !wait_for_watch {
        return each_node(nodes, |i, n| replace(i, n).map(drop));
    }
    each_node(nodes, |i, n| {
        replace(i, n)?;
        for (_, name, uid) in n.pods.iter().take(count) {
            api.server.apply(&pod_object(&n.name, name, uid))?;
        }
        Ok(())
    })?;
    // The watches push each object within milliseconds; leave them ample time.
    std::thread::sleep(Duration::from_millis(500));
    each_node(nodes, |_, n| {
        for (j, (sandbox, name, uid)) in n.pods.iter().enumerate().take(count) {
            n.cni
                .invoke("ADD", &cni_pod(sandbox, name, uid, j))
                .with_context(|| format!("ADD on {}", n.name))?;
        }
        Ok(())
    })
}

/// Waits until every agent lists and watches its pods and the namespaces.
fn wait_watching(api: &Api, nodes: &[SimNode]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let requests = api.server.requests();
        let pod_watch = |node: &str| {
            requests.iter().any(|r| {
                r.is_watch()
                    && r.path == "/api/v1/pods"
                    && r.param("fieldSelector") == Some(&format!("spec.nodeName={node}"))
            })
        };
        let ns_watches = requests
            .iter()
            .filter(|r| r.is_watch() && r.path == "/api/v1/namespaces")
            .count();
        if nodes.iter().all(|n| pod_watch(&n.name)) && ns_watches >= nodes.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the agents did not all watch pods and namespaces within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn run(bins: &Bins, cfg: &ApiLoadConfig) -> anyhow::Result<ApiLoadResults> {
    let t0 = Instant::now();
    let api = Api::start()?;
    let parent = CgroupGuard::new()?;
    let mut nodes = Vec::with_capacity(cfg.nodes);
    for i in 0..cfg.nodes {
        let name = format!("bench-api-node-{i}");
        let shared = CgroupGuard::new()?;
        // 100 pods per node and their churn: small maps, so N agents fit in memory.
        let agent = AgentProc::start_on(&bins.agent, &api.kubeconfig, shared.path(), &name, 1024)
            .with_context(|| format!("starting the agent of {name}"))?;
        let cni = Cni {
            plugin: bins.plugin.clone(),
            socket: agent.socket().to_path_buf(),
        };
        let sandboxes = LightPod::create_many(cfg.pods_per_node, parent.path())?;
        let pods = sandboxes
            .into_iter()
            .enumerate()
            .map(|(j, s)| {
                (
                    s,
                    format!("n{i}-p{j}"),
                    format!("00000000-0000-4000-8{i:03}-{j:012}"),
                )
            })
            .collect();
        nodes.push(SimNode {
            name,
            agent,
            cni,
            pods,
            _shared: shared,
        });
    }
    for n in &nodes {
        for (_, name, uid) in &n.pods {
            api.server.apply(&pod_object(&n.name, name, uid))?;
        }
    }
    wait_watching(&api, &nodes)?;
    std::thread::sleep(Duration::from_millis(500));
    let mut phases = Vec::new();
    let mut mark = 0;
    let mut t = Instant::now();
    let mut close = |name: &str, adds: usize, dels: usize, t: &mut Instant| {
        let all = api.server.requests();
        let p = phase(name, &all[mark..], adds, dels, t.elapsed().as_secs_f64());
        mark = all.len();
        *t = Instant::now();
        p
    };
    phases.push(close("start-up (list + watch)", 0, 0, &mut t));
    eprintln!(
        "bench: API load: {} agents watching ({:.1} s)",
        nodes.len(),
        t0.elapsed().as_secs_f64()
    );

    each_node(&mut nodes, |_, n| {
        for (j, (sandbox, name, uid)) in n.pods.iter().enumerate() {
            n.cni
                .invoke("ADD", &cni_pod(sandbox, name, uid, j))
                .with_context(|| format!("ADD on {}", n.name))?;
        }
        Ok(())
    })?;
    let fill_adds = cfg.nodes * cfg.pods_per_node;
    phases.push(close("fill", fill_adds, 0, &mut t));

    let churn_n = cfg.churn_per_round.min(cfg.pods_per_node);
    for round in 1..=cfg.churn_rounds {
        churn(&api, &mut nodes, round, churn_n, true)?;
    }
    let churned = cfg.nodes * churn_n * cfg.churn_rounds;
    phases.push(close("churn (steady state)", churned, churned, &mut t));

    let racing_n = cfg.racing_per_node.min(cfg.pods_per_node);
    churn(&api, &mut nodes, cfg.churn_rounds + 1, racing_n, false)?;
    let raced = cfg.nodes * racing_n;
    phases.push(close(
        "churn, ADD racing the pod watch",
        raced,
        raced,
        &mut t,
    ));

    for n in &nodes {
        let registered = n.agent.status()?;
        if registered != cfg.pods_per_node {
            bail!(
                "{}: {registered} pods registered, {} expected",
                n.name,
                cfg.pods_per_node
            );
        }
    }
    let watches_open = api.server.watches_open();
    let all = api.server.requests();
    let pod_watches: Vec<usize> = nodes
        .iter()
        .map(|n| {
            let sel = format!("spec.nodeName={}", n.name);
            all.iter()
                .filter(|r| {
                    r.is_watch()
                        && r.path == "/api/v1/pods"
                        && r.param("fieldSelector") == Some(sel.as_str())
                })
                .count()
        })
        .collect();
    // Undo the registrations before the sandboxes go.
    each_node(&mut nodes, |_, n| {
        for (j, (sandbox, name, uid)) in n.pods.iter().enumerate() {
            n.cni.invoke("DEL", &cni_pod(sandbox, name, uid, j))?;
        }
        Ok(())
    })?;
    let adds: usize = phases.iter().map(|p| p.adds).sum();
    let n = cfg.nodes as f64;
    Ok(ApiLoadResults {
        config: cfg.clone(),
        phases,
        watches_open_per_node: watches_open as f64 / n,
        pod_watches_per_node: (
            pod_watches.iter().copied().min().unwrap_or(0),
            pod_watches.iter().copied().max().unwrap_or(0),
        ),
        requests_per_node: all.len() as f64 / n,
        adds_per_node: adds as f64 / n,
        linkerd_requests_per_node: LINKERD_REQUESTS_PER_ADD * adds as f64 / n,
    })
}

/// The scenario's section of BENCHMARKS.md.
pub fn markdown(r: &ApiLoadResults) -> String {
    let mut md = String::new();
    let c = &r.config;
    let _ = writeln!(md, "\n## 7. Kubernetes API load\n");
    let _ = writeln!(
        md,
        "{} simulated nodes (one agent process each) share one stand-in API server that records \
         every request; {} meshed pods per node through the real plugin, then {} churn rounds of \
         {} pods per node (DEL, pod object deleted, a new one bound to the node, ADD once the \
         watches had 500 ms to deliver it), then {} pods per node replaced with the ADD sent \
         right after the pod object was created (the kubelet racing the agent's watch). \
         Linkerd's plugin: a GET of the pod and, for a meshed pod, a GET of its namespace for each \
         of the five `config.linkerd.io/*` overrides the pod does not carry: {} requests per ADD \
         over a new connection each time (the plugin is a process per ADD), no watch.\n",
        c.nodes,
        c.pods_per_node,
        c.churn_rounds,
        c.churn_per_round,
        c.racing_per_node,
        LINKERD_REQUESTS_PER_ADD
    );
    let _ = writeln!(
        md,
        "| phase | ADDs | DELs | requests (no watches) | per ADD | Linkerd's plugin per ADD | watches opened | by kind | seconds |\n|---|---|---|---|---|---|---|---|---|"
    );
    for p in &r.phases {
        let kinds: Vec<String> = p.by_kind.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            p.name,
            p.adds,
            p.dels,
            p.requests,
            if p.adds == 0 {
                "–".into()
            } else {
                format!("{:.2}", p.requests_per_add())
            },
            if p.adds == 0 {
                "–".into()
            } else {
                format!("{LINKERD_REQUESTS_PER_ADD:.0}")
            },
            p.watches_started,
            if kinds.is_empty() {
                "–".into()
            } else {
                kinds.join(", ")
            },
            p.secs
        );
    }
    let _ = writeln!(
        md,
        "\nPer node over the whole run: {:.0} requests (watches included) for {:.0} ADDs, against \
         {:.0} for Linkerd's plugin; {:.1} watch connections open at the end (this node's pods, \
         every namespace's metadata); pod watches opened per node {}–{}.",
        r.requests_per_node,
        r.adds_per_node,
        r.linkerd_requests_per_node,
        r.watches_open_per_node,
        r.pod_watches_per_node.0,
        r.pod_watches_per_node.1
    );
    md
}
