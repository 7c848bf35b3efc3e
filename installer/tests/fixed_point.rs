//! The installer's rewrite is a fixed point and changes nothing but its own entry, byte for
//! byte: numbers of every spelling (`6e81`, `6.4345e-68`, 44-digit integers), in other plugins,
//! at the top level and in the plugin's own template; and the entry is built as data, so no
//! setting can inject keys into it.

mod support;

use std::path::Path;

use linkerd_cni_installer::{
    FileState, Installer, InstallerConfig,
    conflist::{self, ConfKind},
    json::Json,
};
use support::{Node, fixture};

/// Numbers whose spelling a parse into `f64`/`u64` and back would change.
const ODD_NUMBERS: &[&str] = &[
    "6e81",
    "6.4345e-68",
    "12345678901234567890123456789012345678901234",
    "-12345678901234567890123456789012345678901234",
    "18446744073709551616",
    "-9223372036854775809",
    "1E+2",
    "1e-0",
    "-0",
    "-0.0",
    "0.1000",
    "100.0",
    "0e0",
    "-1.5E-3",
    "1.7976931348623157e308",
    "5e-324",
    "2.2250738585072011e-308",
    "9007199254740993",
    "0.30000000000000004",
    "1e-400",
    "123456789012345678901234567890.12345678901234567890e-12",
];

/// The template as the DaemonSet passes it, with `number` in places a user might put one.
fn template_with(number: &str) -> String {
    format!(
        r#"{{"name":"linkerd-cni","type":"linkerd-cni","log_level":"info",
"kubernetes":{{"kubeconfig":"__KUBECONFIG_FILEPATH__"}},
"linkerd":{{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,
"odd":{number},"odd-list":[{number},{{"deep":{number}}}]}}}}"#
    )
}

fn config(template: &str, extra: &[(&str, &str)]) -> InstallerConfig {
    let lookup = |key: &str| {
        extra
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| (*v).to_owned())
            .or_else(|| match key {
                "CNI_NETWORK_CONFIG" => Some(template.to_owned()),
                "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".into()),
                "KUBERNETES_SERVICE_PORT" => Some("443".into()),
                _ => None,
            })
    };
    InstallerConfig::from_lookup(lookup).unwrap_or_else(|e| panic!("config: {e}"))
}

fn entry_from(template: &str) -> Json {
    config(template, &[])
        .plugin_entry()
        .unwrap_or_else(|e| panic!("entry from {template}: {e}"))
}

fn fixture_entry() -> Json {
    entry_from(&support::template())
}

/// What the installer leaves in a `.conflist` holding `input`.
fn patched(input: &[u8], entry: &Json) -> Vec<u8> {
    match conflist::patch(Path::new("/d/x.conflist"), input, entry) {
        Ok(Some(p)) => p.bytes,
        Ok(None) => input.to_vec(),
        Err(e) => panic!("{e}: {}", String::from_utf8_lossy(input)),
    }
}

/// What cleanup leaves in a `.conflist` holding `input`.
fn unpatched(input: &[u8], entry: &Json) -> Vec<u8> {
    match conflist::unpatch(input, entry) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => input.to_vec(),
        Err(e) => panic!("{e}: {}", String::from_utf8_lossy(input)),
    }
}

fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() > 600 {
        format!(
            "{}…({} bytes)",
            &text[..text.floor_char_boundary(600)],
            text.len()
        )
    } else {
        text.into_owned()
    }
}

/// The properties every conflist `input` without a linkerd-cni entry must have:
/// - the patch is `input` with one insertion, and that insertion is `,`, whitespace and our
///   entry: every byte outside the entry is unchanged;
/// - patching the output changes nothing (a fixed point), and the file reads as patched;
/// - cleanup gives back `input` byte for byte.
fn check_plain_conflist(input: &[u8], entry: &Json, label: &str) {
    let out = patched(input, entry);
    let at = input.iter().zip(&out).take_while(|(a, b)| a == b).count();
    let rest = &input[at..];
    assert!(
        out.len() > input.len() && out.ends_with(rest),
        "{label}: the patch is not one insertion into the input\ninput:  {}\noutput: {}",
        show(input),
        show(&out)
    );
    let inserted = &out[at..out.len() - rest.len()];
    let Some(entry_text) = inserted.strip_prefix(b",") else {
        panic!(
            "{label}: the insertion does not start with a comma: {}",
            show(inserted)
        );
    };
    let inserted_entry = Json::parse(entry_text).unwrap_or_else(|e| {
        panic!(
            "{label}: the insertion is not one value ({e}): {}",
            show(inserted)
        )
    });
    assert!(
        inserted_entry == *entry,
        "{label}: the inserted entry differs from ours: {}",
        show(entry_text)
    );
    check_fixed_point(&out, entry, label);
    assert!(
        unpatched(&out, entry) == input,
        "{label}: cleanup does not give the input back\ninput:   {}\ncleaned: {}",
        show(input),
        show(&unpatched(&out, entry))
    );
}

