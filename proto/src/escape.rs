//! Logging text that came from outside (`CNI_ARGS`, the network config, the agent's replies,
//! the Kubernetes API): one line per record, and no value that can pass for another field.
//!
//! A newline in a pod's namespace would otherwise end the record and start a forged one
//! (`shop\nlinkerd-cni: INFO … redirected`), and a space would start a forged field
//! (`namespace=shop pod=admin`). Both the plugin's logger and the agent's `tracing` fields use
//! these, so the two sides escape the same characters the same way.

use std::{borrow::Cow, fmt};

/// Whether `c` must not reach a log line as it is: control characters (C0, DEL, C1) and every
/// other character Rust's `escape_debug` escapes (line and paragraph separators, bidi
/// overrides, other invisible format characters), but not the quotes and the backslash,
/// which are harmless in free text.
fn unprintable(c: char) -> bool {
    !matches!(c, '"' | '\'' | '\\') && c.escape_debug().len() != 1
}

/// A value from outside, printed as one unambiguous token: as it is when it is plain
/// (non-empty, no whitespace, quote, backslash or unprintable character, not a lone `-`,
/// which logs use for "no value"), otherwise quoted with Rust's string escapes
/// (`"shop\nlinkerd-cni: …"`, `"web pod=admin"`). A plain value never starts with `"`, so a
/// reader always knows which form it has.
#[derive(Clone, Copy, Debug)]
pub struct Escaped<'a>(pub &'a str);

impl Escaped<'_> {
    fn plain(&self) -> bool {
        !self.0.is_empty()
            && self.0 != "-"
            && !self
                .0
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '"' | '\\') || unprintable(c))
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.plain() {
            f.write_str(self.0)
        } else {
            write!(f, "{:?}", self.0)
        }
    }
}

/// Free text (a message that may hold outside values) with every unprintable character
/// written as its Rust escape (`\n`, `\r`, `\u{1b}`, `\u{85}`, `\u{2028}`), so it stays on one
/// line and cannot move the terminal's cursor. Borrowed when there is nothing to escape.
pub fn escape_unprintable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unprintable(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_print_as_they_are() {
        for v in [
            "emojivoto",
            "web-5d8f",
            "3f5a7e9b21c4",
            "a=b",
            "/var/run/netns/cni-1",
            "café",
            "'",
        ] {
            assert_eq!(Escaped(v).to_string(), v);
        }
    }

    #[test]
    fn other_values_are_quoted_and_escaped() {
        for (v, want) in [
            ("", r#""""#),
            ("-", r#""-""#),
            ("web pod=admin", r#""web pod=admin""#),
            (r#""web""#, r#""\"web\"""#),
            (r"a\nb", r#""a\\nb""#),
            (
                "shop\nlinkerd-cni: INFO forged",
                r#""shop\nlinkerd-cni: INFO forged""#,
            ),
            ("a\rb\tc", r#""a\rb\tc""#),
            ("\u{0}\u{1b}[2K\u{7f}", r#""\0\u{1b}[2K\u{7f}""#),
            ("\u{85}\u{9b}", r#""\u{85}\u{9b}""#),
            ("a\u{2028}b\u{2029}", r#""a\u{2028}b\u{2029}""#),
            ("a\u{202e}b\u{200b}", r#""a\u{202e}b\u{200b}""#),
            ("a\u{a0}b", r#""a\u{a0}b""#),
        ] {
            assert_eq!(Escaped(v).to_string(), want, "{v:?}");
        }
    }

    #[test]
    fn every_control_character_is_escaped() {
        let controls = (0..=0x9f_u32)
            .filter_map(char::from_u32)
            .filter(|c| c.is_control());
        for c in controls {
            let v = format!("a{c}b");
            for out in [Escaped(&v).to_string(), escape_unprintable(&v).into_owned()] {
                assert!(
                    !out.chars().any(char::is_control),
                    "{:#x}: {out:?}",
                    c as u32
                );
            }
        }
    }

    #[test]
    fn free_text_keeps_quotes_and_escapes_the_rest() {
        assert!(matches!(
            escape_unprintable("pod \"web\" at C:\\x"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_unprintable("two\nlines\r\u{1b}[2K\u{85}\u{2028}\u{7f}"),
            r"two\nlines\r\u{1b}[2K\u{85}\u{2028}\u{7f}"
        );
    }
}
