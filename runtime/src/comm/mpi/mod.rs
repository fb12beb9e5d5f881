//! MPI communicator (in progress).
