//! A private containerd 2.1.9 for the NRI tests: the containerd test
//! harness's [`Containerd2`] (started with `scripts/containerd.sh`, in a
//! mount namespace of its own with a private `/run`), re-exported under the
//! names these tests have always used.

#![allow(unused_imports)]

pub use steward_testing_containerd::{
    CONTAINERD2_BIN_ENV as BIN_ENV, Containerd2, bin_dir, bin_dir_or_skip,
};
