//! MLIR's parser and verifier through melior, with the diagnostics captured as text.

use std::cell::RefCell;
use std::rc::Rc;

use melior::Context;
use melior::dialect::DialectRegistry;
use melior::ir::Module;
use melior::ir::operation::OperationLike;
use melior::utility::register_all_dialects;

use super::MlirError;

/// An MLIR context with every upstream dialect registered (none unregistered allowed).
pub struct Verifier {
    context: Context,
    diagnostics: Rc<RefCell<Vec<String>>>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").finish_non_exhaustive()
    }
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier::new()
    }
}

impl Verifier {
    pub fn new() -> Verifier {
        let registry = DialectRegistry::new();
        register_all_dialects(&registry);
        let context = Context::new();
        context.append_dialect_registry(&registry);
        context.load_all_available_dialects();
        context.set_allow_unregistered_dialects(false);
        let diagnostics = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&diagnostics);
        context.attach_diagnostic_handler(move |d| {
            sink.borrow_mut().push(format!("{}: {d}", d.location()));
            true
        });
        Verifier {
            context,
            diagnostics,
        }
    }

    fn take(&self) -> String {
        let mut d = self.diagnostics.borrow_mut();
        let text = d.join("; ");
        d.clear();
        if text.is_empty() {
            "no diagnostic".into()
        } else {
            text
        }
    }

    /// Parses `text` and runs MLIR's verifier on the module.
    pub fn check(&self, name: &str, text: &str) -> Result<(), MlirError> {
        self.diagnostics.borrow_mut().clear();
        let Some(module) = Module::parse(&self.context, text) else {
            return Err(MlirError::Parse {
                name: name.into(),
                diagnostics: self.take(),
            });
        };
        if !module.as_operation().verify() {
            return Err(MlirError::Verify {
                name: name.into(),
                diagnostics: self.take(),
            });
        }
        Ok(())
    }
}
