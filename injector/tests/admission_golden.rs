//! AdmissionReview fixtures (real API server shapes) through the webhook, with `cniEnabled`
//! false and true: the response's patch, applied with the `json-patch` crate, must give the
//! golden pods, which must pass `kubernetes-validate --strict`; and `injected_pod` (the
//! function exposed for the agreement test) must give the same pods.

mod support;

use std::sync::Arc;

use linkerd_cni_k8s::names;
use linkerd_injector::{Values, injected_pod, metrics::Metrics, webhook::Webhook};
use serde_json::{Value, json};
use support::{FakeApi, apply_response, fixture, golden, validate};

const FIXTURES: &[&str] = &[
    "review-deployment-pod",
    "review-pod-with-init-and-skips",
    "review-ingress-pod",
];

fn init_names(pod: &Value) -> Vec<String> {
    pod["spec"]["initContainers"]
        .as_array()
        .unwrap_or_else(|| panic!("no initContainers in {pod}"))
        .iter()
        .map(|c| c["name"].as_str().expect("container name").to_string())
        .collect()
}

#[tokio::test]
async fn fixtures_patch_into_golden_pods_that_validate() {
    let api = FakeApi::start().await;
    api.set_namespace(
        "emojivoto",
        json!({names::INJECT_ANNOTATION: "enabled"}),
        json!({}),
    );
    api.set_namespace("shop", json!({}), json!({}));
    api.set_namespace("ingress", json!({}), json!({}));
    let webhook = Webhook::new(api.client(), "linkerd", Arc::new(Metrics::default()));

    let mut patched_pods = Vec::new();
    for name in FIXTURES {
        let review = fixture(&format!("{name}.json"));
        let pod = review["request"]["object"].clone();
        let original_inits = pod["spec"]["initContainers"].as_array().map_or(0, Vec::len);
        for cni in [false, true] {
            let values = Values {
                cni_enabled: cni,
                ..Values::default()
            };
            api.set_config(&values);
            let resp = webhook
                .review(review.to_string().as_bytes())
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let r = &resp["response"];
            assert_eq!(r["uid"], review["request"]["uid"], "{name}: uid echoed");
            assert_eq!(
                (&r["allowed"], &r["patchType"]),
                (&json!(true), &json!("JSONPatch")),
                "{name}: {resp}"
            );
            let patched = apply_response(&pod, &resp);

            let inits = init_names(&patched);
            let first = if cni {
                names::VALIDATOR_CONTAINER
            } else {
                names::INIT_CONTAINER
            };
            assert_eq!(
                &inits[..2],
                [first, names::PROXY_CONTAINER],
                "{name} cni={cni}"
            );
            assert_eq!(
                inits.len(),
                original_inits + 2,
                "{name} cni={cni}: the pod's own init containers kept"
            );
            let text = patched.to_string();
            assert_eq!(
                text.contains("NET_ADMIN"),
                !cni,
                "{name} cni={cni}: NET_ADMIN only without CNI"
            );
            assert_eq!(
                text.contains(names::XTABLES_LOCK_VOLUME),
                !cni,
                "{name} cni={cni}"
            );

            let same = injected_pod(&pod, &values).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                same, patched,
                "{name} cni={cni}: injected_pod agrees with the webhook"
            );

            golden(&format!("{name}.cni-{cni}.json"), &patched);
            // Admission sees controller-made pods before the API server turns generateName into
            // a name; the validator insists on one.
            let mut named = patched;
            if named.pointer("/metadata/name").is_none() {
                let generated = format!(
                    "{}x7k2q",
                    named["metadata"]["generateName"]
                        .as_str()
                        .expect("generateName")
                );
                named["metadata"]["name"] = json!(generated);
            }
            patched_pods.push(named);
        }
    }
    validate(&patched_pods);
}
