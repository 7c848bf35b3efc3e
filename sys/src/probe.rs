//! Asks the running kernel for each feature of [`FEATURES`] ([`Probe`] says how), for the
//! agent's start-up check and `linkerd check --node`: the kernel's answer, not its version
//! number, decides (distributions backport eBPF features far past their version).
//!
//! Each probe is a raw `bpf(2)` program load of two or three instructions, a `BPF_LINK_CREATE`
//! on an invalid cgroup fd, or a `getsockopt` on a fresh socket. Every fd a probe opens is
//! closed before it returns; nothing is attached or pinned. Loading programs needs root (or
//! `CAP_BPF` with `CAP_NET_ADMIN`); without it the answer is [`Answer::CannotAsk`], never a
//! guess.
//!
//! Written for little-endian machines (x86_64, arm64): the instruction encoding puts the
//! destination register in the low nibble.

use std::{
    fmt, io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use linkerd_cni_common::{
    kernel::{FEATURES, Feature, MissingList, Mode, Named, Probe, SkLookupVariant, parse_release},
    names::Hook,
};

use crate::{
    bpf::{Insn, insn, link_create_raw, prog_load},
    sock, uapi,
};

/// What the kernel said about one feature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The feature works.
    Present,
    /// The kernel refused it (the error it gave).
    Absent(String),
    /// The question could not be asked (not permitted): no answer.
    CannotAsk(String),
}

/// The kernel's answers for every feature of [`FEATURES`], with its release.
#[derive(Clone, Debug)]
pub struct Findings {
    /// `uname(2)`'s release (information only).
    pub release: String,
    /// One answer per row of [`FEATURES`], in order.
    pub answers: Vec<(&'static Feature, Answer)>,
}

impl Findings {
    /// Asks the running kernel for every feature.
    pub fn probe() -> Self {
        Self {
            release: release(),
            answers: FEATURES.iter().map(|f| (f, ask(f.probe))).collect(),
        }
    }

    /// The required features the kernel refused, in table order.
    pub fn missing(&self) -> Vec<&'static Feature> {
        self.absent().filter(|f| f.required()).collect()
    }

    /// The features with a stand-in ([`Feature::without`]) the kernel refused: the agent runs
    /// the stand-in.
    pub fn stood_in(&self) -> Vec<&'static Feature> {
        self.absent().filter(|f| !f.required()).collect()
    }

    fn absent(&self) -> impl Iterator<Item = &'static Feature> + '_ {
        self.answers
            .iter()
            .filter(|(_, a)| matches!(a, Answer::Absent(_)))
            .map(|(f, _)| *f)
    }

    /// The `sk_lookup` program this kernel gets: [`SkLookupVariant::Ifindex`] when its probe
    /// said yes, [`SkLookupVariant::Address`] otherwise (refused, or not asked: a kernel that
    /// could not be asked is refused by [`Self::verdict`] anyway).
    pub fn sk_lookup_variant(&self) -> SkLookupVariant {
        SkLookupVariant::for_kernel(
            self.answers
                .iter()
                .any(|(f, a)| f.probe == Probe::SkLookupIngressIfindex && *a == Answer::Present),
        )
    }

    /// The features that could not be asked for, with why.
    pub fn unasked(&self) -> Vec<(&'static Feature, &str)> {
        self.answers
            .iter()
            .filter_map(|(f, a)| match a {
                Answer::CannotAsk(why) => Some((*f, why.as_str())),
                _ => None,
            })
            .collect()
    }

    /// The verdict in one line: `Ok("<release>: every feature present")` (or `every required
    /// feature present (without <feature>, <its stand-in>)`), or the error naming
    /// each missing feature (`kernel <release> lacks features ...; missing: name (5.15+), ...`)
    /// or each feature that could not be asked for.
    pub fn verdict(&self) -> Result<String, String> {
        let missing = self.missing();
        if !missing.is_empty() {
            return Err(format!(
                "kernel {} lacks features linkerd-cni's eBPF mode needs; missing: {}",
                self.release,
                Named(&missing)
            ));
        }
        let unasked = self.unasked();
        if let Some((_, why)) = unasked.first() {
            let by_version = match parse_release(&self.release) {
                Some(v) if MissingList(v).to_string().is_empty() => {
                    "by its version number it has every feature".to_string()
                }
                Some(v) => format!("by its version number it would lack: {}", MissingList(v)),
                None => "its version number does not parse".to_string(),
            };
            return Err(format!(
                "cannot ask kernel {} for {} of its {} features ({why}): run as root; {by_version}",
                self.release,
                unasked.len(),
                self.answers.len()
            ));
        }
        let stood_in = self.stood_in();
        if stood_in.is_empty() {
            return Ok(format!("{}: every feature present", self.release));
        }
        let stand_ins: Vec<String> = stood_in
            .iter()
            .map(|f| format!("without {}, {}", f.name, f.without.unwrap_or_default()))
            .collect();
        Ok(format!(
            "{}: every required feature present ({})",
            self.release,
            stand_ins.join("; ")
        ))
    }
}

