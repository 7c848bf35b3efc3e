//! The plugin kubeconfig: private, complete, and rewritten when the token rotates.

mod support;

use std::{fs, os::unix::fs::PermissionsExt, time::Duration};

use base64::Engine as _;
use linkerd_cni_installer::InstallError;
use support::{CA, Node, Running, TOKEN, eventually};

fn yaml(node: &Node) -> serde_yaml::Value {
    let text = fs::read_to_string(node.installer.config().kubeconfig_path())
        .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("kubeconfig is not YAML ({e}):\n{text}"))
}

fn field<'a>(v: &'a serde_yaml::Value, path: &[&str]) -> &'a serde_yaml::Value {
    path.iter().fold(v, |v, key| match key.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => &v[*key],
    })
}

fn str_at<'a>(v: &'a serde_yaml::Value, path: &[&str]) -> Option<&'a str> {
    field(v, path).as_str()
}

fn mode(node: &Node) -> u32 {
    fs::metadata(node.installer.config().kubeconfig_path())
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0)
}

struct Case {
    env: &'static [(&'static str, &'static str)],
    server: &'static str,
    with_ca: bool,
    skip_verify: bool,
    mode: u32,
}

#[test]
fn kubeconfig_is_private_and_complete() {
    let cases = [
        Case {
            env: &[],
            server: "https://10.96.0.1:443",
            with_ca: true,
            skip_verify: false,
            mode: 0o600,
        },
        Case {
            env: &[("SKIP_TLS_VERIFY", "true")],
            server: "https://10.96.0.1:443",
            with_ca: false,
            skip_verify: true,
            mode: 0o600,
        },
        Case {
            env: &[
                ("KUBERNETES_SERVICE_HOST", "fd00:10:96::1"),
                ("KUBERNETES_SERVICE_PORT", "6443"),
            ],
            server: "https://[fd00:10:96::1]:6443",
            with_ca: true,
            skip_verify: false,
            mode: 0o600,
        },
        Case {
            env: &[
                ("KUBERNETES_SERVICE_PROTOCOL", "http"),
                ("KUBECONFIG_MODE", "640"),
            ],
            server: "http://10.96.0.1:443",
            with_ca: true,
            skip_verify: false,
            mode: 0o640,
        },
    ];
    for Case {
        env,
        server,
        with_ca,
        skip_verify,
        mode: want_mode,
    } in &cases
    {
        let node = Node::with_env(env);
        node.installer
            .install_once()
            .unwrap_or_else(|e| panic!("{env:?}: install: {e}"));
        assert_eq!(mode(&node), *want_mode, "{env:?}: mode");
        let y = yaml(&node);
        assert_eq!(
            str_at(&y, &["current-context"]),
            Some("linkerd-cni-context"),
            "{env:?}"
        );
        assert_eq!(
            str_at(&y, &["contexts", "0", "name"]),
            Some("linkerd-cni-context"),
            "{env:?}"
        );
        let cluster = str_at(&y, &["contexts", "0", "context", "cluster"]);
        let user = str_at(&y, &["contexts", "0", "context", "user"]);
        assert_eq!(
            str_at(&y, &["clusters", "0", "name"]),
            cluster,
            "{env:?}: context names the cluster"
        );
        assert_eq!(
            str_at(&y, &["users", "0", "name"]),
            user,
            "{env:?}: context names the user"
        );
        assert_eq!(
            str_at(&y, &["clusters", "0", "cluster", "server"]),
            Some(*server),
            "{env:?}"
        );
        assert_eq!(
            str_at(&y, &["users", "0", "user", "token"]),
            Some(TOKEN),
            "{env:?}"
        );
        let ca = str_at(
            &y,
            &["clusters", "0", "cluster", "certificate-authority-data"],
        )
        .map(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_else(|e| panic!("{env:?}: CA data: {e}"))
        });
        assert_eq!(
            ca,
            with_ca.then(|| CA.as_bytes().to_vec()),
            "{env:?}: CA data"
        );
        let skip = field(
            &y,
            &["clusters", "0", "cluster", "insecure-skip-tls-verify"],
        )
        .as_bool();
        assert_eq!(
            skip,
            skip_verify.then_some(true),
            "{env:?}: insecure-skip-tls-verify"
        );
    }
}

#[test]
fn missing_token_is_a_clear_error_and_nothing_is_patched() {
    let node = Node::new();
    node.add_fixtures(&["10-flannel.conflist"]);
    fs::remove_file(node.sa_dir().join("token")).unwrap_or_else(|e| panic!("{e}"));
    let err = node.installer.install_once().err();
    assert!(
        matches!(err, Some(InstallError::Token { .. })),
        "got {err:?}"
    );
    assert!(err.is_some_and(|e| e.to_string().contains("token")));
    let original = fs::read(support::fixture("net.d/10-flannel.conflist")).unwrap_or_default();
    assert_eq!(
        node.read("10-flannel.conflist"),
        original,
        "patched without a kubeconfig"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_token_is_written_within_a_second() {
    support::init_tracing();
    let node = Node::new();
    node.add_fixtures(&["10-flannel.conflist"]);
    let running = Running::start(&node.installer);
    let token_is = |want: &str| {
        let path = node.installer.config().kubeconfig_path();
        let want = want.to_owned();
        move || {
            fs::read_to_string(&path).is_ok_and(|t| {
                serde_yaml::from_str::<serde_yaml::Value>(&t).is_ok_and(|y| {
                    str_at(&y, &["users", "0", "user", "token"]) == Some(want.as_str())
                })
            })
        }
    };
    eventually(Duration::from_secs(5), "first kubeconfig", token_is(TOKEN)).await;
    let writes = node.installer.write_counts().kubeconfig;

    for (i, token) in ["second.token.sig", "third.token.sig"]
        .into_iter()
        .enumerate()
    {
        node.rotate_token(token);
        eventually(
            Duration::from_secs(1),
            &format!("kubeconfig with {token}"),
            token_is(token),
        )
        .await;
        assert_eq!(mode(&node), 0o600, "mode after rotation");
        assert_eq!(
            node.installer.write_counts().kubeconfig,
            writes + i as u64 + 1,
            "one write per rotation"
        );
    }

    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    assert!(
        !node.installer.config().kubeconfig_path().exists(),
        "kubeconfig left after shutdown"
    );
}
