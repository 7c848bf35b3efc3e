//! The DaemonSet's image in the tests: the OCI archive `cargo xtask image` built in the same
//! run (named by [`IMAGE_ENV`]), or, when that variable is unset, a stand-in built here from
//! the workspace's own binaries with the image's file layout: the agent on `PATH`
//! (`/usr/local/bin/linkerd-cni-agent`, plus the shared libraries it links when it is not
//! static) and the plugin where the installer copies it from (`/opt/cni/bin/linkerd-cni`).
//! Nothing else: no shell.
//!
//! Either archive is imported into the node's containerd with `ctr images import` and, when
//! the names differ, tagged with the image reference the rendered DaemonSet names, so that the
//! pod spec runs exactly as rendered.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};

use super::{AGENT_BIN, PLUGIN_BIN, workspace_bin};
use crate::{
    error::{Error, IoContext, Result},
    names,
};

/// The image archive `cargo xtask test` builds with `cargo xtask image` and hands to the
/// privileged tests.
pub const IMAGE_ENV: &str = "LINKERD_CNI_TEST_IMAGE";

/// `PATH` in the stand-in image's config.
const IMAGE_PATH: &str = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where the DaemonSet's image came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageOrigin {
    /// `cargo xtask image` (the archive named by [`IMAGE_ENV`]).
    Xtask(PathBuf),
    /// Built by this crate from the workspace's binaries.
    StandIn(PathBuf),
}

impl ImageOrigin {
    /// The archive.
    pub fn archive(&self) -> &Path {
        match self {
            ImageOrigin::Xtask(p) | ImageOrigin::StandIn(p) => p,
        }
    }
}

impl std::fmt::Display for ImageOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageOrigin::Xtask(p) => write!(f, "`cargo xtask image` archive {}", p.display()),
            ImageOrigin::StandIn(p) => write!(
                f,
                "stand-in archive {} (the workspace's binaries; {IMAGE_ENV} unset)",
                p.display()
            ),
        }
    }
}

/// The archive to import: `$LINKERD_CNI_TEST_IMAGE` when set (it must exist), else a stand-in
/// built in `work` under the name `reference`.
pub fn agent_image(work: &Path, reference: &str) -> Result<ImageOrigin> {
    if let Some(path) = std::env::var_os(IMAGE_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(Error::Missing(format!(
                "{IMAGE_ENV}={} is not a file (build it with `cargo xtask image`)",
                path.display()
            )));
        }
        return Ok(ImageOrigin::Xtask(path));
    }
    build_stand_in(work, reference).map(ImageOrigin::StandIn)
}

/// The names (`io.containerd.image.name`, else `org.opencontainers.image.ref.name`) an OCI
/// archive's index gives its images.
pub fn archive_names(archive: &Path) -> Result<Vec<String>> {
    let index = names::run(
        Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg("index.json"),
    )?;
    let index: Value = serde_json::from_str(&index).map_err(|e| Error::Parse {
        what: format!("index.json of {}", archive.display()),
        detail: e.to_string(),
    })?;
    Ok(index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let a = &m["annotations"];
            a["io.containerd.image.name"]
                .as_str()
                .or(a["org.opencontainers.image.ref.name"].as_str())
                .map(str::to_string)
        })
        .collect())
}

/// Builds the stand-in image archive in `work`, named `reference`; returns its path.
fn build_stand_in(work: &Path, reference: &str) -> Result<PathBuf> {
    let layer = work.join("rootfs");
    let oci = work.join("oci");
    for d in [
        layer.join("usr/local/bin"),
        layer.join("opt/cni/bin"),
        oci.join("blobs/sha256"),
    ] {
        fs::create_dir_all(&d).ctx(|| format!("creating {}", d.display()))?;
    }
    let mut libraries = std::collections::BTreeSet::new();
    for (bin, to) in [
        (AGENT_BIN, Path::new("usr/local/bin").join(AGENT_BIN)),
        (PLUGIN_BIN, Path::new("opt/cni/bin").join(PLUGIN_BIN)),
    ] {
        let from = workspace_bin(bin)?;
        // Debug builds carry hundreds of MB of debug info: the image needs none of it.
        names::run(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(layer.join(&to))
                .arg(&from),
        )?;
        libraries.extend(shared_libraries(&from)?);
    }
    for lib in &libraries {
        let rel = lib.strip_prefix("/").unwrap_or(lib);
        let to = layer.join(rel);
        if let Some(dir) = to.parent() {
            fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        }
        fs::copy(lib, &to).ctx(|| format!("copying {}", lib.display()))?;
    }
    let layer_tar = work.join("layer.tar");
    names::run(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&layer)
            .arg("-cf")
            .arg(&layer_tar)
            .arg("."),
    )?;
    let (layer_digest, layer_size) = store_blob(&oci, &layer_tar)?;
    let config = json!({
        "architecture": super::cri::oci_arch(),
        "os": "linux",
        "config": {"Env": [format!("PATH={IMAGE_PATH}")]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = store_json(&oci, work, &config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer_size,
        }],
    });
    let (digest, size) = store_json(&oci, work, &manifest)?;
    let tag = reference.rsplit(':').next().unwrap_or("latest");
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": size,
            "platform": {"architecture": super::cri::oci_arch(), "os": "linux"},
            "annotations": {
                "io.containerd.image.name": reference,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    fs::write(oci.join("index.json"), index.to_string()).ctx(|| "writing index.json")?;
    fs::write(oci.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .ctx(|| "writing oci-layout")?;
    let archive = work.join("agent-image.tar");
    names::run(
        Command::new("tar")
            .arg("-C")
            .arg(&oci)
            .arg("-cf")
            .arg(&archive)
            .args(["oci-layout", "index.json", "blobs"]),
    )?;
    fs::remove_dir_all(&layer).ctx(|| "removing the stand-in's rootfs")?;
    fs::remove_dir_all(&oci).ctx(|| "removing the stand-in's layout")?;
    Ok(archive)
}

/// The shared libraries `bin` loads (`ldd`), none for a static binary.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .ctx(|| format!("ldd {}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Moves `path` into the layout's blobs under its digest; returns the digest and size.
fn store_blob(oci: &Path, path: &Path) -> Result<(String, u64)> {
    let hex = super::cri::sha256_file(path)?;
    let size = fs::metadata(path)
        .ctx(|| format!("stat {}", path.display()))?
        .len();
    fs::rename(path, oci.join("blobs/sha256").join(&hex)).ctx(|| format!("storing blob {hex}"))?;
    Ok((format!("sha256:{hex}"), size))
}

fn store_json(oci: &Path, work: &Path, value: &Value) -> Result<(String, u64)> {
    let path = work.join("blob.json");
    fs::write(&path, value.to_string()).ctx(|| "writing a JSON blob")?;
    store_blob(oci, &path)
}
