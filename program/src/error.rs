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
        "{}: is a link to nothing; the programs go into a directory: name a new one, or make \
         the link point at one",
        path.display()
    )]
    DanglingLink { path: PathBuf },
    #[error(
        "{}: holds {}; codegen would write its index.json and template files among them: name \
         a new or empty directory, or one codegen wrote before",
        path.display(),
        foreign_contents(*others, *foreign_index)
    )]
    ForeignDirectory {
        path: PathBuf,
        /// Entries that are neither a program's files nor hidden.
        others: usize,
        /// Its `index.json` is not a program's.
        foreign_index: bool,
    },
}

/// What a directory holds that is not a program's, for [`ProgramError::ForeignDirectory`].
fn foreign_contents(others: usize, foreign_index: bool) -> String {
    let files = match others {
        0 => None,
        1 => Some("1 file that is not a program's".to_string()),
        n => Some(format!("{n} files that are not a program's")),
    };
    let index = foreign_index.then(|| "an index.json that is not plait's".to_string());
    match (files, index) {
        (Some(f), Some(i)) => format!("{f} and {i}"),
        (Some(f), None) => f,
        (None, Some(i)) => i,
        (None, None) => "files that are not a program's".into(),
    }
}
