//! eqfuse: an e-graph superoptimizer that discovers kernel-fusion plans for tensor programs.
//!
//! A program (`.eqf` text or JSON) becomes a typed [`Program`]; it goes into an
//! [`egg::EGraph`] over [`TensorLang`] with [`ShapeAnalysis`]; staged rulesets add equal forms;
//! the extractor picks a [`FusionPlan`] by memory traffic; the CPU reference ([`eval`]) checks it all.
//! See `ARCHITECTURE.md` for the code map and invariants.

mod analysis;
mod calibrate;
mod codegen;
mod cost;
mod dag;
mod error;
mod expand;
mod explain;
mod extract;
mod fuse;
mod generate;
mod gpu;
mod ilp;
mod infer;
mod json;
mod lang;
mod npy;
mod nvrtc;
mod optimize;
mod parse;
mod plan;
mod plancheck;
mod profile;
mod program;
mod reference;
mod render;
mod rng;
mod run_cpu;
mod run_gpu;
mod scalar;
mod tensor;
mod types;

pub use analysis::{ClassData, ShapeAnalysis, Sign, TensorGraph};
pub use calibrate::{calibrate, calibrate_on, short_name as profile_name_of, Calibration};
pub use codegen::{
    codegen_kernel, codegen_plan, manifest_json, write_codegen_dir, ArgRole, KernelArg, KernelSource, Launch,
    TEMPLATE_FILES,
};
pub use cost::{analyse, KernelCost};
pub use dag::{Dag, DagNode, Role};
pub use error::{Diagnostic, Error, Result};
pub use expand::expand_composites;
pub use explain::explain;
pub use extract::{build_plan, dag_of, extract, fused_cost, local_selection, ExtractOptions, Extracted, Selection};
pub use fuse::{Fusion, Group};
pub use generate::residual_stack_eqf;
pub use gpu::{tensor_bytes, tensor_from_bytes, Gpu};
pub use ilp::{relaxed_cost, solve as solve_ilp, IlpResult, ILP_MAX_NODES};
pub use infer::{broadcast_shapes, infer, norm_axis, Fact, Inferred};
pub use json::{program_from_json, program_to_json};
pub use lang::{Binary, Composite, Dims, Kind, Num, OpCode, OpInfo, Reduce, TensorLang, Unary, OPS};
pub use npy::{read_npy, write_npy};
pub use nvrtc::{
    available as nvrtc_available, cache_dir, compile as nvrtc_compile, compile_cached as nvrtc_compile_cached,
    Compiled, DEFAULT_ARCH,
};
pub use optimize::{egraph_of, optimize, unfused_totals, OptimizeOptions, Optimized, StageSummary};
pub use parse::{load_program, parse_dim_override, parse_program};
pub use plan::{FusionPlan, Kernel, SearchReport, Template, TensorRef, Totals};
pub use plancheck::{check_plan, eval_plan, kernel_program};
pub use profile::{DeviceProfile, TemplateRates};
pub use program::{Input, Output, Program};
pub use reference::{eval, eval_all};
pub use render::{human_bytes, plan_json, render, Format};
pub use rng::{dropout_keep, dropout_scale, dropout_threshold, random_input, random_inputs};
pub use run_cpu::{run_cpu, CpuRunOptions, CpuRunReport, InputReport, InputSource, OutputReport};
pub use run_gpu::{
    compare as compare_output, run_on, run_plan_gpu, unfused_plan, GpuRunOptions, GpuRunReport, KernelTiming,
    OutputCheck,
};
pub use tensor::{tolerance, Comparison, Summary, Tensor};
pub use types::{DType, TensorType};

/// The counter-based generator that dropout and seeded inputs use (the CUDA side reproduces it).
pub mod random {
    pub use crate::rng::*;
}

/// The README's examples run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Pointwise semantics on f64, shared by every CPU evaluator.
pub mod scalars {
    pub use crate::scalar::{binary, gelu, gelu_tanh, sigmoid, unary};
}
