//! Kubernetes resource quantities (`500m`, `1.5Gi`, `1e9`, `2Ei`, `1k`):
//! the one parser for every quantity steward reads — CPU and memory on the
//! CRI path, extended-resource counts (device slots, exclusive CPUs) at
//! scheduling time. The grammar is the API machinery's
//! (`k8s.io/apimachinery/pkg/api/resource`), which also writes quantities
//! in it: Go's canonical form of 1000 is `"1k"`, of 1536Mi `"1536Mi"`, and
//! a value given in exponent form stays in it (`"1e3"`).
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= <number> | <sign><number>
//! <sign>            ::= "+" | "-"
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedInt> | "E" <signedInt>
//! ```
//!
//! A quantity in JSON may also be a bare number (`2`, `1e3`); the
//! Kubernetes types read it as its decimal text, which parses here.
//!
//! The value is kept exact (an integer mantissa times a power of ten and a
//! power of two) until the one rounding at the end: CPU and memory are
//! rounded up to the integer unit the caller needs, as kubelet does (CPU in
//! millicores: `ceil(q * 1000)`; memory in bytes: `ceil(q)`); a count must
//! be a whole number, as the API server requires of extended resources.

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
    /// A count (an extended resource) that is not a whole number.
    #[error("{0:?} is not a whole number")]
    NotWhole(String),
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

/// Parse a count (an extended resource: device slots, exclusive CPUs;
/// `"2"`, `"1k"`, `"1e3"`, `"2Ki"`). Kubernetes allows only whole numbers
/// there, so a fraction (`"500m"`, `"1.5"`) is refused, not rounded.
pub fn parse_count(s: &str) -> Result<u64, QuantityError> {
    let whole = parse_scaled(s, 0)?;
    // Whole exactly when rounding up at a finer scale gives the same value:
    // checked on the exact value, so "1001m" is refused and "1000m" is 1.
    let (_, v) = parse_exact(s.trim()).map_err(|_| QuantityError::Malformed(s.to_owned()))?;
    if is_whole(&v) {
        Ok(whole)
    } else {
        Err(QuantityError::NotWhole(s.to_owned()))
    }
}

