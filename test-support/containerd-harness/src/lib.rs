//! Test support: starts a private containerd, imports local images, CRI client helpers
