//! steward-discovery
