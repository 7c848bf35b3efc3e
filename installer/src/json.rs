//! A JSON value that keeps object keys in file order.
//!
//! `serde_json::Value` sorts keys unless the `preserve_order` feature is on, and that feature
//! is global to a build: turning it on here would change key order for every other crate of
//! the workspace. Conflists written by other CNIs should come back in the order their authors
//! chose, so this crate carries its own small ordered tree instead. Scalars stay
//! `serde_json::Value`.

use std::fmt;

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{MapAccess, SeqAccess, Visitor},
    ser::{SerializeMap, SerializeSeq},
};

/// A JSON document whose objects remember their key order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// An object, keys in the order they were read or inserted.
    Object(Vec<(String, Json)>),
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
    pub fn as_object(&self) -> Option<&[(String, Json)]> {
        match self {
            Json::Object(entries) => Some(entries),
            _ => None,
        }
    }

    /// The value under `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.as_object()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Mutable access to the value under `key` of an object.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Object(entries) => entries.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
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
        let mut entries: Vec<(String, Json)> = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            // A repeated key: the last one wins, as in every other JSON reader the runtimes use.
            if let Some(slot) = entries.iter_mut().find(|(ek, _)| *ek == k) {
                slot.1 = v;
            } else {
                entries.push((k, v));
            }
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

    #[test]
    fn repeated_key_keeps_first_position_last_value() {
        let doc = Json::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            serde_json::to_string(&doc).unwrap_or_default(),
            r#"{"a":3,"b":2}"#
        );
    }
}