/// Patching `out` again writes nothing, and the file reads as carrying our entry.
fn check_fixed_point(out: &[u8], entry: &Json, label: &str) {
    let again = conflist::patch(Path::new("/d/x.conflist"), out, entry)
        .unwrap_or_else(|e| panic!("{label}: the output is malformed: {e}"));
    assert!(
        again.is_none(),
        "{label}: patching the output changes it\nfirst:  {}\nsecond: {}",
        show(out),
        show(&again.map(|p| p.bytes).unwrap_or_default())
    );
    assert_eq!(
        conflist::state(Path::new("/d/x.conflist"), out, entry),
        FileState::Patched,
        "{label}"
    );
}

/// A conflist with `number` at the top level and in other plugins, nested, laid out with
/// `sep` between array elements (`", "`, `",\n    "`, ...).
fn conflist_with(number: &str, sep: &str, plugins: &[String]) -> String {
    format!(
        "{{\"cniVersion\": \"0.4.0\", \"name\": \"odd\", \"mtu\": {number},\n  \"plugins\": [{}]\n, \"after\": [{number}, {{\"x\": {number}}}]}}\n",
        plugins.join(sep)
    )
}

fn other_plugins(number: &str) -> Vec<String> {
    vec![
        format!(
            "{{\"type\": \"bridge\", \"mtu\": {number}, \"ipam\": {{\"type\": \"host-local\", \"ranges\": [[{number}, {{\"n\": {number}}}]]}}}}"
        ),
        format!(
            "{{ \"type\":\"portmap\",\"capabilities\":{{\"portMappings\":true}},\"n\":{number} }}"
        ),
    ]
}

fn check_number(number: &str, entry: &Json) {
    for sep in [",", ", ", ",\n    ", ",\n\t\t"] {
        let label = format!("{number} sep {sep:?}");
        let input = conflist_with(number, sep, &other_plugins(number));
        check_plain_conflist(input.as_bytes(), entry, &label);

        // Old linkerd-cni entries (first, middle, last): removed with their separator, every
        // other byte kept; the result is the same as for the input without them.
        let old = format!("{{\"type\": \"linkerd-cni\", \"old\": {number}}}");
        let others = other_plugins(number);
        let with_old = conflist_with(
            number,
            sep,
            &[
                old.clone(),
                others[0].clone(),
                old.clone(),
                others[1].clone(),
                old,
            ],
        );
        let out = patched(with_old.as_bytes(), entry);
        check_fixed_point(&out, entry, &label);
        assert!(
            unpatched(&out, entry) == input.as_bytes(),
            "{label}: old entries not removed byte for byte\ninput:   {}\ncleaned: {}",
            show(with_old.as_bytes()),
            show(&unpatched(&out, entry))
        );
        assert!(
            unpatched(with_old.as_bytes(), entry) == input.as_bytes(),
            "{label}: cleanup of old entries"
        );
        assert!(
            out == patched(input.as_bytes(), entry),
            "{label}: old entries change the patch"
        );

        // A single-plugin `.conf`: kept verbatim inside the list it becomes.
        let conf = format!("{{\"type\": \"bridge\", \"mtu\": {number}}}\n");
        let p = conflist::patch(Path::new("/d/x.conf"), conf.as_bytes(), entry)
            .unwrap_or_else(|e| panic!("{label}: {e}"))
            .unwrap_or_else(|| panic!("{label}: a .conf is always converted"));
        let text = String::from_utf8_lossy(&p.bytes);
        assert!(
            text.contains(conf.trim_end()),
            "{label}: the .conf is not kept verbatim: {text}"
        );
        assert_eq!(ConfKind::of(&p.path), Some(ConfKind::Conflist));
        check_fixed_point(&p.bytes, entry, &label);
    }
}

