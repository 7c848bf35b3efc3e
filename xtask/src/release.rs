//! `cargo xtask release [--out DIR] [--chart-url URL]`: everything a release publishes, in
//! `dist/` (git-ignored), reproducibly (two runs on one commit give the same `SHA256SUMS`):
//!
//! - the image archives of `cargo xtask image` (see `image.rs`): the multi-platform OCI archive
//!   and one archive per architecture;
//! - the chart, packaged by `helm package` (`linkerd2-cni-<version>.tgz`), and a chart
//!   repository's `index.yaml` (`helm repo index`): serve the directory over HTTP(S) and
//!   `helm repo add` it, or `helm install` the `.tgz` directly;
//! - the `linkerd` CLI, static (musl), for linux/amd64 and linux/arm64
//!   (`linkerd-<tag>-linux-<arch>`);
//! - `SHA256SUMS` of all of them (`sha256sum -c SHA256SUMS`).
//!
//! It packages only a commit whose arm64 binaries have passed the data-plane tests on an arm64
//! kernel: `cargo xtask vmtest --arch arm64 --kernel 6.12` records such a pass (CI runs only
//! amd64 guests, see `vmtest.rs`); `--without-arm64-run` releases without one, saying so.
//!
//! `helm package` takes the chart files' modification times and `helm repo index` stamps the
//! current time: the chart is packaged from a copy whose times are `SOURCE_DATE_EPOCH`, and
//! the index's `created` and `generated` are set to it too.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use serde_yaml_ng::Value as Yaml;

use crate::{
    build::{
        cross, elf,
        image::{self, CHART_DIR, Provenance},
        target::{Arch, Libc, Target},
    },
    exec::{run, workspace},
};

/// The CLI's package and binary.
const CLI_PACKAGE: &str = "linkerd-cli";
const CLI_BIN: &str = "linkerd";

/// The CLI's file name in a release.
pub fn cli_file(tag: &str, arch: Arch) -> String {
    format!("{CLI_BIN}-{tag}-linux-{}", arch.oci())
}

/// Builds the CLI as released for `arch`: static musl, not position-independent, as the
/// plugin is. The default static-pie link through Debian's `musl-gcc` gave a PIE that still
/// names `/lib/ld-musl-x86_64.so.1` as its interpreter (`file`), which `check_static_for`
/// refused, so `cargo xtask release` never completed.
pub fn build_cli(arch: Arch) -> anyhow::Result<PathBuf> {
    let cli = cross::build(&cross::Build {
        target: Target::new(arch, Libc::Musl),
        package: CLI_PACKAGE,
        bin: CLI_BIN,
        release: true,
        rustc_flags: &["-C", "relocation-model=static"],
        envs: Vec::new(),
    })?;
    elf::check_static_for(&cli, arch)?;
    Ok(cli)
}

/// `cargo xtask release`; `arm64_run` requires a recorded arm64 guest pass of the commit.
pub fn release(out: &Path, chart_url: Option<&str>, arm64_run: bool) -> anyhow::Result<()> {
    if Command::new("helm").arg("version").output().is_err() {
        bail!("helm is missing: `cargo xtask setup` installs it");
    }
    if arm64_run {
        let record = crate::vmtest::recorded_pass(Arch::Arm64)?;
        eprintln!("release: the arm64 guest run of this commit:\n{record}");
    } else {
        eprintln!(
            "release: WARNING: --without-arm64-run: no arm64 kernel has run this commit's arm64 binaries"
        );
    }
    let prov = Provenance::of_checkout()?;
    let meta = image::chart_meta(&workspace())?;
    if meta.version != env!("CARGO_PKG_VERSION") {
        bail!(
            "Chart.yaml says version {}, the workspace {}: they move together",
            meta.version,
            env!("CARGO_PKG_VERSION")
        );
    }
    // A fresh directory: nothing of an earlier release stays beside this one.
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    std::fs::create_dir_all(out)?;

    image::image(out, &Arch::ALL)?;

    for arch in Arch::ALL {
        let built = build_cli(arch)?;
        let to = out.join(cli_file(&prov.name.tag, arch));
        std::fs::copy(&built, &to)
            .with_context(|| format!("copying {} to {}", built.display(), to.display()))?;
        check_cli_version(&to, arch)?;
    }

    package_chart(out, &prov, &format!("{}-{}.tgz", meta.name, meta.version))?;
    let mut index = Command::new("helm");
    index.args(["repo", "index"]).arg(out);
    if let Some(url) = chart_url {
        index.args(["--url", url]);
    }
    run(&mut index)?;
    pin_index_times(&out.join("index.yaml"), &prov.created())?;

    let sums = sha256sums(out)?;
    std::fs::write(out.join("SHA256SUMS"), &sums)?;
    print!("{sums}");
    eprintln!("release {} in {}", prov.name.tag, out.display());
    Ok(())
}

