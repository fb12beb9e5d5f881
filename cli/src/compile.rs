//! `plait compile MODEL --cluster C --gpus N --global-batch B`: search the fastest plan that
//! fits, print it with its alternatives, and write `plan.json`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use planner::estimate::Estimate;
use planner::plan::{ModelRef, Plan, SearchSummary};
use planner::search::{Alternative, Pins, SearchRequest, SearchResult, search};
use planner::{Cluster, ModelInfo};

use crate::estimate::print_text;
use crate::model;
use crate::strategy_args::{ClusterArgs, StrategyArgs, Switch};

#[derive(Args, Debug)]
pub struct CompileArgs {
    /// A zoo name (see `plait models`), a Hugging Face config.json (or its directory), an ONNX
    /// file, or a Hub id (`org/name`) already downloaded to the local Hugging Face cache.
    model: String,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Strategy knobs to pin (every flag of `plait estimate`); the rest are searched.
    #[command(flatten)]
    pins: StrategyArgs,
    /// Write the plan to this file (plait-plan/1 JSON).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Print one JSON object (the estimate schema plus `search` and `alternatives`).
    #[arg(long)]
    json: bool,
    /// How many rejected alternatives to keep.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Search only what this engine can run (megatron, torchtitan or deepspeed: no GPipe or
    /// ZeRO-2/3 with pipelining on Megatron-LM, no ZeRO-1 on torchtitan, ZeRO ≤ 1 with
    /// pipelining on DeepSpeed), priced with its profile, for `plait export --to` it
    #[arg(long, value_name = "ENGINE")]
    target: Option<planner::engine::Engine>,
    /// Also plan with these data-parallel exchanges, comma-separated (bf16, int8,
    /// topk:FRACTION, local-sgd:H; e.g. `bf16,int8,topk:0.01`), each at ZeRO-0, and keep the
    /// fastest plan of them and the synchronous one. Naming a mode accepts what it does to
    /// convergence: plait never tries them unasked
    #[arg(long, value_name = "MODES", value_delimiter = ',', value_parser = planner::dp_comm::DpComm::parse_mode)]
    search_dp_comm: Vec<planner::dp_comm::DpComm>,
}

/// Where MODEL comes from, for the plan's model reference.
pub fn model_source(model: &str) -> &'static str {
    if model.ends_with(".onnx") {
        "onnx"
    } else if Path::new(model).exists() || model.ends_with(".json") {
        "config"
    } else {
        "zoo"
    }
}

/// A plan searched with pins, and what the search saw.
pub struct Compiled {
    pub plan: Plan,
    pub result: planner::search::SearchResult,
    pub cluster: Cluster,
    pub name: String,
}

