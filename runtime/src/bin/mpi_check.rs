//! MPI check program (in progress).
fn main() {}
