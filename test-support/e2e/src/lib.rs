//! End-to-end tests across the stand-ins, containerd and steward

pub mod chart;
