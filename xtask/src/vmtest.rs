//! `cargo xtask vmtest [--arch arm64] --kernel 6.1|6.12|5.10|<image>`: the privileged test
//! binaries on another kernel, in a QEMU guest.
//!
//! The guest boots the kernel with a small initramfs (Debian's static busybox, see
//! `initramfs.rs`) that loads the virtio/9p/overlay modules, mounts the host's root filesystem
//! read-only over virtio-9p with a tmpfs overlay for writes, and mounts what a real node has:
//! a pure cgroup v2 hierarchy at `/sys/fs/cgroup`, bpffs, a fresh `/run`, `/tmp` and `/dev`,
//! and the kernel's own modules at `/lib/modules/<release>` (so `modprobe` works). It then runs
//! the test binaries, built on the host beforehand, one at a time with `--test-threads=1` under
//! the per-binary time limit of `privileged.rs` (twice it under TCG). A second 9p share (read-write, the run's
//! directory under `target/vmtest/`) carries the script in and the logs out: per binary its
//! output, its exit status and wall time, and the guest's `dmesg` when it failed; the serial
//! console is kept there too.
//!
//! KVM is used only when `/dev/kvm` belongs to a hardware KVM module (`kvm_intel`, `kvm_amd`):
//! a paravirtual KVM (`kvm_pvm`) boots no stock kernel, so the guest runs under TCG.
//!
//! `--arch arm64` on an amd64 host: Debian's arm64 kernel package boots under
//! `qemu-system-aarch64 -M virt` (TCG); the host's programs cannot run there, so the guest's
//! root is an arm64 userland unpacked from Debian's packages (`userland.rs`) and the workspace
//! is shared at its own path (read-only, under a tmpfs overlay), the kernel's modules over a
//! share of their own. The test binaries, the shipped binaries they execute and the helper
//! binaries are built for aarch64 (glibc, static, as the arm64 agent ships: `cross.rs`), the
//! end-to-end tests' CNI runtime by Go's cross compiler. Without `--test` it runs
//! [`FOREIGN_DEFAULT`], the data-plane binaries.

mod initramfs;
mod kernel;
mod userland;

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::{
    build::{
        cross,
        target::{Arch, Libc, Target},
    },
    exec::{cargo, git, run, workspace},
    phases::Phases,
};

/// Guest memory (the tests' tmpfs writes, containerd, a few agents).
const MEMORY: &str = "4G";
/// Guest CPUs (the host has two).
const CPUS: u32 = 2;
/// Where the run's directory is mounted in the guest.
const GUEST_OUT: &str = "/run/l5d-vmtest";
/// Longest a guest may take from start to its first test binary.
const BOOT_LIMIT: Duration = Duration::from_secs(300);
/// How many times the host's per-binary limit a binary may take in a guest under TCG: the
/// suite runs 1-3x slower emulated, containerd's image import and container starts about 10x
/// (`daemonset` took 61 s on the host and 658 s in the 6.1 guest with the host idle, and went
/// over the host's 900 s limit there with the host's load average at 28). CI's time budget
/// still bounds the whole run.
const TCG_LIMIT_FACTOR: u32 = 2;
/// The same for a guest of another architecture: every instruction is translated (arm64 on
/// amd64: `dataplane` took 1019 s there against about 400 s in an amd64 guest).
const FOREIGN_LIMIT_FACTOR: u32 = 4;

/// The binaries `cargo xtask vmtest --arch <not the host's>` runs without `--test`: the data
/// plane (programs, links, redirection both ways, the pin layout, the end-to-end chain
/// through libcni). The others need containerd or Kubernetes images of the guest's
/// architecture, which the unpacked userland does not have.
pub const FOREIGN_DEFAULT: &[&str] = &[
    "kernel",
    "dataplane",
    "inbound",
    "layout",
    "cgroup_layout",
    "e2e",
];

/// Where the end-to-end tests find a CNI runtime built for the guest (the tests build their
/// own with the host's Go otherwise): `tests/src/cniruntime.rs` reads it.
const CNI_RUNTIME_ENV: &str = "LINKERD_CNI_TEST_CNI_RUNTIME";
/// How many times slower than the host the tests' start-up limits allow
/// (`tests/src/node/mod.rs` reads it); [`FOREIGN_LIMIT_FACTOR`] in a guest of another
/// architecture.
const SLOWDOWN_ENV: &str = "LINKERD_CNI_TEST_SLOWDOWN";

