use std::{collections::BTreeMap, io::Read};

use super::*;

fn prov() -> Provenance {
    Provenance {
        name: ImageName {
            repository: "example.org/linkerd/linkerd-cni-ebpf".into(),
            tag: "v9.8.7".into(),
        },
        epoch: 1_764_144_000,
        revision: "0123456789abcdef0123456789abcdef01234567".into(),
    }
}

/// Stand-ins for the two binaries, different per architecture.
fn files(arch: Arch) -> Vec<File> {
    vec![
        File {
            path: dist::AGENT_IN_IMAGE.into(),
            mode: 0o755,
            content: format!("agent for {arch}").into_bytes(),
        },
        File {
            path: dist::plugin_in_image(),
            mode: 0o755,
            content: format!("plugin for {arch}").into_bytes(),
        },
    ]
}

fn both() -> Vec<(Arch, Vec<File>)> {
    Arch::ALL.iter().map(|&a| (a, files(a))).collect()
}

/// A tar's entries: path -> (header, content).
fn entries(tar: &[u8]) -> BTreeMap<String, (tar::Header, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let header = entry.header().clone();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).unwrap();
        assert!(
            out.insert(path.clone(), (header, content)).is_none(),
            "{path} twice"
        );
    }
    out
}

fn json(bytes: &[u8]) -> Json {
    serde_json::from_slice(bytes).unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// The blob a descriptor names, checked against its digest and size.
fn blob<'a>(layout: &'a BTreeMap<String, (tar::Header, Vec<u8>)>, d: &Json) -> &'a [u8] {
    let digest = d["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let (_, bytes) = layout
        .get(&format!("blobs/sha256/{hex}"))
        .unwrap_or_else(|| panic!("{digest} is not in the layout"));
    assert_eq!(sha256_hex(bytes), hex, "content of {digest}");
    assert_eq!(
        d["size"].as_u64(),
        Some(bytes.len() as u64),
        "size of {digest}"
    );
    bytes
}

#[test]
fn rfc3339_is_utc_calendar_time() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    // `date -u -d @1764144000 +%FT%TZ`
    assert_eq!(rfc3339(1_764_144_000), "2025-11-26T08:00:00Z");
    // A leap day, and the last second of a century's leap year.
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(978_307_199), "2000-12-31T23:59:59Z");
}

