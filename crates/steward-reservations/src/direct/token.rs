//! The extender's credential for `/v1/decide`: a bearer token read from a
//! file, a projected ServiceAccount token volume with the audience
//! [`super::auth::DECIDE_AUDIENCE`].
//!
//! kubelet rotates that token by writing a new file and swapping a
//! symlink to it: every call looks at the file (one `stat`, following
//! links) and reads it again only when it is another file or changed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use steward_nodeio::identity::FileIdentity;

/// Why no token could be sent.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("reading the decide token {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("the decide token file {0} is empty")]
    Empty(PathBuf),
}

#[derive(Debug)]
struct Kept {
    stamp: FileIdentity,
    token: String,
}

/// A bearer token file, read again when it changes.
#[derive(Clone)]
pub struct DecideToken {
    path: PathBuf,
    kept: Arc<Mutex<Option<Kept>>>,
}

impl std::fmt::Debug for DecideToken {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecideToken")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl DecideToken {
    /// The token in `path` (read at the first call).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            kept: Arc::new(Mutex::new(None)),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The token as the file says now.
    pub fn bearer(&self) -> Result<String, TokenError> {
        let read = |e| TokenError::Read(self.path.clone(), e);
        let stamp = FileIdentity::from_metadata(&std::fs::metadata(&self.path).map_err(read)?);
        if let Ok(kept) = self.kept.lock()
            && let Some(k) = kept.as_ref()
            && k.stamp == stamp
        {
            return Ok(k.token.clone());
        }
        let token = std::fs::read_to_string(&self.path)
            .map_err(read)?
            .trim()
            .to_owned();
        if token.is_empty() {
            return Err(TokenError::Empty(self.path.clone()));
        }
        tracing::debug!(path = %self.path.display(), "read the decide token");
        if let Ok(mut kept) = self.kept.lock() {
            *kept = Some(Kept {
                stamp,
                token: token.clone(),
            });
        }
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A fresh directory of this test's own.
    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "steward-decide-token-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// As kubelet's atomic writer rotates a projected token: a new
    /// directory, the `..data` symlink swapped to it by a rename, the file
    /// a symlink through `..data`.
    #[test]
    fn a_rotated_token_is_read_again() {
        let d = dir("rotate");
        let write = |n: u32, token: &str| {
            let data = d.join(format!("..gen{n}"));
            std::fs::create_dir(&data).unwrap();
            std::fs::write(data.join("token"), token).unwrap();
            let tmp = d.join("..data_tmp");
            std::os::unix::fs::symlink(&data, &tmp).unwrap();
            std::fs::rename(&tmp, d.join("..data")).unwrap();
        };
        write(1, "first\n");
        std::os::unix::fs::symlink(d.join("..data/token"), d.join("token")).unwrap();
        let t = DecideToken::new(d.join("token"));
        assert_eq!(t.bearer().unwrap(), "first");
        assert_eq!(t.bearer().unwrap(), "first");
        // Same length, same second: another file all the same.
        write(2, "secnd\n");
        assert_eq!(t.bearer().unwrap(), "secnd");
        assert!(!format!("{t:?}").contains("secnd"), "Debug shows the token");
        std::fs::write(d.join("..data/token"), "").unwrap();
        assert!(matches!(t.bearer(), Err(TokenError::Empty(_))));
        std::fs::remove_dir_all(&d).unwrap();
        assert!(matches!(t.bearer(), Err(TokenError::Read(..))));
    }
}