/// A privileged test binary, built on the host.
#[derive(Clone, Debug)]
pub struct TestBinary {
    /// Its target name (`tests/tests/<name>.rs`).
    pub name: String,
    /// The executable cargo built.
    pub path: PathBuf,
}

/// What a guest run found.
pub struct Outcome {
    /// The guest's `uname -r`.
    pub release: String,
    /// Tests that passed.
    pub passed: usize,
    /// Tests (`binary::test`) that failed, and binaries that did not finish.
    pub failed: Vec<String>,
    /// Binaries not run because the run had to end by its deadline.
    pub not_run: Vec<String>,
    /// Wall time of the whole guest, boot included.
    pub wall: Duration,
}

/// The binaries of `cargo test -p linkerd-cni-tests --no-run` for `arch`, with the helper
/// binaries and the shipped binaries the tests execute (as `cargo xtask test` builds them on
/// the host; for another architecture see [`build_foreign`]); `only` keeps those named.
pub fn build(only: &[String], arch: Arch) -> anyhow::Result<Vec<TestBinary>> {
    if !arch.is_host() {
        return build_foreign(only, arch);
    }
    crate::build::ebpf::build_ebpf()?;
    run(cargo().args(["build", "--bins"]))?;
    crate::build::dist::build_plugin(false)?;
    let mut cmd = cargo();
    cmd.args(["test", "-p", "linkerd-cni-tests", "--tests", "--no-run"]);
    test_binaries(&mut cmd, only)
}

/// [`build`] for an architecture other than the host's: glibc, static, every crate built with
/// the cross toolchain of `cross.rs` into its target directory, where the tests look for the
/// binaries they execute (beside themselves); the CNI runtime of the end-to-end tests built by
/// Go for `arch` into the same place.
fn build_foreign(only: &[String], arch: Arch) -> anyhow::Result<Vec<TestBinary>> {
    let object = crate::build::ebpf::build_ebpf()?;
    let target = Target::new(arch, Libc::Gnu);
    run(cross::cargo_all_static(target, "build")?
        .env("LINKERD_CNI_EBPF_OBJECT", &object)
        .args(["--bins"])
        .args(
            [
                "linkerd-cni-agent",
                "linkerd-cni-plugin",
                "linkerd-cli",
                "linkerd-cni-fake-apiserver",
            ]
            .iter()
            .flat_map(|p| ["-p", p]),
        ))?;
    let mut cmd = cross::cargo_all_static(target, "test")?;
    cmd.env("LINKERD_CNI_EBPF_OBJECT", &object).args([
        "-p",
        "linkerd-cni-tests",
        "--tests",
        "--no-run",
    ]);
    let only: Vec<String> = if only.is_empty() {
        FOREIGN_DEFAULT.iter().map(|s| s.to_string()).collect()
    } else {
        only.to_vec()
    };
    let binaries = test_binaries(&mut cmd, &only)?;
    let dir = foreign_bin_dir(arch);
    cni_runtime(arch, &dir)?;
    Ok(binaries)
}

/// Where [`build_foreign`] leaves the binaries for `arch`.
fn foreign_bin_dir(arch: Arch) -> PathBuf {
    let target = Target::new(arch, Libc::Gnu);
    target.target_dir().join(target.triple()).join("debug")
}

/// The end-to-end tests' CNI runtime (`tests/cniruntime/main.go`, built against Debian's libcni
/// sources in GOPATH mode as `tests/src/cniruntime.rs` does on the host) for `arch`, into
/// `dir/cniruntime/linkerd-cni-runtime`.
fn cni_runtime(arch: Arch, dir: &Path) -> anyhow::Result<PathBuf> {
    const GOCODE: &str = "/usr/share/gocode";
    let gopath = dir.join("cniruntime").join("gopath");
    let pkg = gopath.join("src").join("linkerd-cni-runtime");
    fs::create_dir_all(&pkg)?;
    fs::copy(
        workspace().join("tests/cniruntime/main.go"),
        pkg.join("main.go"),
    )?;
    let out = dir.join("cniruntime").join("linkerd-cni-runtime");
    run(Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg("linkerd-cni-runtime")
        .current_dir(&gopath)
        .env("GO111MODULE", "off")
        .env("GOPATH", format!("{}:{GOCODE}", gopath.display()))
        .env("GOCACHE", dir.join("cniruntime").join("gocache"))
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .env("GOOS", "linux")
        .env("GOARCH", arch.oci()))
    .context("building the CNI runtime for the guest (Debian's golang-go and golang-github-appc-cni-dev)")?;
    Ok(out)
}

