//! The `eqfuse` command line: argument parsing, then a call into the library.
//!
//! Invariant: exit status 0 on success, 1 on bad input (`error: FILE:LINE:COL: what`), 2 on
//! usage errors, 3 when a GPU command finds no usable GPU. Every option value is checked where
//! clap parses it (one value parser per kind of value: seconds, counts, sizes, byte counts), so a
//! bad value is clap's usage error; options that contradict each other or the program are
//! [`Error::Usage`], also exit status 2; no option is silently ignored: one a command cannot
//! honour is refused.

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
        #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = dim_arg)]
        dims: Vec<(String, usize)>,
    },
    /// Write one self-contained `.cu` per kernel, `plan.json` and a launch manifest.
    Codegen {
        #[command(flatten)]
        plan: PlanArgs,
        /// Folder to write into: a new or empty one, or one an earlier `codegen` wrote (its
        /// `.cu` files, `plan.json` and `launch.json` are replaced; a folder holding anything else
        /// is refused).
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Unfused against fused on the GPU, measured and predicted, for each program (default: the
    /// examples that run on the GPU), with the rank correlation of predicted and measured time.
    Bench {
        /// Programs (`.eqf`, `.json`, `.onnx`); none means every example that runs on the GPU.
        progs: Vec<String>,
        /// Override a declared size in every program: `--dim N=4096` (repeatable).
        #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = dim_arg)]
        dims: Vec<(String, usize)>,
        /// Device profile the plans are made for.
        #[arg(long, default_value = "h100")]
        device: String,
        /// Timed repetitions per plan (at least 1).
        #[arg(long, default_value_t = 30, value_parser = at_least_one, allow_negative_numbers = true)]
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
        /// Evaluate the program with the CPU reference interpreter instead of the GPU. The CPU
        /// reference runs the program itself, not a plan, and times nothing: the planning options
        /// (`--device`, `--rules`, `--memory-budget`, ...) and `--repeat`/`--graph` are refused
        /// with it.
        #[arg(long, conflicts_with_all = [
            "device", "extractor", "node_limit", "time_limit", "no_fusion", "rules", "strict", "memory_budget",
            "repeat", "graph",
        ])]
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
        /// Timed repetitions on the GPU (0: check the outputs, time nothing).
        #[arg(long, default_value_t = 20)]
        repeat: usize,
        /// Also capture the plan's launches once as a CUDA graph and time its replays (needs
        /// `--repeat` of at least 1).
        #[arg(long)]
        graph: bool,
    },
}

#[derive(Args)]
struct PlanArgs {
    /// A `.eqf` program, a `.json` graph, an `.onnx` model, or `-` for standard input.
    prog: String,
    /// Override a declared size (an ONNX symbolic dim too): `--dim N=4096` (repeatable; each
    /// dim at most once).
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = dim_arg)]
    dims: Vec<(String, usize)>,
    /// Device profile: `h100`, `h200`, or a profile JSON file.
    #[arg(long, default_value = "h100")]
    device: String,
    /// Extractor: the greedy DAG extractor, or an exact lower bound by integer programming.
    #[arg(long, value_enum, default_value_t = ExtractorArg::Greedy)]
    extractor: ExtractorArg,
    /// Most e-nodes the saturation may grow to (at least 1).
    #[arg(long, default_value_t = 20_000, value_parser = at_least_one, allow_negative_numbers = true)]
    node_limit: usize,
    /// Seconds the whole planning may take: saturation, extraction, the fusion search and the ILP
    /// (more than 0, at most 1000000); when they run out, the best plan found so far.
    #[arg(long, default_value = "2", value_parser = seconds, allow_negative_numbers = true)]
    time_limit: Duration,
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
    #[arg(long, value_name = "BYTES", value_parser = byte_count)]
    memory_budget: Option<u64>,
}

/// The longest `--time-limit`, in seconds (about 11.6 days): longer is more likely a typo than a
/// wish, and every longer value would take the same plan as no limit at all.
const MAX_TIME_LIMIT_S: f64 = 1e6;

/// `--time-limit SECS`: a positive, finite number of seconds up to [`MAX_TIME_LIMIT_S`].
fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0 && v <= MAX_TIME_LIMIT_S) {
        return Err(format!("a time limit must be more than 0 and at most {MAX_TIME_LIMIT_S} seconds, got {s}"));
    }
    Duration::try_from_secs_f64(v).map_err(|e| format!("{s}: {e}"))
}

/// A count that must be at least 1 (`--node-limit`, `bench --repeat`).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        Ok(_) => Err("must be at least 1".into()),
        Err(_) => Err(format!("`{s}` is not a whole number")),
    }
}

/// `--dim NAME=VALUE`.
fn dim_arg(s: &str) -> Result<(String, usize), String> {
    eqfuse::parse_dim_override(s)
}

