//! `cargo xtask image`: the DaemonSet's image, built from this checkout, as OCI image
//! archives for linux/amd64 and linux/arm64, the same bytes on every build of one commit.
//!
//! The image is one layer: the agent (which is also the installer) on `PATH` and the plugin
//! where the installer copies it from (see `dist.rs`), both static; no shell, no libraries, no
//! other file (the DaemonSet's commands are `linkerd-cni-agent run` and `linkerd-cni-agent
//! mount-bpffs`, executed directly). Its name and tag are the chart's (`image.name` in
//! `values.yaml`, `appVersion` in `Chart.yaml`: the one place they are defined; the CLI embeds
//! the same files and a test holds `appVersion` to the workspace version).
//!
//! The archives (in `target/image`, or `--out`), all OCI image layouts in a tar:
//! - `<name>-<tag>.oci.tar`: the multi-platform image: an image index with one manifest per
//!   architecture. For `ctr -n k8s.io images import`, `skopeo copy --all oci-archive:...` (to
//!   push it to a registry), podman, and Docker 25 or later.
//! - `<name>-<tag>-linux-<arch>.tar`: one architecture, with a Docker `manifest.json` beside
//!   the OCI layout, so every `docker load` and `podman load` accepts it too, and `kind load
//!   image-archive` / `k3s ctr images import` on a node of that architecture.
//!
//! The image names itself in the layout's `index.json` with its full reference
//! (`ghcr.io/linkerd/linkerd-cni-ebpf:v0.1.0`) under the two annotations tools look for:
//! `io.containerd.image.name` (containerd's `ctr import`, Docker) and OCI's own
//! `org.opencontainers.image.ref.name` (skopeo and podman, which write the full reference
//! there themselves).
//!
//! Reproducible: every time in the image (file times, the config's `created`, its history)
//! is `SOURCE_DATE_EPOCH`, by default the time of the checkout's commit; files are owned by
//! 0:0 with fixed modes, in sorted order; gzip without a name or time; JSON with sorted keys.
//! The types are OCI's (`oci-spec`), the layer a `tar` crate archive: nothing is assembled
//! by hand but the byte order, which is what reproducibility needs to pin down.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use oci_spec::image::{
    Arch as OciArch, ConfigBuilder, Descriptor, HistoryBuilder, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, Os, PlatformBuilder, RootFsBuilder,
    Sha256Digest,
};
use serde_json::Value as Json;
use sha2::{Digest as _, Sha256};

use crate::{
    build::{dist, target::Arch},
    exec::{git, workspace},
};

/// The chart, whose files name the image.
pub const CHART_DIR: &str = "deploy/charts/linkerd2-cni";
/// The image's `PATH`: where the DaemonSet's commands are found (the agent is in
/// `/usr/local/bin`; the other directories do not exist and cost nothing).
pub const PATH_ENV: &str = "PATH=/usr/local/bin:/usr/bin:/bin";
/// Where the project lives (the `org.opencontainers.image.source` label).
const SOURCE_URL: &str = "https://github.com/linkerd/linkerd-cni-ebpf";

/// The image's name and tag, as the chart renders them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageName {
    /// `ghcr.io/linkerd/linkerd-cni-ebpf`: `image.name` in `values.yaml`.
    pub repository: String,
    /// `v0.1.0`: `image.version` in `values.yaml`, else `appVersion` in `Chart.yaml` (as the
    /// DaemonSet's template chooses).
    pub tag: String,
}

impl ImageName {
    /// `repository:tag`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.repository, self.tag)
    }

    /// The archives' file name stem: the repository's last part and the tag
    /// (`linkerd-cni-ebpf-v0.1.0`).
    pub fn file_stem(&self) -> String {
        let base = self
            .repository
            .rsplit_once('/')
            .map_or(self.repository.as_str(), |(_, b)| b);
        format!("{base}-{}", self.tag)
    }

    /// The multi-platform archive's file name.
    pub fn index_archive(&self) -> String {
        format!("{}.oci.tar", self.file_stem())
    }

    /// One architecture's archive's file name.
    pub fn arch_archive(&self, arch: Arch) -> String {
        format!("{}-linux-{}.tar", self.file_stem(), arch.oci())
    }
}