/// Runs `cmd` (a `cargo test --no-run`) with JSON messages and returns the test binaries it
/// built; `only` keeps those named.
fn test_binaries(cmd: &mut Command, only: &[String]) -> anyhow::Result<Vec<TestBinary>> {
    cmd.arg("--message-format=json").stderr(Stdio::inherit());
    eprintln!("+ {cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        // With JSON output the compiler's errors come on stdout too.
        if msg["reason"] == "compiler-message"
            && msg["message"]["level"] == "error"
            && let Some(rendered) = msg["message"]["rendered"].as_str()
        {
            eprint!("{rendered}");
        }
        let is_test = msg["reason"] == "compiler-artifact"
            && msg["profile"]["test"] == true
            && msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"));
        if let (true, Some(name), Some(path)) = (
            is_test,
            msg["target"]["name"].as_str(),
            msg["executable"].as_str(),
        ) {
            binaries.push(TestBinary {
                name: name.to_string(),
                path: PathBuf::from(path),
            });
        }
    }
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    if !only.is_empty() {
        let known: BTreeSet<&str> = binaries.iter().map(|b| b.name.as_str()).collect();
        if let Some(unknown) = only.iter().find(|o| !known.contains(o.as_str())) {
            bail!("no test binary {unknown} (there are: {known:?})");
        }
        binaries.retain(|b| only.contains(&b.name));
    }
    if binaries.is_empty() {
        bail!("cargo built no test binary of linkerd-cni-tests");
    }
    Ok(binaries)
}

/// The kernels `cargo xtask test` (CI) runs the privileged binaries on after the host's, in
/// this order, with the binaries each runs (every one when empty): on 5.10, below the eBPF
/// floor, the binaries of the per-node fallback the probes choose there and of the kernel
/// verdict (about 3.5 minutes: a 22 s boot, 172 s and 11 s of tests); the data-plane
/// binaries on 6.12 (about 7 minutes); then the whole suite on 6.1 (36-47 minutes: both whole
/// suites do not fit CI's 90 minutes under emulation). The short sets go first: when a busy
/// machine spends the budget, what it cuts is the end of 6.1's suite, whose binaries also ran
/// on the host, never the only kernel below the floor. `LINKERD_CNI_VM_KERNELS=none` skips
/// them.
pub const CI_KERNELS: &[(&str, &[&str])] = &[
    ("5.10", &["fallback", "kernel"]),
    (
        "6.12",
        &[
            "dataplane",
            "inbound",
            "kernel",
            "cgroup_layout",
            "coexistence",
        ],
    ),
    ("6.1", &[]),
];

/// How long after `cargo xtask test` started its guests must be done: CI stops a run at 90
/// minutes, and `cargo` builds xtask itself before the clock here starts.
/// `LINKERD_CNI_VM_BUDGET_SECS` says otherwise.
const CI_BUDGET: Duration = Duration::from_secs(80 * 60);

/// `cargo xtask test`'s guest runs: every kernel of [`CI_KERNELS`], each run whatever the
/// previous one did, all ending by [`CI_BUDGET`] after `started`; fails when any test failed
/// in any of them. Binaries the budget left no time for are named as not run, and do not fail
/// the task (they ran on the host). Each kernel's wall time goes to `phases`.
pub fn ci(args: &[String], started: Instant, phases: &mut Phases) -> anyhow::Result<()> {
    if std::env::var("LINKERD_CNI_VM_KERNELS").as_deref() == Ok("none") {
        eprintln!("vmtest: LINKERD_CNI_VM_KERNELS=none: no guest kernels");
        return Ok(());
    }
    let budget = std::env::var("LINKERD_CNI_VM_BUDGET_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(CI_BUDGET, Duration::from_secs);
    let until = started + budget;
    // Guests of the machine's own architecture (CI's is amd64).
    let arch = Arch::host().context("this machine's architecture is not one the release ships")?;
    let all = phases.run("vmtest: build", || build(&[], arch))?;
    let mut summary = Vec::new();
    let mut failed = Vec::new();
    for (kernel, only) in CI_KERNELS {
        let binaries: Vec<TestBinary> = all
            .iter()
            .filter(|b| only.is_empty() || only.contains(&b.name.as_str()))
            .cloned()
            .collect();
        if Instant::now() >= until {
            summary.push(format!(
                "{kernel}: NOT RUN: CI's time budget ({} s) is spent",
                budget.as_secs()
            ));
            continue;
        }
        let start = Instant::now();
        let result = run_guest(kernel, arch, &binaries, args, Some(until));
        let passed = result.as_ref().is_ok_and(|o| o.failed.is_empty());
        phases.record(format!("vmtest: {kernel}"), start.elapsed(), passed);
        match result {
            Ok(outcome) => {
                summary.push(format!(
                    "{} ({} binaries): {} passed, {} failed, {} s{}",
                    outcome.release,
                    binaries.len(),
                    outcome.passed,
                    outcome.failed.len(),
                    outcome.wall.as_secs(),
                    if outcome.not_run.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; NOT RUN (CI's time budget): {}",
                            outcome.not_run.join(", ")
                        )
                    }
                ));
                failed.extend(
                    outcome
                        .failed
                        .iter()
                        .map(|f| format!("{}: {f}", outcome.release)),
                );
            }
            Err(e) => {
                summary.push(format!("{kernel}: no run: {e:#}"));
                failed.push(format!("{kernel}: {e:#}"));
            }
        }
    }
    for line in &summary {
        eprintln!("vmtest: {line}");
    }
    if !failed.is_empty() {
        bail!("on guest kernels: {}", failed.join(", "));
    }
    Ok(())
}

