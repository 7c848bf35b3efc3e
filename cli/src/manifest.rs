//! `linkerd inject` and `linkerd uninject` over Kubernetes manifests: multi-document YAML (or
//! JSON) in, the same documents out with their pod templates changed.
//!
//! Pod templates are found in Pods, Deployments, StatefulSets, DaemonSets, ReplicaSets,
//! ReplicationControllers, Jobs and CronJobs, also inside `kind: List`. Other documents pass
//! through unchanged. Key order is not preserved (documents are re-serialised).

use linkerd_cni_k8s::names;
use serde::Deserialize;
use serde_json::{Value, json};

use linkerd_injector::{
    decision::{self, InjectMode},
    patch::{self, InjectContext, InjectError},
    values::Values,
};

/// What `linkerd inject` does to each pod template.
#[derive(Clone, Debug)]
pub enum InjectHow {
    /// Only add `linkerd.io/inject: enabled`; the webhook does the rest at pod creation.
    Annotate,
    /// Apply the full injection patch now, with these values (`cniEnabled` decides between
    /// `linkerd-init` and the network validator).
    Manual(Box<Values>),
}

/// What happened to one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// `deployment/web`, lower-cased kind.
    pub workload: String,
    /// What was done.
    pub outcome: Outcome,
}

/// The fate of one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Annotated or injected.
    Injected,
    /// Left alone, with the reason.
    Skipped(String),
    /// Injection artefacts removed.
    Uninjected,
    /// Nothing to remove.
    Unchanged,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Outcome::Injected => write!(f, "{} injected", self.workload),
            Outcome::Skipped(why) => write!(f, "{} skipped: {why}", self.workload),
            Outcome::Uninjected => write!(f, "{} uninjected", self.workload),
            Outcome::Unchanged => write!(f, "{} unchanged: nothing to uninject", self.workload),
        }
    }
}

/// Why a manifest could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A document is not valid YAML/JSON.
    #[error("document {index}: {source}")]
    Parse {
        /// 1-based document number.
        index: usize,
        /// The parser's error.
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// A pod template cannot be injected.
    #[error("{workload}: {source}")]
    Inject {
        /// The workload.
        workload: String,
        /// Why.
        #[source]
        source: InjectError,
    },
    /// Output could not be serialised.
    #[error("writing YAML: {0}")]
    Write(#[source] serde_yaml_ng::Error),
}

/// Splits a multi-document stream into JSON values (empty documents dropped).
pub fn parse_documents(input: &str) -> Result<Vec<Value>, ManifestError> {
    let mut docs = Vec::new();
    for (i, de) in serde_yaml_ng::Deserializer::from_str(input).enumerate() {
        let v = Value::deserialize(de).map_err(|source| ManifestError::Parse {
            index: i + 1,
            source,
        })?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Joins documents into one YAML stream (`---` separated).
pub fn write_documents(docs: &[Value]) -> Result<String, ManifestError> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(d).map_err(ManifestError::Write)?);
    }
    Ok(out)
}

/// Pointer to a workload's pod template (`""` for a Pod itself), if it has one.
fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

fn workload_name(doc: &Value) -> String {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object")
        .to_lowercase();
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    format!("{kind}/{name}")
}

/// What is done to one pod template: `(template, workload, namespace) -> outcome`.
type TemplateFn<'a> =
    dyn FnMut(&mut Value, &str, Option<&str>) -> Result<Outcome, ManifestError> + 'a;