#[test]
fn odd_numbers_in_other_plugins_survive_byte_for_byte() {
    let entry = fixture_entry();
    for number in ODD_NUMBERS {
        check_number(number, &entry);
    }
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn digits(&mut self, min: u64, max: u64, out: &mut String) {
        for _ in 0..min + self.below(max - min + 1) {
            out.push(char::from(b'0' + self.below(10) as u8));
        }
    }
}

/// A random number in JSON's grammar: `-`? (`0` | [1-9][0-9]*) (`.` [0-9]+)? ([eE] [+-]? [0-9]+)?
fn generated_number(rng: &mut Rng) -> String {
    let mut n = String::new();
    if rng.below(2) == 0 {
        n.push('-');
    }
    if rng.below(5) == 0 {
        n.push('0');
    } else {
        n.push(char::from(b'1' + rng.below(9) as u8));
        rng.digits(0, 60, &mut n);
    }
    if rng.below(2) == 0 {
        n.push('.');
        rng.digits(1, 40, &mut n);
    }
    if rng.below(2) == 0 {
        n.push(if rng.below(2) == 0 { 'e' } else { 'E' });
        match rng.below(3) {
            0 => n.push('+'),
            1 => n.push('-'),
            _ => {}
        }
        rng.digits(1, 4, &mut n);
    }
    n
}

#[test]
fn generated_numbers_survive_byte_for_byte() {
    let entry = fixture_entry();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0;
    while checked < 250 {
        let number = generated_number(&mut rng);
        if !number.parse::<f64>().is_ok_and(f64::is_finite) {
            // Beyond `f64`: refused, as serde_json and the runtimes refuse it.
            let doc = conflist_with(&number, ",", &other_plugins("1"));
            assert!(
                Json::parse(doc.as_bytes()).is_err(),
                "{number}: accepted although out of range"
            );
            continue;
        }
        check_number(&number, &entry);
        checked += 1;
    }
}

/// With odd numbers in the template, the entry the installer writes reads back as its own:
/// the file is a fixed point and the node becomes ready.
#[test]
fn odd_numbers_in_the_template_are_seen_in_place() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let generated: Vec<String> = std::iter::repeat_with(|| generated_number(&mut rng))
        .filter(|n| n.parse::<f64>().is_ok_and(f64::is_finite))
        .take(200)
        .collect();
    let plain = conflist_with("1", ",\n    ", &other_plugins("2"));
    for number in ODD_NUMBERS
        .iter()
        .copied()
        .chain(generated.iter().map(String::as_str))
    {
        let template = template_with(number);
        let entry = entry_from(&template);
        let odd = entry
            .get("linkerd")
            .and_then(|l| l.get("odd"))
            .unwrap_or_else(|| panic!("{number}: no linkerd.odd in the entry"));
        assert_eq!(
            odd.to_pretty_bytes(),
            format!("{number}\n").into_bytes(),
            "{number}: the entry's number is not spelled as in the template"
        );
        check_plain_conflist(plain.as_bytes(), &entry, &format!("template with {number}"));
    }
}

#[test]
fn odd_number_in_the_template_node_becomes_ready_and_stays_quiet() {
    for number in [
        "6e81",
        "6.4345e-68",
        "12345678901234567890123456789012345678901234",
    ] {
        let template = template_with(number);
        let node = Node::with_env(&[("CNI_NETWORK_CONFIG", &template)]);
        node.add_fixtures(&["10-flannel.conflist", "10-calico.conf"]);
        node.installer
            .install_once()
            .unwrap_or_else(|e| panic!("{number}: install: {e}"));
        let status = node.installer.status();
        assert!(status.ready(), "{number}: not ready: {status:?}");
        let writes = node.installer.write_counts().conflists;
        let restarted = Installer::new(node.installer.config().clone())
            .unwrap_or_else(|e| panic!("{number}: {e}"));
        restarted.patch_all();
        node.installer.patch_all();
        assert_eq!(
            restarted.write_counts().conflists,
            0,
            "{number}: a restart rewrote"
        );
        assert_eq!(
            node.installer.write_counts().conflists,
            writes,
            "{number}: a second pass rewrote"
        );
    }
}