/// `Chart.yaml`'s fields this task reads.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartMeta {
    pub name: String,
    pub version: String,
    pub app_version: String,
}

/// Reads `Chart.yaml` of the chart in `workspace`.
pub fn chart_meta(workspace: &Path) -> anyhow::Result<ChartMeta> {
    let path = workspace.join(CHART_DIR).join("Chart.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The image the chart in `workspace` deploys by default.
pub fn chart_image(workspace: &Path) -> anyhow::Result<ImageName> {
    #[derive(serde::Deserialize)]
    struct Values {
        image: ImageValues,
    }
    #[derive(serde::Deserialize)]
    struct ImageValues {
        name: String,
        #[serde(default)]
        version: String,
    }
    let meta = chart_meta(workspace)?;
    let path = workspace.join(CHART_DIR).join("values.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let values: Values =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let tag = if values.image.version.is_empty() {
        meta.app_version
    } else {
        values.image.version
    };
    Ok(ImageName {
        repository: values.image.name,
        tag,
    })
}

/// What the image records about its build.
#[derive(Clone, Debug)]
pub struct Provenance {
    pub name: ImageName,
    /// Seconds since the epoch: every time in the image.
    pub epoch: u64,
    /// The commit built (the `org.opencontainers.image.revision` label).
    pub revision: String,
}

impl Provenance {
    /// The checkout's: the chart's name and tag, `SOURCE_DATE_EPOCH` if set, else the commit's
    /// time, and the commit. Warns when the work tree differs from the commit (the image then
    /// holds what the commit does not).
    pub fn of_checkout() -> anyhow::Result<Self> {
        let root = workspace();
        let revision = git(&["rev-parse", "HEAD"])?;
        let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(s) => s
                .trim()
                .parse()
                .with_context(|| format!("SOURCE_DATE_EPOCH={s:?} is not a number"))?,
            Err(_) => git(&["log", "-1", "--format=%ct", "HEAD"])?
                .parse()
                .context("the commit's time")?,
        };
        if !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
            eprintln!(
                "warning: the work tree has changes that are not in {revision}: the image holds them, \
                 its revision label does not say so"
            );
        }
        Ok(Self {
            name: chart_image(&root)?,
            epoch,
            revision,
        })
    }

    /// `epoch` as RFC 3339 (UTC).
    pub fn created(&self) -> String {
        rfc3339(self.epoch)
    }
}

