//! Tables as kubectl prints them: upper-case headers, columns padded to the
//! widest cell, three spaces between columns.

use super::escape::term;

/// Renders `rows` under `headers`. Every cell is escaped for the terminal
/// ([`term`]): cells hold what handlers and the API server sent.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let escaped: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| term(c).into_owned()).collect())
        .collect();
    let rows = &escaped;
    let headers: Vec<String> = headers.iter().map(|h| term(h).into_owned()).collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 3;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    };
    line(headers.clone(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// Bytes as Kubernetes quantities print them (`512Mi`, `2Gi`), exact only.
pub fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (suffix, unit) in UNITS {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_like_kubectl() {
        let t = table(
            &["NAME", "CPUS"],
            &[
                vec!["a".into(), "0-3".into()],
                vec!["longer".into(), "4".into()],
            ],
        );
        assert_eq!(t, "NAME     CPUS\na        0-3\nlonger   4\n");
    }

    /// A cell from a handler or the API server is escaped, and the columns
    /// still line up (widths count the escaped text).
    #[test]
    fn cells_are_escaped_for_the_terminal() {
        let t = table(
            &["NAME", "ID"],
            &[
                vec!["a\x1b[2J".into(), "x\ry".into()],
                vec!["b".into(), "z".into()],
            ],
        );
        assert_eq!(t, "NAME         ID\na\\u{1b}[2J   x\\ry\nb            z\n");
    }

    #[test]
    fn bytes_as_quantities() {
        assert_eq!(bytes(1 << 30), "1Gi");
        assert_eq!(bytes(3 * (1 << 20)), "3Mi");
        assert_eq!(bytes(1000), "1000");
        assert_eq!(bytes(0), "0");
    }
}
