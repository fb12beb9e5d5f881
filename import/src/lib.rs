//! Model importers.
