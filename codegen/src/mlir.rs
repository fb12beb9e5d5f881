//! MLIR export of per-rank programs (a separate task; empty until then).
