//! eqfuse: an e-graph superoptimizer that discovers kernel-fusion plans for tensor programs.
//!
//! A program (`.eqf` text, a JSON graph or an ONNX model) becomes a typed [`Program`]; it goes
//! into an [`egg::EGraph`] over [`TensorLang`] with [`ShapeAnalysis`]; staged rulesets add equal
//! forms; the extractor picks a [`FusionPlan`] by memory traffic; the CPU reference ([`eval`])
//! checks it all. See `ARCHITECTURE.md` for the code map and invariants.
//!
//! # As a library
//!
//! A front end (an AD framework, a compiler) drives eqfuse in three steps:
//!
//! 1. **Build** a [`Program`]: from text ([`parse_program`]), a JSON graph ([`program_from_json`],
//!    schema in `docs/graph-schema.md`), an ONNX model ([`program_from_onnx`]), any of them by
//!    file name ([`load_program`]), or in code with the builder: [`Program::add_input`], then
//!    [`Program::apply`] for each operator (a [`Kind`] and child ids), [`Program::num`] for a
//!    literal, [`Program::add`] for a shape ([`TensorLang::Dims`]) or dtype attribute, and
//!    [`Program::add_output`]. Every operator is type-checked as it is added; a bad one is an
//!    `Err(String)` naming the operator and shapes, and the program is left as it was.
//! 2. **Plan** it: [`optimize`] with [`OptimizeOptions`] (a [`DeviceProfile`], budgets) gives an
//!    [`Optimized`] whose [`FusionPlan`] lists the kernels in order, with the tensors each reads
//!    and writes and its body; [`plan_json`] is the contract of `docs/plan-schema.md`.
//! 3. **Evaluate**: [`eval`] runs the program on the CPU reference with the caller's tensors by
//!    input name, [`eval_plan`] runs the plan kernel by kernel, and [`check_plan`] compares them.
//!
//! ```
//! use eqfuse::{check_plan, optimize, random_inputs, Binary, DType, DeviceProfile, Dims, Kind};
//! use eqfuse::{OptimizeOptions, Program, Reduce, TensorLang, TensorType, Unary};
//!
//! // y = softmax-like normalisation of exp(x) along rows, flattened: written op by op.
//! let mut p = Program::new("rows");
//! let x = p.add_input("x", TensorType::new(DType::F32, vec![8, 32])).unwrap();
//! let e = p.apply(Kind::Unary(Unary::Exp), vec![x]).unwrap();
//! let last = p.num(-1.0);
//! let s = p.apply(Kind::Reduce(Reduce::Sum), vec![e, last]).unwrap();
//! let y = p.apply(Kind::Binary(Binary::Div), vec![e, s]).unwrap();
//! let flat = p.add(TensorLang::Dims(Dims(vec![256]))).unwrap();
//! let y = p.apply(Kind::Reshape, vec![y, flat]).unwrap();
//! p.add_output("y", y).unwrap();
//! // A type error is a value: [8, 32] does not reshape to [100].
//! let bad = p.add(TensorLang::Dims(Dims(vec![100]))).unwrap();
//! assert!(p.apply(Kind::Reshape, vec![x, bad]).unwrap_err().contains("cannot reshape"));
//!
//! let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
//! let plan = optimize(&p, &opts).unwrap().plan;
//! assert!(plan.total.kernels < plan.unfused.kernels);
//! for (_, cmp) in check_plan(&p, &plan, &random_inputs(&p, 0)).unwrap() {
//!     assert!(cmp.ok());
//! }
//! ```
//!
//! `examples/library.rs` does the same for a dense layer with a residual and a layer norm.

// The layers, lowest first: each module imports only modules declared before it
// (`tests/layers.rs` checks it; ARCHITECTURE.md draws it).
// Errors (a comment above each `mod` keeps rustfmt from sorting the list).
mod error;
// Reading user files with checks.
mod files;
// The program IR: operators, types, shape inference, programs, tensors, strided views.
mod ir;
// The CPU reference: evaluation, the counter-based generator, `.npy`, `run --cpu`.
mod reference;
// Fusion plans: kernels, the kernel DAG, memory and liveness, rendering, plan checks.
mod plan;
// CUDA code generation of a plan's kernels; `codegen::caps` is what the planner may ask.
mod codegen;
// Reverse mode and composite expansion.
mod autodiff;
// Reading programs: `.eqf`, JSON graphs, ONNX.
mod frontend;
// The cost model and device profiles.
mod cost;
// Finding a plan: e-graph, rules, saturation, extraction, fusion, ILP, budgets.
mod search;
// Running plans on the GPU.
mod runtime;
// Calibration, benchmarks, program generators.
mod tools;