/// The mode a node runs, and why: what the agent chose at start ([`Findings::choose`]), kept
/// in a small file of its state ([`Choice::render`], [`Choice::parse`]) where `inspect` and
/// `linkerd check --node` read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub mode: Mode,
    /// Whether `--mode` forced it (`ebpf` or `iptables`) rather than the probes (`auto`).
    pub forced: bool,
    /// Why, in one line: the kernel's verdict, naming the missing features, or the flag.
    pub reason: String,
}

impl Choice {
    /// The file's text: `<mode>\n<auto|forced>\n<reason>\n`.
    pub fn render(&self) -> String {
        let how = match self.forced {
            true => "forced",
            false => "auto",
        };
        let reason = self.reason.replace('\n', " ");
        format!("{}\n{how}\n{reason}\n", self.mode.name())
    }

    /// Reads [`Self::render`]'s text back (`None`: not such a text).
    pub fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let mode = Mode::of_name(lines.next()?)?;
        let forced = match lines.next()? {
            "forced" => true,
            "auto" => false,
            _ => return None,
        };
        let reason = lines.next()?.to_string();
        Some(Self {
            mode,
            forced,
            reason,
        })
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.forced {
            true => "forced by --mode",
            false => "chosen by the kernel probes",
        };
        write!(f, "{} ({how}): {}", self.mode.name(), self.reason)
    }
}

impl Findings {
    /// The mode a node runs for `asked` (`--mode`; `None` is `auto`):
    /// - `iptables`: the fallback, whatever the kernel;
    /// - `ebpf`: the eBPF data plane, or the verdict's error (each missing feature named);
    /// - `auto`: the eBPF data plane where [`Self::verdict`] accepts the kernel, the fallback
    ///   where the kernel refused a required feature (the reason names them), and the
    ///   verdict's error where the kernel could not be asked (no answer is no reason to run
    ///   either).
    pub fn choose(&self, asked: Option<Mode>) -> Result<Choice, String> {
        let forced = asked.is_some();
        match (asked, self.verdict()) {
            (Some(Mode::Iptables), _) => Ok(Choice {
                mode: Mode::Iptables,
                forced,
                reason: "--mode=iptables: Linkerd's rules in each meshed pod's network namespace"
                    .into(),
            }),
            (_, Ok(verdict)) => Ok(Choice {
                mode: Mode::Ebpf,
                forced,
                reason: format!("kernel {verdict}"),
            }),
            (None, Err(why)) if !self.missing().is_empty() => Ok(Choice {
                mode: Mode::Iptables,
                forced,
                reason: format!(
                    "{why}: the per-node fallback (Linkerd's rules in each meshed pod's \
                     network namespace) serves this node"
                ),
            }),
            (_, Err(why)) => Err(why),
        }
    }
}

