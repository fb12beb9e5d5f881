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
    check_strategy(&plan, &file)?;
    Ok(plan)
}

/// The plan's strategy against its model and GPU count, as `compile` and `report` check it: a
/// plan edited by hand (a zero micro-batch, ZeRO-9, tp 3 of 8 GPUs) is refused here, naming the
/// field, before it is lowered, run or exported.
fn check_strategy(plan: &Plan, file: &str) -> anyhow::Result<()> {
    let text = plan.model.ir.as_deref().unwrap_or_default();
    let graph = ir::text::parse(text)
        .with_context(|| format!("{file}: its model's graph (model.ir) does not parse"))?;
    let info = planner::ModelInfo::new(&graph).with_context(|| format!("{file}: model.ir"))?;
    plan.strategy
        .validate(&info, plan.gpus)
        .with_context(|| format!("{file}: its strategy (the `strategy` fields) is not valid"))?;
    plan.check_chunks(info.layers)
        .with_context(|| format!("{file}: its pipeline split (the `chunks` field) is not valid"))?;
    Ok(())
}
