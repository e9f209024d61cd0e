//! What both interfaces share: reading and writing cgroup files, and
//! turning a runtime's cgroups path into a hierarchy-relative one.

use std::path::Path;

use crate::error::ResmgrError;

pub(super) fn read_trimmed(path: &Path) -> Result<String, ResmgrError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| ResmgrError::Cgroup {
            path: path.to_path_buf(),
            reason: "reading failed".into(),
            source: Some(e),
        })
}

pub(super) fn write_file(path: &Path, value: &str) -> Result<(), ResmgrError> {
    std::fs::write(path, value).map_err(|e| ResmgrError::Cgroup {
        path: path.to_path_buf(),
        reason: format!("writing {value:?} failed"),
        source: Some(e),
    })
}

pub(super) fn parse_pids(path: &Path) -> Result<Vec<u32>, ResmgrError> {
    let raw = read_trimmed(path)?;
    raw.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim().parse().map_err(|_| ResmgrError::Cgroup {
                path: path.to_path_buf(),
                reason: format!("not a pid: {l:?}"),
                source: None,
            })
        })
        .collect()
}

pub(super) fn rel(cgroup: &str) -> &str {
    cgroup.trim_start_matches('/')
}

/// Turn a runtime's cgroups path into a hierarchy-relative path. Accepts the
/// cgroupfs form (`/a/b/id`) and the systemd form (`slice:prefix:name`).
pub fn normalize_cgroups_path(spec_path: &str) -> String {
    let parts: Vec<&str> = spec_path.split(':').collect();
    if let [slice, prefix, name] = parts.as_slice()
        && !spec_path.starts_with('/')
    {
        let mut out = expand_slice(slice);
        let unit = if name.ends_with(".slice") {
            (*name).to_owned()
        } else if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        out.push('/');
        out.push_str(&unit);
        return out;
    }
    if spec_path.starts_with('/') {
        spec_path.to_owned()
    } else {
        format!("/{spec_path}")
    }
}

/// `a-b-c.slice` -> `/a.slice/a-b.slice/a-b-c.slice` (`-.slice` is the root).
fn expand_slice(slice: &str) -> String {
    let base = slice.strip_suffix(".slice").unwrap_or(slice);
    if base.is_empty() || base == "-" {
        return String::new();
    }
    let mut out = String::new();
    let mut acc = String::new();
    for (i, part) in base.split('-').enumerate() {
        if i > 0 {
            acc.push('-');
        }
        acc.push_str(part);
        out.push('/');
        out.push_str(&acc);
        out.push_str(".slice");
    }
    out
}
