//! iptables NAT rules in a test netns that redirect like linkerd's proxy-init does: the
//! baseline the eBPF data plane replaces, used to validate the test proxy against the kernel's
//! own `SO_ORIGINAL_DST` answer and to compare against in benchmarks.
//!
//! Two chains per family, in the `nat` table of the netns only:
//! - `PROXY_INIT_REDIRECT` (from `PREROUTING`): inbound TCP to any port except the inbound
//!   ignore list goes to the inbound port;
//! - `PROXY_INIT_OUTPUT` (from `OUTPUT`): TCP from the proxy UID returns, traffic out of `lo`
//!   (loopback and the pod's own IPs) returns, ignored outbound ports return, everything else
//!   goes to the outbound port.

use crate::{
    error::Result,
    names::run,
    netns::NetnsGuard,
    proxy::{INBOUND_PORT, OUTBOUND_PORT, PROXY_UID},
};

/// What to redirect.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Connections from sockets of this UID are not redirected.
    pub proxy_uid: u32,
    /// Outbound TCP is redirected to this port.
    pub outbound_port: u16,
    /// Inbound TCP is redirected to this port.
    pub inbound_port: u16,
    /// Inbound destination ports left alone (`"4190"`, `"4000:4100"`).
    pub inbound_ignore_ports: Vec<String>,
    /// Outbound destination ports left alone.
    pub outbound_ignore_ports: Vec<String>,
    /// Also install the rules with `ip6tables`.
    pub ipv6: bool,
    /// The iptables binary (`iptables`, `iptables-legacy`, `iptables-nft`); `ip6` is inserted
    /// after `ip` for IPv6.
    pub binary: String,
}

impl Default for Rules {
    /// linkerd's defaults: proxy UID 2102, ports 4140/4143, inbound ignore 4190 and 4191.
    fn default() -> Self {
        Rules {
            proxy_uid: PROXY_UID,
            outbound_port: OUTBOUND_PORT,
            inbound_port: INBOUND_PORT,
            inbound_ignore_ports: vec!["4190".into(), "4191".into()],
            outbound_ignore_ports: Vec::new(),
            ipv6: false,
            binary: "iptables".into(),
        }
    }
}

impl Rules {
    /// The iptables argument lists, in order, for one family.
    pub fn commands(&self) -> Vec<Vec<String>> {
        let mut cmds: Vec<Vec<String>> = Vec::new();
        let mut add = |args: &[&str]| cmds.push(args.iter().map(|s| s.to_string()).collect());
        let (inb, outb, uid) = (
            self.inbound_port.to_string(),
            self.outbound_port.to_string(),
            self.proxy_uid.to_string(),
        );
        add(&["-t", "nat", "-N", "PROXY_INIT_REDIRECT"]);
        for ports in &self.inbound_ignore_ports {
            add(&[
                "-t",
                "nat",
                "-A",
                "PROXY_INIT_REDIRECT",
                "-p",
                "tcp",
                "--dport",
                ports,
                "-j",
                "RETURN",
            ]);
        }
        add(&[
            "-t",
            "nat",
            "-A",
            "PROXY_INIT_REDIRECT",
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-ports",
            &inb,
        ]);
        add(&["-t", "nat", "-A", "PREROUTING", "-j", "PROXY_INIT_REDIRECT"]);
        add(&["-t", "nat", "-N", "PROXY_INIT_OUTPUT"]);
        add(&[
            "-t",
            "nat",
            "-A",
            "PROXY_INIT_OUTPUT",
            "-m",
            "owner",
            "--uid-owner",
            &uid,
            "-j",
            "RETURN",
        ]);
        add(&[
            "-t",
            "nat",
            "-A",
            "PROXY_INIT_OUTPUT",
            "-o",
            "lo",
            "-j",
            "RETURN",
        ]);
        for ports in &self.outbound_ignore_ports {
            add(&[
                "-t",
                "nat",
                "-A",
                "PROXY_INIT_OUTPUT",
                "-p",
                "tcp",
                "--dport",
                ports,
                "-j",
                "RETURN",
            ]);
        }
        add(&[
            "-t",
            "nat",
            "-A",
            "PROXY_INIT_OUTPUT",
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-ports",
            &outb,
        ]);
        add(&["-t", "nat", "-A", "OUTPUT", "-j", "PROXY_INIT_OUTPUT"]);
        cmds
    }

    /// The binaries to run the commands with: IPv4, and IPv6 when enabled.
    fn binaries(&self) -> Vec<String> {
        let mut out = vec![self.binary.clone()];
        if self.ipv6 {
            out.push(self.binary.replacen("ip", "ip6", 1));
        }
        out
    }

    /// Installs the rules in `netns` (and nowhere else).
    pub fn install(&self, netns: &NetnsGuard) -> Result<()> {
        for bin in self.binaries() {
            for args in self.commands() {
                run(netns.command(&bin)?.args(&args))?;
            }
        }
        Ok(())
    }

    /// The `nat` table of `netns` as `iptables-save` prints it, for diagnostics.
    pub fn dump(&self, netns: &NetnsGuard) -> Result<String> {
        let mut out = String::new();
        for bin in self.binaries() {
            out += &run(netns.command(&bin)?.args(["-t", "nat", "-S"]))?;
        }
        Ok(out)
    }
}

/// Runs `iptables` with `args` in `netns` (e.g. to add a rule a test needs).
pub fn iptables(netns: &NetnsGuard, args: &[&str]) -> Result<String> {
    run(netns.command("iptables")?.args(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_exempt_proxy_and_loopback_before_redirecting() {
        let rules = Rules {
            outbound_ignore_ports: vec!["443".into(), "6000:6010".into()],
            ..Rules::default()
        };
        let cmds: Vec<String> = rules.commands().iter().map(|c| c.join(" ")).collect();
        let pos = |needle: &str| {
            cmds.iter()
                .position(|c| c.contains(needle))
                .unwrap_or_else(|| panic!("no rule with {needle:?} in {cmds:#?}"))
        };
        let redirect_out = pos("PROXY_INIT_OUTPUT -p tcp -j REDIRECT --to-ports 4140");
        for exempt in [
            "--uid-owner 2102",
            "-o lo -j RETURN",
            "--dport 443 -j RETURN",
            "--dport 6000:6010 -j RETURN",
        ] {
            assert!(
                pos(exempt) < redirect_out,
                "{exempt} must come before the outbound redirect"
            );
        }
        let redirect_in = pos("PROXY_INIT_REDIRECT -p tcp -j REDIRECT --to-ports 4143");
        for ignored in ["--dport 4190 -j RETURN", "--dport 4191 -j RETURN"] {
            assert!(
                pos(ignored) < redirect_in,
                "{ignored} must come before the inbound redirect"
            );
        }
        assert_eq!(rules.binaries(), vec!["iptables".to_string()]);
        let v6 = Rules {
            ipv6: true,
            binary: "iptables-legacy".into(),
            ..Rules::default()
        };
        assert_eq!(
            v6.binaries(),
            vec![
                "iptables-legacy".to_string(),
                "ip6tables-legacy".to_string()
            ]
        );
    }
}
