//! The `linkerd-proxy-injector` binary as deployed: its flags, generated TLS material (what
//! `linkerd install` puts in the Secret and `caBundle`; the CLI's tests check that rendering),
//! a kubeconfig pointing at the fake API server, and a client that trusts only the CA.

mod support;

use std::{
    net::{SocketAddr, TcpListener},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use linkerd_cni_k8s::names;
use linkerd_injector::{Values, tls};
use serde_json::json;
use support::{FakeApi, HttpsClient, fixture, tempdir};

/// Kills the child (by PID) when the test ends, however it ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

#[tokio::test]
async fn the_binary_serves_with_the_rendered_tls_and_a_kubeconfig() {
    let api = FakeApi::start().await;
    api.set_namespace(
        "emojivoto",
        json!({names::INJECT_ANNOTATION: "enabled"}),
        json!({}),
    );
    api.set_config(&Values {
        cni_enabled: true,
        ..Values::default()
    });

    let material = tls::generate(&tls::service_dns_names(
        names::INJECTOR,
        names::CONTROL_PLANE_NAMESPACE,
    ))
    .expect("TLS");
    let ca_bundle = material.ca_pem.clone();

    let dir = tempdir();
    let (cert, key, kubeconfig) = (
        dir.path.join("tls.crt"),
        dir.path.join("tls.key"),
        dir.path.join("kubeconfig"),
    );
    support::write(&cert, &material.cert_pem);
    support::write(&key, &material.key_pem);
    support::write(
        &kubeconfig,
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user:\n    token: not-a-secret\n",
            api.addr
        ),
    );
    let (addr, admin) = (free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_linkerd-proxy-injector"))
        .arg(format!("--addr={addr}"))
        .arg(format!("--admin-addr={admin}"))
        .arg(format!("--tls-cert={}", cert.display()))
        .arg(format!("--tls-key={}", key.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting linkerd-proxy-injector");
    let _guard = ChildGuard(child);

    let client = HttpsClient::new(addr, &ca_bundle, "linkerd-proxy-injector.linkerd.svc");
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.connect().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "linkerd-proxy-injector did not start listening on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let review = fixture("review-deployment-pod.json");
    let resp = client.review(&review).await;
    let pod = support::apply_response(&review["request"]["object"], &resp);
    let inits: Vec<&str> = pod["spec"]["initContainers"]
        .as_array()
        .expect("initContainers")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        inits,
        [names::VALIDATOR_CONTAINER, names::PROXY_CONTAINER],
        "cniEnabled read through the kubeconfig"
    );

    let mut admin_conn = tokio::net::TcpStream::connect(admin)
        .await
        .expect("admin endpoint");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    admin_conn
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut metrics = String::new();
    admin_conn
        .read_to_string(&mut metrics)
        .await
        .expect("metrics");
    assert!(
        metrics.contains("linkerd_proxy_injector_injected_total{cni_enabled=\"true\"} 1"),
        "{metrics}"
    );
}
