//! steward-api
