//! Shared helpers for plait's cross-crate tests.

pub mod emulator;
