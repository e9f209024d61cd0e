//! steward-agent