/// The fixtures: one insertion, a fixed point, cleanup restores them byte for byte (the one
/// with an old linkerd-cni entry: restores them without it).
#[test]
fn fixtures_are_patched_by_one_insertion() {
    let entry = fixture_entry();
    for name in ["05-cilium.conflist", "10-flannel.conflist"] {
        let input = std::fs::read(fixture(&format!("net.d/{name}")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_plain_conflist(&input, &entry, name);
    }
    let kindnet = std::fs::read(fixture("net.d/10-kindnet.conflist"))
        .unwrap_or_else(|e| panic!("kindnet: {e}"));
    let cleaned = unpatched(&kindnet, &entry);
    check_plain_conflist(&cleaned, &entry, "kindnet without its old entry");
    assert!(
        patched(&kindnet, &entry) == patched(&cleaned, &entry),
        "kindnet: the old entry changes the patch"
    );
    let calico = std::fs::read(fixture("net.d/10-calico.conf")).unwrap_or_else(|e| panic!("{e}"));
    let p = conflist::patch(Path::new("/d/10-calico.conf"), &calico, &entry)
        .unwrap_or_else(|e| panic!("calico: {e}"))
        .unwrap_or_else(|| panic!("calico: not converted"));
    let text = String::from_utf8_lossy(&p.bytes);
    let original = String::from_utf8_lossy(&calico);
    assert!(
        text.contains(original.trim_end()),
        "calico: the .conf is not kept verbatim: {text}"
    );
    check_fixed_point(&p.bytes, &entry, "calico");
}

/// 60,000 keys in another plugin's object: kept byte for byte, in a fixed point.
#[test]
fn sixty_thousand_keys_in_another_plugin_are_kept() {
    let entry = fixture_entry();
    let mut big = String::from("{\"type\": \"bridge\"");
    for i in 0..60_000 {
        big.push_str(&format!(", \"k{i}\": {i}.50"));
    }
    big.push_str(", \"k7\": 6e81}");
    let input = conflist_with("7", ",\n    ", &[big]);
    check_plain_conflist(input.as_bytes(), &entry, "60,000 keys");
}

/// A `"` (or any JSON syntax) in a setting that ends up in the entry is data: it lands inside
/// the kubeconfig path string and adds no key.
#[test]
fn settings_cannot_inject_keys_into_the_entry() {
    let template = support::template();
    let cases: &[(&str, &str)] = &[
        (
            "DEST_CNI_NET_DIR",
            r#"/etc/cni/net.d", "injected": "yes", "x": ""#,
        ),
        (
            "DEST_CNI_NET_DIR",
            r#"/etc/cni/net.d\"}, "injected": {"a":"#,
        ),
        ("DEST_CNI_NET_DIR", "/etc/cni/\u{0}net\n.d\\"),
        ("KUBECONFIG_FILE_NAME", r#"kc", "injected": "yes"#),
    ];
    for (var, value) in cases {
        let cfg = config(&template, &[(var, value)]);
        let entry = cfg
            .plugin_entry()
            .unwrap_or_else(|e| panic!("{var}={value:?}: {e}"));
        let want_path = cfg.kubeconfig_host_path().to_string_lossy().into_owned();
        assert!(
            want_path.contains(value),
            "{var}={value:?}: the path {want_path:?} does not hold the value"
        );
        assert_eq!(
            entry
                .get("kubernetes")
                .and_then(|k| k.get("kubeconfig"))
                .and_then(Json::as_str),
            Some(want_path.as_str()),
            "{var}={value:?}"
        );
        let keys = |j: Option<&Json>| -> Vec<String> {
            j.and_then(Json::as_object)
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert_eq!(
            keys(Some(&entry)),
            [
                "name",
                "type",
                "log_level",
                "kubernetes",
                "linkerd",
                "capabilities"
            ],
            "{var}={value:?}: top-level keys of the entry"
        );
        assert_eq!(
            keys(entry.get("kubernetes")),
            ["kubeconfig"],
            "{var}={value:?}: keys of kubernetes"
        );
        // And the written entry reads back as the same data.
        let plain = conflist_with("1", ",\n    ", &other_plugins("2"));
        check_plain_conflist(plain.as_bytes(), &entry, &format!("{var}={value:?}"));
    }
}