/// `cargo xtask vmtest`: builds for `arch`, then runs `binaries` on `kernel` and fails unless
/// every test passed. A whole pass of [`FOREIGN_DEFAULT`] on another architecture, with no
/// test filter, on a commit with no uncommitted change, is recorded for `cargo xtask release`
/// ([`record_pass`]).
pub fn vmtest(kernel: &str, arch: Arch, only: &[String], args: &[String]) -> anyhow::Result<()> {
    // The commit the binaries are built from, if the work tree is as committed: a pass is
    // recorded for it only if it is still the checkout's when the run ends.
    let built_from = clean_commit()?;
    let binaries = build(only, arch)?;
    let outcome = run_guest(kernel, arch, &binaries, args, None)?;
    let whole = args.is_empty()
        && FOREIGN_DEFAULT
            .iter()
            .all(|d| binaries.iter().any(|b| b.name == *d));
    if !arch.is_host() && whole && outcome.failed.is_empty() && outcome.passed > 0 {
        record_pass(arch, &outcome, &binaries, built_from.as_deref())?;
    }
    if !outcome.failed.is_empty() {
        bail!(
            "on {} ({} s): {} failed: {}",
            outcome.release,
            outcome.wall.as_secs(),
            outcome.failed.len(),
            outcome.failed.join(", ")
        );
    }
    Ok(())
}

/// Where passes of the data-plane binaries on another architecture are recorded, one file per
/// commit and architecture: `target/vmtest/passes/<commit>-<arch>`.
fn pass_record(commit: &str, arch: Arch) -> PathBuf {
    workspace()
        .join("target")
        .join("vmtest")
        .join("passes")
        .join(format!("{commit}-{arch}"))
}

/// The checkout's commit, if its tracked files are as committed.
fn clean_commit() -> anyhow::Result<Option<String>> {
    let commit = git(&["rev-parse", "HEAD"])?;
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok((!dirty).then_some(commit))
}

/// Records that every binary of [`FOREIGN_DEFAULT`] passed on `arch` for `built_from`, the
/// commit the binaries were built from (nothing when the work tree had uncommitted changes, or
/// the checkout is at another commit now: the binaries were not the commit's).
fn record_pass(
    arch: Arch,
    outcome: &Outcome,
    binaries: &[TestBinary],
    built_from: Option<&str>,
) -> anyhow::Result<()> {
    let now = clean_commit()?;
    let (Some(commit), true) = (built_from, now.as_deref() == built_from) else {
        eprintln!(
            "vmtest: not recorded for `cargo xtask release`: the work tree had uncommitted \
             changes, or the checkout moved to another commit during the run"
        );
        return Ok(());
    };
    let path = pass_record(commit, arch);
    fs::create_dir_all(path.parent().context("record path")?)?;
    let names: Vec<&str> = binaries.iter().map(|b| b.name.as_str()).collect();
    fs::write(
        &path,
        format!(
            "commit {commit}\narch {arch}\nkernel {}\nbinaries {}\npassed {}\nwall {} s\n",
            outcome.release,
            names.join(" "),
            outcome.passed,
            outcome.wall.as_secs()
        ),
    )?;
    eprintln!("vmtest: recorded in {}", path.display());
    Ok(())
}

