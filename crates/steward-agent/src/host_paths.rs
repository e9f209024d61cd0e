//! The node's own rule for host paths handed to containers.
//!
//! Instances are API objects: whoever can write one can put any path into
//! its `mounts` and `deviceSpecs`, and a Configuration's `allowedHostPaths`
//! is written by the Configuration's author and checked only at discovery.
//! So nothing from the API becomes a host path in an Allocate answer or a
//! CDI spec before it passes the policy the node's operator set here
//! (`steward agent --allowed-device-paths --allowed-mount-paths
//! --allow-block-devices --host-root`):
//!
//! - the path is absolute, holds no NUL and no `..` component;
//! - it is resolved on the node, following every symlink (at most
//!   [`MAX_LINKS`]), inside [`HostPathPolicy::host_root`] (where the host's
//!   `/` is seen by the agent; absolute link targets restart there);
//! - a device node must exist; a mount may name a path not there yet (its
//!   existing part is resolved, the rest taken as written);
//! - the resolved path is under one of the allowed prefixes, compared
//!   component by component (`/dev2` is not under `/dev/`);
//! - it is none of [`DENIED_DEVICES`] (physical memory and I/O ports) and,
//!   unless block devices are allowed, not a block device — whatever the
//!   prefixes allow, for mounts too.
//!
//! The resolved path is what the container is given, so a link changed
//! after the check does not redirect it.
//!
//! The policy is configuration of one agent, not of the process: it is
//! [`crate::AgentConfig::host_paths`], carried into the slot keeper
//! (Allocate) and the device plugins' CDI specs, so two agents in one
//! process may hold different ones.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use steward_api::{InstanceDeviceSpec, InstanceMount};

/// Device nodes never handed to a container: physical memory, kernel
/// memory, I/O ports.
pub const DENIED_DEVICES: &[&str] = &["/dev/mem", "/dev/kmem", "/dev/port"];

/// Most symlinks followed resolving one path (Linux's own limit).
pub const MAX_LINKS: usize = 40;

/// Default of `--allowed-device-paths`.
pub const DEFAULT_DEVICE_PATHS: &[&str] = &["/dev/"];

/// What a host path is used as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathUse {
    Device,
    Mount,
}

impl std::fmt::Display for PathUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PathUse::Device => "device",
            PathUse::Mount => "mount",
        })
    }
}

/// Why a host path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPathRefused {
    #[error("{kind} host path {path:?} is not an absolute path without `..`")]
    Malformed { kind: PathUse, path: String },
    #[error("{kind} host path {path:?} does not exist on this node")]
    Missing { kind: PathUse, path: String },
    #[error("{kind} host path {path:?} cannot be resolved on this node: {reason}")]
    Unresolvable {
        kind: PathUse,
        path: String,
        reason: String,
    },
    #[error(
        "{kind} host path {path:?} (resolved {resolved:?}) is outside this node's allowed {kind} paths {allowed:?}"
    )]
    NotAllowed {
        kind: PathUse,
        path: String,
        resolved: String,
        allowed: Vec<String>,
    },
    #[error(
        "{kind} host path {path:?} (resolved {resolved:?}) is a device this node never hands out ({why})"
    )]
    Denied {
        kind: PathUse,
        path: String,
        resolved: String,
        why: &'static str,
    },
}

/// Errors building a policy.
#[derive(Debug, thiserror::Error)]
pub enum HostPathPolicyError {
    #[error("allowed host path prefix {0:?} is not an absolute path without `..`")]
    BadPrefix(String),
}

/// The node's host path policy (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPathPolicy {
    host_root: PathBuf,
    device_prefixes: Vec<Vec<OsString>>,
    mount_prefixes: Vec<Vec<OsString>>,
    allow_block_devices: bool,
    /// Off only in unit tests of the users of the policy.
    checked: bool,
}

impl Default for HostPathPolicy {
    /// Devices under `/dev/`, no mounts, no block devices, host root `/`.
    fn default() -> Self {
        Self {
            host_root: PathBuf::from("/"),
            device_prefixes: vec![vec![OsString::from("dev")]],
            mount_prefixes: Vec::new(),
            allow_block_devices: false,
            checked: true,
        }
    }
}

fn prefix(p: &str) -> Result<Vec<OsString>, HostPathPolicyError> {
    lexical(p).ok_or_else(|| HostPathPolicyError::BadPrefix(p.to_owned()))
}

/// The components of an absolute path without `..` or NUL (`.` and empty
/// ones dropped).
fn lexical(p: &str) -> Option<Vec<OsString>> {
    if !p.starts_with('/') || p.contains('\0') {
        return None;
    }
    let mut out = Vec::new();
    for c in Path::new(p).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n.to_owned()),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn join(parts: &[OsString]) -> PathBuf {
    let mut p = PathBuf::from("/");
    p.extend(parts);
    p
}

