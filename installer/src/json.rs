//! A JSON value that keeps object keys in file order and numbers as they were written.
//!
//! `serde_json::Value` sorts keys unless the `preserve_order` feature is on, and it reads
//! every number into a `u64`, `i64` or `f64` (so `6e81`, `6.4345e-68` or a 44-digit integer
//! come back spelled differently) unless `arbitrary_precision` is on. Both features are global
//! to a build: turning them on here would change how every other crate of the workspace reads
//! JSON. Conflists written by other CNIs must come back exactly as their authors wrote them, so
//! this crate carries its own small tree instead:
//! - objects are [`IndexMap`]s (the map serde_json itself uses for `preserve_order`): key order
//!   is kept and a look-up is O(1) however many keys an object has; a repeated key keeps the
//!   position of its first occurrence and takes its last value, as in serde_json;
//! - a [`Number`] is the text of the number, byte for byte;
//! - strings are decoded (two spellings of the same string are equal).
//!
//! serde_json checks the syntax ([`Json::parse`] accepts what `serde_json::Value` accepts, with
//! its error messages: a nesting limit of [`MAX_DEPTH`], no number beyond `f64`'s range); this
//! module then reads the checked
//! text into the tree, and finds where values sit in it ([`array_spans`]), so the installer can
//! edit a file without touching any byte it does not mean to change.

use std::{fmt, ops::Range};

use indexmap::IndexMap;

/// The deepest nesting of arrays and objects [`Json::parse`] accepts (serde_json's own limit).
pub const MAX_DEPTH: usize = 128;

/// The entries of a JSON object, in the order they were read or inserted.
pub type Object = IndexMap<String, Json>;

/// A JSON number, exactly as it was written (`6e81` stays `6e81`, `1.0` stays `1.0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Number(String);

impl Number {
    /// The number's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A JSON document whose objects remember their key order and whose numbers keep their text.
///
/// Two documents are equal when they hold the same values with object keys in the same order
/// (the order is part of what the installer writes) and numbers spelled the same way.
#[derive(Clone, Debug)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as written.
    Number(Number),
    /// A string (decoded).
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object, keys in the order they were read or inserted.
    Object(Object),
}

impl PartialEq for Json {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            // `IndexMap`'s own equality ignores order; ours does not.
            (Json::Object(a), Json::Object(b)) => a.len() == b.len() && a.iter().eq(b.iter()),
            (Json::Array(a), Json::Array(b)) => a == b,
            (Json::String(a), Json::String(b)) => a == b,
            (Json::Number(a), Json::Number(b)) => a == b,
            (Json::Bool(a), Json::Bool(b)) => a == b,
            (Json::Null, Json::Null) => true,
            _ => false,
        }
    }
}

fn error(msg: impl fmt::Display) -> serde_json::Error {
    <serde_json::Error as serde::de::Error>::custom(msg)
}

