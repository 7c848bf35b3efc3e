//! The filesystem locations injection and the webhook use: inside the injector's own pod, and
//! inside the pods it injects.

/// Where the proxy injector reads its serving certificate (`tls.crt`, `tls.key`), mounted
/// from its Secret.
pub const PROXY_INJECTOR_TLS_DIR: &str = "/var/run/linkerd/tls";
/// Inside injected pods: the proxy's identity directory (in-memory emptyDir).
pub const PROXY_IDENTITY_DIR: &str = "/var/run/linkerd/identity/end-entity";
/// Inside injected pods: the directory of the projected token the proxy presents for identity.
pub const PROXY_IDENTITY_TOKEN_DIR: &str = "/var/run/secrets/tokens";
/// Inside injected pods: where `linkerd-init` keeps the xtables lock (Linkerd's `xtMountPath`).
pub const PROXY_INIT_XTABLES_LOCK_DIR: &str = "/run";
/// Inside the proxy image: the network validator binary.
pub const NETWORK_VALIDATOR_BIN: &str = "/usr/lib/linkerd/linkerd2-network-validator";
