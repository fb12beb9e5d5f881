//! Why a program directory could not be read or written.

use std::path::PathBuf;

/// A program-file error, with the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{}: {message}", path.display())]
    Io { path: PathBuf, message: String },
    #[error("{}: not a valid program file: {message}", path.display())]
    Format { path: PathBuf, message: String },
}
