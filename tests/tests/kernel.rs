//! The kernel floor tells the truth on the kernel this runs on (the host, and each kernel of
//! `cargo xtask vmtest`): the agent's start-up check and `linkerd check --node` accept or refuse
//! it together, naming the same missing features from the one table
//! (`linkerd_cni_common::kernel`), and every program loads exactly when that table says the
//! kernel has everything (the verifier's own word, with the agent's check bypassed).
//!
//! Run: `cargo test -p linkerd-cni-tests --test kernel -- --test-threads=1`

use std::{fs, path::PathBuf, process::Command};

use linkerd_cni_agent::dataplane;
use linkerd_cni_common::{
    kernel::{self, MissingList},
    names::{self, Program},
    paths,
};
use linkerd_cni_tests::{
    bins,
    names::{TempDir, unique_name},
};

/// `uname -r` and its `major.minor`.
fn running_kernel() -> (String, (u32, u32)) {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("reading /proc/sys/kernel/osrelease")
        .trim()
        .to_string();
    let version = kernel::parse_release(&release)
        .unwrap_or_else(|| panic!("kernel release {release:?} does not parse"));
    (release, version)
}

/// A bpffs directory of this test's, removed with what is pinned in it on drop.
struct PinRoot(PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_agent_and_check_node_accept_or_refuse_this_kernel_naming_the_same_features() {
    let (release, version) = running_kernel();
    let missing = MissingList(version).to_string();

    let pins = PinRoot(PathBuf::from(paths::BPFFS).join(unique_name()));
    let state = TempDir::new().expect("state dir");
    let agent = Command::new(bins::bin_path("linkerd-cni-agent").expect("agent binary"))
        .arg("--pin-root")
        .arg(&pins.0)
        .arg("--state-dir")
        .arg(state.path())
        .arg("load")
        .output()
        .expect("run linkerd-cni-agent load");
    let agent_err = String::from_utf8_lossy(&agent.stderr);

    let check = Command::new(bins::bin_path("linkerd").expect("linkerd binary"))
        .args(["check", "--node"])
        .output()
        .expect("run linkerd check --node");
    let check_out = String::from_utf8_lossy(&check.stdout);
    // The check's line, and on failure its detail on the indented lines under it.
    let check_line: String = {
        let mut lines = check_out
            .lines()
            .skip_while(|l| !l.contains("kernel has every feature"));
        let first = lines
            .next()
            .unwrap_or_else(|| panic!("no kernel line in check --node:\n{check_out}"));
        let detail: Vec<&str> = lines
            .take_while(|l| l.starts_with(' '))
            .map(str::trim)
            .collect();
        [first, &detail.join(" ")].join(" ")
    };

    if missing.is_empty() {
        assert!(
            agent.status.success(),
            "kernel {release} has every feature, yet the agent did not load:\n{agent_err}"
        );
        assert!(
            check_line.starts_with('√'),
            "kernel {release} has every feature: {check_line}"
        );
    } else {
        let named = format!("missing: {missing}");
        assert!(
            !agent.status.success(),
            "kernel {release} lacks {missing}, yet the agent loaded"
        );
        assert!(
            agent_err.contains(&format!("kernel {release} is too old"))
                && agent_err.contains(&named),
            "the agent's refusal on {release} does not name {missing}:\n{agent_err}"
        );
        assert!(
            !check_line.starts_with('√') && check_line.contains(&named),
            "check --node on {release} does not name {missing}: {check_line}"
        );
        assert!(!check.status.success(), "check --node passed on {release}");
    }
}

#[test]
fn every_program_loads_exactly_when_the_table_says_the_kernel_has_everything() {
    let (release, version) = running_kernel();
    let missing = MissingList(version).to_string();
    let mut ebpf = aya::EbpfLoader::new()
        .load(dataplane::OBJECT)
        .unwrap_or_else(|e| panic!("creating the object's maps on {release}: {e}"));
    let mut refused = Vec::new();
    for Program { name, hook } in names::PROGRAMS {
        let program = ebpf
            .program_mut(name)
            .unwrap_or_else(|| panic!("no program {name} in the object"));
        if let Err(e) = dataplane::load_program(program, hook) {
            // The verifier's first complaint is enough to name the feature.
            let log = format!("{e:?}");
            let reason = log
                .lines()
                .rev()
                .find(|l| l.contains("unknown func") || l.contains("invalid bpf_context"))
                .map_or_else(|| e.to_string(), str::to_string);
            refused.push(format!("{name}: {reason}"));
        }
    }
    eprintln!(
        "kernel {release}: missing [{missing}]; programs refused: {}",
        if refused.is_empty() {
            "none".to_string()
        } else {
            refused.join("; ")
        }
    );
    if missing.is_empty() {
        assert!(
            refused.is_empty(),
            "kernel {release} has every feature of the table, yet: {refused:#?}"
        );
    } else {
        assert!(
            !refused.is_empty(),
            "kernel {release} lacks {missing}, yet every program loaded: the table is wrong"
        );
    }
}
