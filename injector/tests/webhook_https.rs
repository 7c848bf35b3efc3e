//! The webhook over real HTTPS: a client trusting the generated CA posts AdmissionReviews;
//! `linkerd-config` comes from a fake API server and `cniEnabled` flips between requests; bad
//! input gets a 400/413 or an allow without patch, and the webhook keeps serving.

mod support;

use std::{net::SocketAddr, sync::Arc};

use linkerd_cni_k8s::names;
use linkerd_injector::{
    Values, admission,
    metrics::Metrics,
    server::{self, Limits},
    tls,
    webhook::Webhook,
};
use serde_json::{Value, json};
use support::{CONFIG_PATH, FakeApi, HttpsClient, fixture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SERVER_NAME: &str = "linkerd-proxy-injector.linkerd.svc";

struct Running {
    api: FakeApi,
    client: HttpsClient,
    admin: SocketAddr,
    ca_pem: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Running {
    let api = FakeApi::start().await;
    api.set_namespace(
        "emojivoto",
        json!({names::INJECT_ANNOTATION: "enabled"}),
        json!({}),
    );
    api.set_namespace(
        "opted-out",
        json!({names::INJECT_ANNOTATION: "enabled"}),
        json!({names::ADMISSION_WEBHOOKS_LABEL: "disabled"}),
    );
    api.set_config(&Values::default());

    let material = tls::generate(&tls::service_dns_names(
        names::INJECTOR,
        names::CONTROL_PLANE_NAMESPACE,
    ))
    .expect("TLS material");
    let config = tls::server_config(material.cert_pem.as_bytes(), material.key_pem.as_bytes())
        .expect("server config");
    let webhook = Arc::new(Webhook::new(
        api.client(),
        "linkerd",
        Arc::new(Metrics::default()),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind webhook");
    let addr = listener.local_addr().expect("webhook address");
    let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind admin");
    let admin = admin_listener.local_addr().expect("admin address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (stop_admin, stopped_admin) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve_https(
        listener,
        config,
        webhook.clone(),
        Limits::default(),
        async move {
            let _ = stopped.await;
            let _ = stop_admin.send(());
        },
    ));
    tokio::spawn(server::serve_admin(admin_listener, webhook, async move {
        let _ = stopped_admin.await;
    }));
    Running {
        api,
        client: HttpsClient::new(addr, &material.ca_pem, SERVER_NAME),
        admin,
        ca_pem: material.ca_pem,
        _stop: stop,
    }
}

fn deployment_review() -> Value {
    fixture("review-deployment-pod.json")
}

fn patched_init_names(review: &Value, resp: &Value) -> Vec<String> {
    let pod = support::apply_response(&review["request"]["object"], resp);
    pod["spec"]["initContainers"]
        .as_array()
        .expect("initContainers")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_string())
        .collect()
}

#[tokio::test]
async fn https_injection_follows_cni_enabled_between_requests() {
    let w = start().await;
    let review = deployment_review();
    // Flip cniEnabled between requests; every request must read linkerd-config again.
    for (i, cni) in [false, true, false, true].into_iter().enumerate() {
        w.api.set_config(&Values {
            cni_enabled: cni,
            ..Values::default()
        });
        let resp = w.client.review(&review).await;
        assert_eq!(resp["response"]["allowed"], true, "{resp}");
        let first = if cni {
            names::VALIDATOR_CONTAINER
        } else {
            names::INIT_CONTAINER
        };
        assert_eq!(
            patched_init_names(&review, &resp),
            [first, names::PROXY_CONTAINER],
            "request {i}, cni={cni}"
        );
        assert_eq!(
            w.api.hits(CONFIG_PATH),
            i + 1,
            "linkerd-config read once per request"
        );
    }
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_is_refused() {
    let w = start().await;
    let other = tls::generate(&tls::service_dns_names("other", "ns")).expect("other CA");
    let stranger = HttpsClient::new(w.client.addr, &other.ca_pem, SERVER_NAME);
    let err = stranger
        .connect()
        .await
        .expect_err("untrusted certificate must fail");
    assert!(err.contains("TLS handshake"), "{err}");
    let wrong_name = HttpsClient::new(w.client.addr, &w.ca_pem, "evil.example.com");
    let err = wrong_name
        .connect()
        .await
        .expect_err("a certificate for another name must fail");
    assert!(err.contains("TLS handshake"), "{err}");
    // The server still serves the right client.
    assert_eq!(
        w.client.review(&deployment_review()).await["response"]["allowed"],
        true
    );
}

fn with_request(mut review: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut review["request"]);
    review
}

/// What a case expects.
enum Want {
    Status(u16, &'static str),
    AllowNoPatch(Option<&'static str>),
    Deny(&'static str),
}

#[tokio::test]
async fn bad_input_and_skips_never_break_the_webhook() {
    let w = start().await;
    let good = deployment_review();
    let big = {
        let mut r = good.clone();
        r["request"]["object"]["metadata"]["annotations"] =
            json!({"filler": "x".repeat(2 * 1024 * 1024)});
        r.to_string().into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>, Want)> = vec![
        ("not JSON", b"{not json".to_vec(), Want::Status(400, "not JSON")),
        ("empty body", Vec::new(), Want::Status(400, "not JSON")),
        ("v1beta1", with_request(good.clone(), |_| {}).to_string().replace("admission.k8s.io/v1\"", "admission.k8s.io/v1beta1\"").into_bytes(), Want::Status(400, "v1beta1")),
        ("no request", json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string().into_bytes(), Want::Status(400, "no request")),
        ("no uid", with_request(good.clone(), |r| { r.as_object_mut().expect("object").remove("uid"); }).to_string().into_bytes(), Want::Status(400, "no uid")),
        ("uid not a string", with_request(good.clone(), |r| r["uid"] = json!(42)).to_string().into_bytes(), Want::Status(400, "no uid")),
        ("operation not a string", with_request(good.clone(), |r| r["operation"] = json!(["CREATE"])).to_string().into_bytes(), Want::Status(400, "malformed")),
        ("oversized", big, Want::Status(413, "exceeds")),
        ("a Service", with_request(good.clone(), |r| {
            r["kind"] = json!({"group": "", "version": "v1", "kind": "Service"});
            r["resource"] = json!({"group": "", "version": "v1", "resource": "services"});
            r["object"] = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}});
        }).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("an unknown kind", with_request(good.clone(), |r| {
            r["kind"] = json!({"group": "example.com", "version": "v1", "kind": "Widget"});
            r["resource"] = json!({"group": "example.com", "version": "v1", "resource": "widgets"});
        }).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("pod UPDATE", with_request(good.clone(), |r| r["operation"] = json!("UPDATE")).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("pod without object", with_request(good.clone(), |r| { r.as_object_mut().expect("object").remove("object"); }).to_string().into_bytes(), Want::AllowNoPatch(Some("no pod object"))),
        ("object is a string", with_request(good.clone(), |r| r["object"] = json!("pod")).to_string().into_bytes(), Want::AllowNoPatch(Some("no pod object"))),
        ("pod without spec", with_request(good.clone(), |r| { r["object"].as_object_mut().expect("object").remove("spec"); }).to_string().into_bytes(), Want::AllowNoPatch(Some("spec is missing"))),
        ("hostNetwork", with_request(good.clone(), |r| r["object"]["spec"]["hostNetwork"] = json!(true)).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("already injected", with_request(good.clone(), |r| {
            r["object"]["spec"]["initContainers"] = json!([{"name": "linkerd-proxy", "image": "p", "restartPolicy": "Always"}]);
        }).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("pod disabled in an enabled namespace", with_request(good.clone(), |r| {
            r["object"]["metadata"]["annotations"] = json!({names::INJECT_ANNOTATION: "disabled"});
        }).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("kube-system", with_request(good.clone(), |r| {
            r["namespace"] = json!("kube-system");
            r["object"]["metadata"]["annotations"] = json!({names::INJECT_ANNOTATION: "enabled"});
        }).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("namespace opted out of webhooks", with_request(good.clone(), |r| r["namespace"] = json!("opted-out")).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("namespace that does not exist", with_request(good.clone(), |r| r["namespace"] = json!("ghost")).to_string().into_bytes(), Want::AllowNoPatch(None)),
        ("malformed skip annotation", with_request(good.clone(), |r| {
            r["object"]["metadata"]["annotations"] = json!({names::SKIP_OUTBOUND_PORTS_ANNOTATION: "443,https"});
        }).to_string().into_bytes(), Want::Deny(names::SKIP_OUTBOUND_PORTS_ANNOTATION)),
    ];
    for (name, body, want) in &cases {
        let (status, resp) = w
            .client
            .request("POST", "/", body.clone())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = String::from_utf8_lossy(&resp).to_string();
        match want {
            Want::Status(code, msg) => {
                assert_eq!(status, *code, "{name}: {text}");
                assert!(text.contains(msg), "{name}: expected {msg:?} in {text:?}");
            }
            Want::AllowNoPatch(warning) => {
                assert_eq!(status, 200, "{name}: {text}");
                let review: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"));
                assert_eq!(review["response"]["allowed"], true, "{name}: {text}");
                assert!(
                    review["response"].get("patch").is_none(),
                    "{name}: no patch expected: {text}"
                );
                let warnings = review["response"]["warnings"].to_string();
                match warning {
                    Some(w) => assert!(
                        warnings.contains(w),
                        "{name}: expected warning {w:?}, got {warnings}"
                    ),
                    None => assert!(
                        review["response"].get("warnings").is_none(),
                        "{name}: {text}"
                    ),
                }
            }
            Want::Deny(annotation) => {
                assert_eq!(status, 200, "{name}: {text}");
                let review: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"));
                assert_eq!(review["response"]["allowed"], false, "{name}: {text}");
                assert_eq!(review["response"]["status"]["code"], 400, "{name}: {text}");
                let msg = review["response"]["status"]["message"]
                    .as_str()
                    .unwrap_or_default();
                assert!(
                    msg.contains(annotation),
                    "{name}: the message names the annotation: {msg}"
                );
            }
        }
        // After every case the webhook still injects.
        let after = w.client.review(&good).await;
        assert!(
            admission::response_patch(&after).is_some(),
            "{name}: webhook stopped injecting: {after}"
        );
    }

    // linkerd-config unreadable: allowed without a patch, with a warning naming it.
    w.api.fail(CONFIG_PATH, 500);
    let resp = w.client.review(&good).await;
    assert_eq!(resp["response"]["allowed"], true);
    assert!(resp["response"].get("patch").is_none(), "{resp}");
    assert!(
        resp["response"]["warnings"]
            .to_string()
            .contains("linkerd-config"),
        "{resp}"
    );
    w.api.set_config(&Values::default());

    // Chunked body over the limit (no Content-Length to check up front), then garbage instead
    // of TLS: neither stops the server.
    let mut tls = w.client.connect().await.expect("connect");
    tls.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .expect("write head");
    let chunk = vec![b'a'; 64 * 1024];
    let mut answer = Vec::new();
    for _ in 0..40 {
        let head = format!("{:x}\r\n", chunk.len());
        if tls.write_all(head.as_bytes()).await.is_err()
            || tls.write_all(&chunk).await.is_err()
            || tls.write_all(b"\r\n").await.is_err()
        {
            break;
        }
    }
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tls.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "chunked oversized body: {answer:?}"
    );
    let mut raw = tokio::net::TcpStream::connect(w.client.addr)
        .await
        .expect("connect raw");
    raw.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write garbage");
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        raw.read_to_end(&mut sink),
    )
    .await;

    let (status, _) = w
        .client
        .request("GET", "/", Vec::new())
        .await
        .expect("GET /");
    assert_eq!(status, 405);
    let (status, _) = w
        .client
        .request("GET", "/nowhere", Vec::new())
        .await
        .expect("GET /nowhere");
    assert_eq!(status, 404);

    // The counters saw all of it, on the HTTPS and on the admin endpoint.
    let (status, metrics) = w
        .client
        .request("GET", "/metrics", Vec::new())
        .await
        .expect("metrics");
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&metrics).to_string();
    let mut admin = tokio::net::TcpStream::connect(w.admin)
        .await
        .expect("admin");
    admin
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("admin request");
    let mut admin_metrics = Vec::new();
    admin
        .read_to_end(&mut admin_metrics)
        .await
        .expect("admin response");
    let admin_metrics = String::from_utf8_lossy(&admin_metrics).to_string();
    let injected = cases.len(); // one good request after each case
    for line in [
        "linkerd_proxy_injector_errors_total{kind=\"bad-request\"} 7".to_string(),
        "linkerd_proxy_injector_errors_total{kind=\"too-large\"} 2".to_string(),
        "linkerd_proxy_injector_errors_total{kind=\"invalid-pod\"} 3".to_string(),
        "linkerd_proxy_injector_errors_total{kind=\"invalid-annotation\"} 1".to_string(),
        "linkerd_proxy_injector_errors_total{kind=\"config\"} 1".to_string(),
        "linkerd_proxy_injector_skipped_total{reason=\"host-network\"} 1".to_string(),
        "linkerd_proxy_injector_skipped_total{reason=\"not-pod-create\"} 3".to_string(),
        "linkerd_proxy_injector_skipped_total{reason=\"webhooks-disabled\"} 1".to_string(),
        format!(
            "linkerd_proxy_injector_injected_total{{cni_enabled=\"false\"}} {}",
            injected
        ),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line:?} in /metrics:\n{metrics}"
        );
        assert!(
            admin_metrics.contains(&line),
            "missing {line:?} in admin /metrics:\n{admin_metrics}"
        );
    }
}