/// `seconds` since the epoch as RFC 3339 in UTC (`2025-11-26T08:00:00Z`).
pub fn rfc3339(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let rem = seconds % 86_400;
    // Days to a civil date (proleptic Gregorian), H. Hinnant's algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// Content with its media type and digest.
#[derive(Clone, Debug)]
pub struct Blob {
    pub media_type: MediaType,
    pub bytes: Vec<u8>,
    /// Hex SHA-256 of `bytes`.
    pub sha256: String,
}

impl Blob {
    pub fn new(media_type: MediaType, bytes: Vec<u8>) -> Self {
        let sha256 = sha256_hex(&bytes);
        Self {
            media_type,
            bytes,
            sha256,
        }
    }

    /// A JSON document, with sorted keys and no whitespace.
    pub fn json<T: serde::Serialize>(media_type: MediaType, value: &T) -> anyhow::Result<Self> {
        Ok(Self::new(media_type, canonical_json(value)?))
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> String {
        format!("sha256:{}", self.sha256)
    }

    /// Its path in an OCI layout.
    pub fn path(&self) -> String {
        format!("blobs/sha256/{}", self.sha256)
    }

    pub fn descriptor(&self) -> anyhow::Result<Descriptor> {
        let digest: Sha256Digest = self.sha256.parse()?;
        Ok(Descriptor::new(
            self.media_type.clone(),
            self.bytes.len() as u64,
            digest,
        ))
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `value` as JSON with every object's keys sorted (oci-spec keeps labels and annotations in
/// hash maps, whose order changes from run to run), without whitespace.
pub fn canonical_json<T: serde::Serialize>(value: &T) -> anyhow::Result<Vec<u8>> {
    fn sort(v: Json) -> Json {
        match v {
            Json::Object(map) => {
                let sorted: BTreeMap<String, Json> =
                    map.into_iter().map(|(k, v)| (k, sort(v))).collect();
                Json::Object(sorted.into_iter().collect())
            }
            Json::Array(items) => Json::Array(items.into_iter().map(sort).collect()),
            other => other,
        }
    }
    Ok(serde_json::to_vec(&sort(serde_json::to_value(value)?))?)
}

/// One file of the image's root filesystem.
#[derive(Clone, Debug)]
pub struct File {
    /// Relative path (`usr/local/bin/linkerd-cni-agent`).
    pub path: String,
    pub mode: u32,
    pub content: Vec<u8>,
}

/// The layer as an uncompressed tar: every parent directory (0755) and file, sorted by path,
/// owned by 0:0, every time `mtime`.
pub fn layer_tar(files: &[File], mtime: u64) -> anyhow::Result<Vec<u8>> {
    let mut entries: BTreeMap<String, Option<&File>> = BTreeMap::new();
    for file in files {
        if file.path.starts_with('/') || file.path.split('/').any(|c| c.is_empty() || c == "..") {
            bail!("{:?} is not a plain relative path", file.path);
        }
        let mut dir = String::new();
        let parts: Vec<&str> = file.path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            dir.push_str(part);
            dir.push('/');
            entries.entry(dir.clone()).or_insert(None);
        }
        if entries.insert(file.path.clone(), Some(file)).is_some() {
            bail!("{} is in the image twice", file.path);
        }
    }
    let mut tar = tar::Builder::new(Vec::new());
    for (path, file) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        match file {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                tar.append_data(&mut header, &path, std::io::empty())?;
            }
            Some(file) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(file.mode);
                header.set_size(file.content.len() as u64);
                tar.append_data(&mut header, &path, file.content.as_slice())?;
            }
        }
    }
    Ok(tar.into_inner()?)
}

