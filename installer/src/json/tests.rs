//! Tests of the ordered, number-preserving JSON tree.

use super::*;

fn parse(text: &str) -> Json {
    Json::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn round_trips_keep_key_order_and_values() {
    let cases: &[(&str, &str)] = &[
        (r#"{"z":1,"a":2,"m":{"y":true,"b":null}}"#, "zam"),
        (
            r#"{"type":"calico","ipam":{"type":"calico-ipam"},"mtu":1440}"#,
            "tim",
        ),
        (r#"{"b":1.5,"a":-3,"c":"x"}"#, "bac"),
    ];
    for (input, first_letters) in cases {
        let doc = parse(input);
        let keys: String = doc
            .as_object()
            .unwrap_or_else(|| panic!("{input}: not an object"))
            .iter()
            .filter_map(|(k, _)| k.chars().next())
            .collect();
        assert_eq!(&keys, first_letters, "key order of {input}");
        assert_eq!(
            &doc.to_compact_string(),
            input,
            "compact re-serialization of {input}"
        );
    }
}

#[test]
fn numbers_keep_their_spelling() {
    for n in [
        "6e81",
        "6.4345e-68",
        "12345678901234567890123456789012345678901234",
        "-0",
        "-0.0",
        "1E+2",
        "0.1000",
        "1e-400",
        "5e-324",
        "9007199254740993",
    ] {
        let text = format!("[{n},{{\"n\":{n}}}]");
        let doc = parse(&text);
        assert_eq!(doc.to_compact_string(), text, "{n}");
        match doc.as_array() {
            Some([Json::Number(a), _]) => assert_eq!(a.as_str(), n),
            other => panic!("{n}: {other:?}"),
        }
        assert_eq!(
            parse(&format!(" {n} ")).to_pretty_bytes(),
            format!("{n}\n").into_bytes()
        );
    }
    // Two spellings of one value are two numbers: the tree compares text.
    assert_ne!(parse("1.0"), parse("1"));
    assert_ne!(parse("1e2"), parse("100"));
}

#[test]
fn strings_compare_decoded_and_print_as_serde_json_does() {
    assert_eq!(parse(r#""\u0041\/\u00e9""#), Json::string("A/é"));
    let strings = [
        "plain",
        "quote \" backslash \\ slash /",
        "controls \n \r \t \u{8} \u{c} \u{0} \u{1f} \u{7f}",
        "unicode é ✓ 𝄞",
        "",
    ];
    for s in strings {
        let ours = Json::string(s).to_compact_string();
        let theirs = serde_json::to_string(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ours, theirs, "{s:?}");
        assert_eq!(parse(&ours), Json::string(s), "{s:?}");
    }
}

#[test]
fn pretty_printing_matches_serde_json_for_plain_values() {
    let text = r#"{"a":[],"b":{},"c":[1,{"d":"e","f":[true,false,null]}],"g":"h"}"#;
    let ours = String::from_utf8(parse(text).to_pretty_bytes()).unwrap_or_default();
    let value: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}"));
    let theirs = serde_json::to_string_pretty(&value).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ours, format!("{theirs}\n"));

    let mut indented = String::new();
    parse(r#"{"a":[1]}"#).write_pretty(&mut indented, "\t", "\t");
    assert_eq!(indented, "{\n\t\t\"a\": [\n\t\t\t1\n\t\t]\n\t}");
}

#[test]
fn rejects_what_serde_json_rejects_and_deep_nesting() {
    let bad: &[&[u8]] = &[
        b"",
        b"{",
        b"[1,]",
        b"{\"a\" 1}",
        b"01",
        b"1.",
        b"-",
        b"+1",
        b"\"\\x\"",
        b"\"\\ud800\"",
        b"\"a\nb\"",
        b"\"\xff\"",
        b"{} x",
        b"NaN",
        b"tru",
        b"1e400",
        b"[-1e309]",
        b"{\"a\":{\"b\":1E+999}}",
    ];
    for input in bad {
        assert!(
            Json::parse(input).is_err(),
            "accepted {:?}",
            String::from_utf8_lossy(input)
        );
    }
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(Json::parse(ok.as_bytes()).is_ok(), "{MAX_DEPTH} levels");
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert!(
        Json::parse(deep.as_bytes()).is_err(),
        "{} levels",
        MAX_DEPTH + 1
    );
    // Far deeper than that: an error, not a stack overflow.
    let very_deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    assert!(Json::parse(very_deep.as_bytes()).is_err());
}

#[test]
fn array_spans_point_at_the_last_repeated_key() {
    let text = "{\"plugins\": [0], \"x\": {\"plugins\": [9]},\n \"plugins\" : [ {\"a\": [1, \"]\"]} ,\"s\\\"]\",\t-2.5e3 ] }";
    let spans = array_spans(text, "plugins").unwrap_or_else(|| panic!("no spans"));
    let pieces: Vec<&str> = spans.elements.iter().map(|r| &text[r.clone()]).collect();
    assert_eq!(pieces, ["{\"a\": [1, \"]\"]}", "\"s\\\"]\"", "-2.5e3"]);
    assert_eq!(
        array_spans("{\"plugins\": []}", "plugins").map(|s| s.elements.len()),
        Some(0)
    );
    assert_eq!(array_spans("{\"plugins\": {}}", "plugins"), None);
    assert_eq!(array_spans("[1]", "plugins"), None);
    assert_eq!(array_spans("{\"plugins\": [1,]}", "plugins"), None);
}

/// 60,000 keys in one object, every seventh given again later (twice for every 49th):
/// each key keeps its first position and takes its last value. With a linear search per
/// key this took seconds (quadratic); it must stay linear.
#[test]
fn sixty_thousand_keys_with_repeats_keep_first_position_and_last_value() {
    const KEYS: usize = 60_000;
    let value = |i: usize| {
        if i.is_multiple_of(49) {
            format!("[{i}]")
        } else if i.is_multiple_of(7) {
            format!("\"again {i}\"")
        } else {
            i.to_string()
        }
    };
    let mut text = String::from("{");
    for i in 0..KEYS {
        text.push_str(&format!("\"k{i}\":{i},"));
    }
    for i in (0..KEYS).step_by(7) {
        text.push_str(&format!("\"k{i}\":\"again {i}\","));
    }
    for i in (0..KEYS).step_by(49) {
        text.push_str(&format!("\"k{i}\":[{i}],"));
    }
    text.push_str("\"end\":null}");

    let doc = parse(&text);
    let object = doc.as_object().unwrap_or_else(|| panic!("not an object"));
    assert_eq!(object.len(), KEYS + 1, "one entry per distinct key");
    for (i, (k, v)) in object.iter().take(KEYS).enumerate() {
        assert_eq!(*k, format!("k{i}"), "key at position {i}");
        assert_eq!(v.to_compact_string(), value(i), "value of k{i}");
    }
    assert_eq!(object.get_index(KEYS).map(|(k, _)| k.as_str()), Some("end"));
    for i in [59_999, 59_990, 59_976] {
        assert_eq!(
            doc.get(&format!("k{i}")).map(Json::to_compact_string),
            Some(value(i)),
            "k{i} looked up"
        );
    }

    // Re-serialized, the document is the de-duplicated one, in first-position order.
    let mut want = String::from("{");
    for i in 0..KEYS {
        want.push_str(&format!("\"k{i}\":{},", value(i)));
    }
    want.push_str("\"end\":null}");
    assert!(
        doc.to_compact_string() == want,
        "re-serialized document differs from the de-duplicated input"
    );
}

#[test]
fn equality_sees_key_order() {
    let a = parse(r#"{"a":1,"b":2}"#);
    let b = parse(r#"{"b":2,"a":1}"#);
    assert_ne!(a, b);
    assert_eq!(a, a.clone());
}

#[test]
fn repeated_key_keeps_first_position_last_value() {
    let doc = parse(r#"{"a":1,"b":2,"a":3}"#);
    assert_eq!(doc.to_compact_string(), r#"{"a":3,"b":2}"#);
}
