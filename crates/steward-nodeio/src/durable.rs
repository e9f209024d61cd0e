//! Durable file replacement: a crash or a failed write leaves the old
//! content or the new one, never a torn file and never a stray temporary.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::NodeIoError;

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Replaces the content of `path` with `bytes` durably. See [`write_file_with`].
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), NodeIoError> {
    write_file_with(path, |f| f.write_all(bytes))
}

/// Replaces the content of `path` with what `fill` writes: a temporary
/// sibling file is filled, fsync-ed, renamed over `path`, then the directory
/// is fsync-ed so the rename itself survives a crash. If any step fails the
/// temporary file is removed and `path` keeps its old content.
pub fn write_file_with<F>(path: &Path, fill: F) -> Result<(), NodeIoError>
where
    F: FnOnce(&mut File) -> std::io::Result<()>,
{
    let invalid = |reason| NodeIoError::InvalidPath {
        path: path.to_path_buf(),
        reason,
    };
    let file_name = path.file_name().ok_or_else(|| invalid("no file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(
        ".{}-{}.tmp",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);
    let written = (|| {
        let mut f = File::create(&tmp).map_err(|e| NodeIoError::io("create", &tmp, e))?;
        fill(&mut f).map_err(|e| NodeIoError::io("write", &tmp, e))?;
        f.sync_all()
            .map_err(|e| NodeIoError::io("fsync", &tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| NodeIoError::io("rename into", path, e))
    })();
    if let Err(e) = written {
        if let Err(rm) = std::fs::remove_file(&tmp)
            && rm.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %tmp.display(), error = %rm, "cannot remove temporary file");
        }
        return Err(e);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| NodeIoError::io("fsync directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<OsString> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_file(&path, b"one").unwrap();
        write_file(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(names(dir.path()), vec![OsString::from("state.json")]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_content_and_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_file(&path, b"old").unwrap();
        let err = write_file_with(&path, |f| {
            f.write_all(b"half of the n")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), vec![OsString::from("state.json")]);
    }

    #[test]
    fn a_failed_rename_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory where the file should go: rename fails.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"x").unwrap();
        assert!(write_file(&path, b"new").is_err());
        assert_eq!(names(dir.path()), vec![OsString::from("taken")]);
        assert_eq!(std::fs::read(path.join("inside")).unwrap(), b"x");
    }
}