pub use autodiff::expand::expand_composites;
pub use autodiff::{expand_grads, grad, grad_decomposed, has_grads};
pub use codegen::caps::{row_cluster, row_keep, RowCluster, RowKeep, MAX_ROW_SMEM_BYTES};
pub use codegen::cublaslt::{LtCall, LtEpilogue, LtLoop, LtOperand};
pub use codegen::gemm::cublaslt_call as gemm_cublaslt_call;
pub use codegen::{
    codegen_kernel, codegen_plan, loads_masks, manifest_json, stores_masks, write_codegen_dir, ArgRole, KernelArg,
    KernelSource, Launch, TEMPLATE_FILES,
};
pub use cost::profile::{DeviceProfile, TemplateRates};
pub use cost::{analyse, KernelCost};
pub use error::{Diagnostic, Error, Result};
pub use frontend::json::{program_from_json, program_to_json};
pub use frontend::onnx::{
    program_from_onnx, program_from_onnx_file, supported_onnx_ops, ONNX_DIM_METADATA_PREFIX, ONNX_OPSETS,
};
pub use frontend::parse::{load_program, parse_dim_override, parse_program};
pub use ir::infer::{broadcast_shapes, infer, norm_axis, Fact, Inferred};
pub use ir::lang::{AttnArg, Binary, Composite, Dims, Kind, Num, OpCode, OpInfo, Reduce, TensorLang, Unary, OPS};
pub use ir::program::{Input, Output, Program};
pub use ir::tensor::{tolerance, Comparison, Summary, Tensor};
pub use ir::types::{DType, TensorType};
pub use plan::dag::{Dag, DagNode, Role};
pub use plan::memory::{
    liveness, pack_mask, packed_bytes, parse_bytes, unpack_mask, KernelIo, MemoryReport, SavedTensor,
};
pub use plan::plancheck::{check_plan, eval_plan, eval_plan_with, kernel_program};
pub use plan::render::{human_bytes, plan_json, render, Format};
pub use plan::{FusionPlan, GemmImpl, Kernel, SearchReport, Template, TensorRef, Totals};
pub use reference::check::{compare as compare_output, OutputCheck};
pub use reference::npy::{read_npy, write_npy};
pub use reference::rng::{dropout_keep, dropout_scale, dropout_threshold, random_input, random_inputs};
pub use reference::run_cpu::{
    check_run_folders, run_cpu, CpuRunOptions, CpuRunReport, InputReport, InputSource, OutputReport,
};
pub use reference::{check_fits, eval, eval_all, eval_with, Precision};
pub use runtime::gpu::{tensor_bytes, tensor_from_bytes, Gpu};
pub use runtime::memplan::{MemoryPlan, Step as MemoryStep};
pub use runtime::nvrtc::{
    available as nvrtc_available, cache_dir, compile as nvrtc_compile, compile_cached as nvrtc_compile_cached,
    Compiled, DEFAULT_ARCH,
};
pub use runtime::run_gpu::{run_on, run_plan_gpu, unfused_plan, GpuRunOptions, GpuRunReport, KernelTiming};
pub use search::analysis::{ClassData, ShapeAnalysis, Sign, TensorGraph};
pub use search::conditions::{condition, NamedCondition, CONDITIONS};
pub use search::deadline::Deadline;
pub use search::explain::explain;
pub use search::extract::{
    build_plan, dag_of, extract, fused_cost, local_selection, local_selection_by_egg, planned_cost, written_selection,
    ExtractOptions, Extracted, Selection,
};
pub use search::fuse::{Fusion, FusionParts, Group};
pub use search::ilp::{relaxed_cost, solve as solve_ilp, IlpResult, ILP_MAX_NODES};
pub use search::native::{fold_slices, native_rules, NativeRule, NATIVE_RULES};
pub use search::optimize::{
    egraph_of, optimize, plan_saturated, saturate_program, unfused_totals, OptimizeOptions, Optimized, Saturated,
    StageSummary,
};
pub use search::rules::{default_rules, parse_rules_dir, parse_ruleset, Rule, RuleSet, STAGE_ORDER};
pub use search::saturate::{saturate, saturate_egraph, Budgets, Saturation, StageReport, StopReason, MIN_STAGE_ROOM};
pub use search::soundness::{check_native_rule, check_rewrite_on, check_rule, load_rules_dir};
pub use tools::bench::{bench_programs, spearman, BenchReport, BenchRow};
pub use tools::calibrate::{calibrate, calibrate_on, short_name as profile_name_of, Calibration};
pub use tools::gen_program::{random_recipe, recipes, Recipe, Scale, Step};
pub use tools::generate::{
    gpt2_train_eqf, residual_stack_eqf, skip_chain_eqf, transformer_stack_eqf, SKIP_CHAIN_FUNCTIONS,
};

/// The counter-based generator that dropout and seeded inputs use (the CUDA side reproduces it).
pub mod random {
    pub use crate::reference::rng::*;
}

/// The README's examples run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Pointwise semantics on f64, shared by every CPU evaluator.
pub mod scalars {
    pub use crate::ir::scalar::{binary, gelu, gelu_tanh, sigmoid, unary};
}
