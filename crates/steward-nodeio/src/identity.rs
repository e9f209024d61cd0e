//! Which file a path names right now, to notice that a socket (ours, or a
//! peer's such as `kubelet.sock`) was removed or re-created.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Identity of a file: device, inode and change time. Inode numbers are
/// reused at once on tmpfs, so the change time is part of it: a file
/// removed and created again has another identity even with the same inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl FileIdentity {
    /// The identity of the file at `path` (following symlinks); `None` when
    /// nothing is there or it cannot be inspected.
    pub fn of(path: &Path) -> Option<Self> {
        std::fs::metadata(path)
            .ok()
            .map(|m| Self::from_metadata(&m))
    }

    /// The identity recorded in `meta`.
    pub fn from_metadata(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }

    /// Whether `path` still names this very file.
    pub fn is_at(&self, path: &Path) -> bool {
        Self::of(path) == Some(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recreated_file_has_another_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        assert_eq!(FileIdentity::of(&path), None);
        std::fs::write(&path, b"a").unwrap();
        let first = FileIdentity::of(&path).unwrap();
        assert!(first.is_at(&path));
        assert_eq!(
            FileIdentity::of(&path),
            Some(first),
            "stable while unchanged"
        );
        std::fs::remove_file(&path).unwrap();
        assert!(!first.is_at(&path));
        std::fs::write(&path, b"a").unwrap();
        assert_ne!(FileIdentity::of(&path), Some(first));
    }
}