/// Searches the fastest plan for `model` with `pins` fixed (what `plait compile` writes).
pub fn compile(
    model_arg: &str,
    cluster_args: &ClusterArgs,
    pins: &StrategyArgs,
    top: usize,
    target: Option<planner::engine::Engine>,
) -> anyhow::Result<Compiled> {
    if let (Some(t), Some(e)) = (target, pins.engine)
        && t != e
    {
        anyhow::bail!(
            "--target {t} searches what {t} runs and prices it with {t}'s profile; drop --engine {e} or make it --engine {t}"
        );
    }
    let dp_comm = pins.dp_comm();
    if let Some(z) = pins.zero.filter(|&z| z > 0 && !dp_comm.is_plain()) {
        anyhow::bail!(
            "--grad-compression {} --dp-sync {} run at ZeRO-0 (a compressed exchange is an all-reduce; local SGD keeps each replica's whole optimizer state), not with --zero {z}: pass --zero 0 or drop it",
            dp_comm.grad_compression,
            dp_comm.dp_sync
        );
    }
    let cluster = Cluster::load(&cluster_args.cluster)?;
    cluster.check_gpus(cluster_args.gpus)?;
    let batch_for_import = pins.micro_batch.unwrap_or(1);
    let m = model::load(model_arg, batch_for_import, cluster_args.seq)?;
    let info = ModelInfo::new(&m.graph)?;
    if let Some(engine) = target {
        planner::export::check_model(&info, engine, m.binding.seq)?;
    }
    let p = pins;
    let req = SearchRequest {
        gpus: cluster_args.gpus,
        global_batch: cluster_args.global_batch,
        seq: m.binding.seq,
        pins: Pins {
            tp: p.tp,
            pp: p.pp,
            dp: p.dp,
            micro_batch: p.micro_batch,
            zero: p.zero,
            recompute: p.recompute,
            schedule: p.schedule,
            virtual_stages: p.virtual_stages,
            sequence_parallel: p.sequence_parallel.map(|s| s == Switch::On),
            precision: p.precision,
            stage_layers: p.stage_layers.clone(),
            attention: p.attention,
            kernels: p.kernels,
            cp: p.cp,
            ep: p.ep,
            engine: target.or(p.engine),
            target: target.is_some(),
            dp_comm: p.dp_comm(),
        },
        top_k: top,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("searching {bar:40} {pos}/{len} candidates ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // Only show the bar when the search takes a while.
    let started = std::time::Instant::now();
    let mut progress = |done: u64, total: u64| {
        if started.elapsed().as_secs_f64() > 0.8 {
            bar.set_length(total);
            bar.set_position(done);
        }
    };
    let result = search(&info, &cluster, &req, &mut progress)?;
    bar.finish_and_clear();
    let r = match result {
        Ok(r) => r,
        Err(inf) => {
            // In MiB below a GiB: a shortfall of 40 MiB read "by 0.0 GiB".
            let short = planner::report::why::size(inf.smallest_shortfall_bytes);
            // A bound's shortfall (nothing was priced) is the least the closest misses by.
            let short = if inf.shortfall_is_lower_bound {
                format!("at least {short}")
            } else {
                short
            };
            let closest = inf
                .closest
                .as_ref()
                .map(|s| {
                    format!(
                        " (closest: tp {} pp {} dp {}{}, ZeRO-{}, recompute {}, micro-batch {})",
                        s.tp,
                        s.pp,
                        s.dp,
                        cp_ep(s),
                        s.zero,
                        s.recompute,
                        s.micro_batch
                    )
                })
                .unwrap_or_default();
            anyhow::bail!(
                "{} does not fit on {} x {}: every plan runs out of memory, the closest by {short}{closest}; \
                 to make it fit: {}",
                m.graph.name,
                cluster_args.gpus,
                cluster.gpu.name,
                inf.suggestions.join("; ")
            );
        }
    };
    let lowering = Lowering {
        info: &info,
        cluster: &cluster,
        gpus: cluster_args.gpus,
        train_tokens: cluster_args.train_tokens,
        model: ModelRef::of(model_source(model_arg), model_arg, &info),
        search: SearchSummary {
            candidates_evaluated: r.candidates_evaluated,
            candidates_pruned: r.candidates_pruned,
            target,
        },
    };
    let (mut plan, r) = lowered_within_the_gpu(&lowering, &req, r)?;
    record_kernel_seconds(&mut plan, &info, &cluster)?;
    Ok(Compiled {
        plan,
        result: r,
        cluster,
        name: m.graph.name.clone(),
    })
}

/// Each stage's predicted seconds per step by instruction kind (`predicted.stages[].kernel_s`),
/// priced as the plan's prediction is, for `plait run --op-times` to show beside what it
/// measures.
fn record_kernel_seconds(
    plan: &mut Plan,
    info: &planner::ModelInfo<'_>,
    cluster: &planner::Cluster,
) -> anyhow::Result<()> {
    let by_kind = planner::estimate::estimate_traced(
        info,
        cluster,
        plan.gpus,
        &plan.strategy,
        plan.tp_pricing(),
    )?;
    for (stage, priced) in plan
        .predicted
        .stages
        .iter_mut()
        .zip(by_kind.predicted.stages)
    {
        stage.kernel_s = priced.kernel_s;
    }
    Ok(())
}

/// Searches again at most this many times, each on a card whose capacity is tightened by the
/// programs that did not fit it.
const TIGHTENED_SEARCHES: usize = 3;

/// The plan whose program fits the GPU, from `r` (searched for `req`): where every plan the
/// search offered has a program over the card (the memory model is within the verifier's
/// tolerance, not exact, and the search packs plans up to the capacity), the search runs again
/// on a card whose capacity is that of the real one shrunk by the worst such program's excess
/// over its plan, so plans that close to the edge drop out; its plans are priced again on the
/// real card and lowered as before. (With tp 8, pp 1 and ZeRO-1 pinned, Qwen1.5-MoE on 8 H100
/// was refused: both the plan and its one runner-up were planned within 0.1 % of 80 GiB and
/// their programs came out 0.1 % over, though 16 sequences a micro-batch fit with 26 GiB to
/// spare.)
fn lowered_within_the_gpu(
    cx: &Lowering<'_, '_>,
    req: &SearchRequest,
    mut r: SearchResult,
) -> anyhow::Result<(Plan, SearchResult)> {
    let mut capacity = cx.cluster.memory_bytes();
    for attempt in 0..=TIGHTENED_SEARCHES {
        r.best = r.best.with_training(cx.cluster, cx.train_tokens);
        let excess = match rerank_as_lowered(cx, &mut r)? {
            Ok(plan) => return Ok((plan, r)),
            Err(excess) => excess,
        };
        if attempt == TIGHTENED_SEARCHES || excess <= 1.0 {
            break;
        }
        // A hair below the shrunk capacity: a plan planned exactly there came out over.
        capacity = capacity / excess * (1.0 - 1e-3);
        let mut tight = cx.cluster.clone();
        tight.gpu.memory_gib = capacity / (1u64 << 30) as f64;
        let Ok(searched) = search(cx.info, &tight, req, &mut |_, _| {})? else {
            break;
        };
        r = on_the_real_card(cx, searched)?;
    }
    let why = r
        .alternatives
        .iter()
        .filter(|a| !a.fits)
        .find_map(|a| a.reason.strip_prefix("its program "))
        .map_or_else(String::new, |r| format!(": the fastest plan's program {r}"));
    anyhow::bail!(
        "no plan whose program fits the GPU{why}; use more GPUs, or pin more recomputation or a higher ZeRO stage"
    )
}

/// A search run on a tightened card, its plan and alternatives priced on the real one.
fn on_the_real_card(cx: &Lowering<'_, '_>, mut r: SearchResult) -> anyhow::Result<SearchResult> {
    let price =
        |s: &planner::Strategy| planner::estimate::estimate(cx.info, cx.cluster, cx.gpus, s);
    r.best = price(&r.best.strategy)?;
    let capacity = cx.cluster.memory_bytes();
    for a in &mut r.alternatives {
        if let Ok(e) = price(&a.strategy) {
            // Its reason is worded again against the plan once the re-ranking chose it.
            *a = Alternative {
                shortfall_bytes: (e.predicted.peak_memory_bytes - capacity).max(0.0),
                ..searched_alternative(&e)
            };
        }
    }
    Ok(r)
}

/// What a plan is lowered and priced with.
struct Lowering<'a, 'i> {
    info: &'a planner::ModelInfo<'i>,
    cluster: &'a planner::Cluster,
    gpus: u64,
    train_tokens: Option<f64>,
    model: ModelRef,
    search: SearchSummary,
}

impl Lowering<'_, '_> {
    /// The plan of `searched` with its extractions recorded ([`record_extractions`] says in
    /// `sharding.method` which layout its program runs: the extraction codegen lowered, its
    /// memory checked on the program, or Megatron-LM's rules), priced for that layout.
    fn plan(&self, searched: &Estimate) -> anyhow::Result<(Plan, Estimate)> {
        let mut plan = Plan::new(
            self.model.clone(),
            self.info,
            self.cluster,
            self.gpus,
            searched,
            self.search.clone(),
            Vec::new(),
        );
        record_extractions(&mut plan, self.info, self.cluster, &searched.strategy);
        let pricing = plan.tp_pricing();
        let priced = if pricing == planner::Pricing::SEARCH {
            searched.clone()
        } else {
            planner::estimate::estimate_priced(
                self.info,
                self.cluster,
                self.gpus,
                &searched.strategy,
                pricing,
            )?
            .with_training(self.cluster, self.train_tokens)
        };
        plan.predicted = priced.predicted.clone();
        Ok((plan, priced))
    }
}

impl Lowering<'_, '_> {
    /// Where a plan's program would not fit the GPU, its template's peak and stage. The
    /// verifier holds a program within [`crate::codegen::MEMORY_TOLERANCE`] of the plan, so
    /// only a plan that close to the card's capacity is lowered to see (a program that does
    /// not lower is left to `plait codegen` to report).
    fn program_over_the_gpu(&self, plan: &Plan) -> Option<(f64, u32)> {
        let capacity = self.cluster.memory_bytes();
        let tolerance = crate::codegen::MEMORY_TOLERANCE;
        if plan.predicted.peak_memory_bytes <= capacity / (1.0 + tolerance) {
            return None;
        }
        let check = |set: &codegen::ProgramSet| {
            codegen::verify::verify_with(
                set,
                codegen::verify::Options {
                    memory_tolerance: Some(tolerance),
                },
            )
        };
        let (_, report, _) = codegen::lower_checked(
            &memory_proxy(plan),
            self.info.graph,
            codegen::Options::default(),
            check,
        )
        .ok()?;
        report
            .memory
            .iter()
            .map(|m| (m.program_peak_bytes as f64, m.stage))
            .filter(|&(peak, _)| peak > capacity)
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }
}

/// `plan` with no more micro-batches per iteration than its peak memory needs, for compile's
/// memory checks: a 1F1B pipeline, interleaved or not, holds at most pp·(v + 1) − 1
/// micro-batches in flight on its first stage, so a program of 2·pp·v of them peaks as the
/// whole iteration's does; GPipe holds every micro-batch and keeps them all. (A global batch of
/// 8192 sequences on 8 GPUs made a program of 1024 micro-batches a rank, 5 GB, to check it.)
fn memory_proxy(plan: &Plan) -> std::borrow::Cow<'_, Plan> {
    let s = &plan.strategy;
    let enough = 2 * u64::from(s.pp) * u64::from(s.virtual_stages.max(1));
    if s.schedule == planner::Schedule::Gpipe || s.micro_batches() <= enough {
        return std::borrow::Cow::Borrowed(plan);
    }
    let mut proxy = plan.clone();
    proxy.strategy.global_batch = u64::from(s.dp) * s.micro_batch * enough;
    std::borrow::Cow::Owned(proxy)
}

/// An alternative priced as searched (one whose lowering failed).
fn searched_alternative(e: &Estimate) -> Alternative {
    Alternative {
        strategy: e.strategy.clone(),
        iteration_time_s: e.predicted.iteration_time_s,
        fits: e.predicted.fits,
        peak_memory_bytes: e.predicted.peak_memory_bytes,
        shortfall_bytes: 0.0,
        shortfall_stage: 0,
        reason: String::new(),
    }
}

/// A strategy's entry among the alternatives once lowered: its time as its program runs, or
/// why its program does not fit.
fn as_alternative(cx: &Lowering<'_, '_>, e: &Estimate, over: Option<(f64, u32)>) -> Alternative {
    let capacity = cx.cluster.memory_bytes();
    let gib = (1u64 << 30) as f64;
    let (peak, stage) = over.unwrap_or((e.predicted.peak_memory_bytes, 0));
    Alternative {
        strategy: e.strategy.clone(),
        iteration_time_s: e.predicted.iteration_time_s,
        fits: over.is_none(),
        peak_memory_bytes: peak,
        shortfall_bytes: (peak - capacity).max(0.0),
        shortfall_stage: stage,
        reason: over.map_or_else(String::new, |(peak, _)| {
            format!(
                "its program peaks at {:.2} GiB, over the {:.2} GiB of a {} (planned {:.2} GiB)",
                peak / gib,
                capacity / gib,
                cx.cluster.gpu.name,
                e.predicted.peak_memory_bytes / gib
            )
        }),
    }
}

/// Whether pricing a plan as lowered failed because its layer runs only in the sharding
/// extraction's layout, which did not lower ([`planner::PlanError::NeedsExtraction`]).
fn needs_extraction(err: &anyhow::Error) -> bool {
    matches!(
        err.downcast_ref::<planner::PlanError>(),
        Some(planner::PlanError::NeedsExtraction { .. })
    )
}

/// The search ranks strategies by their extractions' prices, where an extraction splits the
/// work as the memory model does; a winner's program may run another layout (Megatron-LM's,
/// where the extraction does not lower or its memory breaks the plan's) and cost more than it
/// was ranked at, or, planned within the verifier's tolerance of the card, not fit it. So the
/// winner is lowered and priced for its program, and while a fitting alternative was searched
/// faster than the plan as its program runs, that alternative is lowered and priced the same
/// way; the fastest whose program fits is the plan. Every alternative is then worded against
/// it, those priced as lowered said to be.
///
/// `Err` where no program fits the card: the largest ratio of a program's peak to its plan's
/// among those lowered over it.
fn rerank_as_lowered(
    cx: &Lowering<'_, '_>,
    r: &mut SearchResult,
) -> anyhow::Result<Result<Plan, f64>> {
    // Strategies priced as their programs run, and those tried (lowered, or whose estimate
    // failed and keep their searched price).
    let mut lowered = Vec::new();
    let mut tried = Vec::new();
    let mut winner: Option<(Plan, Estimate)> = None;
    let mut excess: f64 = 1.0;
    let mut next = Some(r.best.clone());
    while let Some(searched) = next.take() {
        let first = tried.is_empty();
        tried.push(searched.strategy.clone());
        match cx.plan(&searched) {
            Ok((p, e)) => {
                lowered.push(searched.strategy.clone());
                let over = cx.program_over_the_gpu(&p);
                if let Some((peak, stage)) = over {
                    let planned = e
                        .predicted
                        .stages
                        .get(stage as usize)
                        .map_or(e.predicted.peak_memory_bytes, |s| s.peak_memory_bytes);
                    excess = excess.max(peak / planned);
                }
                let faster = winner.as_ref().is_none_or(|(_, w)| {
                    e.predicted.iteration_time_s < w.predicted.iteration_time_s
                });
                if over.is_none() && faster {
                    if let Some((_, old)) = winner.replace((p, e)) {
                        r.alternatives.push(as_alternative(cx, &old, None));
                    }
                } else {
                    r.alternatives.push(as_alternative(cx, &e, over));
                }
            }
            // A layer only the extraction runs (OLMo 2's q/k norms at tp > 1) whose
            // extraction did not lower has no program: the next plan is tried.
            Err(err) if needs_extraction(&err) => r.alternatives.push(Alternative {
                fits: false,
                reason: format!("its program does not lower: {err}"),
                ..searched_alternative(&searched)
            }),
            // The search's winner must price as lowered; an alternative that does not keeps
            // its searched price.
            Err(err) if first => return Err(err),
            Err(_) => r.alternatives.push(searched_alternative(&searched)),
        }
        let t0 = winner
            .as_ref()
            .map_or(f64::INFINITY, |(_, w)| w.predicted.iteration_time_s);
        let Some(i) = r
            .alternatives
            .iter()
            .enumerate()
            .filter(|(_, a)| a.fits && a.iteration_time_s < t0 && !tried.contains(&a.strategy))
            .min_by(|x, y| x.1.iteration_time_s.total_cmp(&y.1.iteration_time_s))
            .map(|(i, _)| i)
        else {
            break;
        };
        let a = r.alternatives.remove(i);
        match planner::estimate::estimate(cx.info, cx.cluster, cx.gpus, &a.strategy) {
            Ok(e) => next = Some(e.with_training(cx.cluster, cx.train_tokens)),
            Err(_) => {
                // Kept as searched; never tried again.
                tried.push(a.strategy.clone());
                r.alternatives.push(a);
            }
        }
    }
    let Some((mut plan, best)) = winner else {
        return Ok(Err(excess));
    };
    let t0 = best.predicted.iteration_time_s;
    let mesh = |s: &planner::Strategy| (s.tp, s.pp, s.dp);
    let same_mesh = |a: &Alternative| mesh(&a.strategy) == mesh(&best.strategy);
    // The runner-up of the winner's mesh first (what the other knobs are worth), then by
    // time; plans that do not fit last.
    r.alternatives.sort_by(|a, b| {
        (!a.fits, !same_mesh(a))
            .cmp(&(!b.fits, !same_mesh(b)))
            .then(a.iteration_time_s.total_cmp(&b.iteration_time_s))
    });
    for a in &mut r.alternatives {
        let note = lowered
            .contains(&a.strategy)
            .then_some("as its program runs");
        a.reason = planner::search::reworded(a, &best.strategy, t0, note);
    }
    plan.alternatives = r.alternatives.clone();
    r.best = best;
    Ok(Ok(plan))
}

/// What `--search-dp-comm` planned: each exchange's predicted iteration, or why it did not
/// plan.
type ExchangeTrials = Vec<(String, Result<f64, String>)>;

/// The synchronous plan and one per accepted exchange (each at ZeRO-0); the fastest that
/// fits, and what each predicted.
fn compile_over_exchanges(args: &CompileArgs) -> anyhow::Result<(Compiled, ExchangeTrials)> {
    let p = &args.pins;
    if p.grad_compression.is_some() || p.dp_sync.is_some() {
        anyhow::bail!(
            "--search-dp-comm chooses the data-parallel exchange itself: drop --grad-compression and --dp-sync, or drop --search-dp-comm"
        );
    }
    if let Some(z) = p.zero.filter(|&z| z > 0) {
        anyhow::bail!(
            "--search-dp-comm plans its exchanges at ZeRO-0 (a compressed exchange is an all-reduce; local SGD keeps each replica's whole optimizer state), not with --zero {z}: drop --zero or pass --zero 0"
        );
    }
    let mut tried = ExchangeTrials::new();
    let mut best: Option<Compiled> = None;
    let mut first_error = None;
    let plain = planner::dp_comm::DpComm::default();
    let named = args
        .search_dp_comm
        .iter()
        .copied()
        .filter(|m| !m.is_plain());
    for mode in std::iter::once(plain).chain(named) {
        let mut pins = p.clone();
        if !mode.is_plain() {
            pins.grad_compression = Some(mode.grad_compression);
            pins.dp_sync = Some(mode.dp_sync);
            pins.zero = Some(0);
        }
        match compile(&args.model, &args.cluster, &pins, args.top, args.target) {
            Ok(c) => {
                let t = c.result.best.predicted.iteration_time_s;
                tried.push((mode.name(), Ok(t)));
                let faster = best
                    .as_ref()
                    .is_none_or(|b| t < b.result.best.predicted.iteration_time_s);
                if faster {
                    best = Some(c);
                }
            }
            Err(e) => {
                tried.push((mode.name(), Err(format!("{e:#}"))));
                first_error.get_or_insert(e);
            }
        }
    }
    match (best, first_error) {
        (Some(b), _) => Ok((b, tried)),
        (None, Some(e)) => Err(e),
        (None, None) => anyhow::bail!("no exchange was planned"),
    }
}

/// The `dp exchange` lines of a `--search-dp-comm` compile.
fn print_exchange_trials(tried: &ExchangeTrials, chosen: &str) {
    println!("dp exchange searched (--search-dp-comm), predicted iteration:");
    for (name, r) in tried {
        match r {
            Ok(t) => println!("  {name:<22} {t:.4} s"),
            Err(e) => println!("  {name:<22} not planned: {e}"),
        }
    }
    println!(
        "  chose {chosen}: the fastest; what it does to convergence is the trade you accepted by naming it"
    );
}

pub fn run(args: &CompileArgs) -> anyhow::Result<()> {
    if let Some(out) = &args.output {
        crate::outputs::not_an_input(out, &[("model", std::path::Path::new(&args.model))])?;
    }
    let (compiled, tried) = if args.search_dp_comm.is_empty() {
        let c = compile(
            &args.model,
            &args.cluster,
            &args.pins,
            args.top,
            args.target,
        )?;
        (c, ExchangeTrials::new())
    } else {
        compile_over_exchanges(args)?
    };
    let chosen = compiled.result.best.strategy.dp_comm.name();
    let Compiled {
        plan,
        result: r,
        cluster,
        name,
    } = compiled;
    if let Some(path) = &args.output {
        std::fs::write(path, plan.to_json() + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        let mut v = serde_json::to_value(&r.best)?;
        v["search"] = serde_json::json!({
            "time_s": r.time_s,
            "candidates_evaluated": r.candidates_evaluated,
            "candidates_pruned": r.candidates_pruned,
            "candidates_bounded": r.candidates_bounded,
        });
        v["alternatives"] = serde_json::to_value(&r.alternatives)?;
        if !tried.is_empty() {
            v["dp_exchange_search"] = tried
                .iter()
                .map(|(mode, r)| match r {
                    Ok(t) => serde_json::json!({"mode": mode, "iteration_time_s": t}),
                    Err(e) => serde_json::json!({"mode": mode, "error": e}),
                })
                .collect();
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_text(&name, &cluster, &r.best);
    println!();
    if !tried.is_empty() {
        print_exchange_trials(&tried, &chosen);
    }
    println!(
        "search      {} candidates evaluated, {} pruned by the memory bound, {} by the time bound, {:.2} s{}",
        r.candidates_evaluated,
        r.candidates_pruned,
        r.candidates_bounded,
        r.time_s,
        plan.search
            .target
            .map_or(String::new(), |t| format!(", within what {t} runs"))
    );
    if !r.alternatives.is_empty() {
        println!("alternatives");
        for a in &r.alternatives {
            let s = &a.strategy;
            println!(
                "  tp {} pp {} dp {}{} mb {} {}{} ZeRO-{} recompute {}{}: {}{}",
                s.tp,
                s.pp,
                s.dp,
                cp_ep(s),
                s.micro_batch,
                s.schedule,
                if s.virtual_stages > 1 {
                    format!(" v={}", s.virtual_stages)
                } else {
                    String::new()
                },
                s.zero,
                s.recompute,
                if s.sequence_parallel { " SP" } else { "" },
                a.reason,
                alternative_days(&r.best, a)
            );
        }
    }
    if let Some(path) = &args.output {
        println!(
            "\nplan written to {} (see it with `plait report {}`)",
            path.display(),
            path.display()
        );
    }
    if let Some(why) = engine_cannot_run(&plan) {
        eprintln!("{why}");
    }
    Ok(())
}

/// A note where the plan's engine cannot run it as planned (a search over plait's whole
/// space, without `--target`): `plait export` would refuse it, and `--target` plans one the
/// engine runs.
fn engine_cannot_run(plan: &Plan) -> Option<String> {
    if plan.search.target.is_some() {
        return None;
    }
    let engine = plan.strategy.engine;
    let why = planner::export::export(plan, engine).err()?;
    // A model the engine cannot build at all: no --target plan of it would run either.
    let buildable = plan
        .model
        .ir
        .as_deref()
        .and_then(|text| ir::text::parse(text).ok())
        .is_some_and(|g| {
            planner::ModelInfo::new(&g).is_ok_and(|info| {
                planner::export::check_model(&info, engine, plan.strategy.seq).is_ok()
            })
        });
    Some(if buildable {
        format!(
            "note: {why}; this plan runs on plait's own runtime (`plait run`), and \
             `plait compile --target {engine}` plans the fastest one {engine} runs"
        )
    } else {
        format!("note: {why}; this plan runs on plait's own runtime (`plait run`)")
    })
}

/// ", N days" for an alternative that fits, when the plan carries a training run.
fn alternative_days(best: &planner::Estimate, a: &planner::search::Alternative) -> String {
    match &best.predicted.training {
        Some(t) if a.fits && a.iteration_time_s > 0.0 => {
            let days = t.days * a.iteration_time_s / best.predicted.iteration_time_s;
            format!(" ({days:.1} days vs {:.1})", t.days)
        }
        _ => String::new(),
    }
}

/// Why the programs of `plan` would not run its recorded extraction (`None`: they do): the
/// layer does not lower as extracted, or, where that layout is not the rules' own, its
/// programs break the planner's memory and codegen lowers the rules' instead.
fn extracted_program_fits(
    plan: &Plan,
    graph: &ir::Graph,
) -> Result<Option<String>, codegen::CodegenError> {
    if let Some(why) = codegen::lower::extraction_mismatch(plan, graph)? {
        return Ok(Some(why));
    }
    if codegen::lower::rules_match_extraction(plan, graph) {
        return Ok(None);
    }
    let check = |set: &codegen::ProgramSet| {
        codegen::verify::verify_with(
            set,
            codegen::verify::Options {
                memory_tolerance: Some(crate::codegen::MEMORY_TOLERANCE),
            },
        )
    };
    let (_, report, note) = codegen::lower_checked(
        &memory_proxy(plan),
        graph,
        codegen::Options::default(),
        check,
    )?;
    // Where only the extraction lowers the layer, `lower_checked` keeps its programs over the
    // planner's memory: that plan's program would be refused by `plait codegen`.
    let over = report
        .violations
        .iter()
        .find(|v| v.check == codegen::verify::Check::Memory);
    Ok(note.or_else(|| {
        over.map(|v| {
            format!(
                "its program breaks the planner's memory ({}), and the segment rules do not lower the layer",
                v.message
            )
        })
    }))
}

/// Records the extraction of the embedding and the head (`plan.embedding_head_plan`) and, in
/// `sharding.embedding_head`, whether the program runs it: codegen lowers them by its rules
/// (vocabulary-parallel where the vocabulary splits, whole otherwise), which must be the
/// extraction's layout op for op ([`codegen::lower::embedding_head_mismatch`]).
fn record_embedding_head(
    plan: &mut Plan,
    info: &planner::ModelInfo<'_>,
    cluster: &planner::Cluster,
    s: &planner::Strategy,
) {
    let rules = |why: String| format!("{} ({why})", planner::plan::RULES_METHOD);
    plan.sharding.embedding_head = Some(
        match planner::sharding_costs::embedding_head_plan(info, cluster, s) {
            Ok(bp) => {
                let solver = format!("e-graph + {}", bp.solve.solver);
                plan.embedding_head_plan = Some(bp);
                match codegen::lower::embedding_head_mismatch(plan, info.graph) {
                    Ok(None) => solver,
                    Ok(Some(why)) => rules(format!(
                        "the e-graph's layout of the embedding and head is not the one lowered: {why}"
                    )),
                    Err(e) => rules(format!("the embedding or head does not lower: {e}")),
                }
            }
            Err(e) => rules(format!("e-graph extraction failed: {e}")),
        },
    );
}

/// Runs the e-graph extractions the winning strategy needs and records them in the plan: the
/// tensor-parallel block (at tp 1 too, where it is the whole block), whose every op must run in the layout codegen lowers
/// ([`codegen::lower::extraction_mismatch`]), and the expert-parallel group's (ep > 1), whose
/// expert layout must be the all-gather dispatcher codegen lowers. `sharding.method` names the
/// e-graph only when every extraction succeeded and is the program's layout; otherwise it
/// says Megatron's rules (the segment lowering's) and why, and the extraction stays recorded.
fn record_extractions(
    plan: &mut Plan,
    info: &planner::ModelInfo<'_>,
    cluster: &planner::Cluster,
    s: &planner::Strategy,
) {
    use planner::sharding_costs::{expert_block_plan, expert_layout_is_lowered};
    let mut methods = Vec::new();
    let mut fallback = None;
    // At tp 1 the tensor-parallel extraction is the whole block on every rank; it is still
    // recorded and checked against the program, except under expert parallelism, whose
    // group's extraction below lays the block out.
    if s.tp > 1 || s.ep <= 1 {
        match block_plans(info, cluster, s) {
            Ok((bp, later)) => {
                let solver = bp.solve.solver.clone();
                plan.block_plan = Some(bp);
                plan.run_block_plans = later;
                match extracted_program_fits(plan, info.graph) {
                    Ok(None) => methods.push(solver),
                    Ok(Some(why)) => {
                        fallback = Some(format!(
                            "the e-graph's tensor-parallel layout is not the one lowered: {why}"
                        ))
                    }
                    Err(e) => fallback = Some(format!("the layer does not lower: {e}")),
                }
            }
            Err(e) => fallback = Some(format!("e-graph extraction failed: {e}")),
        }
    }
    if s.ep > 1 {
        match expert_block_plan(info, cluster, s) {
            Ok(bp) => {
                match expert_layout_is_lowered(&bp) {
                    Ok(()) => methods.push(bp.solve.solver.clone()),
                    Err(why) => {
                        fallback = Some(format!(
                            "the e-graph's expert layout is not the one lowered: {why}"
                        ))
                    }
                }
                plan.expert_block_plan = Some(bp);
            }
            Err(e) => fallback = Some(format!("expert e-graph extraction failed: {e}")),
        }
    }
    methods.dedup();
    if s.tp > 1 {
        record_embedding_head(plan, info, cluster, s);
    }
    plan.sharding.method = match (fallback, methods.first()) {
        (Some(why), _) => format!("megatron-rules ({why})"),
        (None, Some(solver)) => {
            // The program runs the extraction: the per-op table is its layout, not the rule's.
            if let Some(bp) = &plan.block_plan {
                plan.sharding.ops = planner::plan::extracted_ops(info.graph, bp);
            }
            format!("e-graph + {solver}{}", runs_note(info))
        }
        (None, None) => plan.sharding.method.clone(),
    };
}

/// The tensor-parallel extraction of each run of identical layers: the first run's, then the
/// later runs' where the block changes structure. The error names the run that failed.
fn block_plans(
    info: &planner::ModelInfo<'_>,
    cluster: &planner::Cluster,
    s: &planner::Strategy,
) -> Result<
    (
        planner::sharding::BlockPlan,
        Vec<planner::sharding::BlockPlan>,
    ),
    String,
> {
    let runs = info.runs();
    let mut plans = Vec::with_capacity(runs.len());
    for run in &runs {
        let bp = planner::sharding_costs::block_plan(run.info, cluster, s).map_err(|e| {
            if runs.len() > 1 {
                format!("layers {}-{}: {e}", run.first, run.first + run.count - 1)
            } else {
                e.to_string()
            }
        })?;
        plans.push(bp);
    }
    let first = plans.remove(0);
    Ok((first, plans))
}

/// Where the block changes structure, that each run of identical layers has its own
/// extraction.
fn runs_note(info: &planner::ModelInfo<'_>) -> String {
    let runs = info.runs();
    if runs.len() < 2 {
        return String::new();
    }
    let spans: Vec<String> = runs
        .iter()
        .map(|r| format!("{}-{}", r.first, r.first + r.count - 1))
        .collect();
    format!(
        " (one extraction per run of identical layers: {})",
        spans.join(", ")
    )
}

/// A strategy's context- and expert-parallel degrees beside tp, pp and dp in one line (" cp 2",
/// " ep 8"; nothing at 1), so that two alternatives differing only there read differently.
fn cp_ep(s: &planner::Strategy) -> String {
    let mut out = String::new();
    if s.cp > 1 {
        out += &format!(" cp {}", s.cp);
    }
    if s.ep > 1 {
        out += &format!(" ep {}", s.ep);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use planner::engine::Engine;
    use planner::plan::{ModelRef, Plan, SearchSummary};
    use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule, Strategy};

    /// Each stage's program peak, lowered and verified.
    fn peaks(plan: &Plan, graph: &ir::Graph) -> Vec<u64> {
        let check = |set: &codegen::ProgramSet| {
            codegen::verify::verify_with(set, codegen::verify::Options::default())
        };
        let (_, report, _) =
            codegen::lower_checked(plan, graph, codegen::Options::default(), check).unwrap();
        report.memory.iter().map(|m| m.program_peak_bytes).collect()
    }

    /// The memory proxy's program peaks as the whole iteration's does, stage by stage, for a
    /// pipeline of 1F1B and of interleaved 1F1B with many micro-batches; it is smaller.
    #[test]
    fn the_memory_proxy_peaks_as_the_whole_iteration() {
        let spec = import::zoo::find("gpt2").unwrap();
        let graph = import::build_forward(&spec, ir::DType::F32).unwrap();
        let info = ModelInfo::new(&graph).unwrap();
        let cluster = Cluster::load("dgx-h100").unwrap();
        for (schedule, v) in [(Schedule::OneFOneB, 1), (Schedule::Interleaved, 2)] {
            let s = Strategy {
                tp: 1,
                pp: 2,
                dp: 1,
                micro_batch: 1,
                global_batch: 40,
                seq: 256,
                zero: 0,
                recompute: Recompute::None,
                schedule,
                virtual_stages: v,
                sequence_parallel: false,
                precision: Precision::Bf16,
                attention: Default::default(),
                kernels: Default::default(),
                stage_layers: None,
                cp: 1,
                ep: 1,
                engine: Engine::Megatron,
                overlap: Engine::Megatron.overlap(0),
                dp_comm: Default::default(),
            };
            let est = planner::estimate(&info, &cluster, 2, &s).unwrap();
            let summary = SearchSummary {
                candidates_evaluated: 1,
                candidates_pruned: 0,
                target: None,
            };
            let mut plan = Plan::new(
                ModelRef::of("zoo", "gpt2", &info),
                &info,
                &cluster,
                2,
                &est,
                summary,
                vec![],
            );
            plan.model.ir = Some(ir::text::print(&graph));
            let proxy = super::memory_proxy(&plan);
            assert!(
                proxy.strategy.micro_batches() < s.micro_batches(),
                "{schedule:?}"
            );
            let whole = peaks(&plan, &graph);
            assert_eq!(whole.len(), 2, "a peak for each stage");
            assert_eq!(peaks(&proxy, &graph), whole, "{schedule:?} v {v}");
        }
    }
}
