//! Node-local I/O shared by every steward component.