/// The recorded pass of the data-plane binaries on `arch` for the checkout's commit: fails,
/// saying how to make one, when there is none or the work tree differs from the commit.
pub fn recorded_pass(arch: Arch) -> anyhow::Result<String> {
    let run_it = format!(
        "run `cargo xtask vmtest --arch {arch} --kernel 6.12` on this commit first (about an \
         hour under emulation), or give `--without-{arch}-run` to release without it"
    );
    let Some(commit) = clean_commit()? else {
        bail!(
            "the work tree has uncommitted changes, so no {arch} guest run can vouch for it: commit, then {run_it}"
        );
    };
    fs::read_to_string(pass_record(&commit, arch))
        .map_err(|_| anyhow::anyhow!("no recorded {arch} guest run for commit {commit}: {run_it}"))
}

/// Boots `kernel` for `arch` and runs `binaries` in it (`args` passed to each), reporting each
/// test. With `until`, the guest is stopped then, and the binaries it had not finished are not
/// run.
pub fn run_guest(
    kernel: &str,
    arch: Arch,
    binaries: &[TestBinary],
    args: &[String],
    until: Option<Instant>,
) -> anyhow::Result<Outcome> {
    let kernel = kernel::resolve(kernel, arch)?;
    if let Some(package) = &kernel.package {
        eprintln!("vmtest: kernel {} from {package}", kernel.release);
    }
    let dir = workspace()
        .join("target")
        .join("vmtest")
        .join(&kernel.release);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The guest's root: the host's own, or a userland of the guest's architecture.
    let foreign = !arch.is_host();
    let root = if foreign {
        userland::root(arch)?
    } else {
        PathBuf::from("/")
    };
    let initrd = dir.join("initramfs.cpio");
    let layout = Layout {
        modules: kernel.modules.as_deref(),
        foreign,
    };
    initramfs::build(
        &initrd,
        &init_script(&layout),
        kernel.modules.as_deref(),
        &root.join("bin/busybox"),
    )?;
    let accel = if foreign { Accel::Tcg } else { accel() };
    let limit = match accel {
        Accel::Kvm => crate::privileged::limit(),
        Accel::Tcg if foreign => crate::privileged::limit() * FOREIGN_LIMIT_FACTOR,
        Accel::Tcg => crate::privileged::limit() * TCG_LIMIT_FACTOR,
    };
    let env: Vec<(&str, String)> = if foreign {
        let runtime = foreign_bin_dir(arch)
            .join("cniruntime")
            .join("linkerd-cni-runtime");
        vec![
            (CNI_RUNTIME_ENV, runtime.display().to_string()),
            (SLOWDOWN_ENV, FOREIGN_LIMIT_FACTOR.to_string()),
        ]
    } else {
        Vec::new()
    };
    fs::write(dir.join("run.sh"), run_script(binaries, args, limit, &env)?)?;

    let (qemu, machine): (&str, &[&str]) = match arch {
        Arch::Amd64 => ("qemu-system-x86_64", &["-machine", "q35"]),
        // `pauth-impdef`: QEMU's own pointer-authentication hash, much cheaper to emulate than
        // the architected one (the guest cannot tell).
        Arch::Arm64 => ("qemu-system-aarch64", &["-machine", "virt"]),
    };
    let console = match arch {
        Arch::Amd64 => "ttyS0",
        Arch::Arm64 => "ttyAMA0",
    };
    let mut cmd = Command::new(qemu);
    cmd.args(["-nodefaults", "-no-user-config", "-display", "none"])
        .arg("-no-reboot")
        .args(machine)
        .args(match (accel, arch) {
            (Accel::Kvm, _) => ["-accel", "kvm", "-cpu", "host"],
            (Accel::Tcg, Arch::Amd64) => ["-accel", "tcg", "-cpu", "max"],
            (Accel::Tcg, Arch::Arm64) => ["-accel", "tcg", "-cpu", "max,pauth-impdef=on"],
        })
        .args(["-smp", &CPUS.to_string(), "-m", MEMORY])
        .arg("-kernel")
        .arg(&kernel.image)
        .arg("-initrd")
        .arg(&initrd)
        .arg("-append")
        .arg(format!("console={console} panic=-1 loglevel=4"))
        .arg("-serial")
        .arg(format!("file:{}", dir.join("console.log").display()));
    let mut shares = vec![("host", root.clone(), true), ("out", dir.clone(), false)];
    if foreign {
        shares.push(("work", workspace(), true));
        if let Some(modules) = &kernel.modules {
            shares.push(("modules", modules.clone(), true));
        }
    }
    for (tag, path, readonly) in &shares {
        cmd.arg("-fsdev")
            .arg(format!(
                "local,id={tag},path={},security_model=none{}",
                path.display(),
                if *readonly {
                    ",readonly=on,multidevs=remap"
                } else {
                    ""
                }
            ))
            .arg("-device")
            .arg(format!("virtio-9p-pci,fsdev={tag},mount_tag={tag}"));
    }
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(dir.join("qemu.log"))?)
        .stderr(fs::File::create(dir.join("qemu.err"))?);
    eprintln!(
        "vmtest: booting {} ({} under {accel:?}, {CPUS} CPUs, {MEMORY}); logs in {}",
        kernel.release,
        kernel.image.display(),
        dir.display()
    );
    let start = Instant::now();
    let mut qemu = cmd.spawn().with_context(|| format!("starting {qemu}"))?;
    let deadline = BOOT_LIMIT + (limit + Duration::from_secs(30)) * binaries.len() as u32;
    let mut shown = 0;
    let mut booted = false;
    let mut cut = false;
    let status = loop {
        if let Some(status) = qemu.try_wait()? {
            break Some(status);
        }
        if !booted && let Ok(release) = fs::read_to_string(dir.join("uname")) {
            booted = true;
            eprintln!(
                "vmtest: guest {} up after {} s",
                release.trim(),
                start.elapsed().as_secs()
            );
        }
        shown = show_progress(&dir, binaries, shown);
        if start.elapsed() > deadline || (!booted && start.elapsed() > BOOT_LIMIT) {
            break None;
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            cut = true;
            break None;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    if status.is_none() {
        eprintln!(
            "vmtest: guest still running after {} s: killed{}",
            start.elapsed().as_secs(),
            if cut { " (its deadline)" } else { "" }
        );
        let _ = qemu.kill();
        let _ = qemu.wait();
    }
    show_progress(&dir, binaries, shown);
    let wall = start.elapsed();
    let outcome = collect(&dir, binaries, wall, &kernel.release, cut);
    eprintln!(
        "vmtest: kernel {}: {} passed, {} failed, {} s wall",
        outcome.release,
        outcome.passed,
        outcome.failed.len(),
        wall.as_secs()
    );
    if !outcome.failed.is_empty() {
        eprintln!(
            "vmtest: failed on {}: {}\nvmtest: console, logs and dmesg of failed binaries in {}",
            outcome.release,
            outcome.failed.join(", "),
            dir.display()
        );
    }
    Ok(outcome)
}

/// How the guest's CPU runs.
#[derive(Clone, Copy, Debug)]
enum Accel {
    Kvm,
    Tcg,
}

/// KVM when `/dev/kvm` is hardware KVM (a stock kernel boots on it), else TCG;
/// `LINKERD_CNI_VM_ACCEL=tcg|kvm` decides instead.
fn accel() -> Accel {
    match std::env::var("LINKERD_CNI_VM_ACCEL").as_deref() {
        Ok("kvm") => return Accel::Kvm,
        Ok("tcg") => return Accel::Tcg,
        _ => {}
    }
    let hardware = ["kvm_intel", "kvm_amd"]
        .iter()
        .any(|m| Path::new("/sys/module").join(m).exists());
    if hardware && Path::new("/dev/kvm").exists() {
        Accel::Kvm
    } else {
        Accel::Tcg
    }
}

/// `s` quoted for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What the guest's `/init` mounts besides the root.
struct Layout<'a> {
    /// The kernel's `lib/modules/<release>` on the host, if it has modules.
    modules: Option<&'a Path>,
    /// The root is another architecture's userland, not the host's: the modules and the
    /// workspace come over shares of their own (`modules`, `work`).
    foreign: bool,
}

