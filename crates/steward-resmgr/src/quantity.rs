//! Kubernetes resource quantities (`500m`, `1.5Gi`, `1e9`, `2Ei`), parsed
//! by the API machinery's grammar and rounded up to the integer unit the
//! caller needs, as kubelet does (CPU in millicores: `ceil(q * 1000)`;
//! memory in bytes: `ceil(q)`).
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= <number> | <sign><number>
//! <sign>            ::= "+" | "-"
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
//! ```
//!
//! The value is kept exact (an integer mantissa times a power of ten and a
//! power of two) until the one rounding at the end.

/// Why a quantity was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a quantity by the grammar.
    #[error("{0:?} is not a Kubernetes quantity")]
    Malformed(String),
    /// A negative amount of a resource.
    #[error("{0:?} is negative")]
    Negative(String),
    /// Larger than the unit's integer range.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Parse a CPU quantity (`"2"`, `"500m"`, `"0.25"`, `"1e-3"`) to
/// millicores, rounding up.
pub fn parse_cpu_quantity(s: &str) -> Result<u64, QuantityError> {
    parse_scaled(s, 3)
}

/// Parse a memory quantity (`"64Mi"`, `"1.5Gi"`, `"1G"`, `"1e9"`) to
/// bytes, rounding up.
pub fn parse_memory_quantity(s: &str) -> Result<u64, QuantityError> {
    parse_scaled(s, 0)
}

/// An exact non-negative value: `mantissa * 10^exp10 * 2^exp2`.
struct Exact {
    mantissa: u128,
    exp10: i64,
    exp2: u32,
}

/// `ceil(quantity * 10^scale10)` as a `u64`.
fn parse_scaled(s: &str, scale10: i64) -> Result<u64, QuantityError> {
    let malformed = || QuantityError::Malformed(s.to_owned());
    let (negative, v) = parse_exact(s.trim()).map_err(|e| match e {
        Invalid::Malformed => malformed(),
        Invalid::TooLarge => QuantityError::TooLarge(s.to_owned()),
    })?;
    if negative && v.mantissa != 0 {
        return Err(QuantityError::Negative(s.to_owned()));
    }
    let exp10 = v.exp10.checked_add(scale10).ok_or_else(malformed)?;
    ceil_exact(v.mantissa, exp10, v.exp2).ok_or_else(|| QuantityError::TooLarge(s.to_owned()))
}

/// `ceil(m * 10^exp10 * 2^exp2)`, `None` when it does not fit a `u64`.
fn ceil_exact(m: u128, exp10: i64, exp2: u32) -> Option<u64> {
    if m == 0 {
        return Some(0);
    }
    let mut num = m.checked_mul(1u128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        let p = 10u128.checked_pow(u32::try_from(exp10).ok()?)?;
        num = num.checked_mul(p)?;
        return u64::try_from(num).ok();
    }
    let den = u32::try_from(-exp10)
        .ok()
        .and_then(|e| 10u128.checked_pow(e));
    match den {
        Some(den) => u64::try_from(num.div_ceil(den)).ok(),
        // 10^e beyond u128 exceeds any num that fits: 0 < value < 1.
        None => Some(1),
    }
}

enum Invalid {
    Malformed,
    TooLarge,
}

/// Split sign, digits and suffix: whether it is negative and its value.
fn parse_exact(s: &str) -> Result<(bool, Exact), Invalid> {
    let (negative, rest) = split_sign(s);
    let num_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(num_len);
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return Err(Invalid::Malformed);
    }
    // Leading zeros carry no value; trailing zeros of the fraction neither.
    let whole = whole.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let mut mantissa: u128 = 0;
    for c in whole.chars().chain(frac.chars()) {
        let d = u128::from(c.to_digit(10).ok_or(Invalid::Malformed)?);
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(d))
            .ok_or(Invalid::TooLarge)?;
    }
    let frac_len = i64::try_from(frac.len()).map_err(|_| Invalid::TooLarge)?;
    let (exp10, exp2) = suffix_exponents(suffix).ok_or(Invalid::Malformed)?;
    Ok((
        negative,
        Exact {
            mantissa,
            exp10: exp10.checked_sub(frac_len).ok_or(Invalid::Malformed)?,
            exp2,
        },
    ))
}

fn split_sign(s: &str) -> (bool, &str) {
    if let Some(r) = s.strip_prefix('-') {
        (true, r)
    } else if let Some(r) = s.strip_prefix('+') {
        (false, r)
    } else {
        (false, s)
    }
}

