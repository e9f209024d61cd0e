//! Kubernetes resource quantities: steward has one parser for every
//! quantity it reads, [`steward_core::quantity`]; re-exported here for the
//! CRI path's callers.

pub use steward_core::quantity::{
    QuantityError, parse_count, parse_cpu_quantity, parse_memory_quantity,
};