/// gzip at the best compression, with no file name and time in its header.
pub fn gzip(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

/// One architecture's image: its manifest, config and layer.
#[derive(Clone, Debug)]
pub struct PlatformImage {
    pub arch: Arch,
    pub manifest: Blob,
    pub config: Blob,
    pub layer: Blob,
    /// The layer's uncompressed size.
    pub unpacked_size: u64,
}

impl PlatformImage {
    /// Builds the image of `arch` holding `files`.
    pub fn build(arch: Arch, files: &[File], prov: &Provenance) -> anyhow::Result<Self> {
        let tar = layer_tar(files, prov.epoch)?;
        let unpacked_size = tar.len() as u64;
        let diff_id = format!("sha256:{}", sha256_hex(&tar));
        let layer = Blob::new(MediaType::ImageLayerGzip, gzip(&tar)?);
        let created = prov.created();
        let labels: std::collections::HashMap<String, String> = [
            ("org.opencontainers.image.title", "linkerd-cni-ebpf"),
            (
                "org.opencontainers.image.description",
                "linkerd-cni in eBPF mode: the node agent (also the installer) and the CNI plugin",
            ),
            ("org.opencontainers.image.source", SOURCE_URL),
            ("org.opencontainers.image.licenses", "Apache-2.0"),
            ("org.opencontainers.image.version", &prov.name.tag),
            ("org.opencontainers.image.revision", &prov.revision),
            ("org.opencontainers.image.created", &created),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = ImageConfigurationBuilder::default()
            .created(created.clone())
            .architecture(oci_arch(arch))
            .os(Os::Linux)
            .config(
                ConfigBuilder::default()
                    .env(vec![PATH_ENV.to_string()])
                    // `docker run IMAGE --version` runs the agent; the DaemonSet's `command`
                    // replaces both.
                    .entrypoint(vec![dist::AGENT_BIN.to_string()])
                    .cmd(vec!["run".to_string()])
                    .working_dir("/")
                    .labels(labels.clone())
                    .build()?,
            )
            .rootfs(
                RootFsBuilder::default()
                    .typ("layers")
                    .diff_ids(vec![diff_id])
                    .build()?,
            )
            .history(vec![
                HistoryBuilder::default()
                    .created(created)
                    .created_by("cargo xtask image")
                    .comment("linkerd-cni-agent and the linkerd-cni plugin, static binaries")
                    .build()?,
            ])
            .build()?;
        let config = Blob::json(MediaType::ImageConfig, &config)?;
        let manifest = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(config.descriptor()?)
            .layers(vec![layer.descriptor()?])
            .annotations(
                labels
                    .into_iter()
                    .filter(|(k, _)| k != "org.opencontainers.image.description")
                    .collect::<std::collections::HashMap<_, _>>(),
            )
            .build()?;
        let manifest = Blob::json(MediaType::ImageManifest, &manifest)?;
        Ok(Self {
            arch,
            manifest,
            config,
            layer,
            unpacked_size,
        })
    }

    /// The manifest's descriptor, with its platform.
    pub fn descriptor(&self) -> anyhow::Result<Descriptor> {
        let mut d = self.manifest.descriptor()?;
        d.set_platform(Some(
            PlatformBuilder::default()
                .architecture(oci_arch(self.arch))
                .os(Os::Linux)
                .build()?,
        ));
        Ok(d)
    }

    /// Its size in a registry: manifest, config and compressed layer.
    pub fn pushed_size(&self) -> u64 {
        (self.manifest.bytes.len() + self.config.bytes.len() + self.layer.bytes.len()) as u64
    }
}

fn oci_arch(arch: Arch) -> OciArch {
    match arch {
        Arch::Amd64 => OciArch::Amd64,
        Arch::Arm64 => OciArch::ARM64,
    }
}

/// `d` named `name` for the tools reading a layout's `index.json`.
fn named(mut d: Descriptor, name: &ImageName) -> Descriptor {
    d.set_annotations(Some(
        [
            ("io.containerd.image.name".to_string(), name.reference()),
            (
                "org.opencontainers.image.ref.name".to_string(),
                name.reference(),
            ),
        ]
        .into_iter()
        .collect(),
    ));
    d
}

/// An OCI image layout in a tar: `oci-layout`, `index.json` naming `top`, every blob, and
/// `docker` (`manifest.json`) if given. Entries sorted, owned by 0:0, every time `mtime`.
fn layout_tar(
    top: Descriptor,
    blobs: &[&Blob],
    docker: Option<Vec<u8>>,
    mtime: u64,
) -> anyhow::Result<Vec<u8>> {
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![top])
        .build()?;
    let mut files = vec![
        File {
            path: "oci-layout".into(),
            mode: 0o644,
            content: br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        },
        File {
            path: "index.json".into(),
            mode: 0o644,
            content: canonical_json(&index)?,
        },
    ];
    if let Some(docker) = docker {
        files.push(File {
            path: "manifest.json".into(),
            mode: 0o644,
            content: docker,
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    for blob in blobs {
        if seen.insert(&blob.sha256) {
            files.push(File {
                path: blob.path(),
                mode: 0o644,
                content: blob.bytes.clone(),
            });
        }
    }
    layer_tar(&files, mtime)
}

/// Docker's `manifest.json` (`docker save`'s format) for one image of a layout: `docker
/// load` before Docker 25 reads only this.
fn docker_manifest(image: &PlatformImage, name: &ImageName) -> anyhow::Result<Vec<u8>> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "PascalCase")]
    struct Entry {
        config: String,
        repo_tags: Vec<String>,
        layers: Vec<String>,
    }
    canonical_json(&[Entry {
        config: image.config.path(),
        repo_tags: vec![name.reference()],
        layers: vec![image.layer.path()],
    }])
}

/// The image of every architecture built: the per-architecture images and their index.
#[derive(Clone, Debug)]
pub struct Image {
    pub name: ImageName,
    pub platforms: Vec<PlatformImage>,
    pub index: Blob,
}

impl Image {
    /// Builds the images of `files` (per architecture) and their index.
    pub fn build(files: &[(Arch, Vec<File>)], prov: &Provenance) -> anyhow::Result<Self> {
        let platforms = files
            .iter()
            .map(|(arch, files)| PlatformImage::build(*arch, files, prov))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(
                platforms
                    .iter()
                    .map(PlatformImage::descriptor)
                    .collect::<anyhow::Result<Vec<_>>>()?,
            )
            .build()?;
        Ok(Self {
            name: prov.name.clone(),
            platforms,
            index: Blob::json(MediaType::ImageIndex, &index)?,
        })
    }

    /// The multi-platform archive: the index and every platform's blobs.
    pub fn index_archive(&self, mtime: u64) -> anyhow::Result<Vec<u8>> {
        let mut blobs = vec![&self.index];
        for p in &self.platforms {
            blobs.extend([&p.manifest, &p.config, &p.layer]);
        }
        layout_tar(
            named(self.index.descriptor()?, &self.name),
            &blobs,
            None,
            mtime,
        )
    }

    /// One platform's archive, with Docker's `manifest.json`.
    pub fn arch_archive(&self, p: &PlatformImage, mtime: u64) -> anyhow::Result<Vec<u8>> {
        layout_tar(
            named(p.descriptor()?, &self.name),
            &[&p.manifest, &p.config, &p.layer],
            Some(docker_manifest(p, &self.name)?),
            mtime,
        )
    }

    /// Writes every archive into `out`; returns their paths (the multi-platform one first).
    pub fn write(&self, out: &Path, mtime: u64) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let mut written = Vec::new();
        let path = out.join(self.name.index_archive());
        std::fs::write(&path, self.index_archive(mtime)?)
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        for p in &self.platforms {
            let path = out.join(self.name.arch_archive(p.arch));
            std::fs::write(&path, self.arch_archive(p, mtime)?)
                .with_context(|| format!("writing {}", path.display()))?;
            written.push(path);
        }
        Ok(written)
    }
}