/// `uname(2)`'s release: what the kernel says of itself to this process (a process with the
/// `UNAME26` personality is told `2.6.x`).
pub fn release() -> String {
    // SAFETY: an all-zero utsname is valid, and uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uts is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    let bytes: Vec<u8> = uts
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Asks the running kernel one question.
pub fn ask(probe: Probe) -> Answer {
    match probe {
        Probe::CgroupConnect => answer(load(Hook::Connect4, &[R0_1, EXIT])),
        Probe::CgroupGetsockopt => answer(load(Hook::Getsockopt, &[R0_1, EXIT])),
        Probe::CgroupLink => answer(link_create_exists()),
        Probe::CgroupGetpeername => answer(
            load(Hook::Getpeername4, &[R0_1, EXIT])
                .and_then(|_| load(Hook::Getsockname4, &[R0_1, EXIT])),
        ),
        Probe::SkLookup => answer(load(Hook::SkLookup, &[R0_1, EXIT])),
        Probe::SoNetnsCookie => answer(netns_cookie()),
        Probe::NetnsCookieHelper => {
            let prog = [call(uapi::BPF_FUNC_GET_NETNS_COOKIE), R0_1, EXIT];
            answer(load(Hook::SockOps, &prog).and_then(|_| load(Hook::Getsockopt, &prog)))
        }
        Probe::SkLookupIngressIfindex => {
            // r2 = *(u32 *)(r1 + offsetof(struct bpf_sk_lookup, ingress_ifindex))
            let read = insn(
                uapi::BPF_LDX_MEM_W,
                2,
                1,
                uapi::SK_LOOKUP_INGRESS_IFINDEX,
                0,
            );
            answer(load(Hook::SkLookup, &[read, R0_1, EXIT]))
        }
    }
}

fn answer<T>(result: io::Result<T>) -> Answer {
    match result {
        Ok(_) => Answer::Present,
        // bpf(2) itself refused: no CAP_BPF/CAP_SYS_ADMIN (or, before 5.11, RLIMIT_MEMLOCK).
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Answer::CannotAsk(e.to_string()),
        Err(e) => Answer::Absent(e.to_string()),
    }
}

/// `r0 = 1`: allow (every hook probed here accepts 1).
const R0_1: Insn = insn(uapi::BPF_MOV64_IMM, 0, 0, 0, 1);
const EXIT: Insn = insn(uapi::BPF_EXIT, 0, 0, 0, 0);

const fn call(helper: i32) -> Insn {
    insn(uapi::BPF_CALL, 0, 0, 0, helper)
}

/// Loads `insns` as a program of `hook` (its program type, and its attach type as the expected
/// one); the fd closes when the result drops.
fn load(hook: Hook, insns: &[Insn]) -> io::Result<OwnedFd> {
    prog_load(hook, "l5d_probe", insns, &mut [])
}

/// Whether `BPF_LINK_CREATE` takes cgroup programs: `EBADF` for the invalid cgroup fd means
/// the kernel got as far as looking it up.
fn link_create_exists() -> io::Result<()> {
    let prog = load(Hook::Connect4, &[R0_1, EXIT])?;
    match link_create_raw(prog.as_raw_fd() as u32, u32::MAX, Hook::Connect4, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => Ok(()),
        Err(e) => Err(e),
        // Cannot happen (fd -1 is no cgroup); the link is closed on drop, never attached.
        Ok(_link) => Ok(()),
    }
}

/// `getsockopt(SO_NETNS_COOKIE)` on a fresh Unix socket.
fn netns_cookie() -> io::Result<u64> {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is the socket just created, owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    sock::netns_cookie(&sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        let bytes = |i: Insn| -> [u8; 8] {
            let (off, imm) = (i.off.to_le_bytes(), i.imm.to_le_bytes());
            [
                i.code, i.regs, off[0], off[1], imm[0], imm[1], imm[2], imm[3],
            ]
        };
        assert_eq!(bytes(R0_1), [0xb7, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(bytes(EXIT), [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(call(122)), [0x85, 0, 0, 0, 122, 0, 0, 0]);
        assert_eq!(
            bytes(insn(uapi::BPF_LDX_MEM_W, 2, 1, 64, 0)),
            [0x61, 0x12, 64, 0, 0, 0, 0, 0]
        );
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }

    fn findings(answers: &[Answer]) -> Findings {
        Findings {
            release: "5.14.0-503.el9.x86_64".into(),
            answers: FEATURES.iter().zip(answers.iter().cloned()).collect(),
        }
    }

    /// `auto` runs eBPF where the verdict accepts the kernel and the fallback where a
    /// required feature is missing (named in the reason); an unasked kernel is refused by
    /// `auto` and `ebpf`; `iptables` runs the fallback on any kernel; the state file reads
    /// back as written.
    #[test]
    fn the_mode_is_chosen_by_the_verdict_unless_forced() {
        let all = vec![Answer::Present; FEATURES.len()];
        let auto = findings(&all).choose(None).expect("auto on a full kernel");
        assert_eq!((auto.mode, auto.forced), (Mode::Ebpf, false));
        assert_eq!(
            auto.reason,
            "kernel 5.14.0-503.el9.x86_64: every feature present"
        );

        // 5.10: no SO_NETNS_COOKIE, no bpf_get_netns_cookie in sock_ops/sockopt.
        let mut old = all.clone();
        for (i, f) in FEATURES.iter().enumerate() {
            if matches!(f.probe, Probe::SoNetnsCookie | Probe::NetnsCookieHelper) {
                old[i] = Answer::Absent("Invalid argument".into());
            }
        }
        let old = findings(&old);
        let fallback = old.choose(None).expect("auto below the floor");
        assert_eq!((fallback.mode, fallback.forced), (Mode::Iptables, false));
        let refused = old.verdict().expect_err("below the floor");
        assert!(fallback.reason.starts_with(&refused), "{}", fallback.reason);
        assert!(
            fallback.reason.contains("SO_NETNS_COOKIE (5.14+)"),
            "{}",
            fallback.reason
        );
        assert_eq!(old.choose(Some(Mode::Ebpf)), Err(refused));
        let forced = old.choose(Some(Mode::Iptables)).expect("forced");
        assert_eq!((forced.mode, forced.forced), (Mode::Iptables, true));
        let ebpf = findings(&all)
            .choose(Some(Mode::Ebpf))
            .expect("forced eBPF");
        assert_eq!((ebpf.mode, ebpf.forced), (Mode::Ebpf, true));

        let mut unasked = all.clone();
        unasked[0] = Answer::CannotAsk("Operation not permitted".into());
        assert!(findings(&unasked).choose(None).is_err());

        for choice in [auto, fallback, forced] {
            assert_eq!(Choice::parse(&choice.render()), Some(choice.clone()));
        }
        assert_eq!(Choice::parse("nftables\nauto\nwhy\n"), None);
    }

    #[test]
    fn the_verdict_names_what_the_kernel_refused_not_what_its_number_says() {
        let all = vec![Answer::Present; FEATURES.len()];
        assert_eq!(
            findings(&all).verdict(),
            Ok("5.14.0-503.el9.x86_64: every feature present".into())
        );
        let mut two = all.clone();
        two[6] = Answer::Absent("Invalid argument (os error 22)".into());
        two[7] = Answer::Absent("Permission denied (os error 13)".into());
        assert_eq!(
            findings(&two).verdict(),
            Err(
                "kernel 5.14.0-503.el9.x86_64 lacks features linkerd-cni's eBPF mode needs; \
                 missing: bpf_get_netns_cookie in sock_ops and cgroup sockopt programs (5.15+)"
                    .into()
            )
        );
        let unasked =
            vec![Answer::CannotAsk("Operation not permitted (os error 1)".into()); FEATURES.len()];
        let err = findings(&unasked)
            .verdict()
            .expect_err("no answer is no pass");
        assert!(
            err.starts_with(
                "cannot ask kernel 5.14.0-503.el9.x86_64 for 8 of its 8 features (Operation not \
                 permitted (os error 1)): run as root"
            ),
            "{err}"
        );
        assert!(
            err.ends_with(
                "run as root; by its version number it would lack: \
             bpf_get_netns_cookie in sock_ops and cgroup sockopt programs (5.15+)"
            ),
            "{err}"
        );
    }

    /// A 5.15 kernel (Ubuntu 22.04's GA): everything but `ingress_ifindex` in the `sk_lookup`
    /// context. Accepted, running the address variant; with the row on, the ifindex one.
    #[test]
    fn a_kernel_without_ingress_ifindex_is_served_by_the_address_variant() {
        let all = vec![Answer::Present; FEATURES.len()];
        assert_eq!(findings(&all).sk_lookup_variant(), SkLookupVariant::Ifindex);
        let row = FEATURES
            .iter()
            .position(|f| f.probe == Probe::SkLookupIngressIfindex)
            .expect("the ingress_ifindex row");
        let mut like_5_15 = all.clone();
        like_5_15[row] = Answer::Absent("Permission denied (os error 13)".into());
        let f = Findings {
            release: "5.15.0-1049-azure".into(),
            ..findings(&like_5_15)
        };
        assert!(f.missing().is_empty());
        assert_eq!(f.sk_lookup_variant(), SkLookupVariant::Address);
        assert_eq!(
            f.verdict(),
            Ok(
                "5.15.0-1049-azure: every required feature present (without ingress_ifindex in \
                the sk_lookup context, l5d_sk_lookaddr: the pod's own traffic is known by its \
                source address (loopback, the destination itself, or one of the pod's \
                addresses))"
                    .into()
            )
        );
        // 5.10 (Amazon Linux 2, Debian 11): still refused, for the required rows only.
        let mut like_5_10 = like_5_15.clone();
        for (i, f) in FEATURES.iter().enumerate() {
            if matches!(f.probe, Probe::SoNetnsCookie | Probe::NetnsCookieHelper) {
                like_5_10[i] = Answer::Absent("Invalid argument (os error 22)".into());
            }
        }
        assert_eq!(
            findings(&like_5_10).verdict(),
            Err(
                "kernel 5.14.0-503.el9.x86_64 lacks features linkerd-cni's eBPF mode needs; \
                 missing: SO_NETNS_COOKIE (5.14+), bpf_get_netns_cookie in sock_ops and cgroup \
                 sockopt programs (5.15+)"
                    .into()
            )
        );
    }

    /// `bpf(2)` refused with `EPERM` (no `CAP_BPF`, or before 5.11 `RLIMIT_MEMLOCK`): every
    /// feature asked with a program load is "cannot ask", never absent, and the verdict
    /// refuses to guess; each load asked for its hook's own program type.
    #[test]
    fn a_refused_bpf_call_is_no_answer() {
        let double =
            crate::bpf::tests::Double::new(|_, _| Err(io::Error::from_raw_os_error(libc::EPERM)));
        let findings = Findings::probe();
        for (feature, answer) in &findings.answers {
            if feature.probe != Probe::SoNetnsCookie {
                assert!(
                    matches!(answer, Answer::CannotAsk(_)),
                    "{}: {answer:?}",
                    feature.name
                );
            }
        }
        assert!(findings.verdict().is_err());
        let prog_types: Vec<u32> = double
            .calls()
            .iter()
            .filter(|(cmd, _)| *cmd == uapi::BPF_PROG_LOAD)
            .map(|(_, a)| u32::from_ne_bytes([a[0], a[1], a[2], a[3]]))
            .collect();
        assert!(prog_types.contains(&Hook::SkLookup.prog_type()));
        assert!(prog_types.contains(&Hook::Connect4.prog_type()));
    }

    #[test]
    fn every_row_has_its_own_probe() {
        for (i, a) in FEATURES.iter().enumerate() {
            for b in &FEATURES[i + 1..] {
                assert_ne!(a.probe, b.probe, "{} and {}", a.name, b.name);
            }
        }
    }
}