/// Runs the CLI (under qemu-user for another architecture, when installed) and checks that it
/// says the workspace version.
fn check_cli_version(cli: &Path, arch: Arch) -> anyhow::Result<()> {
    let mut cmd = if arch.is_host() {
        Command::new(cli)
    } else {
        let qemu = cross::qemu(arch);
        if !Path::new(&qemu).exists() {
            eprintln!("note: {qemu} is missing: the {arch} CLI was not run");
            return Ok(());
        }
        let mut c = Command::new(qemu);
        c.arg(cli);
        c
    };
    let out = cmd.arg("--version").output()?;
    let said = String::from_utf8_lossy(&out.stdout);
    let want = format!("{CLI_BIN} {}", env!("CARGO_PKG_VERSION"));
    if !out.status.success() || said.trim() != want {
        bail!(
            "{} --version said {said:?}, expected {want:?}",
            cli.display()
        );
    }
    Ok(())
}

/// `helm package` of a copy of the chart whose files' times are the release's.
fn package_chart(out: &Path, prov: &Provenance, expect: &str) -> anyhow::Result<()> {
    let copy = workspace().join("target/release-chart");
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(&copy)?;
    let chart = workspace().join(CHART_DIR);
    run(Command::new("cp").arg("-R").arg(&chart).arg(&copy))?;
    let name = chart.file_name().context("the chart's directory name")?;
    let copied = copy.join(name);
    run(Command::new("find")
        .arg(&copied)
        .args(["-exec", "touch", "-h", "-d"])
        .arg(format!("@{}", prov.epoch))
        .args(["{}", "+"]))?;
    run(Command::new("helm")
        .arg("package")
        .arg(&copied)
        .arg("--destination")
        .arg(out))?;
    let _ = std::fs::remove_dir_all(&copy);
    if !out.join(expect).exists() {
        bail!("helm package wrote no {expect}");
    }
    Ok(())
}

/// Sets every `created` of the chart repository index and its `generated` to `time`.
fn pin_index_times(index: &Path, time: &str) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let mut doc: Yaml = serde_yaml_ng::from_str(&text)?;
    let time = Yaml::String(time.to_string());
    let Some(map) = doc.as_mapping_mut() else {
        bail!("{} is not a mapping", index.display());
    };
    map.insert("generated".into(), time.clone());
    if let Some(entries) = map.get_mut("entries").and_then(Yaml::as_mapping_mut) {
        for (_, versions) in entries.iter_mut() {
            for version in versions.as_sequence_mut().into_iter().flatten() {
                if let Some(v) = version.as_mapping_mut() {
                    v.insert("created".into(), time.clone());
                }
            }
        }
    }
    std::fs::write(index, serde_yaml_ng::to_string(&doc)?)?;
    Ok(())
}

/// `sha256sum`'s output for every file of `dir`, by name.
fn sha256sums(dir: &Path) -> anyhow::Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "SHA256SUMS")
        .collect();
    names.sort();
    let out = Command::new("sha256sum")
        .args(&names)
        .current_dir(dir)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_times_are_pinned() {
        let dir = std::env::temp_dir().join(format!("xtask-index-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let index = dir.join("index.yaml");
        std::fs::write(
            &index,
            "apiVersion: v1\nentries:\n  linkerd2-cni:\n  - name: linkerd2-cni\n    created: \"2026-01-01T01:02:03.4Z\"\n    version: 0.1.0\ngenerated: \"2026-01-01T01:02:03.5Z\"\n",
        )
        .unwrap();
        pin_index_times(&index, "2025-11-26T08:00:00Z").unwrap();
        let doc: Yaml = serde_yaml_ng::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
        assert_eq!(doc["generated"], Yaml::from("2025-11-26T08:00:00Z"));
        assert_eq!(
            doc["entries"]["linkerd2-cni"][0]["created"],
            Yaml::from("2025-11-26T08:00:00Z")
        );
        assert_eq!(
            doc["entries"]["linkerd2-cni"][0]["version"],
            Yaml::from("0.1.0")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sums_cover_every_file_but_themselves() {
        let dir = std::env::temp_dir().join(format!("xtask-sums-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b"), "b").unwrap();
        std::fs::write(dir.join("a"), "").unwrap();
        std::fs::write(dir.join("SHA256SUMS"), "old").unwrap();
        assert_eq!(
            sha256sums(&dir).unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  a\n\
             3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d  b\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cli_files_name_tag_and_platform() {
        assert_eq!(
            cli_file("v0.1.0", Arch::Arm64),
            "linkerd-v0.1.0-linux-arm64"
        );
    }
}