/// `--memory-budget BYTES`: a byte count of at least 1.
fn byte_count(s: &str) -> Result<u64, String> {
    match eqfuse::parse_bytes(s)? {
        0 => Err("a memory budget must be at least 1 byte".into()),
        b => Ok(b),
    }
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
        eqfuse::load_program(&self.prog, &self.dims)
    }

    fn options(&self) -> Result<OptimizeOptions, Error> {
        let mut o = OptimizeOptions::new(DeviceProfile::load(&self.device)?);
        o.fusion = !self.no_fusion;
        o.rules = self.rules.as_ref().map(|dir| eqfuse::load_rules_dir(dir).map(std::sync::Arc::new)).transpose()?;
        o.node_limit = self.node_limit;
        o.strict = self.strict;
        o.time_limit = self.time_limit;
        o.memory_budget = self.memory_budget;
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
                node_limit: 1,
                time_limit: Duration::from_secs(1),
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
            let stale = codegen_folder(&out)?;
            let (_, opt) = plan.optimize()?;
            let sources = eqfuse::write_codegen_dir(&opt.plan, &out)?;
            let written: Vec<&str> = sources.iter().filter(|s| s.cublaslt.is_none()).map(|s| s.file.as_str()).collect();
            let mut removed = 0;
            for p in
                stale.iter().filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !written.contains(&n)))
            {
                std::fs::remove_file(p).map_err(|e| Error::io(p.display().to_string(), e))?;
                removed += 1;
            }
            let calls = sources.len() - written.len();
            print!("wrote {}, plan.json and launch.json to {}", plural(written.len(), "kernel source"), out.display());
            if calls > 0 {
                let n = if calls == 1 { "1 kernel is a cuBLASLt call" } else { "kernels are cuBLASLt calls" };
                print!(" ({} with no source)", if calls == 1 { n.to_string() } else { format!("{calls} {n}") });
            }
            if removed > 0 {
                print!("; removed {} an earlier codegen left there", plural(removed, "stale .cu file"));
            }
            println!();
            Ok(())
        }
        Command::Bench { progs, dims, device, repeat, json, strict } => {
            if let Some(path) = &json {
                check_output_file(path)?;
            }
            let files = if progs.is_empty() { default_bench_programs() } else { progs };
            let programs = files.iter().map(|f| eqfuse::load_program(f, &dims)).collect::<Result<Vec<_>, _>>()?;
            let mut opts = OptimizeOptions::new(DeviceProfile::load(&device)?);
            opts.strict = strict;
            let report = eqfuse::bench_programs(&programs, &opts, repeat)?;
            print!("{report}");
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&report.to_json()).expect("JSON values serialize") + "\n";
                write_whole(&path, &text)?;
            }
            Ok(())
        }
        Command::Calibrate { out } => {
            if let Some(path) = &out {
                check_output_file(path)?;
            }
            let cal = eqfuse::calibrate()?;
            let text = serde_json::to_string_pretty(&cal.profile).expect("JSON values serialize") + "\n";
            // The report goes to standard output beside a written profile, else to standard error.
            match out {
                Some(path) => {
                    write_whole(&path, &text)?;
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
            if graph && repeat == 0 {
                return Err(Error::Usage("--graph times the graph's replays: it needs --repeat of at least 1".into()));
            }
            eqfuse::check_run_folders(inputs.as_deref(), Some(&outputs))?;
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
                let report = eqfuse::run_plan_gpu(&program, &opt.plan, &opts).map_err(|e| match e {
                    Error::NoGpu(why) => {
                        Error::NoGpu(format!("{why}; `eqfuse run --cpu` runs the program on the CPU reference instead"))
                    }
                    e => e,
                })?;
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

/// A file a command writes when its long work is done (`bench --json`, `calibrate -o`), checked
/// before that work: not a folder, and in a folder that exists.
fn check_output_file(path: &std::path::Path) -> Result<(), Error> {
    let shown = path.display().to_string();
    if path.is_dir() {
        return Err(Error::Invalid(format!("{shown}: is a folder; give the name of a file to write")));
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = parent.filter(|d| !d.is_dir()) {
        return Err(Error::Invalid(format!("{shown}: the folder {} does not exist", dir.display())));
    }
    Ok(())
}

/// Writes `text` to `path` whole or not at all: to a temporary file beside it, then renamed.
fn write_whole(path: &std::path::Path, text: &str) -> Result<(), Error> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.{}.partial", std::process::id()));
    let result = std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, path));
    result.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        Error::io(path.display().to_string(), e)
    })
}

/// `n word` or `n words`.
fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// What `codegen -o DIR` may replace: DIR must be new, empty, or hold only what codegen writes
/// (`*.cu`, `plan.json`, `launch.json`); its `.cu` files are returned, to be removed once the new
/// ones are written unless a new one takes the name. A folder holding anything else is refused,
/// so codegen never deletes or mixes with files it did not write.
fn codegen_folder(dir: &std::path::Path) -> Result<Vec<PathBuf>, Error> {
    let shown = dir.display().to_string();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(_) if dir.exists() && !dir.is_dir() => {
            return Err(Error::Invalid(format!("{shown}: -o names a file; codegen writes into a folder")))
        }
        Err(e) => return Err(Error::io(shown, e)),
    };
    let mut stale = vec![];
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(shown.clone(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().map_err(|e| Error::io(shown.clone(), e))?.is_file();
        if is_file && name.ends_with(".cu") {
            stale.push(entry.path());
        } else if !(is_file && (name == "plan.json" || name == "launch.json")) {
            return Err(Error::Invalid(format!(
                "{shown}: the folder holds `{name}`, which codegen does not write; give a new or empty folder, \
                 or one an earlier codegen wrote (its .cu files, plan.json and launch.json are replaced)"
            )));
        }
    }
    Ok(stale)
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
        "causal_attention_training",
        "rope",
        "embedding_layernorm",
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
            if matches!(e, Error::Usage(_)) {
                eprintln!("\nFor more information, try '--help'.");
            }
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
