//! The `eqfuse` command line: argument parsing, then a call into the library.
//!
//! Invariant: exit status 0 on success, 1 on bad input (`error: FILE:LINE:COL: what`), 2 on
//! usage errors (clap's own), 3 when a GPU command finds no usable GPU.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use eqfuse::{DeviceProfile, Error, Format, OptimizeOptions, Program};

#[derive(Parser)]
#[command(name = "eqfuse", version, about = "E-graph superoptimizer for kernel fusion of tensor programs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan a program and show the plan and what it saves.
    Optimize {
        #[command(flatten)]
        plan: PlanArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = FormatArg::Table)]
        format: FormatArg,
    },
    /// Show rewrites that fired, composite operators recognised and fusions rejected, with why.
    Explain {
        #[command(flatten)]
        plan: PlanArgs,
    },
    /// Print the program as a JSON graph (`eqfuse.graph/1`), sizes applied: for other tools
    /// (the PyTorch baselines in benches/ read it).
    Export {
        /// A `.eqf` program, a `.json` graph, an `.onnx` model, or `-` for standard input.
        prog: String,
        /// Override a declared size (an ONNX symbolic dim too): `--dim N=4096` (repeatable).
        #[arg(long = "dim", value_name = "NAME=VALUE")]
        dims: Vec<String>,
    },
    /// Write one self-contained `.cu` per kernel, `plan.json` and a launch manifest.
    Codegen {
        #[command(flatten)]
        plan: PlanArgs,
        /// Folder to write into.
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Unfused against fused on the GPU, measured and predicted, for each program (default: the
    /// examples that run on the GPU), with the rank correlation of predicted and measured time.
    Bench {
        /// Programs (`.eqf`, `.json`, `.onnx`); none means every example that runs on the GPU.
        progs: Vec<String>,
        /// Override a declared size in every program: `--dim N=4096` (repeatable).
        #[arg(long = "dim", value_name = "NAME=VALUE")]
        dims: Vec<String>,
        /// Device profile the plans are made for.
        #[arg(long, default_value = "h100")]
        device: String,
        /// Timed repetitions per plan.
        #[arg(long, default_value_t = 30)]
        repeat: usize,
        /// Also write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Strict numerics for both plans (see `optimize --strict`).
        #[arg(long)]
        strict: bool,
    },
    /// Measure copy bandwidth, launch overhead, template efficiencies and the compute rates
    /// (gemm implementations and tiles, attention paths and backward) on this GPU.
    Calibrate {
        /// Write the profile JSON here (default: print it).
        #[arg(short = 'o', long = "out")]
        out: Option<PathBuf>,
    },
    /// Run a program on the GPU (or on the CPU reference with --cpu), checking every output
    /// against the CPU reference and timing each kernel against its prediction.
    Run {
        #[command(flatten)]
        plan: PlanArgs,
        /// Evaluate with the CPU reference interpreter instead of the GPU.
        #[arg(long)]
        cpu: bool,
        /// Folder with NAME.npy for each input (missing inputs are generated and saved).
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// Folder for NAME.npy of each output.
        #[arg(long, default_value = "eqfuse-out")]
        outputs: PathBuf,
        /// Seed of the input generator.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Timed repetitions on the GPU.
        #[arg(long, default_value_t = 20)]
        repeat: usize,
        /// Also capture the plan's launches once as a CUDA graph and time its replays.
        #[arg(long)]
        graph: bool,
    },
}

#[derive(Args)]
struct PlanArgs {
    /// A `.eqf` program, a `.json` graph, an `.onnx` model, or `-` for standard input.
    prog: String,
    /// Override a declared size (an ONNX symbolic dim too): `--dim N=4096` (repeatable).
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Device profile: `h100`, `h200`, or a profile JSON file.
    #[arg(long, default_value = "h100")]
    device: String,
    /// Extractor: the greedy DAG extractor, or an exact lower bound by integer programming.
    #[arg(long, value_enum, default_value_t = ExtractorArg::Greedy)]
    extractor: ExtractorArg,
    /// Most e-nodes the saturation may grow to.
    #[arg(long, default_value_t = 20_000)]
    node_limit: usize,
    /// Seconds the saturation may take.
    #[arg(long, default_value_t = 2.0)]
    time_limit: f64,
    /// Plan every computed tensor as its own kernel.
    #[arg(long)]
    no_fusion: bool,
    /// Folder of `*.rules` files to use instead of the built-in rules.
    #[arg(long)]
    rules: Option<String>,
    /// Strict numerics: no inexact rule (reassociation, approximations), and kernels that keep
    /// the unfused plan's floating-point operations and roundings (bit-identical results).
    #[arg(long)]
    strict: bool,
    /// Most bytes of live device tensors the plan may need at once (`1073741824`, `512MiB`,
    /// `1.5GB`): saved tensors are recomputed instead where the budget demands it; exits 1 when
    /// no plan fits.
    #[arg(long, value_name = "BYTES")]
    memory_budget: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    Table,
    Json,
    Text,
    Dot,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExtractorArg {
    Greedy,
    Ilp,
}

impl PlanArgs {
    fn load(&self) -> Result<Program, Error> {
        let overrides = self
            .dims
            .iter()
            .map(|d| eqfuse::parse_dim_override(d).map_err(Error::Invalid))
            .collect::<Result<Vec<_>, _>>()?;
        eqfuse::load_program(&self.prog, &overrides)
    }

    fn options(&self) -> Result<OptimizeOptions, Error> {
        let mut o = OptimizeOptions::new(DeviceProfile::load(&self.device)?);
        o.fusion = !self.no_fusion;
        o.rules_dir = self.rules.clone();
        o.node_limit = self.node_limit;
        o.strict = self.strict;
        if !(self.time_limit.is_finite() && self.time_limit > 0.0) {
            return Err(Error::Invalid(format!(
                "--time-limit must be a positive number of seconds, got {}",
                self.time_limit
            )));
        }
        o.time_limit = Duration::from_secs_f64(self.time_limit);
        if let Some(b) = &self.memory_budget {
            o.memory_budget =
                Some(eqfuse::parse_bytes(b).map_err(|e| Error::Invalid(format!("--memory-budget: {e}")))?);
        }
        o.extractor = match self.extractor {
            ExtractorArg::Greedy => "greedy",
            ExtractorArg::Ilp => "ilp",
        }
        .into();
        Ok(o)
    }

    fn optimize(&self) -> Result<(Program, eqfuse::Optimized), Error> {
        let program = self.load()?;
        let opts = self.options()?;
        let spinner = spinner(&format!("planning {}", self.prog));
        let result = eqfuse::optimize(&program, &opts);
        spinner.finish_and_clear();
        Ok((program, result?))
    }
}

/// A spinner on a terminal; nothing when stderr is piped.
fn spinner(msg: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Optimize { plan, format } => {
            let (_, opt) = plan.optimize()?;
            let format = match format {
                FormatArg::Table => Format::Table,
                FormatArg::Json => Format::Json,
                FormatArg::Text => Format::Text,
                FormatArg::Dot => Format::Dot,
            };
            print!("{}", eqfuse::render(&opt.plan, format));
            Ok(())
        }
        Command::Explain { plan } => {
            let program = plan.load()?;
            let opts = OptimizeOptions { explanations: true, ..plan.options()? };
            let opt = eqfuse::optimize(&program, &opts)?;
            print!("{}", eqfuse::explain(&opt));
            Ok(())
        }
        Command::Export { prog, dims } => {
            let args = PlanArgs {
                prog,
                dims,
                device: "h100".into(),
                extractor: ExtractorArg::Greedy,
                node_limit: 0,
                time_limit: 1.0,
                no_fusion: false,
                rules: None,
                strict: false,
                memory_budget: None,
            };
            let program = args.load()?;
            let text = serde_json::to_string_pretty(&eqfuse::program_to_json(&program)).expect("JSON values serialize");
            println!("{text}");
            Ok(())
        }
        Command::Codegen { plan, out } => {
            let (_, opt) = plan.optimize()?;
            let sources = eqfuse::write_codegen_dir(&opt.plan, &out)?;
            println!("wrote {} kernels, plan.json and launch.json to {}", sources.len(), out.display());
            Ok(())
        }
        Command::Bench { progs, dims, device, repeat, json, strict } => {
            let overrides = dims
                .iter()
                .map(|d| eqfuse::parse_dim_override(d).map_err(Error::Invalid))
                .collect::<Result<Vec<_>, _>>()?;
            let files = if progs.is_empty() { default_bench_programs() } else { progs };
            let programs = files.iter().map(|f| eqfuse::load_program(f, &overrides)).collect::<Result<Vec<_>, _>>()?;
            let mut opts = OptimizeOptions::new(DeviceProfile::load(&device)?);
            opts.strict = strict;
            let report = eqfuse::bench_programs(&programs, &opts, repeat)?;
            print!("{report}");
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&report.to_json()).expect("JSON values serialize") + "\n";
                std::fs::write(&path, text).map_err(|e| Error::io(path.display().to_string(), e))?;
            }
            Ok(())
        }
        Command::Calibrate { out } => {
            let cal = eqfuse::calibrate()?;
            let text = serde_json::to_string_pretty(&cal.profile).expect("JSON values serialize") + "\n";
            // The report goes to standard output beside a written profile, else to standard error.
            match out {
                Some(path) => {
                    std::fs::write(&path, text).map_err(|e| Error::io(path.display().to_string(), e))?;
                    print!("{cal}");
                }
                None => {
                    eprint!("{cal}");
                    print!("{text}");
                }
            }
            Ok(())
        }
        Command::Run { plan, cpu, inputs, outputs, seed, repeat, graph } => {
            if !cpu {
                let (program, opt) = plan.optimize()?;
                let opts = eqfuse::GpuRunOptions {
                    inputs_dir: inputs,
                    outputs_dir: Some(outputs),
                    repeat,
                    seed,
                    profile: Some(plan.options()?.profile),
                    graph,
                    ..Default::default()
                };
                let report = eqfuse::run_plan_gpu(&program, &opt.plan, &opts)?;
                print!("{report}");
                if !report.ok() {
                    return Err(Error::Invalid("outputs differ from the CPU reference".into()));
                }
                return Ok(());
            }
            let program = plan.load()?;
            let report = eqfuse::run_cpu(
                &program,
                &eqfuse::CpuRunOptions { inputs_dir: inputs, outputs_dir: Some(outputs), seed },
            )?;
            print!("{report}");
            Ok(())
        }
    }
}

/// Every example (all run on the GPU) at its declared size: the memory-bound ones first, then
/// the matrix products, attention and the backward passes.
fn default_bench_programs() -> Vec<String> {
    [
        "add_mul",
        "softplus",
        "bias_gelu_dropout",
        "layernorm",
        "rmsnorm",
        "softmax",
        "softmax_small",
        "cross_entropy",
        "cross_entropy_grad",
        "layernorm_grad",
        "dense",
        "dense_gelu_bf16",
        "matmul_softmax",
        "softmax_regression",
        "attention",
        "composites",
        "mlp_grad",
        "mlp_relu_grad",
        "transformer_block",
        "transformer_block_grad",
        "mlp_relu_dropout_grad",
        "attention_grad",
    ]
    .iter()
    .map(|n| format!("examples/{n}.eqf"))
    .collect()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_bench_is_every_example() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".eqf"))
            .map(|n| format!("examples/{n}"))
            .collect();
        let mut listed = super::default_bench_programs();
        on_disk.sort();
        listed.sort();
        assert_eq!(listed, on_disk);
    }
}
