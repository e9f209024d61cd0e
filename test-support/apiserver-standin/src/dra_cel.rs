//! A hand-written evaluator for the subset of CEL that DRA device selectors
//! are written in here (kube-scheduler compiles them with cel-go).
//!
//! Supported:
//! - `device.driver`
//! - `device.attributes["<domain>"].<name>` and
//!   `device.attributes["<domain>"]["<name>"]`
//! - string (`"…"` or `'…'`, escapes `\\ \" \' \n \t \r`), integer (also
//!   negative) and `true`/`false` literals
//! - `==`, `!=`, `<`, `<=`, `>`, `>=` between values of the same type
//!   (string, int, bool)
//! - `&&`, `||` (with CEL's commutative error semantics: `false && <error>`
//!   is `false`, `true || <error>` is `true`), `!`, parentheses
//!
//! Everything else (function calls such as `has()` or `matches()`, macros,
//! `in`, arithmetic, `?:`, `device.capacity`, semantic versions) is refused
//! at compile time or fails at run time with a message naming it.
//!
//! Run-time errors are CEL's: a missing attribute is `no such key`, a
//! comparison between different types is `no matching overload`. An
//! attribute domain with no attribute reads as an empty map, as in
//! kube-scheduler's CEL environment.

use std::collections::BTreeMap;
use std::fmt;

/// A typed attribute value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `string`
    String(String),
    /// `int`
    Int(i64),
    /// `bool`
    Bool(bool),
    /// `version` (semantic version); no comparison is supported on it here.
    Version(String),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::Int(_) => "int",
            Value::Bool(_) => "bool",
            Value::Version(_) => "semver",
        }
    }
}

/// What a selector sees of a device: its driver and its attributes by
/// (domain, name). Unqualified attribute names of a ResourceSlice belong to
/// the driver's domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CelDevice {
    /// `device.driver`
    pub driver: String,
    /// (domain, name) → value.
    pub attributes: BTreeMap<(String, String), Value>,
}