/// The initramfs's `/init` (busybox sh): modules, the shared root read-only under a tmpfs
/// overlay, the node's mounts, then the run script in the new root.
fn init_script(layout: &Layout) -> String {
    const NINEP: &str = "trans=virtio,version=9p2000.L,msize=262144";
    let modules_dir = "\"$N/lib/modules/$(uname -r)\"";
    let modules_mount = match (layout.modules, layout.foreign) {
        (None, _) => String::new(),
        (Some(m), false) => {
            let m = quote(&m.display().to_string());
            format!(
                "mkdir -p {modules_dir}\n\
                 mount --bind \"$N\"{m} {modules_dir} || fail \"binding the modules\"\n"
            )
        }
        (Some(_), true) => format!(
            "mkdir -p {modules_dir}\n\
             mount -t 9p -o {NINEP},ro,cache=loose modules {modules_dir} || fail \"mounting the modules\"\n"
        ),
    };
    let workspace_mount = if layout.foreign {
        let ws = quote(&workspace().display().to_string());
        format!(
            "mkdir -p /work /rw/wupper /rw/wwork \"$N\"{ws}\n\
             mount -t 9p -o {NINEP},ro,cache=loose work /work || fail \"mounting the workspace\"\n\
             mount -t overlay -o lowerdir=/work,upperdir=/rw/wupper,workdir=/rw/wwork overlay \"$N\"{ws} || fail \"mounting the workspace's overlay\"\n"
        )
    } else {
        String::new()
    };
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() {{ echo "vmtest: init: $*"; echo o > /proc/sysrq-trigger; sleep 60; }}
echo "vmtest: init on $(uname -r)"
for m in $(cat /modules/order); do insmod "/modules/$m" || echo "vmtest: insmod $m failed"; done
mount -t 9p -o {NINEP},ro,cache=loose host /lower || fail "mounting the shared root"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || fail "mounting the overlay"
N=/newroot
mount -t proc proc $N/proc
mount -t sysfs sysfs $N/sys
mount -t devtmpfs devtmpfs $N/dev
mkdir -p $N/dev/pts $N/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $N/dev/pts
mount -t tmpfs tmpfs $N/dev/shm
mount -t cgroup2 -o nsdelegate cgroup2 $N/sys/fs/cgroup || fail "mounting cgroup2"
mount -t bpf -o mode=700 bpf $N/sys/fs/bpf || fail "mounting bpffs"
mount -t tmpfs -o mode=0755 tmpfs $N/run
mount -t tmpfs -o mode=1777 tmpfs $N/tmp
mkdir -p $N{GUEST_OUT}
mount -t 9p -o {NINEP} out $N{GUEST_OUT} || fail "mounting the run's directory"
{modules_mount}{workspace_mount}exec switch_root $N /bin/bash {GUEST_OUT}/run.sh
"#
    )
}