/// The one place the image's name and tag are defined is the chart, which the CLI embeds;
/// both move with the workspace version.
#[test]
fn the_chart_names_the_image_at_the_workspace_version() {
    let meta = chart_meta(&workspace()).unwrap();
    assert_eq!(meta.name, "linkerd2-cni");
    assert_eq!(meta.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(meta.app_version, format!("v{}", env!("CARGO_PKG_VERSION")));
    let name = chart_image(&workspace()).unwrap();
    assert_eq!(name.tag, meta.app_version);
    assert!(
        name.repository.ends_with("/linkerd-cni-ebpf"),
        "{}",
        name.repository
    );
    assert_eq!(
        name.index_archive(),
        format!("linkerd-cni-ebpf-v{}.oci.tar", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        name.arch_archive(Arch::Arm64),
        format!(
            "linkerd-cni-ebpf-v{}-linux-arm64.tar",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// Every command the DaemonSet runs is an executable of the image, found through the image's
/// `PATH`, and none is a shell (the image has none).
#[test]
fn the_daemonset_runs_what_the_image_holds() {
    let template =
        std::fs::read_to_string(workspace().join(CHART_DIR).join("templates/daemonset.yaml"))
            .unwrap();
    let image_files: Vec<String> = files(Arch::Amd64).into_iter().map(|f| f.path).collect();
    let dirs: Vec<&str> = PATH_ENV.strip_prefix("PATH=").unwrap().split(':').collect();
    let mut commands = Vec::new();
    for line in template.lines() {
        let Some(rest) = line.trim().strip_prefix("command:") else {
            continue;
        };
        let argv: Vec<String> = serde_json::from_str(rest.trim())
            .unwrap_or_else(|e| panic!("command {rest:?} is not a plain list ({e})"));
        let program = &argv[0];
        assert!(!program.contains('/'), "{argv:?}: found through PATH");
        assert!(
            !["sh", "bash", "ash"].contains(&program.as_str()),
            "{argv:?} needs a shell"
        );
        let found = dirs
            .iter()
            .any(|dir| image_files.contains(&format!("{}/{program}", dir.trim_start_matches('/'))));
        assert!(found, "{argv:?}: {program} is not on the image's PATH");
        commands.push(argv);
    }
    assert_eq!(
        commands,
        [
            vec!["linkerd-cni-agent", "mount-bpffs"],
            vec!["linkerd-cni-agent", "run"]
        ],
        "the init container and the container"
    );
}

#[test]
fn the_layer_is_sorted_owned_by_root_and_timed_by_the_commit() {
    let epoch = prov().epoch;
    let tar = layer_tar(&files(Arch::Amd64), epoch).unwrap();
    assert_eq!(
        tar,
        layer_tar(&files(Arch::Amd64), epoch).unwrap(),
        "same input, same bytes"
    );
    let entries = entries(&tar);
    let paths: Vec<&str> = entries.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        [
            "opt/",
            "opt/cni/",
            "opt/cni/bin/",
            "opt/cni/bin/linkerd-cni",
            "usr/",
            "usr/local/",
            "usr/local/bin/",
            "usr/local/bin/linkerd-cni-agent",
        ]
    );
    for (path, (header, content)) in &entries {
        assert_eq!(header.uid().unwrap(), 0, "{path}");
        assert_eq!(header.gid().unwrap(), 0, "{path}");
        assert_eq!(header.mtime().unwrap(), epoch, "{path}");
        assert_eq!(header.mode().unwrap(), 0o755, "{path}");
        let is_dir = path.ends_with('/');
        assert_eq!(header.entry_type().is_dir(), is_dir, "{path}");
        if !is_dir {
            assert!(!content.is_empty(), "{path}");
        }
    }
    // In archive order too (what a digest covers).
    let order: Vec<String> = tar::Archive::new(tar.as_slice())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(order, paths);
}

#[test]
fn a_path_outside_the_root_is_refused() {
    for bad in ["/etc/passwd", "usr/../../x", "usr//x"] {
        let f = File {
            path: bad.into(),
            mode: 0o644,
            content: vec![1],
        };
        assert!(layer_tar(&[f], 0).is_err(), "{bad}");
    }
}

#[test]
fn json_keys_are_sorted_whatever_the_map() {
    let map: std::collections::HashMap<&str, u8> =
        [("b", 1), ("a", 2), ("c", 3)].into_iter().collect();
    assert_eq!(
        canonical_json(&serde_json::json!({"z": map, "y": [{"k": 1, "j": 2}]})).unwrap(),
        br#"{"y":[{"j":2,"k":1}],"z":{"a":2,"b":1,"c":3}}"#
    );
}

/// Two builds of the same files give the same bytes (labels and annotations live in hash
/// maps with a random order per map).
#[test]
fn two_builds_are_the_same_bytes() {
    let a = Image::build(&both(), &prov()).unwrap();
    let b = Image::build(&both(), &prov()).unwrap();
    assert_eq!(a.index.sha256, b.index.sha256);
    assert_eq!(
        a.index_archive(prov().epoch).unwrap(),
        b.index_archive(prov().epoch).unwrap()
    );
    for (pa, pb) in a.platforms.iter().zip(&b.platforms) {
        assert_eq!(
            a.arch_archive(pa, prov().epoch).unwrap(),
            b.arch_archive(pb, prov().epoch).unwrap()
        );
    }
}

/// The multi-platform archive: a layout whose `index.json` names the image and points at an
/// index of one manifest per architecture; every blob present, with its digest and size.
#[test]
fn the_index_archive_holds_every_platform() {
    let p = prov();
    let image = Image::build(&both(), &p).unwrap();
    let layout = entries(&image.index_archive(p.epoch).unwrap());
    assert_eq!(
        json(&layout["oci-layout"].1),
        serde_json::json!({"imageLayoutVersion": "1.0.0"})
    );
    assert!(!layout.contains_key("manifest.json"));
    let top = json(&layout["index.json"].1);
    let named = &top["manifests"].as_array().unwrap()[..];
    assert_eq!(named.len(), 1);
    assert_eq!(
        named[0]["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(
        named[0]["annotations"]["io.containerd.image.name"],
        "example.org/linkerd/linkerd-cni-ebpf:v9.8.7"
    );
    assert_eq!(
        named[0]["annotations"]["org.opencontainers.image.ref.name"],
        "example.org/linkerd/linkerd-cni-ebpf:v9.8.7"
    );
    let index = json(blob(&layout, &named[0]));
    let manifests = index["manifests"].as_array().unwrap();
    let platforms: Vec<(String, String)> = manifests
        .iter()
        .map(|m| {
            (
                m["platform"]["os"].as_str().unwrap().to_string(),
                m["platform"]["architecture"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("linux".to_string(), "amd64".to_string()),
            ("linux".to_string(), "arm64".to_string())
        ]
    );
    for (m, arch) in manifests.iter().zip(Arch::ALL) {
        assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
        let manifest = json(blob(&layout, m));
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(
            manifest["config"]["mediaType"],
            "application/vnd.oci.image.config.v1+json"
        );
        let config = json(blob(&layout, &manifest["config"]));
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1);
        assert_eq!(
            layers[0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let tar = gunzip(blob(&layout, &layers[0]));
        assert_eq!(
            config["rootfs"],
            serde_json::json!({"type": "layers", "diff_ids": [format!("sha256:{}", sha256_hex(&tar))]})
        );
        assert_eq!(config["architecture"], arch.oci());
        assert_eq!(config["os"], "linux");
        assert_eq!(config["created"], "2025-11-26T08:00:00Z");
        assert_eq!(config["config"]["Env"], serde_json::json!([PATH_ENV]));
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["linkerd-cni-agent"])
        );
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.revision"],
            p.revision
        );
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.version"],
            "v9.8.7"
        );
        // The layer holds this architecture's files.
        let files = entries(&tar);
        assert_eq!(
            files[dist::AGENT_IN_IMAGE].1,
            format!("agent for {arch}").into_bytes()
        );
    }
}

/// One platform's archive: the same manifest as in the index, named, with Docker's
/// `manifest.json` pointing at the layout's own blobs.
#[test]
fn an_arch_archive_is_also_a_docker_archive() {
    let p = prov();
    let image = Image::build(&both(), &p).unwrap();
    let arm = &image.platforms[1];
    assert_eq!(arm.arch, Arch::Arm64);
    let layout = entries(&image.arch_archive(arm, p.epoch).unwrap());
    let top = json(&layout["index.json"].1);
    let named = &top["manifests"][0];
    assert_eq!(named["digest"], arm.manifest.digest());
    assert_eq!(named["platform"]["architecture"], "arm64");
    assert_eq!(
        named["annotations"]["io.containerd.image.name"],
        "example.org/linkerd/linkerd-cni-ebpf:v9.8.7"
    );
    let docker = json(&layout["manifest.json"].1);
    assert_eq!(
        docker,
        serde_json::json!([{
            "Config": arm.config.path(),
            "RepoTags": ["example.org/linkerd/linkerd-cni-ebpf:v9.8.7"],
            "Layers": [arm.layer.path()],
        }])
    );
    assert!(layout.contains_key(&arm.config.path()));
    assert!(layout.contains_key(&arm.layer.path()));
    // Nothing of the other architecture.
    let amd = &image.platforms[0];
    assert!(!layout.contains_key(&amd.layer.path()));
    // Archive entries are owned by root and timed by the commit too.
    for (path, (header, _)) in &layout {
        assert_eq!(header.mtime().unwrap(), p.epoch, "{path}");
        assert_eq!(header.uid().unwrap(), 0, "{path}");
    }
}

fn skopeo(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("skopeo")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("skopeo (cargo xtask setup installs it): {e}"));
    assert!(
        out.status.success(),
        "skopeo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A reader from the field accepts the archives: skopeo finds the index and each platform's
/// manifest and config through the OCI layout, the configs through Docker's `manifest.json`
/// too, and copies every blob out, checking each digest.
#[test]
fn skopeo_reads_the_archives() {
    let p = prov();
    let image = Image::build(&both(), &p).unwrap();
    let dir = std::env::temp_dir().join(format!("xtask-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let written = image.write(&dir, p.epoch).unwrap();
    let multi = format!("oci-archive:{}", written[0].display());
    assert_eq!(skopeo(&["inspect", "--raw", &multi]), image.index.bytes);
    // Found by its name too (`oci-archive:PATH:NAME` matches the ref.name annotation).
    let by_name = format!("{multi}:{}", image.name.reference());
    assert_eq!(skopeo(&["inspect", "--raw", &by_name]), image.index.bytes);
    for (platform, path) in image.platforms.iter().zip(&written[1..]) {
        let arch = platform.arch.oci();
        let config = skopeo(&[
            "--override-arch",
            arch,
            "inspect",
            "--config",
            "--raw",
            &multi,
        ]);
        assert_eq!(config, platform.config.bytes, "{arch} in the index");
        let oci = format!("oci-archive:{}", path.display());
        assert_eq!(
            skopeo(&["inspect", "--raw", &oci]),
            platform.manifest.bytes,
            "{arch} archive"
        );
        let docker = format!("docker-archive:{}", path.display());
        let config = skopeo(&["inspect", "--config", "--raw", &docker]);
        assert_eq!(config, platform.config.bytes, "{arch} as a docker archive");
    }
    let copy = dir.join("copy");
    skopeo(&[
        "--insecure-policy",
        "copy",
        "--all",
        "--quiet",
        &multi,
        &format!("oci:{}", copy.display()),
    ]);
    for p in &image.platforms {
        for blob in [&p.manifest, &p.config, &p.layer] {
            assert_eq!(
                std::fs::read(copy.join(blob.path())).unwrap(),
                blob.bytes,
                "{} copied as is",
                blob.digest()
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The Dockerfile for `docker buildx` lays out what `cargo xtask dist` does (the files this
/// image holds) on an empty base, with this image's PATH, entrypoint and command.
#[test]
fn the_dockerfile_builds_the_same_image() {
    let dockerfile = std::fs::read_to_string(workspace().join("Dockerfile")).unwrap();
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    assert_eq!(lines[last_from], "FROM scratch");
    let image = PlatformImage::build(Arch::Amd64, &files(Arch::Amd64), &prov()).unwrap();
    let config = json(&image.config.bytes);
    let exec_form = |key: &str| {
        let line = lines[last_from..]
            .iter()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the final stage"));
        serde_json::from_str::<Json>(line.trim()).unwrap()
    };
    assert_eq!(exec_form("ENTRYPOINT"), config["config"]["Entrypoint"]);
    assert_eq!(exec_form("CMD"), config["config"]["Cmd"]);
    let env = lines[last_from..]
        .iter()
        .find_map(|l| l.strip_prefix("ENV "))
        .unwrap();
    assert_eq!(Json::from(vec![env]), config["config"]["Env"]);
    // Its only files: what `cargo xtask dist` laid out for the target platform.
    let copies: Vec<&&str> = lines[last_from..]
        .iter()
        .filter(|l| l.starts_with("COPY") || l.starts_with("ADD") || l.starts_with("RUN"))
        .collect();
    assert_eq!(copies, [&"COPY --from=build /rootfs/ /"]);
    assert!(
        lines.contains(&"RUN cargo xtask dist --arch \"${TARGETARCH}\" --out /rootfs"),
        "{lines:#?}"
    );
}