impl Json {
    /// Parses a document: UTF-8 text that serde_json accepts, nested at most [`MAX_DEPTH`]
    /// deep.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        let text = checked(bytes)?;
        let mut scanner = Scanner { text, pos: 0 };
        scanner.ws();
        let doc = scanner.value(0)?;
        Ok(doc)
    }

    /// Pretty-printed with two-space indentation and a final newline.
    pub fn to_pretty_bytes(&self) -> Vec<u8> {
        let mut out = String::new();
        self.write_pretty(&mut out, "", "  ");
        out.push('\n');
        out.into_bytes()
    }

    /// On one line, with no space anywhere outside strings.
    pub fn to_compact_string(&self) -> String {
        let mut out = String::new();
        self.write_compact(&mut out);
        out
    }

    /// Appends the value pretty-printed: nested lines start with `indent` followed by `unit`
    /// once per level (the first line is not indented: it continues the caller's line).
    pub fn write_pretty(&self, out: &mut String, indent: &str, unit: &str) {
        let mut line = String::from(indent);
        self.pretty(out, &mut line, unit);
    }

    fn pretty(&self, out: &mut String, line: &mut String, unit: &str) {
        match self {
            Json::Array(items) if !items.is_empty() => {
                out.push('[');
                line.push_str(unit);
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    out.push_str(line);
                    item.pretty(out, line, unit);
                }
                line.truncate(line.len() - unit.len());
                out.push('\n');
                out.push_str(line);
                out.push(']');
            }
            Json::Object(entries) if !entries.is_empty() => {
                out.push('{');
                line.push_str(unit);
                for (i, (k, v)) in entries.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    out.push_str(line);
                    write_string(out, k);
                    out.push_str(": ");
                    v.pretty(out, line, unit);
                }
                line.truncate(line.len() - unit.len());
                out.push('\n');
                out.push_str(line);
                out.push('}');
            }
            scalar => scalar.write_compact(out),
        }
    }

    fn write_compact(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(n.as_str()),
            Json::String(s) => write_string(out, s),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_compact(out);
                }
                out.push(']');
            }
            Json::Object(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(out, k);
                    out.push(':');
                    v.write_compact(out);
                }
                out.push('}');
            }
        }
    }

    /// The entries of an object, or `None` for any other value.
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Json::Object(entries) => Some(entries),
            _ => None,
        }
    }

    /// The items of an array, or `None` for any other value.
    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(items) => Some(items),
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
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// A string value.
    pub fn string(s: impl Into<String>) -> Self {
        Json::String(s.into())
    }
}

/// Appends `s` as a JSON string, escaped the way serde_json escapes it.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let b = u32::from(c) as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX[b >> 4]));
                out.push(char::from(HEX[b & 0xf]));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `bytes` as text, once serde_json has accepted it as one JSON document.
fn checked(bytes: &[u8]) -> Result<&str, serde_json::Error> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| error(format_args!("invalid UTF-8 at byte {}", e.valid_up_to())))?;
    serde_json::from_str::<serde::de::IgnoredAny>(text)?;
    Ok(text)
}

/// Where the array under `key` of a document's top-level object sits in its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArraySpans {
    /// The byte range of each element, in order.
    pub elements: Vec<Range<usize>>,
}

/// The byte ranges of the elements of the array under `key` in the top-level object of `text`
/// (the last `key` when it is repeated: the one [`Json::parse`] keeps). `None` when `text` is
/// not a JSON document, its top level is not an object, or `key` does not hold an array.
pub fn array_spans(text: &str, key: &str) -> Option<ArraySpans> {
    checked(text.as_bytes()).ok()?;
    let mut s = Scanner { text, pos: 0 };
    s.ws();
    s.eat(b'{')?;
    let mut found = None;
    loop {
        s.ws();
        if s.eat(b'}').is_some() {
            break;
        }
        let k = s.string().ok()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        if k == key {
            found = Some(s.pos);
        }
        s.skip_value()?;
        s.ws();
        if s.eat(b',').is_none() {
            s.eat(b'}')?;
            break;
        }
    }
    s.pos = found?;
    s.eat(b'[')?;
    let mut elements = Vec::new();
    loop {
        s.ws();
        if s.eat(b']').is_some() {
            break;
        }
        let start = s.pos;
        s.skip_value()?;
        elements.push(start..s.pos);
        s.ws();
        if s.eat(b',').is_none() {
            s.eat(b']')?;
            break;
        }
    }
    Some(ArraySpans { elements })
}

