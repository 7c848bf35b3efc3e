//! `linkerd-cni-agent inspect`: every registered pod with its config and live counters, read
//! from the registry and the pinned maps (works whether or not the agent is running).

use std::{fmt::Write, path::Path};

use linkerd_cni_common::{
    FLAG_EXEMPT_GID, FLAG_EXEMPT_UID, FLAG_IPV6, kernel::SkLookupVariant, names, paths,
};

use crate::{
    agent::registry::Registry,
    agent::{self, Mode, ModeChoice},
    dataplane,
    dataplane::maps::{Maps, MapsError},
};

/// What `inspect` prints on a node where the agent never pinned anything (or everything was
/// removed): one line, instead of the kernel's error for the first missing pin.
pub fn nothing_installed(pin_root: &Path, state_dir: &Path, registered: usize) -> String {
    let maps = pin_root.join(paths::PIN_MAPS);
    if registered == 0 {
        format!(
            "nothing installed: no linkerd-cni maps pinned at {} and no pod registered in {} \
             (the agent has not run on this node, or its state was removed)\n",
            maps.display(),
            state_dir.display()
        )
    } else {
        format!(
            "no linkerd-cni maps pinned at {} although {registered} pod(s) are registered in {}: \
             the agent is not running and the pins are gone (bpffs unmounted or emptied); \
             its next start re-attaches them\n",
            maps.display(),
            state_dir.display()
        )
    }
}

/// Which `sk_lookup` program is pinned under `progs/l5d_sk_lookup` (the one every pod's stub
/// tail-calls), from the kernel's name of it, with its rule; or why that cannot be said.
fn sk_lookup_program(pin_root: &Path) -> String {
    let path = pin_root.join(paths::PIN_PROGS).join(names::PROG_SK_LOOKUP);
    let name = linkerd_cni_sys::bpf::obj_get(&path).and_then(linkerd_cni_sys::bpf::prog_name);
    match name {
        Ok(name) => match SkLookupVariant::of_program(&name) {
            Some(v) => v.to_string(),
            None => format!("{name} (not a program of this release)"),
        },
        Err(e) => format!("unknown ({}: {e})", path.display()),
    }
}

/// The mode the agent last started in, and why ([`paths::MODE_FILE`] in `state_dir`), if it
/// recorded one.
pub fn recorded_mode(state_dir: &Path) -> Option<ModeChoice> {
    let text = std::fs::read_to_string(state_dir.join(paths::MODE_FILE)).ok()?;
    ModeChoice::parse(&text)
}

