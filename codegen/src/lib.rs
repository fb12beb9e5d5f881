//! codegen: see docs/architecture.md.
