//! Kubernetes API adapter toolkit.
