//! Why a program directory could not be read or written.

use std::path::PathBuf;

/// A program-file error, with the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{}: {message}", path.display())]
    Io { path: PathBuf, message: String },
    #[error("{}: not a valid program file: {message}", path.display())]
    Format { path: PathBuf, message: String },
    #[error(
        "{}: is a file, not a directory; the programs go into a directory (`plait codegen \
         PLAN -o DIR`): name a new one, or one codegen wrote before",
        path.display()
    )]
    NotADirectory { path: PathBuf },
    #[error(
        "{}: holds {entries} other entries and no program (no plait index.json); codegen would \
         write its index.json and template files among them: name a new or empty directory, \
         or one codegen wrote before",
        path.display()
    )]
    ForeignDirectory { path: PathBuf, entries: usize },
}
