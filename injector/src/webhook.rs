//! The webhook's brain: one AdmissionReview body in, one AdmissionReview out (or a
//! [`ReviewError`] the HTTP layer turns into a 400). Reads the pod's Namespace and
//! `linkerd-config` from the API on every request that needs them, never caching, so that a
//! change of `cniEnabled` applies to the very next pod.
//!
//! Failure policy of the answers:
//! - not a pod CREATE, or nothing to inject: allowed, no patch;
//! - the API cannot be read, or the pod object is unusable: allowed, no patch, with a warning
//!   the client (kubectl) shows; the pod runs without a proxy, as with `failurePolicy: Ignore`;
//! - a malformed `config.linkerd.io/*` override on a pod that would be injected: denied with
//!   the annotation named, since the CNI side would fail that pod anyway.

use k8s_openapi::api::core::v1::Namespace;
use serde_json::Value;

use crate::{
    admission::{self, AdmissionRequest, ReviewError},
    decision::{self, Decision},
    metrics::Metrics,
    patch::{InjectContext, InjectError, injection_patch},
    values::Values,
};

/// Prefix of every warning returned to clients.
const WARNING_PREFIX: &str = "linkerd-proxy-injector";

/// The admission logic with its API client and metrics.
pub struct Webhook {
    client: kube::Client,
    control_plane_namespace: String,
    metrics: std::sync::Arc<Metrics>,
}

impl Webhook {
    /// A webhook reading `linkerd-config` from `control_plane_namespace`.
    pub fn new(
        client: kube::Client,
        control_plane_namespace: impl Into<String>,
        metrics: std::sync::Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            control_plane_namespace: control_plane_namespace.into(),
            metrics,
        }
    }

    /// The metrics this webhook counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Answers one webhook call.
    pub async fn review(&self, body: &[u8]) -> Result<Value, ReviewError> {
        self.metrics.requests.inc();
        let req = admission::parse_review(body).inspect_err(|e| {
            self.metrics.error("bad-request");
            tracing::warn!(error = %e, "bad admission request");
        })?;
        Ok(self.answer(&req).await)
    }

    async fn answer(&self, req: &AdmissionRequest) -> Value {
        let uid = req.uid.as_str();
        let who = req.display_name();
        if !req.is_pod_create() {
            self.metrics.skip("not-pod-create");
            tracing::debug!(%who, operation = %req.operation, kind = %req.kind.kind, "not a pod creation: allowed unchanged");
            return admission::allow(uid, &[]);
        }
        let Some(pod) = req.object.as_ref().filter(|o| o.is_object()) else {
            return self.allow_with_error(
                uid,
                "invalid-pod",
                &who,
                "the request carries no pod object",
            );
        };
        let ns_name = req
            .namespace
            .as_deref()
            .or_else(|| pod.pointer("/metadata/namespace").and_then(Value::as_str))
            .filter(|n| !n.is_empty())
            .unwrap_or("default");

        // Exclusions that need no API call come first.
        if let Some(reason) = decision::structural_skip(pod) {
            self.metrics.skip(reason.label());
            tracing::debug!(%who, %reason, "not injected");
            return admission::allow(uid, &[]);
        }
        let namespace = match self.namespace(ns_name).await {
            Ok(ns) => ns,
            Err(e) => {
                let msg = format!("cannot read namespace {ns_name}: {e}");
                return self.allow_with_error(uid, "namespace", &who, &msg);
            }
        };
        let mode = match decision::decide(pod, ns_name, namespace.as_ref()) {
            Decision::Skip(reason) => {
                self.metrics.skip(reason.label());
                tracing::debug!(%who, %reason, "not injected");
                return admission::allow(uid, &[]);
            }
            Decision::Inject(mode) => mode,
        };
        let values = match Values::fetch(&self.client, &self.control_plane_namespace).await {
            Ok(v) => v,
            Err(e) => return self.allow_with_error(uid, "config", &who, &e.to_string()),
        };
        let ctx = InjectContext {
            values: &values,
            control_plane_namespace: &self.control_plane_namespace,
            namespace_name: Some(ns_name),
            namespace: namespace.as_ref(),
            mode,
        };
        match injection_patch(pod, &ctx) {
            Ok(ops) => {
                self.metrics.inject(values.cni_enabled);
                tracing::info!(%who, cni_enabled = values.cni_enabled, ?mode, "injected");
                admission::allow_with_patch(uid, &ops)
            }
            Err(e @ InjectError::InvalidAnnotation { .. }) => {
                self.metrics.error("invalid-annotation");
                tracing::warn!(%who, error = %e, "denied");
                admission::deny(
                    uid,
                    400,
                    &format!("{WARNING_PREFIX}: cannot inject the proxy: {e}"),
                )
            }
            Err(e) => self.allow_with_error(uid, "invalid-pod", &who, &e.to_string()),
        }
    }

    fn allow_with_error(&self, uid: &str, kind: &str, who: &str, msg: &str) -> Value {
        self.metrics.error(kind);
        tracing::warn!(%who, error = %msg, "not injected");
        admission::allow(
            uid,
            &[format!("{WARNING_PREFIX}: proxy not injected: {msg}")],
        )
    }

    async fn namespace(&self, name: &str) -> Result<Option<Value>, kube::Error> {
        let api: kube::Api<Namespace> = kube::Api::all(self.client.clone());
        let ns = api.get_opt(name).await?;
        // Serialising a typed Namespace back to JSON cannot fail.
        Ok(ns.and_then(|ns| serde_json::to_value(ns).ok()))
    }
}
