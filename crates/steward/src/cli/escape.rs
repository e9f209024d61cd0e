//! Strings from elsewhere (discovery handlers, the API server, a node's pod
//! resources socket) made safe to write to a terminal.
//!
//! Instance properties, device ids, condition messages, pod and container
//! names reach the CLI from parties it does not trust. Written as they are,
//! an ANSI escape sequence in one could clear the screen, move the cursor,
//! retitle the window or hide a line, and a `\r` could overwrite what was
//! printed before it. [`term`] shows every such character as an escape
//! instead; every table cell, described field and line the CLI prints goes
//! through it. JSON and YAML output is left to its encoder (which escapes
//! C0 controls itself).

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal as it is: the C0 controls (`\x00`
/// to `\x1f`, ESC among them), DEL, the C1 controls (`\u{80}` to `\u{9f}`,
/// CSI among them), and the Unicode marks that reorder or separate lines
/// (bidirectional overrides and isolates, line and paragraph separators).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                | '\u{2028}' | '\u{2029}'
        )
}

/// `s` with every character a terminal would act on written as an escape
/// (`\n`, `\r`, `\t`, else `\u{1b}`), so it prints as visible text on one
/// line. Borrowed when there is nothing to escape.
pub fn term(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_not_acted_on() {
        assert_eq!(
            term("plain /dev/ttyUSB0 ünïcode"),
            "plain /dev/ttyUSB0 ünïcode"
        );
        assert!(matches!(term("plain"), Cow::Borrowed(_)));
        assert_eq!(term("a\x1b[2Jb\rc"), "a\\u{1b}[2Jb\\rc");
        assert_eq!(term("x\ny\tz\x07\x7f"), "x\\ny\\tz\\u{7}\\u{7f}");
        // C1 CSI, a bidi override, a line separator.
        assert_eq!(
            term("\u{9b}31m\u{202e}txt\u{2028}"),
            "\\u{9b}31m\\u{202e}txt\\u{2028}"
        );
        for s in ["\x1b]0;title\x07", "\u{85}", "\0"] {
            assert!(!term(s).chars().any(unsafe_char), "{s:?}");
        }
    }
}
