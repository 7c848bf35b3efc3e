//! One source of truth: the CLI renders the chart's own templates; here the same chart is also
//! rendered by Go's text/template with sprig (as Helm does, through `deploy/chart-render`) and
//! the objects are compared, for many value sets.

mod support;

use serde_json::json;
use support::*;

fn compare(what: &str, cli: &str, go: &str) {
    let (mut c, mut g) = (objects(cli), objects(go));
    normalize_created_by(&mut c);
    normalize_created_by(&mut g);
    assert_eq!(
        c.keys().collect::<Vec<_>>(),
        g.keys().collect::<Vec<_>>(),
        "{what}: the same objects"
    );
    for (k, obj) in &c {
        assert_eq!(
            obj, &g[k],
            "{what}: {k} differs between the CLI and the Go/sprig render"
        );
    }
    // The ConfigMap's JSON is compared as text too: it is one string in the cluster.
    let raw = |y: &str| {
        docs(y)
            .into_iter()
            .find(|d| d["kind"] == "ConfigMap")
            .map(|d| d["data"]["cni_network_config"].clone())
    };
    assert_eq!(raw(cli), raw(go), "{what}: cni_network_config text");
}

/// Value sets as `-f` files, given identically to the CLI and to the Go renderer.
#[test]
fn cli_and_chart_render_the_same_objects() {
    let sets: &[(&str, &str)] = &[
        ("default", ""),
        (
            "ports",
            "inboundProxyPort: 1\noutboundProxyPort: 2\nproxyAdminPort: 3\nproxyControlPort: 4\nignoreInboundPorts: \" 25, 9000-9100\"\nignoreOutboundPorts: \"3306\"\nportsToRedirect: \"80,8080\"\n",
        ),
        (
            "ids",
            "proxyUID: 0\nproxyGID: 7\nuseWaitFlag: true\nlogLevel: debug\ndisableIPv6: false\niptablesMode: legacy\n",
        ),
        (
            "integers where strings go",
            "ignoreInboundPorts: 8080\nportsToRedirect: 80\nimage:\n  version: 2\n",
        ),
        ("dirs", "destCNINetDir: /a/net\ndestCNIBinDir: /a/bin\n"),
        (
            "image",
            "image:\n  name: r.io/x\n  version: v1\n  pullPolicy: Never\npriorityClassName: system-node-critical\n",
        ),
        (
            "Linkerd's values",
            "iptablesMode: plain\nprivileged: true\nenablePSP: true\ncliVersion: linkerd/cli x\nrevisionHistoryLimit: 0\npodLabels:\n  a: b\ncommonLabels:\n  c: d\nimagePullSecrets:\n  - name: s\nupdateStrategy:\n  type: OnDelete\n",
        ),
        (
            "no namespace, no tolerations",
            "installNamespace: false\ntolerations: []\n",
        ),
        (
            "some resources",
            "resources:\n  ephemeral-storage:\n    request: 1Gi\n",
        ),
        (
            "agent",
            "agent:\n  logLevel: trace\n  socketPath: /x/y/z.sock\n  pinRoot: /sys/fs/bpf/a/b\n  healthPort: 1234\n  hostCgroupRoot: /c\n  hostNetnsDir: /n\n",
        ),
        (
            "least privilege off the defaults",
            "priorityClassName: \"\"\nagent:\n  mountBpffs: false\n  cniNetnsFromProc: true\n  metrics:\n    enabled: true\n    bindAddress: \"fd00::5\"\n    port: 9100\n",
        ),
        (
            "metrics on IPv4 with IPv6 on",
            "disableIPv6: false\nagent:\n  metrics:\n    enabled: true\n    bindAddress: 10.0.0.5\n",
        ),
    ];
    for (what, values) in sets {
        let file = temp_file(
            &format!("set-{}.yaml", what.replace([' ', ','], "-")),
            values,
        );
        let cli = install_cni(&["-f", &file.display().to_string()], &[]);
        let go =
            chart_render(&[&file]).unwrap_or_else(|e| panic!("{what}: the Go render failed: {e}"));
        compare(what, &cli, &go);
    }
}

/// Every flag at once: the CLI's flags mean the values the chart documents for them.
#[test]
fn full_flags_equal_their_values_in_the_chart() {
    let values = fixture("full-values.yaml");
    let cli = install_cni(
        &[
            "--proxy-uid=2103",
            "--proxy-gid=2104",
            "--inbound-port=5143",
            "--outbound-port=5140",
            "--control-port=5190",
            "--admin-port=5191",
            "--skip-inbound-ports=25,9000-9100",
            "--skip-outbound-ports=3306",
            "--skip-outbound-ports=6379",
            "--redirect-ports=80,8080",
            "--cni-image=example.com/linkerd/agent",
            "--cni-image-version=v9.9.9",
            "--cni-log-level=debug",
            "--agent-log-format=json",
            "--dest-cni-net-dir=/var/lib/cni/net.d",
            "--dest-cni-bin-dir=/var/lib/cni/bin",
            "--priority-class-name=linkerd-cni-critical",
            "--use-wait-flag",
            "--registry=registry.example.com/mirror",
            "--set=agent.healthPort=9992",
            "-f",
            &values.display().to_string(),
        ],
        &[],
    );
    let go = chart_render(&[&values, &fixture("full-flags-as-values.yaml")])
        .unwrap_or_else(|e| panic!("Go render: {e}"));
    compare("full", &cli, &go);
}

/// Both render the iptables mode alike, and refuse a mode that does not exist with the same
/// explanation.
#[test]
fn both_render_iptables_mode_and_refuse_unknown_ones() {
    let file = temp_file("iptables-mode.yaml", "mode: iptables\n");
    let go = chart_render(&[&file]).unwrap_or_else(|e| panic!("Go render: {e}"));
    let cli = install_cni(&["-f", &file.display().to_string()], &[]);
    compare("iptables", &cli, &go);

    let file = temp_file("nft-mode.yaml", "mode: nft\n");
    let go = chart_render(&[&file]).expect_err("the chart must fail for mode nft");
    let cli = linkerd(&["install-cni", "-f", &file.display().to_string()], &[]);
    let cli_err = String::from_utf8_lossy(&cli.stderr);
    let sentence = "mode \"nft\" is not supported: use mode \"auto\", \"ebpf\" or \"iptables\"";
    assert!(go.contains(sentence), "chart error: {go}");
    assert!(cli_err.contains(sentence), "CLI error: {cli_err}");
}

/// The chart and image version move with the CLI's.
#[test]
fn chart_version_is_the_cli_version() {
    let meta = linkerd_cli::chart::chart_meta().expect("Chart.yaml");
    assert_eq!(meta.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(meta.app_version, format!("v{}", env!("CARGO_PKG_VERSION")));
    let objs = objects(&install_cni(&[], &[]));
    assert_eq!(
        objs["DaemonSet/linkerd-cni"].pointer("/spec/template/spec/containers/0/image"),
        Some(&json!(format!(
            "ghcr.io/linkerd/linkerd-cni-ebpf:v{}",
            env!("CARGO_PKG_VERSION")
        )))
    );
}
