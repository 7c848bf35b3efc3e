//! Prometheus metrics of the webhook, served on `/metrics` (text exposition format):
//! requests received, pods injected (by `cniEnabled`), pods skipped (by reason) and errors
//! (by kind).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// Label of [`Metrics::injected`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CniLabel {
    /// `"true"` or `"false"`.
    pub cni_enabled: String,
}

/// Label of [`Metrics::skipped`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// A [`crate::decision::SkipReason::label`], or `not-pod-create`.
    pub reason: String,
}

/// Label of [`Metrics::errors`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `bad-request`, `too-large`, `namespace`, `config`, `invalid-pod`, `invalid-annotation`.
    pub kind: String,
}

/// The webhook's counters and the registry that exposes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Admission requests received (whatever their fate).
    pub requests: Counter,
    /// Pods the webhook patched.
    pub injected: Family<CniLabel, Counter>,
    /// Requests answered without a patch, by reason.
    pub skipped: Family<ReasonLabel, Counter>,
    /// Requests that could not be served as asked, by kind.
    pub errors: Family<KindLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("linkerd_proxy_injector");
        let requests = Counter::default();
        let injected = Family::<CniLabel, Counter>::default();
        let skipped = Family::<ReasonLabel, Counter>::default();
        let errors = Family::<KindLabel, Counter>::default();
        registry.register("requests", "Admission requests received", requests.clone());
        registry.register("injected", "Pods injected with a proxy", injected.clone());
        registry.register(
            "skipped",
            "Admission requests answered without a patch",
            skipped.clone(),
        );
        registry.register("errors", "Admission requests that failed", errors.clone());
        Self {
            registry,
            requests,
            injected,
            skipped,
            errors,
        }
    }
}

impl Metrics {
    /// Counts an injection.
    pub fn inject(&self, cni_enabled: bool) {
        self.injected
            .get_or_create(&CniLabel {
                cni_enabled: cni_enabled.to_string(),
            })
            .inc();
    }

    /// Counts a skip.
    pub fn skip(&self, reason: &str) {
        self.skipped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts an error.
    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_show_up_in_the_exposition() {
        let m = Metrics::default();
        m.requests.inc();
        m.requests.inc();
        m.inject(true);
        m.skip("host-network");
        m.error("bad-request");
        let text = m.encode();
        for line in [
            "linkerd_proxy_injector_requests_total 2",
            "linkerd_proxy_injector_injected_total{cni_enabled=\"true\"} 1",
            "linkerd_proxy_injector_skipped_total{reason=\"host-network\"} 1",
            "linkerd_proxy_injector_errors_total{kind=\"bad-request\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
    }
}
