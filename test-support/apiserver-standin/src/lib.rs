//! Test support: an in-process Kubernetes API server stand-in speaking real REST + watch