/// A compile or run-time failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CelError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, CelError> {
    Err(CelError(msg.into()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Int(i64),
    Cmp(CmpOp),
    And,
    Or,
    Not,
    Minus,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Dot,
}

fn lex(src: &str) -> Result<Vec<Token>, CelError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let next = chars.get(i + 1).copied();
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            '(' | ')' | '[' | ']' | '.' | '-' => {
                out.push(match c {
                    '(' => Token::LParen,
                    ')' => Token::RParen,
                    '[' => Token::LBracket,
                    ']' => Token::RBracket,
                    '.' => Token::Dot,
                    _ => Token::Minus,
                });
                i += 1;
            }
            '&' | '|' if next == Some(c) => {
                out.push(if c == '&' { Token::And } else { Token::Or });
                i += 2;
            }
            '=' if next == Some('=') => {
                out.push(Token::Cmp(CmpOp::Eq));
                i += 2;
            }
            '!' if next == Some('=') => {
                out.push(Token::Cmp(CmpOp::Ne));
                i += 2;
            }
            '!' => {
                out.push(Token::Not);
                i += 1;
            }
            '<' | '>' => {
                let eq = next == Some('=');
                out.push(Token::Cmp(match (c, eq) {
                    ('<', false) => CmpOp::Lt,
                    ('<', true) => CmpOp::Le,
                    (_, false) => CmpOp::Gt,
                    (_, true) => CmpOp::Ge,
                }));
                i += if eq { 2 } else { 1 };
            }
            '"' | '\'' => {
                let (s, end) = lex_string(&chars, i)?;
                out.push(Token::Str(s));
                i = end;
            }
            d if d.is_ascii_digit() => {
                let start = i;
                while chars.get(i).is_some_and(char::is_ascii_digit) {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                let n = text
                    .parse::<i64>()
                    .map_err(|_| CelError(format!("integer literal {text} out of range")))?;
                out.push(Token::Int(n));
            }
            a if a.is_ascii_alphabetic() || a == '_' => {
                let start = i;
                while chars
                    .get(i)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
                {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
            other => return err(format!("unsupported character {other:?} at offset {i}")),
        }
    }
    Ok(out)
}

fn lex_string(chars: &[char], start: usize) -> Result<(String, usize), CelError> {
    let quote = chars[start];
    let mut s = String::new();
    let mut i = start + 1;
    loop {
        match chars.get(i) {
            None => return err("unterminated string literal"),
            Some(&c) if c == quote => return Ok((s, i + 1)),
            Some('\\') => {
                let escaped = match chars.get(i + 1) {
                    Some('\\') => '\\',
                    Some('"') => '"',
                    Some('\'') => '\'',
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('r') => '\r',
                    other => return err(format!("unsupported escape sequence \\{other:?}")),
                };
                s.push(escaped);
                i += 2;
            }
            Some(&c) => {
                s.push(c);
                i += 1;
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Lit(Value),
    Device,
    Member(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn bump(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn expect(&mut self, want: &Token, what: &str) -> Result<(), CelError> {
        match self.bump() {
            Some(t) if &t == want => Ok(()),
            Some(t) => err(format!("expected {what}, found {t:?}")),
            None => err(format!("expected {what}, found the end of the expression")),
        }
    }

    fn or(&mut self) -> Result<Expr, CelError> {
        let mut left = self.and()?;
        while self.peek() == Some(&Token::Or) {
            self.pos += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, CelError> {
        let mut left = self.relation()?;
        while self.peek() == Some(&Token::And) {
            self.pos += 1;
            left = Expr::And(Box::new(left), Box::new(self.relation()?));
        }
        Ok(left)
    }

    fn relation(&mut self) -> Result<Expr, CelError> {
        let left = self.unary()?;
        if let Some(Token::Cmp(op)) = self.peek().cloned() {
            self.pos += 1;
            let right = self.unary()?;
            if matches!(self.peek(), Some(Token::Cmp(_))) {
                return err("chained comparisons are not supported; use && between them");
            }
            return Ok(Expr::Cmp(op, Box::new(left), Box::new(right)));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, CelError> {
        match self.peek() {
            Some(Token::Not) => {
                self.pos += 1;
                Ok(Expr::Not(Box::new(self.unary()?)))
            }
            Some(Token::Minus) => {
                self.pos += 1;
                match self.bump() {
                    Some(Token::Int(n)) => Ok(Expr::Lit(Value::Int(-n))),
                    _ => err("unary minus is only supported before an integer literal"),
                }
            }
            _ => self.postfix(),
        }
    }

    fn postfix(&mut self) -> Result<Expr, CelError> {
        let mut e = self.primary()?;
        loop {
            match self.peek() {
                Some(Token::Dot) => {
                    self.pos += 1;
                    let Some(Token::Ident(name)) = self.bump() else {
                        return err("expected a field name after '.'");
                    };
                    if self.peek() == Some(&Token::LParen) {
                        return err(format!("method calls (.{name}()) are not supported"));
                    }
                    e = Expr::Member(Box::new(e), name);
                }
                Some(Token::LBracket) => {
                    self.pos += 1;
                    let index = self.or()?;
                    self.expect(&Token::RBracket, "']'")?;
                    e = Expr::Index(Box::new(e), Box::new(index));
                }
                _ => return Ok(e),
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, CelError> {
        match self.bump() {
            Some(Token::Int(n)) => Ok(Expr::Lit(Value::Int(n))),
            Some(Token::Str(s)) => Ok(Expr::Lit(Value::String(s))),
            Some(Token::LParen) => {
                let e = self.or()?;
                self.expect(&Token::RParen, "')'")?;
                Ok(e)
            }
            Some(Token::Ident(id)) => {
                if self.peek() == Some(&Token::LParen) {
                    return err(format!("function calls ({id}()) are not supported"));
                }
                match id.as_str() {
                    "true" => Ok(Expr::Lit(Value::Bool(true))),
                    "false" => Ok(Expr::Lit(Value::Bool(false))),
                    "device" => Ok(Expr::Device),
                    "in" => err("the 'in' operator is not supported"),
                    other => err(format!("undeclared reference to '{other}'")),
                }
            }
            Some(t) => err(format!("unexpected {t:?}")),
            None => err("unexpected end of the expression"),
        }
    }
}

/// A compiled selector expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    expr: Expr,
}

/// Compiles `source`; unsupported syntax is a compile error.
pub fn compile(source: &str) -> Result<Program, CelError> {
    let tokens = lex(source)?;
    if tokens.is_empty() {
        return err("empty expression");
    }
    let mut p = Parser { tokens, pos: 0 };
    let expr = p.or()?;
    if let Some(t) = p.peek() {
        return err(format!("unexpected {t:?} after the end of the expression"));
    }
    Ok(Program { expr })
}

/// An intermediate evaluation result.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Device,
    Attributes,
    Domain(String),
    Scalar(Value),
}

impl Program {
    /// Evaluates the selector for `device`: `Ok(true)` when it matches.
    pub fn matches(&self, device: &CelDevice) -> Result<bool, CelError> {
        match eval(&self.expr, device)? {
            Val::Scalar(Value::Bool(b)) => Ok(b),
            other => err(format!(
                "expression evaluated to {}, not a bool",
                describe(&other)
            )),
        }
    }
}

fn describe(v: &Val) -> String {
    match v {
        Val::Device => "the device".to_string(),
        Val::Attributes => "a map of attribute domains".to_string(),
        Val::Domain(d) => format!("the attributes of domain {d:?}"),
        Val::Scalar(s) => format!("a {}", s.type_name()),
    }
}

fn attribute(device: &CelDevice, domain: &str, name: &str) -> Result<Val, CelError> {
    device
        .attributes
        .get(&(domain.to_string(), name.to_string()))
        .map(|v| Val::Scalar(v.clone()))
        .ok_or_else(|| CelError(format!("no such key: {name}")))
}

fn as_bool(v: Result<Val, CelError>) -> Result<bool, CelError> {
    match v? {
        Val::Scalar(Value::Bool(b)) => Ok(b),
        other => err(format!(
            "no matching overload: expected a bool, found {}",
            describe(&other)
        )),
    }
}

fn eval(e: &Expr, device: &CelDevice) -> Result<Val, CelError> {
    match e {
        Expr::Lit(v) => Ok(Val::Scalar(v.clone())),
        Expr::Device => Ok(Val::Device),
        Expr::Member(base, name) => match (eval(base, device)?, name.as_str()) {
            (Val::Device, "driver") => Ok(Val::Scalar(Value::String(device.driver.clone()))),
            (Val::Device, "attributes") => Ok(Val::Attributes),
            (Val::Device, other) => err(format!("unsupported field device.{other}")),
            (Val::Attributes, other) => Ok(Val::Domain(other.to_string())),
            (Val::Domain(d), n) => attribute(device, &d, n),
            (Val::Scalar(s), n) => err(format!("type {} has no field {n}", s.type_name())),
        },
        Expr::Index(base, index) => {
            let base = eval(base, device)?;
            let Val::Scalar(Value::String(key)) = eval(index, device)? else {
                return err("only string keys are supported in [...]");
            };
            match base {
                Val::Attributes => Ok(Val::Domain(key)),
                Val::Domain(d) => attribute(device, &d, &key),
                other => err(format!("{} cannot be indexed", describe(&other))),
            }
        }
        Expr::Not(inner) => Ok(Val::Scalar(Value::Bool(!as_bool(eval(inner, device))?))),
        Expr::And(a, b) => {
            let (a, b) = (as_bool(eval(a, device)), as_bool(eval(b, device)));
            match (a, b) {
                (Ok(false), _) | (_, Ok(false)) => Ok(Val::Scalar(Value::Bool(false))),
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(true), Ok(true)) => Ok(Val::Scalar(Value::Bool(true))),
            }
        }
        Expr::Or(a, b) => {
            let (a, b) = (as_bool(eval(a, device)), as_bool(eval(b, device)));
            match (a, b) {
                (Ok(true), _) | (_, Ok(true)) => Ok(Val::Scalar(Value::Bool(true))),
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(false), Ok(false)) => Ok(Val::Scalar(Value::Bool(false))),
            }
        }
        Expr::Cmp(op, a, b) => {
            let (a, b) = (eval(a, device)?, eval(b, device)?);
            compare(*op, &a, &b).map(|r| Val::Scalar(Value::Bool(r)))
        }
    }
}

fn compare(op: CmpOp, a: &Val, b: &Val) -> Result<bool, CelError> {
    use std::cmp::Ordering;
    let ord: Ordering = match (a, b) {
        (Val::Scalar(Value::String(x)), Val::Scalar(Value::String(y))) => x.cmp(y),
        (Val::Scalar(Value::Int(x)), Val::Scalar(Value::Int(y))) => x.cmp(y),
        (Val::Scalar(Value::Bool(x)), Val::Scalar(Value::Bool(y))) => x.cmp(y),
        _ => {
            return err(format!(
                "no matching overload for '{op}' applied to ({}, {})",
                describe(a),
                describe(b)
            ));
        }
    };
    Ok(match op {
        CmpOp::Eq => ord == Ordering::Equal,
        CmpOp::Ne => ord != Ordering::Equal,
        CmpOp::Lt => ord == Ordering::Less,
        CmpOp::Le => ord != Ordering::Greater,
        CmpOp::Gt => ord == Ordering::Greater,
        CmpOp::Ge => ord != Ordering::Less,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> CelDevice {
        let mut attributes = BTreeMap::new();
        let mut put = |d: &str, n: &str, v: Value| {
            attributes.insert((d.to_string(), n.to_string()), v);
        };
        put("steward.dev", "configuration", Value::String("cam".into()));
        put("steward.dev", "index", Value::Int(3));
        put("steward.dev", "shared", Value::Bool(false));
        put("other.io", "model", Value::String("x\"y".into()));
        put("steward.dev", "fw", Value::Version("1.2.3".into()));
        CelDevice {
            driver: "steward.dev".into(),
            attributes,
        }
    }

    fn eval_str(src: &str) -> Result<bool, CelError> {
        compile(src)?.matches(&dev())
    }

    #[test]
    fn comparisons_and_access_forms() {
        for (src, want) in [
            (r#"device.driver == "steward.dev""#, true),
            (r#"device.driver != 'steward.dev'"#, false),
            (
                r#"device.attributes["steward.dev"].configuration == "cam""#,
                true,
            ),
            (
                r#"device.attributes["steward.dev"]["configuration"] == "mic""#,
                false,
            ),
            (r#"device.attributes["steward.dev"].index >= 3"#, true),
            (r#"device.attributes["steward.dev"].index < 3"#, false),
            (r#"device.attributes["steward.dev"].index > -1"#, true),
            (r#"device.attributes["steward.dev"].shared == false"#, true),
            (r#"!device.attributes["steward.dev"].shared"#, true),
            (r#"device.attributes["other.io"].model == "x\"y""#, true),
            (
                r#"(device.driver == "a" || device.driver == "steward.dev") && device.attributes["steward.dev"].index <= 3"#,
                true,
            ),
            (r#""b" > "a""#, true),
        ] {
            assert_eq!(eval_str(src), Ok(want), "{src}");
        }
    }

    #[test]
    fn errors_and_their_commutative_absorption() {
        let missing = eval_str(r#"device.attributes["steward.dev"].nope == "x""#).unwrap_err();
        assert_eq!(missing.0, "no such key: nope");
        // An unknown domain is an empty map: the attribute is missing.
        assert!(eval_str(r#"device.attributes["none.io"].x == 1"#).is_err());
        let overload = eval_str(r#"device.attributes["steward.dev"].index == "3""#).unwrap_err();
        assert!(overload.0.contains("no matching overload"), "{overload}");
        assert!(eval_str(r#"device.attributes["steward.dev"].fw == "1.2.3""#).is_err());
        // false && error == false; true || error == true, in either order.
        assert_eq!(
            eval_str(r#"device.attributes["x.io"].y == 1 && device.driver == "z""#),
            Ok(false)
        );
        assert_eq!(
            eval_str(r#"device.driver == "steward.dev" || device.attributes["x.io"].y == 1"#),
            Ok(true)
        );
        assert!(
            eval_str(r#"device.driver == "steward.dev" && device.attributes["x.io"].y == 1"#)
                .is_err()
        );
        assert!(eval_str(r#"device.driver"#).is_err());
    }

    #[test]
    fn unsupported_syntax_is_a_compile_error() {
        for src in [
            r#"has(device.attributes["a"].b)"#,
            r#"device.driver.startsWith("a")"#,
            r#"device.driver in ["a"]"#,
            r#"device.attributes["a"].b + 1 == 2"#,
            r#"cel.bind(x, 1, x == 1)"#,
            r#"device.driver == "a" ? true : false"#,
            r#"1 < 2 < 3"#,
            r#"device.driver == "unterminated"#,
            "",
            "foo == 1",
        ] {
            assert!(compile(src).is_err(), "{src} should not compile");
        }
    }
}