impl HostPathPolicy {
    /// A policy: device nodes under `device_prefixes`, mounts under
    /// `mount_prefixes` (absolute prefixes, matched on whole components),
    /// paths resolved inside `host_root`.
    pub fn new(
        host_root: impl Into<PathBuf>,
        device_prefixes: &[String],
        mount_prefixes: &[String],
        allow_block_devices: bool,
    ) -> Result<Self, HostPathPolicyError> {
        let parse = |v: &[String]| {
            v.iter()
                .filter(|p| !p.trim().is_empty())
                .map(|p| prefix(p.trim()))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            host_root: host_root.into(),
            device_prefixes: parse(device_prefixes)?,
            mount_prefixes: parse(mount_prefixes)?,
            allow_block_devices,
            checked: true,
        })
    }

    /// A policy passing every path as written (unit tests of code that is
    /// not about paths).
    #[cfg(test)]
    pub(crate) fn unchecked() -> Self {
        Self {
            checked: false,
            ..Self::default()
        }
    }

    /// Where the host's `/` is seen by the agent.
    pub fn host_root(&self) -> &Path {
        &self.host_root
    }

    fn prefixes(&self, kind: PathUse) -> &[Vec<OsString>] {
        match kind {
            PathUse::Device => &self.device_prefixes,
            PathUse::Mount => &self.mount_prefixes,
        }
    }

    fn allowed_display(&self, kind: PathUse) -> Vec<String> {
        self.prefixes(kind)
            .iter()
            .map(|p| join(p).display().to_string())
            .collect()
    }

    /// `path` as the container may be given it (resolved on the node), or
    /// why not.
    pub fn check(&self, kind: PathUse, path: &str) -> Result<String, HostPathRefused> {
        let malformed = || HostPathRefused::Malformed {
            kind,
            path: path.to_owned(),
        };
        let parts = lexical(path).ok_or_else(malformed)?;
        if !self.checked {
            return Ok(join(&parts).display().to_string());
        }
        let resolved = self.resolve(kind, path, parts)?;
        let shown = join(&resolved).display().to_string();
        if !self.prefixes(kind).iter().any(|p| resolved.starts_with(p)) {
            return Err(HostPathRefused::NotAllowed {
                kind,
                path: path.to_owned(),
                resolved: shown,
                allowed: self.allowed_display(kind),
            });
        }
        let denied = |why| HostPathRefused::Denied {
            kind,
            path: path.to_owned(),
            resolved: shown.clone(),
            why,
        };
        if DENIED_DEVICES
            .iter()
            .any(|d| Path::new(d) == join(&resolved))
        {
            return Err(denied("memory or I/O port device"));
        }
        if !self.allow_block_devices {
            let on_node = self.on_node(&resolved);
            if std::fs::metadata(&on_node).is_ok_and(|m| m.file_type().is_block_device()) {
                return Err(denied("block device; see --allow-block-devices"));
            }
        }
        Ok(shown)
    }

    fn on_node(&self, parts: &[OsString]) -> PathBuf {
        let mut p = self.host_root.clone();
        p.extend(parts);
        p
    }

    /// Follows every symlink of `parts` inside the host root. A missing
    /// component refuses a device; for a mount the rest is taken as
    /// written.
    fn resolve(
        &self,
        kind: PathUse,
        path: &str,
        parts: Vec<OsString>,
    ) -> Result<Vec<OsString>, HostPathRefused> {
        let unresolvable = |reason: String| HostPathRefused::Unresolvable {
            kind,
            path: path.to_owned(),
            reason,
        };
        let mut todo: VecDeque<OsString> = parts.into();
        let mut done: Vec<OsString> = Vec::new();
        let mut links = 0;
        while let Some(c) = todo.pop_front() {
            if c == ".." {
                done.pop();
                continue;
            }
            if c == "." || c.is_empty() {
                continue;
            }
            let here = self.on_node(&done).join(&c);
            let meta = match std::fs::symlink_metadata(&here) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if kind == PathUse::Device {
                        return Err(HostPathRefused::Missing {
                            kind,
                            path: path.to_owned(),
                        });
                    }
                    done.push(c);
                    for rest in todo.drain(..) {
                        if rest == ".." {
                            done.pop();
                        } else if rest != "." && !rest.is_empty() {
                            done.push(rest);
                        }
                    }
                    break;
                }
                Err(e) => return Err(unresolvable(e.to_string())),
            };
            if !meta.file_type().is_symlink() {
                done.push(c);
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(unresolvable(format!("more than {MAX_LINKS} symlinks")));
            }
            let target = std::fs::read_link(&here).map_err(|e| unresolvable(e.to_string()))?;
            if target.is_absolute() {
                done.clear();
            }
            let mut next: VecDeque<OsString> = target
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_owned()),
                    Component::ParentDir => Some(OsString::from("..")),
                    _ => None,
                })
                .collect();
            next.extend(todo.drain(..));
            todo = next;
        }
        Ok(done)
    }

    /// Every mount and device node of one Instance, resolved, or the first
    /// path refused.
    pub fn check_edits(
        &self,
        mounts: &[InstanceMount],
        devices: &[InstanceDeviceSpec],
    ) -> Result<(Vec<InstanceMount>, Vec<InstanceDeviceSpec>), HostPathRefused> {
        let mounts = mounts
            .iter()
            .map(|m| {
                Ok(InstanceMount {
                    host_path: self.check(PathUse::Mount, &m.host_path)?,
                    ..m.clone()
                })
            })
            .collect::<Result<Vec<_>, HostPathRefused>>()?;
        let devices = devices
            .iter()
            .map(|d| {
                Ok(InstanceDeviceSpec {
                    host_path: self.check(PathUse::Device, &d.host_path)?,
                    ..d.clone()
                })
            })
            .collect::<Result<Vec<_>, HostPathRefused>>()?;
        Ok((mounts, devices))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(root: &Path, devices: &[&str], mounts: &[&str]) -> HostPathPolicy {
        let v = |s: &[&str]| s.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
        HostPathPolicy::new(root, &v(devices), &v(mounts), false).unwrap()
    }

    /// A fake host root: dev/ttyUSB0, dev/serial/by-id/usb-1 -> ../../ttyUSB0,
    /// dev/escape -> /etc/shadow (absolute: inside the root), dev/up ->
    /// ../etc, dev/mem, dev2/x, etc/shadow, data/cfg.
    fn host() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        for dir in ["dev/serial/by-id", "dev2", "etc", "data/cfg"] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
        }
        for f in ["dev/ttyUSB0", "dev/mem", "dev2/x", "etc/shadow"] {
            std::fs::write(r.join(f), b"").unwrap();
        }
        let link = std::os::unix::fs::symlink;
        link("../../ttyUSB0", r.join("dev/serial/by-id/usb-1")).unwrap();
        link("/etc/shadow", r.join("dev/escape")).unwrap();
        link("../etc", r.join("dev/up")).unwrap();
        link("loop", r.join("dev/loop")).unwrap();
        d
    }

    #[test]
    fn prefixes_match_whole_components() {
        let h = host();
        let p = policy(h.path(), &["/dev/"], &[]);
        assert_eq!(
            p.check(PathUse::Device, "/dev/ttyUSB0").unwrap(),
            "/dev/ttyUSB0"
        );
        assert_eq!(
            p.check(PathUse::Device, "//dev/./ttyUSB0").unwrap(),
            "/dev/ttyUSB0"
        );
        let err = p.check(PathUse::Device, "/dev2/x").unwrap_err();
        assert!(matches!(err, HostPathRefused::NotAllowed { .. }), "{err}");
        // Given without the trailing slash, the same.
        let p = policy(h.path(), &["/dev"], &[]);
        assert!(p.check(PathUse::Device, "/dev2/x").is_err());
        assert!(p.check(PathUse::Device, "/dev/ttyUSB0").is_ok());
    }

    #[test]
    fn dotdot_and_relative_paths_are_refused() {
        let h = host();
        let p = policy(h.path(), &["/dev/"], &["/data/"]);
        for bad in [
            "/dev/../etc/shadow",
            "dev/ttyUSB0",
            "",
            "/dev/tty\0",
            "/data/..",
        ] {
            let err = p.check(PathUse::Device, bad).unwrap_err();
            assert!(
                matches!(err, HostPathRefused::Malformed { .. }),
                "{bad:?}: {err}"
            );
            assert!(p.check(PathUse::Mount, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn symlinks_are_resolved_and_refused_when_they_leave_the_policy() {
        let h = host();
        let p = policy(h.path(), &["/dev/"], &[]);
        // Inside: given as the resolved node.
        assert_eq!(
            p.check(PathUse::Device, "/dev/serial/by-id/usb-1").unwrap(),
            "/dev/ttyUSB0"
        );
        // Absolute target: resolved inside the host root, then refused.
        let err = p.check(PathUse::Device, "/dev/escape").unwrap_err();
        match &err {
            HostPathRefused::NotAllowed { resolved, .. } => assert_eq!(resolved, "/etc/shadow"),
            other => panic!("{other}"),
        }
        // Relative target climbing out.
        let err = p.check(PathUse::Device, "/dev/up/shadow").unwrap_err();
        assert!(matches!(err, HostPathRefused::NotAllowed { .. }), "{err}");
        // A loop.
        let err = p.check(PathUse::Device, "/dev/loop").unwrap_err();
        assert!(matches!(err, HostPathRefused::Unresolvable { .. }), "{err}");
    }

    #[test]
    fn a_missing_device_is_refused_a_missing_mount_is_not() {
        let h = host();
        let p = policy(h.path(), &["/dev/"], &["/data/"]);
        let err = p.check(PathUse::Device, "/dev/ttyUSB9").unwrap_err();
        assert!(matches!(err, HostPathRefused::Missing { .. }), "{err}");
        assert_eq!(
            p.check(PathUse::Mount, "/data/cfg/later/x").unwrap(),
            "/data/cfg/later/x"
        );
        // Still under the prefix check.
        assert!(p.check(PathUse::Mount, "/elsewhere/x").is_err());
    }

    #[test]
    fn no_mounts_by_default_and_root_is_refused() {
        let h = host();
        let p = HostPathPolicy {
            host_root: h.path().to_owned(),
            ..HostPathPolicy::default()
        };
        for m in ["/", "/data/cfg", "/dev/ttyUSB0"] {
            let err = p.check(PathUse::Mount, m).unwrap_err();
            assert!(
                matches!(err, HostPathRefused::NotAllowed { .. }),
                "{m}: {err}"
            );
            assert!(err.to_string().contains(&format!("{m:?}")), "{err}");
        }
        assert!(p.check(PathUse::Device, "/dev/ttyUSB0").is_ok());
    }

    #[test]
    fn denied_devices_are_refused_under_any_prefix_and_through_links() {
        let h = host();
        std::os::unix::fs::symlink("mem", h.path().join("dev/innocent")).unwrap();
        let p = policy(h.path(), &["/"], &["/"]);
        for path in ["/dev/mem", "/dev/innocent"] {
            for kind in [PathUse::Device, PathUse::Mount] {
                let err = p.check(kind, path).unwrap_err();
                assert!(
                    matches!(err, HostPathRefused::Denied { .. }),
                    "{path}: {err}"
                );
            }
        }
    }

    /// The real node: /dev/null is a character device, a block device (if
    /// the machine shows one) is refused unless allowed.
    #[test]
    fn block_devices_need_the_flag() {
        let p = HostPathPolicy::default();
        assert_eq!(p.check(PathUse::Device, "/dev/null").unwrap(), "/dev/null");
        let block = std::fs::read_dir("/dev").ok().and_then(|d| {
            d.flatten()
                .find(|e| e.file_type().is_ok_and(|t| t.is_block_device()))
                .map(|e| e.path().display().to_string())
        });
        if let Some(block) = block {
            let err = p.check(PathUse::Device, &block).unwrap_err();
            assert!(matches!(err, HostPathRefused::Denied { .. }), "{err}");
            let allowing = HostPathPolicy::new("/", &["/dev/".into()], &[], true).unwrap();
            assert!(allowing.check(PathUse::Device, &block).is_ok());
        }
    }

    #[test]
    fn check_edits_resolves_all_or_names_the_first_refused() {
        let h = host();
        let p = policy(h.path(), &["/dev/"], &["/data/"]);
        let mount = |host: &str| InstanceMount {
            container_path: "/c".into(),
            host_path: host.into(),
            read_only: true,
        };
        let dev = |host: &str| InstanceDeviceSpec {
            container_path: "/dev/x".into(),
            host_path: host.into(),
            permissions: "rw".into(),
        };
        let (m, d) = p
            .check_edits(&[mount("/data/cfg")], &[dev("/dev/serial/by-id/usb-1")])
            .unwrap();
        assert_eq!(m[0].host_path, "/data/cfg");
        assert!(m[0].read_only);
        assert_eq!(d[0].host_path, "/dev/ttyUSB0");
        assert_eq!(d[0].container_path, "/dev/x");
        let err = p
            .check_edits(&[mount("/data/cfg"), mount("/")], &[dev("/dev/ttyUSB0")])
            .unwrap_err();
        assert!(err.to_string().contains("\"/\""), "{err}");
    }

    #[test]
    fn bad_prefixes_are_refused_and_empty_ones_ignored() {
        assert!(HostPathPolicy::new("/", &["dev".into()], &[], false).is_err());
        assert!(HostPathPolicy::new("/", &["/a/../b".into()], &[], false).is_err());
        let p = HostPathPolicy::new("/", &["/dev/".into()], &[String::new()], false).unwrap();
        assert!(p.mount_prefixes.is_empty());
    }
}
