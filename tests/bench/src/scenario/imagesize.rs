//! The DaemonSet's image as `cargo xtask image` wrote it: per architecture, the size a node
//! pulls (the manifest, the config and the gzip layers, as the manifest's descriptors give
//! them), the layers unpacked, and the archive itself. Read with `tar` and `gzip`, from the
//! per-architecture archives (`<name>-<tag>-linux-<arch>.tar`).

use std::{
    io::{Read, Write},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// One architecture's image.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImageSize {
    /// `linux/amd64`, `linux/arm64`.
    pub platform: String,
    /// The archive's file name.
    pub archive: String,
    /// The archive's size.
    pub archive_bytes: u64,
    /// Manifest + config + layers (compressed): what a registry stores and a node pulls.
    pub pulled_bytes: u64,
    /// The layers, compressed.
    pub layer_bytes: u64,
    /// The layers, uncompressed (the tar streams a runtime unpacks).
    pub unpacked_bytes: u64,
    /// The manifest's digest.
    pub manifest_digest: String,
}

/// One member of a tar archive, as bytes.
fn member(archive: &Path, name: &str) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .context("running tar")?;
    if !out.status.success() {
        bail!(
            "tar -xOf {} {name}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The length of `gz` decompressed (`gzip -dc`).
fn gunzipped_len(gz: Vec<u8>) -> anyhow::Result<u64> {
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running gzip")?;
    let mut stdin = child.stdin.take().context("gzip stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(&gz));
    let mut stdout = child.stdout.take().context("gzip stdout")?;
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = stdout.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    let status = child.wait()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("gzip writer panicked"))??;
    if !status.success() {
        bail!("gzip -dc failed: {status}");
    }
    Ok(n)
}

/// A `sha256:<hex>` digest's blob path in an OCI layout.
fn blob(digest: &str) -> anyhow::Result<String> {
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("digest {digest} is not sha256"))?;
    Ok(format!("blobs/sha256/{hex}"))
}

/// Reads one per-architecture archive.
pub fn read_archive(archive: &Path) -> anyhow::Result<ImageSize> {
    let index: serde_json::Value = serde_json::from_slice(&member(archive, "index.json")?)?;
    let desc = &index["manifests"][0];
    let digest = desc["digest"].as_str().context("index.json: no manifest")?;
    let manifest_bytes = desc["size"].as_u64().unwrap_or_default();
    let manifest: serde_json::Value = serde_json::from_slice(&member(archive, &blob(digest)?)?)?;
    let config_bytes = manifest["config"]["size"].as_u64().unwrap_or_default();
    let platform = {
        let cfg: serde_json::Value = serde_json::from_slice(&member(
            archive,
            &blob(
                manifest["config"]["digest"]
                    .as_str()
                    .context("manifest: no config")?,
            )?,
        )?)?;
        format!(
            "{}/{}",
            cfg["os"].as_str().unwrap_or("?"),
            cfg["architecture"].as_str().unwrap_or("?")
        )
    };
    let mut layer_bytes = 0;
    let mut unpacked_bytes = 0;
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let d = layer["digest"].as_str().context("layer without a digest")?;
        layer_bytes += layer["size"].as_u64().unwrap_or_default();
        let bytes = member(archive, &blob(d)?)?;
        unpacked_bytes += match layer["mediaType"].as_str() {
            Some(t) if t.ends_with("gzip") => gunzipped_len(bytes)?,
            _ => bytes.len() as u64,
        };
    }
    Ok(ImageSize {
        platform,
        archive: archive
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        archive_bytes: std::fs::metadata(archive)?.len(),
        pulled_bytes: manifest_bytes + config_bytes + layer_bytes,
        layer_bytes,
        unpacked_bytes,
        manifest_digest: digest.to_string(),
    })
}

/// Every per-architecture archive in `dir` (`*-linux-*.tar`), sorted by name.
pub fn read_dir(dir: &Path) -> anyhow::Result<Vec<ImageSize>> {
    let mut archives: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("-linux-") && n.ends_with(".tar"))
        })
        .collect();
    archives.sort();
    archives.iter().map(|a| read_archive(a)).collect()
}
