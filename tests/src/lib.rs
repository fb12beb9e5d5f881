//! Shared helpers for plait's cross-crate tests.
