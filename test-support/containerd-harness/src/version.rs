//! Which runtime a test talks to, from the CRI `Version` call: tests branch
//! on it only where the runtimes truly differ (containerd 2.x injects CDI
//! devices itself; 1.6 knows no CDI).

use std::path::Path;

use steward_proto::cri::runtime::v1 as cri;

use crate::{HarnessError, cri_client};

/// The runtime's name and version as its CRI `Version` answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// e.g. `containerd`.
    pub name: String,
    /// e.g. `1.6.20~ds1` or `2.1.9`.
    pub version: String,
}

impl RuntimeVersion {
    /// The major version (`1`, `2`), if the version string starts with one
    /// (a leading `v` is skipped).
    pub fn major(&self) -> Option<u32> {
        self.version
            .trim_start_matches('v')
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|m| m.parse().ok())
    }

    /// Whether the runtime applies the CDI devices named in a CRI
    /// `ContainerConfig` itself (containerd 2.x, CDI on by default).
    pub fn injects_cdi(&self) -> bool {
        self.name == "containerd" && self.major().is_some_and(|m| m >= 2)
    }
}

/// Asks the runtime behind `sock` for its version.
pub async fn runtime_version(sock: &Path) -> Result<RuntimeVersion, HarnessError> {
    let (mut runtime, _) = cri_client(sock).await?;
    let v = runtime
        .version(cri::VersionRequest {
            version: String::new(),
        })
        .await
        .map_err(HarnessError::cri("Version"))?
        .into_inner();
    Ok(RuntimeVersion {
        name: v.runtime_name,
        version: v.runtime_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str, version: &str) -> RuntimeVersion {
        RuntimeVersion {
            name: name.to_owned(),
            version: version.to_owned(),
        }
    }

    #[test]
    fn major_and_cdi() {
        assert_eq!(v("containerd", "1.6.20~ds1").major(), Some(1));
        assert_eq!(v("containerd", "v2.1.9").major(), Some(2));
        assert_eq!(v("containerd", "").major(), None);
        assert!(!v("containerd", "1.6.20~ds1").injects_cdi());
        assert!(v("containerd", "2.1.9").injects_cdi());
        assert!(!v("cri-o", "2.0.0").injects_cdi());
    }
}