/// Renders the state under `pin_root` and `state_dir` for humans: the node's mode and why,
/// then every registered pod (in the fallback, with no eBPF maps or programs to show).
pub fn render(pin_root: &Path, state_dir: &Path) -> Result<String, MapsError> {
    let mode = recorded_mode(state_dir);
    let mode_line = match &mode {
        Some(choice) => format!("mode: {choice}\n"),
        None => String::new(),
    };
    let fallback = mode.as_ref().is_some_and(|c| c.mode == Mode::Iptables);
    let maps_dir = pin_root.join(paths::PIN_MAPS);
    let pinned = std::fs::symlink_metadata(&maps_dir).is_ok();
    if !pinned && !fallback {
        // Only a registry that exists is read (opening one creates its directory).
        let registered = if state_dir.is_dir() {
            Registry::open(state_dir)
                .and_then(|r| r.all())
                .map(|r| r.len())
                .unwrap_or(0)
        } else {
            0
        };
        return Ok(mode_line + &nothing_installed(pin_root, state_dir, registered));
    }
    let maps = match pinned {
        true => Some(Maps::open(&maps_dir)?),
        false => None,
    };
    let records = Registry::open(state_dir)
        .and_then(|r| r.all())
        .unwrap_or_default();
    let mut out = mode_line;
    let _ = writeln!(
        out,
        "pin root: {}   registry: {}",
        pin_root.display(),
        state_dir.display()
    );
    match &maps {
        Some(maps) => {
            let (sock, conn) = maps.orig_dst_entries();
            let _ = writeln!(
                out,
                "registered attachments: {}   original-destination entries: {sock} sockets, {conn} connections",
                records.len()
            );
            let fill: Vec<String> = maps
                .fill_levels()
                .iter()
                .map(|f| format!("{} {}/{}", f.name, f.entries, f.max_entries))
                .collect();
            let _ = writeln!(out, "map fill (entries/max): {}", fill.join("  "));
            let _ = writeln!(out, "sk_lookup program: {}", sk_lookup_program(pin_root));
        }
        None => {
            let _ = writeln!(
                out,
                "registered attachments: {}   no eBPF maps or programs (the per-node fallback \
                 pins nothing)",
                records.len()
            );
        }
    }
    for r in &records {
        let pod = r
            .pod
            .as_ref()
            .map_or_else(|| "-".into(), |p| format!("{}/{}", p.namespace, p.name));
        let _ = writeln!(
            out,
            "\npod {pod}  container {}  netns {} (cookie {})",
            r.id,
            r.netns.display(),
            r.netns_cookie
        );
        let _ = writeln!(out, "  {}", r.reason);
        if r.rules {
            fn list<T: ToString>(l: &[T]) -> String {
                let v: Vec<String> = l.iter().map(ToString::to_string).collect();
                v.join(",")
            }
            let c = &r.config;
            let _ = writeln!(
                out,
                "  mode: iptables (no programs; CNI CHECK compares the pod's table with this \
                 config): outbound port {}  inbound port {}  proxy uid {}  gid {}  ipv6 {}\n  \
                 ignored: outbound ports [{}]  inbound ports [{}]  source subnets [{}]  \
                 outbound subnets [{}]",
                c.outgoing_proxy_port,
                c.incoming_proxy_port,
                c.proxy_uid().map_or("-".into(), |u| u.to_string()),
                c.proxy_gid().map_or("-".into(), |g| g.to_string()),
                c.ipv6,
                list(&c.outbound_ports_to_ignore),
                list(&c.inbound_ports_to_ignore),
                list(&c.subnets_to_ignore),
                list(&c.outbound_subnets_to_ignore),
            );
        }
        if let Some(cgroup) = r.attachment.cgroup() {
            let _ = writeln!(out, "  cgroup: {}", cgroup.display());
        }
        if agent::adopt::is_adopted(&r.id) {
            let _ = writeln!(
                out,
                "  adopted: the pod started without linkerd-cni; redirection was attached while \
                 it ran (its earlier connections were not redirected)"
            );
        }
        for (dir, programs) in agent::links_of(pin_root, r) {
            let state = match dataplane::links_in_force(&dir, programs) {
                Ok(_) => "in force".to_string(),
                Err(why) => format!("NOT IN FORCE: {why}"),
            };
            let _ = writeln!(out, "  links: {} ({state})", dir.display());
        }
        let Some(maps) = &maps else {
            continue;
        };
        let view = maps.view(r.netns_cookie);
        match view.config {
            None if r.redirected() => {
                let _ = writeln!(
                    out,
                    "  config: MISSING from {}",
                    linkerd_cni_common::names::MAP_POD_CONFIG
                );
            }
            None => {}
            Some(c) => {
                let uid = if c.flags & FLAG_EXEMPT_UID != 0 {
                    c.proxy_uid.to_string()
                } else {
                    "-".into()
                };
                let gid = if c.flags & FLAG_EXEMPT_GID != 0 {
                    c.proxy_gid.to_string()
                } else {
                    "-".into()
                };
                if let Some(ids) = &r.host_ids {
                    let _ = writeln!(
                        out,
                        "  user namespace: proxy uid {} gid {} of the pod are host uid {} gid {}",
                        r.config.proxy_uid,
                        r.config.proxy_gid,
                        ids.uid.map_or("-".into(), |u| u.to_string()),
                        ids.gid.map_or("-".into(), |g| g.to_string()),
                    );
                }
                let _ = writeln!(
                    out,
                    "  config: outbound port {}  inbound port {}  proxy uid {uid}  gid {gid}  ipv6 {}",
                    c.outbound_port,
                    c.inbound_port,
                    c.flags & FLAG_IPV6 != 0
                );
                let ports: Vec<String> = r
                    .config
                    .outbound_ports_to_ignore
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                let _ = writeln!(
                    out,
                    "  outbound ports ignored: [{}]  ({} bitmap blocks)",
                    ports.join(","),
                    view.port_blocks
                );
                let ips: Vec<String> = view.ips.iter().map(ToString::to_string).collect();
                let addrs: Vec<String> = view.addrs.iter().map(ToString::to_string).collect();
                let _ = writeln!(
                    out,
                    "  pod addresses: [{}]  ignored subnets: [{}]",
                    ips.join(", "),
                    addrs.join(", ")
                );
                let local = match view.local_addrs.as_slice() {
                    [] => "none: redirected sockets keep 127.0.0.1 / ::1 (no pod address)".into(),
                    local => {
                        let local: Vec<String> = local.iter().map(ToString::to_string).collect();
                        format!("[{}] (redirected sockets' local address)", local.join(", "))
                    }
                };
                let _ = writeln!(out, "  getsockname: {local}");
                let listener = match view.listener {
                    (false, false) => {
                        "MISSING (inbound connections are refused until the proxy listens)"
                            .to_string()
                    }
                    (v4, v6) => format!("registered (IPv4 {v4}, IPv6 {v6})"),
                };
                let _ = writeln!(
                    out,
                    "  inbound: proxy listener on port {} {listener}",
                    c.inbound_port
                );
                let s = view.stats;
                let _ = writeln!(
                    out,
                    "  counters: outbound redirected {}  exempt (proxy uid/gid) {}  skipped {}\n            \
                     inbound redirected {}  refused (no listener) {}  passed {}\n            \
                     SO_ORIGINAL_DST answered {} missed {}  handshakes in flight {}",
                    s.out_redirected,
                    s.out_exempt_owner,
                    s.out_skipped,
                    s.in_redirected,
                    s.in_refused,
                    s.in_passed,
                    s.orig_dst_answered,
                    s.orig_dst_missed,
                    view.live_conns
                );
            }
        }
    }
    let orphans: Vec<u64> = maps
        .as_ref()
        .map(Maps::pods)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !records.iter().any(|r| r.netns_cookie == *c))
        .collect();
    if !orphans.is_empty() {
        let _ = writeln!(
            out,
            "\nmap entries with no registration (netns cookies): {orphans:?}"
        );
    }
    Ok(out)
}