/// Calls `f` on every pod template in `doc` (recursing into `kind: List`).
fn for_each_template(
    doc: &mut Value,
    reports: &mut Vec<Report>,
    f: &mut TemplateFn<'_>,
) -> Result<(), ManifestError> {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if kind == "List" || kind.ends_with("List") && doc.get("items").is_some_and(Value::is_array) {
        if let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) {
            for item in items {
                for_each_template(item, reports, f)?;
            }
        }
        return Ok(());
    }
    let Some(ptr) = template_pointer(&kind) else {
        return Ok(());
    };
    let workload = workload_name(doc);
    let namespace = doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(template) = doc.pointer_mut(ptr).filter(|t| t.is_object()) else {
        reports.push(Report {
            workload,
            outcome: Outcome::Skipped("no pod template".into()),
        });
        return Ok(());
    };
    let outcome = f(template, &workload, namespace.as_deref())?;
    reports.push(Report { workload, outcome });
    Ok(())
}

/// Injects one pod template.
fn inject_template(
    template: &mut Value,
    workload: &str,
    namespace: Option<&str>,
    how: &InjectHow,
) -> Result<Outcome, ManifestError> {
    if let Some(reason) = decision::structural_skip(template) {
        return Ok(Outcome::Skipped(reason.to_string()));
    }
    match how {
        InjectHow::Annotate => {
            let keep_ingress = decision::annotation(template, names::INJECT_ANNOTATION)
                == Some(names::INJECT_INGRESS);
            if !keep_ingress {
                set_annotation(template, names::INJECT_ANNOTATION, names::INJECT_ENABLED);
            }
        }
        InjectHow::Manual(values) => {
            let mode: InjectMode = decision::manual_mode(template);
            let ctx = InjectContext {
                namespace_name: namespace,
                ..InjectContext::new(values, mode)
            };
            let err = |source| ManifestError::Inject {
                workload: workload.to_string(),
                source,
            };
            let ops = patch::injection_patch(template, &ctx).map_err(err)?;
            patch::apply_patch(template, &ops).map_err(err)?;
        }
    }
    Ok(Outcome::Injected)
}

fn set_annotation(obj: &mut Value, key: &str, value: &str) {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    let meta = &mut obj["metadata"];
    if !meta.get("annotations").is_some_and(Value::is_object) {
        meta["annotations"] = json!({});
    }
    meta["annotations"][key] = json!(value);
}

/// `linkerd inject`: every pod template in `input` annotated (or injected with
/// [`InjectHow::Manual`]); returns the new stream and one report per workload.
pub fn inject(input: &str, how: &InjectHow) -> Result<(String, Vec<Report>), ManifestError> {
    let mut docs = parse_documents(input)?;
    let mut reports = Vec::new();
    for doc in &mut docs {
        for_each_template(doc, &mut reports, &mut |t, w, ns| {
            inject_template(t, w, ns, how)
        })?;
    }
    Ok((write_documents(&docs)?, reports))
}

