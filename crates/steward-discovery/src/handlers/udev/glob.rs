//! Shell-glob patterns as udev matches them: `*`, `?`, `[...]` (ranges,
//! `!`/`^` negation), `\` escapes, and `|` between alternatives. `*` also
//! matches `/` (udev matches like fnmatch without FNM_PATHNAME).

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// A compiled pattern: one or more alternatives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    alternatives: Vec<Vec<Tok>>,
}

/// Where (char offset into the pattern) and why a pattern is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobError {
    pub offset: usize,
    pub message: String,
}

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Result<Self, GlobError> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut alternatives = vec![Vec::new()];
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let tok = match c {
                '*' => Tok::Star,
                '?' => Tok::Any,
                '|' => {
                    alternatives.push(Vec::new());
                    i += 1;
                    continue;
                }
                '\\' => {
                    i += 1;
                    match chars.get(i) {
                        Some(&escaped) => Tok::Lit(escaped),
                        None => {
                            return Err(GlobError {
                                offset: i - 1,
                                message: "pattern ends with an unescaped '\\'".into(),
                            });
                        }
                    }
                }
                '[' => {
                    let (tok, next) = class(&chars, i)?;
                    i = next;
                    if let Some(current) = alternatives.last_mut() {
                        current.push(tok);
                    }
                    continue;
                }
                other => Tok::Lit(other),
            };
            if let Some(current) = alternatives.last_mut() {
                current.push(tok);
            }
            i += 1;
        }
        Ok(Self { alternatives })
    }

    /// Whether `text` matches any alternative.
    pub fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        self.alternatives.iter().any(|alt| match_tokens(alt, &text))
    }

    /// The alternatives as plain strings, if the pattern has no wildcards.
    pub fn literals(&self) -> Option<Vec<String>> {
        self.alternatives
            .iter()
            .map(|alt| {
                alt.iter()
                    .map(|t| match t {
                        Tok::Lit(c) => Some(*c),
                        _ => None,
                    })
                    .collect::<Option<String>>()
            })
            .collect()
    }
}

/// Parses a `[...]` class starting at `start`; returns it and the index after `]`.
fn class(chars: &[char], start: usize) -> Result<(Tok, usize), GlobError> {
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!') | Some('^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let Some(&c) = chars.get(i) else {
            return Err(GlobError {
                offset: start,
                message: "unterminated '[' character class".into(),
            });
        };
        if c == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        let lo = if c == '\\' {
            i += 1;
            *chars.get(i).ok_or_else(|| GlobError {
                offset: start,
                message: "unterminated '[' character class".into(),
            })?
        } else {
            c
        };
        i += 1;
        if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|&n| n != ']') {
            let hi = chars[i + 1];
            if hi < lo {
                return Err(GlobError {
                    offset: i - 1,
                    message: format!("invalid range '{lo}-{hi}' in character class"),
                });
            }
            ranges.push((lo, hi));
            i += 2;
        } else {
            ranges.push((lo, lo));
        }
    }
    Ok((Tok::Class { negated, ranges }, i))
}

fn token_matches(tok: &Tok, c: char) -> bool {
    match tok {
        Tok::Lit(l) => *l == c,
        Tok::Any => true,
        Tok::Star => false,
        Tok::Class { negated, ranges } => {
            negated ^ ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c))
        }
    }
}

/// Iterative wildcard matching with single-star backtracking (linear in
/// practice, never exponential).
fn match_tokens(toks: &[Tok], text: &[char]) -> bool {
    let (mut t, mut s) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while s < text.len() {
        match toks.get(t) {
            Some(Tok::Star) => {
                star = Some((t, s));
                t += 1;
            }
            Some(tok) if token_matches(tok, text[s]) => {
                t += 1;
                s += 1;
            }
            _ => match star {
                Some((st, ss)) => {
                    t = st + 1;
                    s = ss + 1;
                    star = Some((st, ss + 1));
                }
                None => return false,
            },
        }
    }
    toks[t..].iter().all(|tok| *tok == Tok::Star)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> bool {
        Glob::new(p).unwrap().matches(t)
    }

    #[test]
    fn wildcards() {
        assert!(m("loop[0-9]*", "loop12"));
        assert!(!m("loop[0-9]*", "loopx"));
        assert!(m("sd?", "sda"));
        assert!(!m("sd?", "sda1"));
        assert!(m("*", ""));
        assert!(m("/devices/*/block/*", "/devices/virtual/block/loop0"));
        assert!(m("a*b*c", "axxbyyc"));
        assert!(!m("a*b*c", "axxbyy"));
        assert!(m("[!a]x", "bx"));
        assert!(!m("[^a]x", "ax"));
        assert!(m("[]]", "]"));
        assert!(m("a\\*", "a*"));
        assert!(!m("a\\*", "ab"));
        assert!(m("video|mem", "mem"));
        assert!(m("video|mem", "video"));
        assert!(!m("video|mem", "vid"));
        assert!(m("", ""));
        assert!(!m("", "x"));
    }

    #[test]
    fn errors_have_offsets() {
        assert_eq!(Glob::new("ab[0-9").unwrap_err().offset, 2);
        assert_eq!(Glob::new("ab\\").unwrap_err().offset, 2);
        assert_eq!(Glob::new("[z-a]").unwrap_err().offset, 1);
    }

    #[test]
    fn literals() {
        assert_eq!(
            Glob::new("block|mem").unwrap().literals(),
            Some(vec!["block".into(), "mem".into()])
        );
        assert_eq!(Glob::new("bl*").unwrap().literals(), None);
    }
}
