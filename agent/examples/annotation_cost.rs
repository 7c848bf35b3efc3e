//! What a pod's port annotation costs the agent: the decision (parsing the annotation), the
//! map entries built from it (at ADD, and again at every reconcile pass and at DEL), and the
//! per-pod limit check, each timed on this thread's CPU clock. No root needed; nothing is
//! written to the kernel.
//!
//! `cargo run --release -p linkerd-cni-agent --example annotation_cost -- 32760 1-65535`
//! times `config.linkerd.io/skip-inbound-ports` made of 32,760 comma-separated copies of
//! `1-65535` (about 256 KiB, what the API server allows for all of a pod's annotations).

use std::time::Duration;

use linkerd_cni_agent::dataplane::{limits, maps::PodEntries};
use linkerd_cni_proto::config::{LinkerdConfig, PortRange};

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = thread_cpu();
    let out = f();
    println!("{what}: {:?} CPU", thread_cpu() - start);
    out
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let copies: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(32_760);
    let item = args.next().unwrap_or_else(|| "1-65535".into());
    let value = vec![item.as_str(); copies].join(",");
    println!(
        "skip-inbound-ports: {copies} copies of {item:?} ({} bytes)",
        value.len()
    );
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "hostile",
            "namespace": "shop",
            "annotations": {"config.linkerd.io/skip-inbound-ports": value},
        },
        "spec": {"containers": [{"name": "app"}, {"name": "linkerd-proxy"}]},
    });
    let pod = serde_json::from_value(pod)?;
    let decided = timed("decision (parse the annotation)", || {
        linkerd_cni_k8s::decision::decide(&pod, None, None, &LinkerdConfig::default())
    });
    let config = match decided {
        Ok(d) => d.config,
        Err(e) => {
            let msg = e.to_string();
            println!(
                "refused by the decision ({} bytes of message): {}",
                msg.len(),
                msg.chars().take(300).collect::<String>()
            );
            // What the same list would cost the agent had it arrived anyway (a record stored
            // by an earlier version, or the conflist's lists over the wire).
            let range: PortRange = item.parse()?;
            let mut config = LinkerdConfig::default();
            config.inbound_ports_to_ignore.extend(vec![range; copies]);
            println!("as if it had arrived anyway:");
            match timed("per-pod list check (before any entry)", || {
                limits::check_config(&config)
            }) {
                Ok(()) => println!("within the list limits"),
                Err(e) => println!("refused by the list limits: {e}"),
            }
            config
        }
    };
    println!(
        "inbound-ports-to-ignore: {} ranges",
        config.inbound_ports_to_ignore.len()
    );
    let ips = ["10.1.2.3".parse()?];
    let entries = timed("map entries (ADD, reconcile, DEL each)", || {
        PodEntries::new(1, &config, &ips)
    });
    println!("port blocks: {}", entries.port_blocks.len());
    match timed("per-pod limit check", || limits::check(&entries)) {
        Ok(()) => println!("accepted"),
        Err(e) => println!("refused by the limits: {e}"),
    }
    Ok(())
}