/// The powers of ten and of two a suffix stands for.
fn suffix_exponents(suffix: &str) -> Option<(i64, u32)> {
    let e = match suffix {
        "" => (0, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exp = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let (neg, digits) = split_sign(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let v: i64 = digits.parse().ok()?;
            (if neg { -v } else { v }, 0)
        }
    };
    Some(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_whole_grammar_parses() {
        let cpu = |s: &str| parse_cpu_quantity(s);
        let mem = |s: &str| parse_memory_quantity(s);
        assert_eq!(cpu("2"), Ok(2000));
        assert_eq!(cpu("500m"), Ok(500));
        assert_eq!(cpu("0.25"), Ok(250));
        assert_eq!(cpu(".5"), Ok(500));
        assert_eq!(cpu("5."), Ok(5000));
        assert_eq!(cpu("+1"), Ok(1000));
        assert_eq!(cpu("1e-3"), Ok(1));
        assert_eq!(cpu("1E3"), Ok(1_000_000));
        assert_eq!(mem("64Mi"), Ok(64 << 20));
        assert_eq!(mem("1.5Gi"), Ok(3 << 29));
        assert_eq!(mem("1G"), Ok(1_000_000_000));
        assert_eq!(mem("1e9"), Ok(1_000_000_000));
        assert_eq!(mem("1E3"), Ok(1000));
        assert_eq!(mem("1e+3"), Ok(1000));
        assert_eq!(mem("1000"), Ok(1000));
        assert_eq!(mem("1k"), Ok(1000));
        assert_eq!(mem("2P"), Ok(2_000_000_000_000_000));
        assert_eq!(mem("1E"), Ok(1_000_000_000_000_000_000), "E alone is exa");
        assert_eq!(mem("3Pi"), Ok(3 << 50));
        assert_eq!(mem("7Ei"), Ok(7 << 60));
        assert_eq!(mem("-0"), Ok(0));
        assert_eq!(mem("0.000Gi"), Ok(0));
    }

    #[test]
    fn values_round_up_to_the_unit() {
        // kubelet: MilliValue() = ceil(q * 1000), Value() = ceil(q).
        assert_eq!(parse_cpu_quantity("1.2345"), Ok(1235));
        assert_eq!(parse_cpu_quantity("0.0001"), Ok(1));
        assert_eq!(parse_cpu_quantity("100u").ok(), None);
        assert_eq!(parse_cpu_quantity("1e-30"), Ok(1));
        assert_eq!(parse_memory_quantity("1.5"), Ok(2));
        assert_eq!(parse_memory_quantity("100m"), Ok(1));
        assert_eq!(parse_memory_quantity("1000m"), Ok(1));
        assert_eq!(parse_memory_quantity("1001m"), Ok(2));
        assert_eq!(parse_memory_quantity("0.1Ki"), Ok(103));
        assert_eq!(parse_memory_quantity("1e-400"), Ok(1));
    }

    #[test]
    fn non_quantities_are_refused_with_the_reason() {
        for s in [
            "", "x", "Mi", "1Qi", "1.2.3", ".", "1e", "1e+", "1ee3", "1 Gi", "--1", "1e3.5",
            "1Kii", "1K", "0x10",
        ] {
            assert!(
                matches!(parse_memory_quantity(s), Err(QuantityError::Malformed(_))),
                "{s:?}: {:?}",
                parse_memory_quantity(s)
            );
        }
        assert!(matches!(
            parse_memory_quantity("-1Mi"),
            Err(QuantityError::Negative(_))
        ));
        for s in [
            "16Ei",
            "20E",
            "1e20",
            "99999999999999999999999999999999999999999",
        ] {
            assert!(
                matches!(parse_memory_quantity(s), Err(QuantityError::TooLarge(_))),
                "{s:?}"
            );
        }
    }

    /// The reference: `(whole . frac) * num / den`, rounded up, by plain
    /// rational arithmetic over a suffix table of multipliers.
    fn reference(whole: u64, frac: &str, num: u128, den: u128, scale: u128) -> Option<u64> {
        let f: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().ok()?
        };
        let pow = 10u128.pow(u32::try_from(frac.len()).ok()?);
        let top = (u128::from(whole) * pow + f) * num * scale;
        u64::try_from(top.div_ceil(pow * den)).ok()
    }

    const SUFFIXES: &[(&str, u128, u128)] = &[
        ("", 1, 1),
        ("m", 1, 1000),
        ("k", 1000, 1),
        ("M", 1_000_000, 1),
        ("G", 1_000_000_000, 1),
        ("T", 1_000_000_000_000, 1),
        ("P", 1_000_000_000_000_000, 1),
        ("E", 1_000_000_000_000_000_000, 1),
        ("Ki", 1 << 10, 1),
        ("Mi", 1 << 20, 1),
        ("Gi", 1 << 30, 1),
        ("Ti", 1 << 40, 1),
        ("Pi", 1 << 50, 1),
        ("Ei", 1 << 60, 1),
        ("e-3", 1, 1000),
        ("e0", 1, 1),
        ("E2", 100, 1),
        ("e+6", 1_000_000, 1),
        ("e-9", 1, 1_000_000_000),
    ];

    proptest! {
        #[test]
        fn matches_the_reference(
            whole in 0u64..100_000,
            frac in "[0-9]{0,6}",
            suffix in 0..SUFFIXES.len(),
        ) {
            let (sfx, num, den) = SUFFIXES[suffix];
            let text = if frac.is_empty() { format!("{whole}{sfx}") } else { format!("{whole}.{frac}{sfx}") };
            let bytes = reference(whole, &frac, num, den, 1);
            let milli = reference(whole, &frac, num, den, 1000);
            prop_assert_eq!(parse_memory_quantity(&text).ok(), bytes, "{}", text);
            prop_assert_eq!(parse_cpu_quantity(&text).ok(), milli, "{}", text);
        }

        #[test]
        fn cpu_quantity_roundtrip(milli in 0u64..=4_096_000) {
            prop_assert_eq!(parse_cpu_quantity(&format!("{milli}m")), Ok(milli));
            let s = format!("{}.{:03}", milli / 1000, milli % 1000);
            prop_assert_eq!(parse_cpu_quantity(&s), Ok(milli));
        }
    }
}
