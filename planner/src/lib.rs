//! planner: see docs/architecture.md.
