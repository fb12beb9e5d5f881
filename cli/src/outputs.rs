//! Output paths that must not be a command's own input: `plait compile tiny.json -o tiny.json`
//! would replace the model the plan then loads, `plait export plan.json -o plan.json` the plan.

use std::path::Path;

/// Refuses `output` where it names the same file as one of `inputs` (each with what it is, for
/// the message); a path that does not exist yet cannot be an input.
pub fn not_an_input(output: &Path, inputs: &[(&str, &Path)]) -> anyhow::Result<()> {
    let Ok(out) = output.canonicalize() else {
        return Ok(());
    };
    for (what, input) in inputs {
        if input.canonicalize().is_ok_and(|i| i == out) {
            anyhow::bail!(
                "{} is the {what} this command reads: writing it there would replace it; \
                 choose another output path",
                output.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::not_an_input;

    #[test]
    fn an_output_onto_its_input_is_refused_and_a_new_one_is_not() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("plait-outputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let input = dir.join("plan.json");
        std::fs::write(&input, "{}")?;
        let same = dir.join(".").join("plan.json");
        let err = not_an_input(&same, &[("plan", &input)]).err();
        assert!(err.is_some_and(|e| e.to_string().contains("the plan this command reads")));
        assert!(not_an_input(&dir.join("other.json"), &[("plan", &input)]).is_ok());
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