/// The image's files for `arch`, read from what `dist.rs` built: the agent and the plugin,
/// both executable.
fn image_files(built: &[(String, PathBuf)]) -> anyhow::Result<Vec<File>> {
    built
        .iter()
        .map(|(path, from)| {
            Ok(File {
                path: path.clone(),
                mode: 0o755,
                content: std::fs::read(from)
                    .with_context(|| format!("reading {}", from.display()))?,
            })
        })
        .collect()
}

/// `cargo xtask image [--out DIR] [--arch ARCH ...]`: builds the binaries of every
/// architecture (all by default) and writes the archives into `out`; returns the image and the
/// archives' paths.
pub fn image(out: &Path, archs: &[Arch]) -> anyhow::Result<(Image, Vec<PathBuf>)> {
    let prov = Provenance::of_checkout()?;
    let mut files = Vec::new();
    for &arch in archs {
        files.push((arch, image_files(&dist::build_image_files(arch)?)?));
    }
    let image = Image::build(&files, &prov)?;
    let written = image.write(out, prov.epoch)?;
    println!("{}", image.name.reference());
    println!(
        "  index    {}  (created {})",
        image.index.digest(),
        prov.created()
    );
    for p in &image.platforms {
        println!(
            "  linux/{:<5} {}  {:.1} MiB pushed (gzip), {:.1} MiB unpacked",
            p.arch.oci(),
            p.manifest.digest(),
            p.pushed_size() as f64 / 1_048_576.0,
            p.unpacked_size as f64 / 1_048_576.0,
        );
    }
    for path in &written {
        println!("  {}", path.display());
    }
    Ok((image, written))
}

#[cfg(test)]
mod tests;
