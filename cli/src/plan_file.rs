//! Reading a plan.json for the commands that lower it (`codegen`, `run`).

use std::path::Path;

use anyhow::Context;
use planner::plan::Plan;

/// The plan at `path`, carrying its model's graph: plans written before `model.ir` was recorded
/// get it from `model.reference` (the zoo name or file path as given to `compile`), loaded
/// at the plan's micro-batch and sequence.
pub fn read(path: &Path) -> anyhow::Result<Plan> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {file}"))?;
    let mut plan = Plan::from_json(&text, &file)?;
    if plan.model.ir.is_none() {
        let m = import::load_model(
            &plan.model.reference,
            plan.strategy.micro_batch,
            Some(plan.strategy.seq),
        )
        .with_context(|| {
            format!(
                "{file} does not carry its model's graph (model.ir), and its model `{}` \
                 (model.reference) cannot be loaded from here; compile the model again",
                plan.model.reference
            )
        })?;
        plan.model.ir = Some(ir::text::print(&m.graph));
    }
    Ok(plan)
}
