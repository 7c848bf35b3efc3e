//! `linkerd inject` and `linkerd uninject` over files, directories and stdin. By default
//! `inject` only adds `linkerd.io/inject: enabled` (the webhook injects at pod creation);
//! `--manual` injects now, with the cluster's `linkerd-config` (or, with `--ignore-cluster`,
//! the defaults), and `--linkerd-cni-enabled` means `cniEnabled` for that run. The logic is
//! in [`crate::manifest`].

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
};

use clap::Args;
use linkerd_injector::{Values, values::ValuesError};

use crate::{
    kubernetes::{KubeArgs, KubeArgsError},
    manifest::{self, InjectHow, ManifestError, Report},
};

/// Why inject/uninject failed.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// An input cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An input is not a valid manifest.
    #[error("{}: {source}", path.display())]
    Manifest {
        path: PathBuf,
        #[source]
        source: Box<ManifestError>,
    },
    /// No cluster to read linkerd-config from.
    #[error(
        "cannot reach the cluster to read linkerd-config (use --ignore-cluster to inject with the default configuration)"
    )]
    Client(#[from] KubeArgsError),
    /// linkerd-config could not be read.
    #[error(
        "cannot use the cluster's linkerd-config (use --ignore-cluster to inject with the default configuration)"
    )]
    Values(#[from] ValuesError),
    /// Output failed.
    #[error("writing: {0}")]
    Write(#[from] std::io::Error),
}

/// The flags of `linkerd inject`.
#[derive(Args, Debug, Clone)]
pub struct InjectArgs {
    /// Manifests: files, directories (their *.yaml, *.yml and *.json, recursively) or - (stdin).
    #[arg(required = true, value_name = "FILE|-|DIR")]
    pub inputs: Vec<PathBuf>,
    /// Add the proxy now (the full injection) instead of only the linkerd.io/inject annotation.
    #[arg(long, env = "LINKERD_INJECT_MANUAL")]
    pub manual: bool,
    /// With --manual: use the default configuration instead of the cluster's linkerd-config.
    #[arg(long, env = "LINKERD_INJECT_IGNORE_CLUSTER")]
    pub ignore_cluster: bool,
    /// The CNI plugin redirects traffic: no linkerd-init, the network validator instead
    /// (cniEnabled for this run, whatever linkerd-config says).
    #[arg(long, env = "LINKERD_INJECT_LINKERD_CNI_ENABLED")]
    pub linkerd_cni_enabled: bool,
}

/// The flags of `linkerd uninject`.
#[derive(Args, Debug, Clone)]
pub struct UninjectArgs {
    /// Manifests: files, directories (their *.yaml, *.yml and *.json, recursively) or - (stdin).
    #[arg(required = true, value_name = "FILE|-|DIR")]
    pub inputs: Vec<PathBuf>,
}

fn is_manifest(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), InjectError> {
    let err = |source| InjectError::Read {
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(err)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        entries.sort();
        for e in entries {
            if e.is_dir() || is_manifest(&e) {
                collect(&e, out)?;
            }
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// Reads every input: `(name, text)` in order, `-` from `stdin`.
pub fn read_inputs(
    inputs: &[PathBuf],
    stdin: &mut impl Read,
) -> Result<Vec<(PathBuf, String)>, InjectError> {
    let mut files = Vec::new();
    for input in inputs {
        if input.as_os_str() == "-" {
            files.push(input.clone());
        } else {
            collect(input, &mut files)?;
        }
    }
    let mut out = Vec::new();
    for f in files {
        let err = |source| InjectError::Read {
            path: f.clone(),
            source,
        };
        let text = if f.as_os_str() == "-" {
            let mut s = String::new();
            stdin.read_to_string(&mut s).map_err(err)?;
            s
        } else {
            std::fs::read_to_string(&f).map_err(err)?
        };
        out.push((f, text));
    }
    Ok(out)
}

fn emit(
    inputs: Vec<(PathBuf, String)>,
    out: &mut impl Write,
    log: &mut impl Write,
    f: impl Fn(&str) -> Result<(String, Vec<Report>), ManifestError>,
) -> Result<(), InjectError> {
    for (path, text) in inputs {
        let (yaml, reports) = f(&text).map_err(|source| InjectError::Manifest {
            path: path.clone(),
            source: Box::new(source),
        })?;
        out.write_all(yaml.as_bytes())?;
        for r in reports {
            writeln!(log, "{r}")?;
        }
    }
    Ok(())
}

/// How `linkerd inject` injects, reading linkerd-config from the cluster if it must.
pub async fn how(args: &InjectArgs, kube: &KubeArgs) -> Result<InjectHow, InjectError> {
    if !args.manual {
        return Ok(InjectHow::Annotate);
    }
    let mut values = if args.ignore_cluster {
        Values::default()
    } else {
        Values::fetch(&kube.client().await?, &kube.linkerd_namespace).await?
    };
    values.cni_enabled |= args.linkerd_cni_enabled;
    Ok(InjectHow::Manual(Box::new(values)))
}

/// `linkerd inject`: manifests on `out`, one line per workload on `log`.
pub async fn inject(
    args: &InjectArgs,
    kube: &KubeArgs,
    stdin: &mut impl Read,
    out: &mut impl Write,
    log: &mut impl Write,
) -> Result<(), InjectError> {
    let inputs = read_inputs(&args.inputs, stdin)?;
    let how = how(args, kube).await?;
    emit(inputs, out, log, |text| manifest::inject(text, &how))
}

/// `linkerd uninject`: manifests on `out`, one line per workload on `log`.
pub fn uninject(
    args: &UninjectArgs,
    stdin: &mut impl Read,
    out: &mut impl Write,
    log: &mut impl Write,
) -> Result<(), InjectError> {
    emit(
        read_inputs(&args.inputs, stdin)?,
        out,
        log,
        manifest::uninject,
    )
}
