//! `linkerd`: one variant of [`Command`] per subcommand, each implemented in its own module of
//! the `linkerd_cli` library.

#![forbid(unsafe_code)]

use std::{io::Write, process::ExitCode};

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use linkerd_cli::{
    check, inject, install, install_cni,
    kubernetes::{KubeArgs, KubeArgsError},
    version,
};

/// The linkerd CLI: install and check Linkerd's CNI plugin with eBPF redirection.
#[derive(Parser, Debug)]
#[command(name = "linkerd", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    kube: KubeArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Output Kubernetes manifests installing the linkerd-cni DaemonSet (pipe into
    /// `kubectl apply --prune -l linkerd.io/cni-resource=true -f -`).
    InstallCni(Box<install_cni::InstallCniArgs>),
    /// Check the linkerd-cni installation (--linkerd-cni-enabled) and this node (--node).
    Check(check::CheckArgs),
    /// Output the control plane objects this project owns (namespace, linkerd-config with
    /// cniEnabled, the proxy injector and its webhook) for `kubectl apply -f -`.
    Install(Box<install::InstallArgs>),
    /// Add the linkerd.io/inject annotation to pod templates (--manual: inject the proxy now).
    Inject(inject::InjectArgs),
    /// Remove what inject added (proxy, linkerd-init or validator, volumes, annotations).
    Uninject(inject::UninjectArgs),
    /// Print the client and server version information.
    Version(version::VersionArgs),
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match run(cli, &matches) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, matches: &clap::ArgMatches) -> anyhow::Result<bool> {
    match &cli.command {
        Command::InstallCni(args) => {
            let sub = matches
                .subcommand_matches("install-cni")
                .context("install-cni arguments")?;
            let rendered = install_cni::render(args, sub, &cli.kube.cni_namespace)?;
            for warning in &rendered.warnings {
                eprintln!("{warning}");
            }
            std::io::stdout()
                .lock()
                .write_all(rendered.manifests.as_bytes())
                .context("writing the manifests")?;
            Ok(true)
        }
        Command::Check(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(check::run(args, &cli.kube, &mut std::io::stdout().lock()))
        }
        Command::Install(args) => {
            if !args.ignore_cluster {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the async runtime")?;
                runtime.block_on(async {
                    let client = cli.kube.client().await.map_err(|e| match e {
                        KubeArgsError::Impersonation => anyhow::Error::new(e),
                        other => install::InstallError::Cluster(other.to_string()).into(),
                    })?;
                    install::check_no_control_plane(&client, &cli.kube.linkerd_namespace)
                        .await
                        .map_err(anyhow::Error::new)
                })?;
            }
            let yaml = install::render(args, &cli.kube.linkerd_namespace)?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("writing the manifests")?;
            Ok(true)
        }
        Command::Inject(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let (mut stdin, mut stdout, mut stderr) = (
                std::io::stdin().lock(),
                std::io::stdout().lock(),
                std::io::stderr().lock(),
            );
            runtime.block_on(inject::inject(
                args,
                &cli.kube,
                &mut stdin,
                &mut stdout,
                &mut stderr,
            ))?;
            Ok(true)
        }
        Command::Version(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(version::run(args, &cli.kube, &mut std::io::stdout().lock()))?;
            Ok(true)
        }
        Command::Uninject(args) => {
            let (mut stdin, mut stdout, mut stderr) = (
                std::io::stdin().lock(),
                std::io::stdout().lock(),
                std::io::stderr().lock(),
            );
            inject::uninject(args, &mut stdin, &mut stdout, &mut stderr)?;
            Ok(true)
        }
    }
}
