//! A JSON value that keeps object keys in file order.
//!
//! `serde_json::Value` sorts keys unless the `preserve_order` feature is on, and that feature
//! is global to a build: turning it on here would change key order for every other crate of
//! the workspace. Conflists written by other CNIs should come back in the order their authors
//! chose, so this crate carries its own small ordered tree instead: objects are
//! [`IndexMap`]s (the map serde_json itself uses for `preserve_order`), so key order is kept
//! and a look-up is O(1) however many keys an object has. Scalars stay `serde_json::Value`.

use std::fmt;

use indexmap::IndexMap;

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{MapAccess, SeqAccess, Visitor},
    ser::{SerializeMap, SerializeSeq},
};

/// The entries of a JSON object, in the order they were read or inserted.
pub type Object = IndexMap<String, Json>;

/// A JSON document whose objects remember their key order.
///
/// Two documents are equal when they hold the same values with object keys in the same order
/// (the order is part of what the installer writes).
#[derive(Clone, Debug)]
pub enum Json {
    /// An object, keys in the order they were read or inserted.
    Object(Object),
    /// An array.
    Array(Vec<Json>),
    /// `null`, a boolean, a number or a string.
    Scalar(serde_json::Value),
}

impl Json {
    /// Parses a document.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Pretty-printed with two-space indentation and a final newline, the way the installer
    /// writes every file.
    pub fn to_pretty_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Serializing this tree into a Vec cannot fail: every key is a string and writing to
        // a Vec has no I/O error.
        if serde_json::to_writer_pretty(&mut out, self).is_ok() {
            out.push(b'\n');
        }
        out
    }

    /// The entries of an object, or `None` for any other value.
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Json::Object(entries) => Some(entries),
            _ => None,
        }
    }

    /// The value under `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.as_object()?.get(key)
    }

    /// Mutable access to the value under `key` of an object.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Object(entries) => entries.get_mut(key),
            _ => None,
        }
    }

    /// Whether this is an object holding `key`.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Scalar(serde_json::Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// A string value.
    pub fn string(s: impl Into<String>) -> Self {
        Json::Scalar(serde_json::Value::String(s.into()))
    }
}

impl PartialEq for Json {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            // `IndexMap`'s own equality ignores order; ours does not.
            (Json::Object(a), Json::Object(b)) => a.len() == b.len() && a.iter().eq(b.iter()),
            (Json::Array(a), Json::Array(b)) => a == b,
            (Json::Scalar(a), Json::Scalar(b)) => a == b,
            _ => false,
        }
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Object(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
            Json::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Scalar(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Scalar(v.into()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Scalar(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Scalar(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        // Non-finite floats cannot come out of a JSON parser; `Null` keeps this total.
        Ok(Json::Scalar(serde_json::Number::from_f64(v).map_or(
            serde_json::Value::Null,
            serde_json::Value::Number,
        )))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::string(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::string(v))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Scalar(serde_json::Value::Null))
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Scalar(serde_json::Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Object::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            // A repeated key: the last one wins, as in every other JSON reader the runtimes use,
            // and keeps the position of its first occurrence (`insert` on an existing key
            // replaces the value in place).
            entries.insert(k, v);
        }
        Ok(Json::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let doc = Json::parse(input.as_bytes()).unwrap_or_else(|e| panic!("{input}: {e}"));
            let keys: String = doc
                .as_object()
                .unwrap_or_else(|| panic!("{input}: not an object"))
                .iter()
                .filter_map(|(k, _)| k.chars().next())
                .collect();
            assert_eq!(&keys, first_letters, "key order of {input}");
            let compact = serde_json::to_string(&doc).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(&compact, input, "compact re-serialization of {input}");
        }
    }

    /// 60,000 keys in one object, every seventh given again later (twice for every 49th):
    /// each key keeps its first position and takes its last value. With a linear search per
    /// key this took seconds (quadratic); it must stay linear.
    #[test]
    fn sixty_thousand_keys_with_repeats_keep_first_position_and_last_value() {
        const KEYS: usize = 60_000;
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

        let doc = Json::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let object = doc.as_object().unwrap_or_else(|| panic!("not an object"));
        assert_eq!(object.len(), KEYS + 1, "one entry per distinct key");
        for (i, (k, v)) in object.iter().take(KEYS).enumerate() {
            assert_eq!(*k, format!("k{i}"), "key at position {i}");
            let want = if i % 49 == 0 {
                format!("[{i}]")
            } else if i % 7 == 0 {
                format!("\"again {i}\"")
            } else {
                i.to_string()
            };
            let got = serde_json::to_string(v).unwrap_or_default();
            assert_eq!(got, want, "value of k{i}");
        }
        assert_eq!(object.get_index(KEYS).map(|(k, _)| k.as_str()), Some("end"));
        assert_eq!(
            doc.get("k59999")
                .and_then(|v| serde_json::to_string(v).ok())
                .as_deref(),
            Some("59999")
        );
        assert_eq!(
            doc.get("k59990")
                .and_then(|v| serde_json::to_string(v).ok())
                .as_deref(),
            Some("\"again 59990\"")
        );
        assert_eq!(
            doc.get("k59976")
                .and_then(|v| serde_json::to_string(v).ok())
                .as_deref(),
            Some("[59976]")
        );

        // Re-serialized, the document is the de-duplicated one, in first-position order.
        let mut want = String::from("{");
        for i in 0..KEYS {
            let v = if i % 49 == 0 {
                format!("[{i}]")
            } else if i % 7 == 0 {
                format!("\"again {i}\"")
            } else {
                i.to_string()
            };
            want.push_str(&format!("\"k{i}\":{v},"));
        }
        want.push_str("\"end\":null}");
        assert!(
            serde_json::to_string(&doc).unwrap_or_default() == want,
            "re-serialized document differs from the de-duplicated input"
        );
    }

    #[test]
    fn equality_sees_key_order() {
        let a = Json::parse(br#"{"a":1,"b":2}"#).unwrap_or_else(|e| panic!("{e}"));
        let b = Json::parse(br#"{"b":2,"a":1}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a, b);
        assert_eq!(a, a.clone());
    }

    #[test]
    fn repeated_key_keeps_first_position_last_value() {
        let doc = Json::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            serde_json::to_string(&doc).unwrap_or_default(),
            r#"{"a":3,"b":2}"#
        );
    }
}
