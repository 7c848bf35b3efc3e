//! The kernel is judged by its own answers on the kernel this runs on (the host, and each
//! kernel of `cargo xtask vmtest`): the feature probes (`linkerd_cni_sys::probe`, one per
//! row of `linkerd_cni_common::kernel::FEATURES`) say yes exactly when the real programs and
//! calls that need each feature work (the verifier's own word, with the agent's check
//! bypassed), the agent's start-up check (`load`, the eBPF data plane) and `linkerd check
//! --node` accept or refuse the kernel together naming the same missing features (where it is
//! refused, `check --node` warns and says the per-node fallback serves the node, and the
//! agent in `auto` mode starts in the fallback), a kernel that reports a low version number
//! (`UNAME26`: `uname` says 2.6.x) is judged the same way, and probing leaves no fd behind.
//!
//! Run: `cargo test -p linkerd-cni-tests --test kernel -- --test-threads=1`

use std::{
    fs,
    os::{fd::AsFd, unix::process::CommandExt},
    path::PathBuf,
    process::{Command, Output},
    time::{Duration, Instant},
};

use linkerd_cni_agent::{
    agent::{Agent, AgentConfig, Mode},
    dataplane::{self, stub},
    host::netns,
};
use linkerd_cni_common::{
    kernel::{self, FEATURES, MissingList, Probe},
    names::{self, Hook, Program},
    paths,
};
use linkerd_cni_sys::{
    bpf,
    probe::{Answer, Findings},
};
use linkerd_cni_tests::{
    bins,
    cgroup::CgroupGuard,
    names::{TempDir, unique_name},
};

/// `personality(2)`'s `UNAME26`: `uname(2)` reports the release as 2.6.x.
const UNAME26: libc::c_ulong = 0x0020000;