/// Whether `mantissa * 10^exp10 * 2^exp2` is an integer.
fn is_whole(v: &Exact) -> bool {
    if v.mantissa == 0 || v.exp10 >= 0 {
        return true;
    }
    // Divisible by 10^-exp10 once multiplied by 2^exp2 (exp2 <= 60): the
    // power of two supplies factors of 2 only, so 5^k must divide the
    // mantissa and 2^k the mantissa times 2^exp2.
    let Ok(k) = u32::try_from(-v.exp10) else {
        return false;
    };
    let Some(p5) = 5u128.checked_pow(k) else {
        return false;
    };
    if !v.mantissa.is_multiple_of(p5) {
        return false;
    }
    let twos = v.mantissa.trailing_zeros().saturating_add(v.exp2);
    twos >= k
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
        "n" => (-9, 0),
        "u" => (-6, 0),
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
        assert_eq!(
            parse_cpu_quantity("100u"),
            Ok(1),
            "micro: Go's decimalSI has u"
        );
        assert_eq!(parse_cpu_quantity("5000000n"), Ok(5), "nano too");
        assert_eq!(parse_memory_quantity("1n"), Ok(1));
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

    #[test]
    fn counts_read_every_form_go_writes_and_refuse_fractions() {
        // Go's canonical forms of whole numbers: 1000 is "1k", 2048 written
        // as "2Ki" stays binary, exponent form stays exponent form.
        for (s, n) in [
            ("0", 0),
            ("1", 1),
            ("1k", 1000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("5k", 5000),
            ("2Ki", 2048),
            ("1M", 1_000_000),
            ("1000m", 1),
            ("2000000u", 2),
            ("3000000000n", 3),
            ("1.5k", 1500),
            ("120e-1", 12),
        ] {
            assert_eq!(parse_count(s), Ok(n), "{s:?}");
        }
        for s in ["500m", "1.5", "12e-1", "1001m", "1e-400", "0.1Ki"] {
            assert!(
                matches!(parse_count(s), Err(QuantityError::NotWhole(_))),
                "{s:?}: {:?}",
                parse_count(s)
            );
        }
        assert_eq!(
            parse_count("0.5Ki"),
            Ok(512),
            "binary fractions can be whole"
        );
        assert!(matches!(parse_count("-1"), Err(QuantityError::Negative(_))));
        assert!(matches!(parse_count("x"), Err(QuantityError::Malformed(_))));
        assert!(matches!(
            parse_count("20E"),
            Err(QuantityError::TooLarge(_))
        ));
        assert_eq!(
            parse_count("1.5").map_err(|e| e.to_string()),
            Err("\"1.5\" is not a whole number".into())
        );
    }

    /// `n` the way Go's `resource.Quantity` writes a whole number of
    /// `format`: canonical decimal SI (the largest suffix without a
    /// fraction: 1000 is "1k"), binary SI (1024 is "1Ki"), or decimal
    /// exponent (the exponent a multiple of 3: 1000 is "1e3").
    fn go_canonical(n: u64, format: u8) -> String {
        if n == 0 {
            return "0".into();
        }
        match format {
            0 => {
                let mut m = n;
                let mut i = 0;
                while m.is_multiple_of(1000) && i < 6 {
                    m /= 1000;
                    i += 1;
                }
                format!("{m}{}", ["", "k", "M", "G", "T", "P", "E"][i])
            }
            1 => {
                let mut m = n;
                let mut i = 0;
                while m.is_multiple_of(1024) && i < 6 {
                    m /= 1024;
                    i += 1;
                }
                // Go falls back to decimal SI when not a multiple of 1024.
                if i == 0 {
                    return go_canonical(n, 0);
                }
                format!("{m}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][i])
            }
            _ => {
                let mut m = n;
                let mut e = 0;
                while m.is_multiple_of(1000) {
                    m /= 1000;
                    e += 3;
                }
                if e == 0 {
                    format!("{m}")
                } else {
                    format!("{m}e{e}")
                }
            }
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
        fn counts_read_back_what_go_writes(
            n in prop_oneof![0u64..5000, (1u64..5000).prop_map(|m| m * 1000), (1u64..64).prop_map(|m| m << 20), any::<u32>().prop_map(u64::from)],
            format in 0u8..3,
        ) {
            let text = go_canonical(n, format);
            prop_assert_eq!(parse_count(&text), Ok(n), "{}", text);
            // As Kubernetes' JSON may carry it: a bare number, read as text.
            prop_assert_eq!(parse_count(&n.to_string()), Ok(n));
        }

        #[test]
        fn a_count_is_the_memory_value_when_whole(text in "[+-]?[0-9]{0,4}(\\.[0-9]{0,3})?(|n|u|m|k|M|G|Ki|Mi|e[+-]?[0-9])") {
            match parse_count(&text) {
                Ok(n) => prop_assert_eq!(parse_memory_quantity(&text), Ok(n)),
                Err(QuantityError::NotWhole(_)) => {
                    let bytes = parse_memory_quantity(&text);
                    let milli = parse_cpu_quantity(&text);
                    prop_assert!(bytes.is_ok() && milli.is_ok(), "{} {:?} {:?}", text, bytes, milli);
                }
                Err(e) => prop_assert_eq!(parse_memory_quantity(&text), Err(e)),
            }
        }

        #[test]
        fn cpu_quantity_roundtrip(milli in 0u64..=4_096_000) {
            prop_assert_eq!(parse_cpu_quantity(&format!("{milli}m")), Ok(milli));
            let s = format!("{}.{:03}", milli / 1000, milli % 1000);
            prop_assert_eq!(parse_cpu_quantity(&s), Ok(milli));
        }
    }
}