/// The guest's run script (bash, from the host's root): each binary under `limit`, its log,
/// status and, when it failed, the kernel log; then power off.
fn run_script(
    binaries: &[TestBinary],
    args: &[String],
    limit: Duration,
    env: &[(&str, String)],
) -> anyhow::Result<String> {
    let cwd = workspace().join("tests");
    let args: Vec<String> = args.iter().map(|a| quote(a)).collect();
    let env: String = env
        .iter()
        .map(|(k, v)| format!("export {k}={}\n", quote(v)))
        .collect();
    let mut script = format!(
        r#"#!/bin/bash
# Written by `cargo xtask vmtest`; runs in the guest.
set -u
exec </dev/null
out={GUEST_OUT}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
{env}ip link set lo up
echo "vmtest: guest up: kernel $(uname -r) ($(uname -m)), $(nproc) CPUs, cgroup $(stat -fc %T /sys/fs/cgroup)"
uname -r > "$out/uname.tmp" && mv "$out/uname.tmp" "$out/uname"
cd {cwd}
one() {{
    name=$1; exe=$2; shift 2
    echo "vmtest: $name"
    start=$(date +%s)
    "$exe" "$@" --test-threads=1 >"$out/$name.log" 2>&1 &
    pid=$!
    # Past the limit: every thread's state and kernel stack, and where gdb is, the binary's
    # backtraces, into $name.stuck; then KILL.
    ( sleep {limit}; kill -0 $pid 2>/dev/null || exit 0
      for t in /proc/[0-9]*/task/[0-9]*; do
          echo "== $t $(cat $t/comm 2>/dev/null) $(cut -d' ' -f3 $t/stat 2>/dev/null) wchan=$(cat $t/wchan 2>/dev/null) syscall=$(cat $t/syscall 2>/dev/null)"
          cat $t/stack 2>/dev/null
      done >"$out/$name.stuck"
      command -v gdb >/dev/null && timeout 300 gdb -p $pid -batch -ex 'thread apply all bt' >>"$out/$name.stuck" 2>&1
      kill -KILL $pid ) &
    watchdog=$!
    wait $pid
    rc=$?
    kill $watchdog 2>/dev/null
    if [ $rc -ne 0 ]; then dmesg >"$out/$name.dmesg"; fi
    echo "$name $rc $(( $(date +%s) - start ))" >>"$out/status"
}}
"#,
        cwd = quote(&cwd.display().to_string()),
        limit = limit.as_secs(),
    );
    for binary in binaries {
        let path = binary
            .path
            .to_str()
            .context("test binary path is not UTF-8")?;
        script.push_str(&format!(
            "one {} {} {}\n",
            quote(&binary.name),
            quote(path),
            args.join(" ")
        ));
    }
    script.push_str("sync\necho \"vmtest: done\"\necho o > /proc/sysrq-trigger\nsleep 60\n");
    Ok(script)
}

