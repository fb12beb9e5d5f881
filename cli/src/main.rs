//! `plait`: a thin command line over plait's libraries.

mod bench;
mod bench_codegen;
mod bench_kernels;
mod bench_memory;
mod clusters;
mod codegen;
mod compile;
mod device;
mod estimate;
mod export;
mod inspect;
mod model;
mod models;
mod outputs;
mod plan_file;
mod profile;
mod profile_gpu;
mod report;
mod run;
mod step_time;
mod strategy_args;
mod tokenize;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for bad input (a missing file, an invalid config, an impossible request).
const EXIT_BAD_INPUT: u8 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "plait",
    version,
    about = "Plan, compile and run parallel training of large models",
    long_about = "plait imports a model (a Hugging Face config.json or a Hub id in the local Hugging \
Face cache, an ONNX file, or a built-in zoo name), lowers it to a typed tensor-graph IR with autodiff, searches the fastest way to train it on \
a cluster that fits in memory (`compile`), explains the plan (`report`), generates and verifies one \
program per rank (`codegen`), trains it on CPU ranks (`run`) or writes it as the launch of \
Megatron-LM, torchtitan or DeepSpeed (`export`).\n\nStart with `plait models`, `plait inspect \
gpt2` and `plait compile llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 128`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Describe a model: parameters, shape, repeated block, training FLOPs per token, op histogram.
    Inspect(inspect::InspectArgs),
    /// List the built-in model zoo.
    Models(models::ModelsArgs),
    /// List the built-in cluster presets.
    Clusters(clusters::ClustersArgs),
    /// Search the fastest training plan that fits, explain it, and write plan.json.
    Compile(compile::CompileArgs),
    /// Predict iteration time and per-GPU memory of one parallelization strategy.
    Estimate(estimate::EstimateArgs),
    /// Explain a plan.json: degrees and why, stages, communication, alternatives; trace and HTML.
    Report(report::ReportArgs),
    /// Generate and verify one program per rank from a plan.json.
    Codegen(codegen::CodegenArgs),
    /// Write a plan as the launch of an engine you already run (Megatron-LM, torchtitan, DeepSpeed).
    Export(export::ExportArgs),
    /// Print one rank's program listing.
    Show(codegen::ShowArgs),
    /// Run the static verifier over a program directory.
    Verify(codegen::VerifyArgs),
    /// Benchmarks: the cost model against published runs, and the estimator's speed.
    Bench(bench::BenchArgs),
    /// Train: run every rank's program (threads, or one process per rank under torchrun or mpirun).
    Run(run::RunArgs),
    /// Measure this machine (matmul, memory, threads communicator) and write a cluster file.
    Profile(profile::ProfileArgs),
    /// Tokenize a text with a model's tokenizer.json into a `.bin` of token ids for `run --data`.
    Tokenize(tokenize::TokenizeArgs),
}

/// A reader that stops early (`plait compile … | head`) closes stdout, and what is left to
/// print has nowhere to go: not an error (`println!` would panic on it), so plait ends quietly,
/// as `head`'s other writers do.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.contains("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Models(args) => models::run(&args),
        Command::Clusters(args) => clusters::run(&args),
        Command::Compile(args) => compile::run(&args),
        Command::Estimate(args) => estimate::run(&args),
        Command::Report(args) => report::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Tokenize(args) => tokenize::run(&args),
        Command::Codegen(args) => codegen::run_codegen(&args),
        Command::Export(args) => export::run(&args),
        Command::Show(args) => codegen::run_show(&args),
        Command::Verify(args) => codegen::run_verify(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

/// The error and its causes on one line, each cause once: library errors often already quote
/// their source in their own message.
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg.replace('\n', " ")
}