/// `linkerd uninject`: removes from every pod template what injection added (proxy,
/// `linkerd-init` or validator, volumes, annotations including `linkerd.io/inject`, labels).
pub fn uninject(input: &str) -> Result<(String, Vec<Report>), ManifestError> {
    let mut docs = parse_documents(input)?;
    let mut reports = Vec::new();
    for doc in &mut docs {
        for_each_template(doc, &mut reports, &mut |t, _, _| {
            Ok(if patch::uninject_pod(t) {
                Outcome::Uninjected
            } else {
                Outcome::Unchanged
            })
        })?;
    }
    Ok((write_documents(&docs)?, reports))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: emojivoto}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: 'web:1'}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: '* * * * *'
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: tick, image: 'busybox'}]
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: host, annotations: {linkerd.io/inject: ingress}}
  spec: {hostNetwork: true, containers: [{name: h, image: h}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: edge, annotations: {linkerd.io/inject: ingress}}
  spec: {containers: [{name: e, image: e}]}
---
";

    fn templates(out: &str) -> Vec<Value> {
        let mut found = Vec::new();
        fn walk(d: &Value, found: &mut Vec<Value>) {
            if let Some(items) = d.get("items").and_then(Value::as_array) {
                items.iter().for_each(|i| walk(i, found));
            }
            let kind = d.get("kind").and_then(Value::as_str).unwrap_or("");
            if let Some(t) = template_pointer(kind).and_then(|p| d.pointer(p)) {
                found.push(t.clone());
            }
        }
        for d in parse_documents(out).expect("output parses") {
            walk(&d, &mut found);
        }
        found
    }

    #[test]
    fn annotate_only_touches_pod_templates() {
        let (out, reports) = inject(INPUT, &InjectHow::Annotate).expect("inject");
        let outcomes: Vec<String> = reports.iter().map(ToString::to_string).collect();
        assert_eq!(outcomes[0], "deployment/web injected");
        assert_eq!(outcomes[1], "cronjob/tick injected");
        assert!(
            outcomes[2].starts_with("pod/host skipped: pods with hostNetwork"),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[3], "pod/edge injected");
        let t = templates(&out);
        let ann: Vec<Option<&str>> = t
            .iter()
            .map(|t| decision::annotation(t, names::INJECT_ANNOTATION))
            .collect();
        assert_eq!(
            ann,
            [
                Some("enabled"),
                Some("enabled"),
                Some("ingress"),
                Some("ingress")
            ]
        );
        assert!(
            t.iter().all(|t| !decision::has_proxy(t)),
            "annotation only: no proxy"
        );
        let docs = parse_documents(&out).expect("parse");
        assert_eq!(docs.len(), 4, "documents kept, empty trailing one dropped");
        assert_eq!(
            docs[1],
            parse_documents(INPUT).expect("parse")[1],
            "the Service is untouched"
        );
    }

    #[test]
    fn manual_follows_cni_enabled_and_uninject_reverts() {
        let original = templates(INPUT);
        for cni in [false, true] {
            let values = Values {
                cni_enabled: cni,
                ..Values::default()
            };
            let (out, _) = inject(INPUT, &InjectHow::Manual(Box::new(values))).expect("inject");
            let injected = templates(&out);
            for (i, t) in injected.iter().enumerate() {
                let names: Vec<&str> = decision::container_names(t).collect();
                if i == 2 {
                    assert!(
                        !names.contains(&names::PROXY_CONTAINER),
                        "hostNetwork pod skipped: {names:?}"
                    );
                    continue;
                }
                assert!(
                    names.contains(&names::PROXY_CONTAINER),
                    "cni={cni} #{i}: {names:?}"
                );
                assert_eq!(
                    names.contains(&names::INIT_CONTAINER),
                    !cni,
                    "cni={cni} #{i}: {names:?}"
                );
                assert_eq!(
                    names.contains(&names::VALIDATOR_CONTAINER),
                    cni,
                    "cni={cni} #{i}: {names:?}"
                );
            }
            let ingress = &injected[3]["spec"]["initContainers"][1]["env"];
            assert!(
                ingress.to_string().contains("LINKERD2_PROXY_INGRESS_MODE"),
                "ingress mode kept"
            );
            assert_eq!(
                injected[0]
                    .pointer("/metadata/labels/linkerd.io~1workload-ns")
                    .and_then(Value::as_str),
                Some("emojivoto")
            );
            let (back, reports) = uninject(&out).expect("uninject");
            assert!(
                reports
                    .iter()
                    .filter(|r| r.outcome == Outcome::Uninjected)
                    .count()
                    == 4,
                "{reports:?}"
            );
            let back = templates(&back);
            // Annotation-free originals come back exactly; the ingress pods lose their inject annotation.
            assert_eq!(back[0], original[0], "cni={cni}");
            assert_eq!(back[1], original[1], "cni={cni}");
            assert!(decision::annotation(&back[3], names::INJECT_ANNOTATION).is_none());
        }
    }

    #[test]
    fn bad_yaml_names_the_document() {
        let err =
            inject("kind: Pod\n---\n: : :\n  - [\n", &InjectHow::Annotate).expect_err("bad yaml");
        assert!(err.to_string().starts_with("document 2"), "{err}");
    }
}
