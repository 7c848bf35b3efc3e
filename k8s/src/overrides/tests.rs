//! Unit tests of the pod overrides' table: each row's conflist key, field, merge and parser
//! agree with the conflist's own reading.

use serde_json::{Value, json};

use super::*;

/// A value each parser accepts, and one it refuses.
fn samples(parser: Parser) -> (&'static str, &'static str) {
    match parser {
        Parser::PortList => ("3306, 9000-9100", "80,http"),
        Parser::CidrList => ("192.168.0.0/16,fd00::/8", "10.0.0.0/33"),
        Parser::Uid => ("1337", "-5"),
        Parser::Gid => ("1338", "4294967296"),
        Parser::Text => ("  cr.example/proxy  ", ""),
    }
}

/// `parsed` as the conflist's `linkerd` section writes it.
fn conflist_json(parsed: &Parsed) -> Value {
    match parsed {
        Parsed::Ports(p) => p.iter().map(|r| json!(r.to_string())).collect(),
        Parsed::Cidrs(c) => c.iter().map(|r| json!(r.to_string())).collect(),
        Parsed::Id(id) => json!(id),
        Parsed::Text(t) => json!(t),
    }
}

/// Each row's conflist key, field and merge agree: applying the annotation to the default
/// section gives the section whose conflist key holds the annotation's value (replace) or the
/// default entries followed by it (append), and nothing else differs.
#[test]
fn each_row_sets_its_conflist_key_as_it_says() {
    let base = LinkerdConfig::default();
    let base_json = serde_json::to_value(&base).expect("the section serialises");
    for row in POD_OVERRIDES.iter().filter(|r| r.redirects()) {
        let key = row
            .conflist_key
            .expect("a redirect setting has a conflist key");
        let (good, _) = samples(row.parser);
        let parsed = row.parse(good).expect("the sample parses");
        let mut want = base_json.clone();
        let value = conflist_json(&parsed);
        want[key] = match row.merge {
            Merge::Replace => value,
            Merge::Append => {
                let mut list = want[key].as_array().cloned().expect("a list to append to");
                list.extend(value.as_array().cloned().expect("a list"));
                Value::Array(list)
            }
        };
        let want: LinkerdConfig = serde_json::from_value(want).expect("the section reads");
        assert_ne!(
            want, base,
            "{}: the sample changes the section",
            row.annotation
        );
        let mut got = base.clone();
        row.apply(&mut got, good)
            .unwrap_or_else(|e| panic!("{}: {e}", row.annotation));
        assert_eq!(got, want, "{}", row.annotation);
        assert!(
            row.field
                .config_field()
                .is_some_and(|f| f == key.replace('-', "_")),
            "{}: field {:?} is not conflist key {key}",
            row.annotation,
            row.field
        );
    }
}

#[test]
fn rows_are_unique_and_injector_rows_set_no_redirect() {
    for (i, row) in POD_OVERRIDES.iter().enumerate() {
        assert!(row.annotation.starts_with("config.linkerd.io/"), "{row:?}");
        assert!(
            POD_OVERRIDES[..i]
                .iter()
                .all(|r| r.annotation != row.annotation && r.field != row.field),
            "{} twice",
            row.annotation
        );
        assert_eq!(row.conflist_key.is_some(), row.redirects(), "{row:?}");
        if !row.redirects() {
            assert_eq!(
                row.apply(&mut LinkerdConfig::default(), "x"),
                Err(ApplyError::NotARedirectSetting {
                    annotation: row.annotation
                })
            );
        }
    }
    for other in OTHER_KEYS {
        assert!(
            POD_OVERRIDES.iter().all(|r| r.annotation != other.key),
            "{} is both an override and another key",
            other.key
        );
    }
}

#[test]
fn parsers_refuse_what_they_say_is_invalid() {
    for row in &POD_OVERRIDES {
        let (good, bad) = samples(row.parser);
        assert!(row.parse(good).is_ok(), "{}", row.annotation);
        if row.parser == Parser::Text {
            assert_eq!(row.parse(good), Ok(Parsed::Text(good.trim().into())));
            continue;
        }
        let err = row.parse(bad).expect_err(row.annotation);
        assert!(!err.is_empty());
        let mut config = LinkerdConfig::default();
        assert_eq!(
            row.apply(&mut config, bad),
            Err(ApplyError::Invalid(err)),
            "{}",
            row.annotation
        );
        assert_eq!(
            config,
            LinkerdConfig::default(),
            "a refused value changes nothing"
        );
    }
    // The conflist's meanings: 0 is a UID (no exemption), a negative GID is none.
    assert_eq!(Parser::Uid.parse("0"), Ok(Parsed::Id(0)));
    assert_eq!(Parser::Gid.parse(" -1 "), Ok(Parsed::Id(-1)));
    assert!(Parser::Uid.parse("4294967296").is_err());
}

#[test]
fn sources_name_the_annotation_with_its_conflist_key() {
    assert_eq!(
        sources_of("subnets-to-ignore"),
        "config.linkerd.io/skip-subnets / conflist subnets-to-ignore"
    );
    assert_eq!(
        sources_of("ports-to-redirect"),
        "conflist ports-to-redirect"
    );
}
