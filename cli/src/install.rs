//! `linkerd install`: renders the control-plane objects this project owns (namespace
//! `linkerd`, ConfigMap `linkerd-config` carrying `cniEnabled`, the proxy injector and its
//! MutatingWebhookConfiguration with TLS) for `kubectl apply -f -`. The objects themselves
//! are defined in [`objects`].
//!
//! As Linkerd's `install` does, it first asks the cluster (unless `--ignore-cluster`) and
//! refuses when a control plane is already there ([`check_no_control_plane`]), so it never
//! prints what would overwrite a real Linkerd's `linkerd-config` or proxy injector.

use std::path::PathBuf;

use clap::Args;
pub mod objects;

use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration, apps::v1::Deployment,
    core::v1::ConfigMap,
};
use kube::{Api, Client};
use linkerd_cni_k8s::names;
use linkerd_injector::{
    tls,
    values::{self, Values},
};

use self::objects::{FailurePolicy, InstallOptions, WebhookTls};

/// Why `install` could not produce manifests.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The trust anchors file cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// Rendering failed.
    #[error(transparent)]
    Render(#[from] objects::InstallError),
    /// The cluster cannot be asked whether a control plane is installed.
    #[error(
        "Unable to install the Linkerd control plane. Cannot connect to the Kubernetes cluster:\n\n\
         {0}\n\nYou can use the --ignore-cluster flag if you just want to generate the \
         installation config."
    )]
    Cluster(String),
    /// A control plane is already installed.
    #[error(
        "Can't install the Linkerd control plane in the '{namespace}' namespace. Reason: {} \
         already exists.\n\
         Applying this output would overwrite that control plane's configuration and proxy \
         injector. With a control plane installed by Linkerd's own CLI or Helm chart, keep it and \
         turn on the CNI there (Linkerd's `linkerd upgrade --linkerd-cni-enabled`, or Helm value \
         cniEnabled=true): its injector's pods are redirected by this CNI as they are. To \
         re-render this project's control plane anyway, use --ignore-cluster.",
        found.join(", ")
    )]
    AlreadyInstalled {
        namespace: String,
        /// `Kind/name` of each control-plane object found.
        found: Vec<String>,
    },
}

/// The flags of `linkerd install`.
#[derive(Args, Debug, Clone)]
pub struct InstallArgs {
    /// The CNI plugin redirects traffic: sets cniEnabled in linkerd-config (injected pods get
    /// the network validator instead of linkerd-init) and Pod Security "restricted" on the
    /// control plane namespace.
    #[arg(long, env = "LINKERD_INSTALL_LINKERD_CNI_ENABLED")]
    pub linkerd_cni_enabled: bool,
    /// Linkerd version: the default tag of the proxy image.
    #[arg(long, env = "LINKERD_INSTALL_LINKERD_VERSION", default_value = values::DEFAULT_LINKERD_VERSION)]
    pub linkerd_version: String,
    /// Proxy image repository (also runs the network validator).
    #[arg(long, env = "LINKERD_INSTALL_PROXY_IMAGE", default_value = values::DEFAULT_PROXY_IMAGE)]
    pub proxy_image: String,
    /// UID the proxy runs as.
    #[arg(long, env = "LINKERD_INSTALL_PROXY_UID", default_value_t = i64::from(names::DEFAULT_PROXY_UID), value_parser = clap::value_parser!(i64).range(0..=i64::from(u32::MAX)))]
    pub proxy_uid: i64,
    /// Proxy log level.
    #[arg(
        long,
        env = "LINKERD_INSTALL_PROXY_LOG_LEVEL",
        default_value = "warn,linkerd=info,hickory=error"
    )]
    pub proxy_log_level: String,
    /// proxy-init image repository (linkerd-init, without --linkerd-cni-enabled).
    #[arg(long, env = "LINKERD_INSTALL_INIT_IMAGE", default_value = values::DEFAULT_PROXY_INIT_IMAGE)]
    pub init_image: String,
    /// proxy-init image tag.
    #[arg(long, env = "LINKERD_INSTALL_INIT_IMAGE_VERSION", default_value = values::DEFAULT_PROXY_INIT_VERSION)]
    pub init_image_version: String,
    /// iptables flavour of linkerd-init.
    #[arg(long, env = "LINKERD_INSTALL_IPTABLES_MODE", default_value = "legacy", value_parser = ["legacy", "nft"])]
    pub iptables_mode: String,
    /// The cluster's DNS domain.
    #[arg(
        long,
        env = "LINKERD_INSTALL_CLUSTER_DOMAIN",
        default_value = "cluster.local"
    )]
    pub cluster_domain: String,
    /// PEM file of the identity trust anchors handed to every proxy.
    #[arg(
        long,
        env = "LINKERD_INSTALL_IDENTITY_TRUST_ANCHORS_FILE",
        value_name = "PATH"
    )]
    pub identity_trust_anchors_file: Option<PathBuf>,
    /// Proxy injector image, repo:tag.
    #[arg(long, env = "LINKERD_INSTALL_INJECTOR_IMAGE", default_value_t = format!("{}:{}", objects::DEFAULT_INJECTOR_IMAGE, env!("CARGO_PKG_VERSION")))]
    pub injector_image: String,
    /// Proxy injector replicas.
    #[arg(long, env = "LINKERD_INSTALL_INJECTOR_REPLICAS", default_value_t = 1)]
    pub injector_replicas: u32,
    /// What the API server does when the webhook cannot be reached.
    #[arg(long, env = "LINKERD_INSTALL_WEBHOOK_FAILURE_POLICY", default_value = "Ignore", value_parser = ["Ignore", "Fail"])]
    pub webhook_failure_policy: String,
    /// Have cert-manager issue the webhook's certificate from this issuer (and inject the CA
    /// into the webhook configuration) instead of rendering a generated one.
    #[arg(long, env = "LINKERD_INSTALL_CERT_MANAGER_ISSUER", value_name = "NAME")]
    pub cert_manager_issuer: Option<String>,
    /// Do not ask the cluster whether a control plane is already installed; just render.
    #[arg(long, env = "LINKERD_INSTALL_IGNORE_CLUSTER")]
    pub ignore_cluster: bool,
    /// Kind of --cert-manager-issuer.
    #[arg(long, env = "LINKERD_INSTALL_CERT_MANAGER_ISSUER_KIND", default_value = "Issuer", value_parser = ["Issuer", "ClusterIssuer"])]
    pub cert_manager_issuer_kind: String,
}

