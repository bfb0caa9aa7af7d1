//! Workspace root: integration tests and examples live beside this crate.