/// One line of the guest's `status` file: binary, exit code, seconds.
fn statuses(dir: &Path) -> Vec<(String, i32, u64)> {
    fs::read_to_string(dir.join("status"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.to_string(),
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Each test's result in a binary's log: (test, passed). A result is on the test's own line
/// (`test a ... ok`) or, when the test printed something of its own in between (a run with
/// `--nocapture`), alone on a later line.
fn results(log: &str) -> Vec<(String, bool)> {
    let verdict = |s: &str| match s.trim() {
        "ok" => Some(true),
        "FAILED" => Some(false),
        _ => None,
    };
    let mut out = Vec::new();
    let mut pending: Option<String> = None;
    for line in log.lines() {
        if let Some((name, result)) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.split_once(" ... "))
        {
            match verdict(result) {
                Some(ok) => out.push((name.to_string(), ok)),
                // `ignored` has no verdict; anything else is the test's own output.
                None if result.trim() == "ignored" => {}
                None => pending = Some(name.to_string()),
            }
        } else if let (Some(ok), Some(_)) = (verdict(line), pending.as_ref()) {
            out.push((pending.take().expect("pending"), ok));
        }
    }
    out
}

/// Prints the binaries finished since the `shown` first ones; returns how many are shown now.
fn show_progress(dir: &Path, binaries: &[TestBinary], shown: usize) -> usize {
    let done = statuses(dir);
    for (name, rc, secs) in done.iter().skip(shown) {
        let log = fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let tests = results(&log);
        let passed = tests.iter().filter(|(_, ok)| *ok).count();
        for (test, ok) in &tests {
            eprintln!(
                "vmtest: {name}::{test} {}",
                if *ok { "ok" } else { "FAILED" }
            );
        }
        eprintln!(
            "vmtest: {name} ({} of {}): {passed} passed, {} failed, exit {rc}, {secs} s",
            done.iter().position(|d| &d.0 == name).map_or(0, |i| i + 1),
            binaries.len(),
            tests.len() - passed
        );
    }
    done.len()
}

/// The outcome from the run's directory; when the run was `cut` at its deadline, the binaries
/// it had not finished are not run rather than failed.
fn collect(
    dir: &Path,
    binaries: &[TestBinary],
    wall: Duration,
    release: &str,
    cut: bool,
) -> Outcome {
    let release = fs::read_to_string(dir.join("uname"))
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| format!("{release} (never came up)"));
    let done = statuses(dir);
    let mut passed = 0;
    let mut failed = Vec::new();
    let mut not_run = Vec::new();
    for binary in binaries {
        let Some((_, rc, _)) = done.iter().find(|d| d.0 == binary.name) else {
            if cut {
                not_run.push(binary.name.clone());
            } else {
                failed.push(format!("{} (did not run)", binary.name));
            }
            continue;
        };
        let log = fs::read_to_string(dir.join(format!("{}.log", binary.name))).unwrap_or_default();
        let tests = results(&log);
        passed += tests.iter().filter(|(_, ok)| *ok).count();
        failed.extend(
            tests
                .iter()
                .filter(|(_, ok)| !ok)
                .map(|(t, _)| format!("{}::{t}", binary.name)),
        );
        if *rc != 0 && tests.iter().all(|(_, ok)| *ok) {
            failed.push(format!("{} (exit {rc})", binary.name));
        }
    }
    Outcome {
        release,
        passed,
        failed,
        not_run,
        wall,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_read_from_libtest_lines() {
        let log = "running 3 tests\ntest a::b ... ok\ntest c ... FAILED\ntest d ... ignored\n\
                   test result: FAILED. 1 passed; 1 failed";
        assert_eq!(
            results(log),
            vec![("a::b".to_string(), true), ("c".to_string(), false)]
        );
    }

    #[test]
    fn results_are_read_when_tests_print_their_own_lines() {
        // The arm64 guest's `kernel` binary with `--nocapture`.
        let log = "running 3 tests\ntest a ... ok\ntest b ... kernel x: probes [..]\n\
                   real: l5d_connect4: loaded\nkernel x: jit on\nok\n\
                   test c ... one round took 3ms\nFAILED\n\
                   test result: FAILED. 2 passed; 1 failed";
        assert_eq!(
            results(log),
            vec![
                ("a".to_string(), true),
                ("b".to_string(), true),
                ("c".to_string(), false)
            ]
        );
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("a'b"), r"'a'\''b'");
    }
}