/// A bpffs directory of this test's, removed with what is pinned in it on drop.
struct PinRoot(PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// What the agent (`load`) and `linkerd check --node` said of the kernel.
struct Verdicts {
    agent: Output,
    agent_err: String,
    /// The kernel line of `check --node`, with its detail lines joined to it.
    check_line: String,
    /// The mode line of `check --node`, with its detail lines joined to it.
    mode_line: String,
    check_ok: bool,
}

/// Runs `linkerd-cni-agent load` (a pin root of the test's) and `linkerd check --node`, with
/// the `UNAME26` personality when `uname26`.
fn verdicts(uname26: bool) -> Verdicts {
    let with_personality = |cmd: &mut Command| {
        if uname26 {
            // SAFETY: personality(2) is async-signal-safe; the flag survives exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::personality(UNAME26) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
    };
    let pins = PinRoot(PathBuf::from(paths::BPFFS).join(unique_name()));
    let state = TempDir::new().expect("state dir");
    let mut agent = Command::new(bins::bin_path("linkerd-cni-agent").expect("agent binary"));
    agent
        .arg("--pin-root")
        .arg(&pins.0)
        .arg("--state-dir")
        .arg(state.path())
        .arg("load");
    with_personality(&mut agent);
    let agent = agent.output().expect("run linkerd-cni-agent load");
    drop(pins);
    let agent_err = String::from_utf8_lossy(&agent.stderr).into_owned();

    let mut check = Command::new(bins::bin_path("linkerd").expect("linkerd binary"));
    check.args(["check", "--node"]);
    with_personality(&mut check);
    let check = check.output().expect("run linkerd check --node");
    let check_out = String::from_utf8_lossy(&check.stdout);
    let line_of = |name: &str| {
        let mut lines = check_out.lines().skip_while(|l| !l.contains(name));
        let first = lines
            .next()
            .unwrap_or_else(|| panic!("no line {name:?} in check --node:\n{check_out}"));
        let detail: Vec<&str> = lines
            .take_while(|l| l.starts_with(' '))
            .map(str::trim)
            .collect();
        [first, &detail.join(" ")].join(" ")
    };
    Verdicts {
        agent,
        agent_err,
        check_line: line_of("kernel has every feature"),
        mode_line: line_of("the node's redirection mode"),
        check_ok: check.status.success(),
    }
}

/// Asserts that the agent and `check --node` both gave `verdict` (this process's probes, with
/// `release` the release they were told).
fn assert_verdicts(v: &Verdicts, verdict: &Result<String, String>, release: &str) {
    match verdict {
        Ok(present) => {
            assert!(
                v.agent.status.success(),
                "kernel {release}: {present}, yet the agent did not load:\n{}",
                v.agent_err
            );
            assert!(
                v.check_line.starts_with('√') && v.check_line.contains(present.as_str()),
                "check --node on {release} does not say {present:?}: {}",
                v.check_line
            );
        }
        Err(refused) => {
            assert!(!v.agent.status.success(), "{refused}, yet the agent loaded");
            assert!(
                v.agent_err.contains(refused.as_str()),
                "the agent's refusal on {release} is not {refused:?}:\n{}",
                v.agent_err
            );
            // `auto` (no agent recorded another mode here) runs the fallback on a kernel that
            // lacks a feature: check --node warns, naming the same features, and says so.
            assert!(
                v.check_line.starts_with("√ kernel has every feature")
                    && v.check_line.contains("(warning: ")
                    && v.check_line.contains(refused.as_str()),
                "check --node on {release} does not warn {refused:?}: {}",
                v.check_line
            );
            assert!(
                v.mode_line
                    .contains("iptables (chosen by the kernel probes)")
                    && v.mode_line.contains(refused.as_str()),
                "check --node on {release} does not say the fallback serves it: {}",
                v.mode_line
            );
            assert!(
                v.check_ok,
                "check --node failed on {release} (the fallback serves it)"
            );
        }
    }
}

#[test]
fn the_agent_and_check_node_accept_or_refuse_this_kernel_naming_the_same_features() {
    let findings = Findings::probe();
    let verdict = findings.verdict();
    let by_version = kernel::parse_release(&findings.release)
        .map(|v| MissingList(v).to_string())
        .unwrap_or_default();
    eprintln!(
        "kernel {}: the probes say {verdict:?}; by its version number it would lack [{by_version}]",
        findings.release
    );
    assert!(
        findings.unasked().is_empty(),
        "the suite runs as root, yet: {:?}",
        findings.unasked()
    );
    assert_verdicts(&verdicts(false), &verdict, &findings.release);
    assert_auto_mode(&verdict);
}

/// The agent started in `auto` mode (the default) runs the eBPF data plane where the verdict
/// accepts the kernel, and the per-node fallback, pinning nothing, where it refuses it (on
/// 5.10): started in process, as `run` starts it.
fn assert_auto_mode(verdict: &Result<String, String>) {
    let pins = PinRoot(PathBuf::from(paths::BPFFS).join(unique_name()));
    let state = TempDir::new().expect("state dir");
    let config = AgentConfig {
        pin_root: pins.0.clone(),
        state_dir: state.path().to_path_buf(),
        mode: None,
        ..AgentConfig::default()
    };
    let agent = Agent::start(config).unwrap_or_else(|e| panic!("auto mode refused: {e}"));
    let choice = agent.mode_choice().clone();
    drop(agent);
    match verdict {
        Ok(_) => assert_eq!(choice.mode, Mode::Ebpf, "{choice}"),
        Err(refused) => {
            assert_eq!(choice.mode, Mode::Iptables, "{choice}");
            assert!(choice.reason.contains(refused.as_str()), "{choice}");
            assert!(!pins.0.exists(), "the fallback pinned {}", pins.0.display());
        }
    }
    assert!(!choice.forced);
}

/// A kernel that says it is 2.6 (`UNAME26`, as `setarch --uname-2.6` sets) is judged by its
/// answers: with every feature present, both accept it, the release they report being the
/// 2.6.x they were told. (Judged by version number, as before the probes, both refused it.)
#[test]
fn a_kernel_reporting_2_6_is_judged_by_what_it_has() {
    let findings = Findings::probe();
    let v = verdicts(true);
    let told = v
        .check_line
        .split(['(', ' '])
        .find(|w| w.starts_with("2.6."))
        .unwrap_or_else(|| panic!("check --node was not told 2.6.x: {}", v.check_line))
        .trim_end_matches(':')
        .to_string();
    let as_told = Findings {
        release: told.clone(),
        answers: findings.answers.clone(),
    };
    assert_verdicts(&v, &as_told.verdict(), &told);
}

/// Probing leaves no fd behind (nothing is attached or pinned: a probe's program lives only as
/// long as its fd), and costs little: the time of one full round is printed (median of 21), for
/// the start-up figure in the docs.
#[test]
fn probing_is_cheap_and_leaves_no_fd_behind() {
    let fds = || {
        fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .count()
    };
    let before = fds();
    let mut took: Vec<Duration> = (0..21)
        .map(|_| {
            let start = Instant::now();
            let findings = Findings::probe();
            let took = start.elapsed();
            assert!(findings.unasked().is_empty(), "{findings:?}");
            took
        })
        .collect();
    assert_eq!(fds(), before, "the probes left fds open");
    took.sort();
    eprintln!(
        "kernel {}: one round of every probe took {:?} (median of 21; min {:?}, max {:?})",
        linkerd_cni_sys::probe::release(),
        took[10],
        took[0],
        took[20]
    );
    assert!(
        took[10] < Duration::from_secs(1),
        "a round of probes took {:?}",
        took[10]
    );
}

/// Each program (and the agent's per-pod `sk_lookup` stub) loads exactly when the probes of
/// every feature the table lists for it say yes; the two features no program needs are checked
/// against the real calls (a cgroup link of `l5d_connect4` on a test cgroup, the agent's
/// `SO_NETNS_COOKIE`).
#[test]
fn every_program_and_call_works_exactly_when_the_probes_say_so() {
    let findings = Findings::probe();
    let release = &findings.release;
    let present = |probe: Probe| {
        let (_, answer) = findings
            .answers
            .iter()
            .find(|(f, _)| f.probe == probe)
            .expect("every probe is in the table");
        *answer == Answer::Present
    };
    let expected = |program: &str| {
        let needs: Vec<&str> = FEATURES
            .iter()
            .filter(|f| f.programs.contains(&program))
            .map(|f| f.name)
            .collect();
        assert!(
            !needs.is_empty(),
            "the table lists no feature for {program}"
        );
        FEATURES
            .iter()
            .filter(|f| f.programs.contains(&program))
            .all(|f| present(f.probe))
    };

    let mut ebpf = aya::EbpfLoader::new()
        .load(dataplane::OBJECT)
        .unwrap_or_else(|e| panic!("creating the object's maps on {release}: {e}"));
    let mut report = Vec::new();
    let mut disagree = Vec::new();
    // With the JIT on (every kernel this suite boots: the default of Debian's amd64 and arm64
    // configurations), each loaded program must have machine code.
    let jit = fs::read_to_string("/proc/sys/net/core/bpf_jit_enable")
        .map(|v| v.trim() != "0")
        .unwrap_or(false);
    let mut not_jited = Vec::new();
    // The variants too (the address variant of sk_lookup loads wherever sk_lookup does).
    for Program { name, hook, .. } in names::PROGRAMS.into_iter().chain(names::variant_programs()) {
        let program = ebpf
            .program_mut(name)
            .unwrap_or_else(|| panic!("no program {name} in the object"));
        let loaded = dataplane::load_program(program, hook).map_err(|e| {
            // The verifier's first complaint is enough to name the feature.
            let log = format!("{e:?}");
            log.lines()
                .rev()
                .find(|l| l.contains("unknown func") || l.contains("invalid bpf_context"))
                .map_or_else(|| e.to_string(), str::to_string)
        });
        if loaded.is_ok() {
            // Which code the kernel runs: the JIT's (the arm64 guest's claim "through the
            // arm64 JIT" rests on this) or the interpreter's.
            let fd = program.fd().expect("a loaded program has an fd");
            let info = bpf::prog_info(fd.as_fd()).expect("the loaded program's info");
            report.push(format!("{name}: loaded, {} bytes JITed", info.jited_len));
            if jit && info.jited_len == 0 {
                not_jited.push(name);
            }
        } else {
            report.push(format!("{name}: {loaded:?}"));
        }
        if loaded.is_ok() != expected(name) {
            disagree.push(format!(
                "{name}: loaded {loaded:?}, the probes expected {}",
                expected(name)
            ));
        }
    }

    // The per-pod stub, built and loaded as the agent does.
    let scratch = bpf::map_create(6, 4, 8, 1, 0, "l5d_t_ns", None).expect("percpu array");
    let progs = bpf::map_create(3, 4, 4, 1, 0, "l5d_t_prog", None).expect("prog array");
    let insns = stub::sk_lookup_stub(1, scratch.as_fd(), progs.as_fd());
    let stub = bpf::load_sk_lookup(names::PROG_SK_LOOKUP_STUB, &insns).map(drop);
    report.push(format!("{}: {stub:?}", names::PROG_SK_LOOKUP_STUB));
    if stub.is_ok() != expected(names::PROG_SK_LOOKUP_STUB) {
        disagree.push(format!("the sk_lookup stub: {stub:?}"));
    }

    // bpf_link: the real link of l5d_connect4 on a cgroup of the test's (dropped at once,
    // which detaches it).
    let connect4 = ebpf
        .program(names::PROG_CONNECT4)
        .and_then(|p| p.fd().ok())
        .unwrap_or_else(|| panic!("l5d_connect4 did not load on {release}"));
    let cgroup = CgroupGuard::new().expect("test cgroup");
    let cg = fs::File::open(cgroup.path()).expect("open the test cgroup");
    let link = bpf::link_create(connect4.as_fd(), &cg, Hook::Connect4).map(drop);
    report.push(format!("cgroup link: {link:?}"));
    if link.is_ok() != present(Probe::CgroupLink) {
        disagree.push(format!("cgroup link: {link:?}"));
    }
    drop(cg);
    drop(cgroup);

    let cookie = netns::current_netns_cookie();
    report.push(format!("SO_NETNS_COOKIE: {cookie:?}"));
    if cookie.is_ok() != present(Probe::SoNetnsCookie) {
        disagree.push(format!("SO_NETNS_COOKIE: {cookie:?}"));
    }

    eprintln!(
        "kernel {release}: probes {:?}\nreal: {}",
        findings
            .answers
            .iter()
            .map(|(f, a)| (f.name, a))
            .collect::<Vec<_>>(),
        report.join("; ")
    );
    assert!(
        disagree.is_empty(),
        "on kernel {release} the probes and the real programs disagree: {disagree:#?}"
    );
    assert!(
        not_jited.is_empty(),
        "on kernel {release} (bpf_jit_enable on) these programs have no JITed code: {not_jited:?}"
    );
    eprintln!(
        "kernel {release}: bpf_jit_enable {}",
        if jit { "on" } else { "off" }
    );
}