impl InstallArgs {
    /// The options these flags describe, for the control plane namespace `namespace`
    /// (generating the webhook's certificate, for the injector's Service there, if needed).
    pub fn options(&self, namespace: &str) -> Result<InstallOptions, InstallError> {
        let mut values = Values {
            cni_enabled: self.linkerd_cni_enabled,
            ..Values::default()
        };
        values.linkerd_version = self.linkerd_version.clone();
        values.cluster_domain = self.cluster_domain.clone();
        values.proxy.image.name = self.proxy_image.clone();
        values.proxy.uid = self.proxy_uid;
        values.proxy.log_level = self.proxy_log_level.clone();
        values.proxy_init.image.name = self.init_image.clone();
        values.proxy_init.image.version = self.init_image_version.clone();
        values.proxy_init.iptables_mode = self.iptables_mode.clone();
        if let Some(path) = &self.identity_trust_anchors_file {
            values.identity_trust_anchors_pem =
                std::fs::read_to_string(path).map_err(|source| InstallError::Read {
                    path: path.clone(),
                    source,
                })?;
        }
        let tls = match &self.cert_manager_issuer {
            Some(issuer) => WebhookTls::CertManager {
                issuer: issuer.clone(),
                issuer_kind: self.cert_manager_issuer_kind.clone(),
            },
            None => WebhookTls::Generated(tls::generate(&tls::service_dns_names(
                names::INJECTOR,
                namespace,
            ))?),
        };
        Ok(InstallOptions {
            values,
            injector_image: self.injector_image.clone(),
            replicas: self.injector_replicas,
            failure_policy: if self.webhook_failure_policy == "Fail" {
                FailurePolicy::Fail
            } else {
                FailurePolicy::Ignore
            },
            tls,
            namespace: namespace.to_string(),
        })
    }
}

async fn found<K>(api: Api<K>, kind: &str, name: &str) -> Result<Option<String>, InstallError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(_)) => Ok(Some(format!("{kind}/{name}"))),
        Ok(None) => Ok(None),
        Err(e) => Err(InstallError::Cluster(format!(
            "checking for an existing {kind}/{name}: {e}"
        ))),
    }
}

/// Refuses when the cluster already has a control plane in `ns`: the ConfigMap
/// `linkerd-config` (what Linkerd checks), the proxy injector's Deployment, or its webhook
/// configuration (cluster-wide).
pub async fn check_no_control_plane(client: &Client, ns: &str) -> Result<(), InstallError> {
    let found: Vec<String> = [
        found(
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            "ConfigMap",
            names::CONFIG_MAP,
        )
        .await?,
        found(
            Api::<Deployment>::namespaced(client.clone(), ns),
            "Deployment",
            names::INJECTOR,
        )
        .await?,
        found(
            Api::<MutatingWebhookConfiguration>::all(client.clone()),
            "MutatingWebhookConfiguration",
            names::WEBHOOK_CONFIG,
        )
        .await?,
    ]
    .into_iter()
    .flatten()
    .collect();
    if found.is_empty() {
        Ok(())
    } else {
        Err(InstallError::AlreadyInstalled {
            namespace: ns.to_string(),
            found,
        })
    }
}

/// The manifests for the control plane namespace `namespace`, one YAML stream.
pub fn render(args: &InstallArgs, namespace: &str) -> Result<String, InstallError> {
    Ok(objects::render_yaml(&args.options(namespace)?)?)
}