/// Whether `b` is JSON whitespace.
pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Reads text that serde_json has already accepted. Anything unexpected is still an error,
/// never a panic.
struct Scanner<'a> {
    text: &'a str,
    pos: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek() == Some(b)).then(|| self.pos += 1)
    }

    fn unexpected(&self) -> serde_json::Error {
        error(format_args!("unexpected input at byte {}", self.pos))
    }

    /// The end (one past the closing quote) of the string starting at `self.pos`.
    fn string_end(&self) -> Option<usize> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.pos) != Some(&b'"') {
            return None;
        }
        let mut i = self.pos + 1;
        loop {
            match bytes.get(i)? {
                b'"' => return Some(i + 1),
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
    }

    fn string(&mut self) -> Result<String, serde_json::Error> {
        let end = self.string_end().ok_or_else(|| self.unexpected())?;
        let raw = self
            .text
            .get(self.pos..end)
            .ok_or_else(|| self.unexpected())?;
        self.pos = end;
        match raw.get(1..raw.len() - 1) {
            Some(inner) if !inner.contains('\\') => Ok(inner.to_owned()),
            _ => serde_json::from_str(raw),
        }
    }

    /// The end of the number or literal starting at `self.pos`.
    fn token_end(&self) -> usize {
        let bytes = self.text.as_bytes();
        let mut i = self.pos;
        while bytes
            .get(i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
        {
            i += 1;
        }
        i
    }

    fn value(&mut self, depth: usize) -> Result<Json, serde_json::Error> {
        match self.peek() {
            Some(b'{') => {
                let depth = deeper(depth)?;
                self.pos += 1;
                let mut entries = Object::new();
                self.ws();
                if self.eat(b'}').is_some() {
                    return Ok(Json::Object(entries));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.ws();
                    self.eat(b':').ok_or_else(|| self.unexpected())?;
                    self.ws();
                    let value = self.value(depth)?;
                    // A repeated key: the last one wins, as in every other JSON reader the
                    // runtimes use, and keeps the position of its first occurrence (`insert`
                    // on an existing key replaces the value in place).
                    entries.insert(key, value);
                    self.ws();
                    if self.eat(b',').is_none() {
                        self.eat(b'}').ok_or_else(|| self.unexpected())?;
                        return Ok(Json::Object(entries));
                    }
                }
            }
            Some(b'[') => {
                let depth = deeper(depth)?;
                self.pos += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat(b']').is_some() {
                    return Ok(Json::Array(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth)?);
                    self.ws();
                    if self.eat(b',').is_none() {
                        self.eat(b']').ok_or_else(|| self.unexpected())?;
                        return Ok(Json::Array(items));
                    }
                }
            }
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(_) => {
                let end = self.token_end();
                let token = self
                    .text
                    .get(self.pos..end)
                    .ok_or_else(|| self.unexpected())?;
                let value = match token {
                    "null" => Json::Null,
                    "true" => Json::Bool(true),
                    "false" => Json::Bool(false),
                    // A number beyond `f64` (`1e400`) is refused, as serde_json refuses it
                    // and as the runtimes' JSON readers do: no file the runtime cannot read
                    // counts as patched.
                    n if n.starts_with(|c: char| c == '-' || c.is_ascii_digit()) => {
                        if !n.parse::<f64>().is_ok_and(f64::is_finite) {
                            return Err(error(format_args!(
                                "number out of range at byte {}",
                                self.pos
                            )));
                        }
                        Json::Number(Number(n.to_owned()))
                    }
                    _ => return Err(self.unexpected()),
                };
                self.pos = end;
                Ok(value)
            }
            None => Err(self.unexpected()),
        }
    }

    /// Moves past one value, without building it and without recursion.
    fn skip_value(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            self.ws();
            match self.peek()? {
                b'{' | b'[' => {
                    depth += 1;
                    self.pos += 1;
                    continue;
                }
                b',' | b':' if depth > 0 => {
                    self.pos += 1;
                    continue;
                }
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    self.pos += 1;
                }
                b'"' => self.pos = self.string_end()?,
                _ => {
                    let end = self.token_end();
                    if end == self.pos {
                        return None;
                    }
                    self.pos = end;
                }
            }
            if depth == 0 {
                return Some(());
            }
        }
    }
}

fn deeper(depth: usize) -> Result<usize, serde_json::Error> {
    if depth >= MAX_DEPTH {
        return Err(error(format_args!(
            "nested more than {MAX_DEPTH} arrays or objects deep"
        )));
    }
    Ok(depth + 1)
}

#[cfg(test)]
mod tests;
