//! `FusionPlan` and `Kernel`: what the extractor chooses and everything downstream consumes.
//!
//! A plan is a list of kernels in execution order. Each kernel is an instance of one template,
//! names the tensors it reads from and writes to device memory, and carries its body: a small
//! `TensorLang` expression whose `Var` leaves are the tensors it reads. Everything in the body
//! that is not a read stays in registers or shared memory.
//! Invariant: a plan is self-contained; evaluating its kernels in order on the CPU reference
//! gives the program's outputs (checked by tests for every example), and codegen never changes it.

pub mod dag;
pub mod memory;
pub mod plancheck;
pub mod render;

use egg::{Id, RecExpr};
use serde::Serialize;

use crate::ir::lang::TensorLang;
use crate::ir::types::TensorType;

/// The kernel templates of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Template {
    /// Any fused pointwise body over broadcast inputs; several outputs.
    Elementwise,
    /// Reductions along the last axis with pointwise prologue and epilogue; several outputs.
    RowReduce,
    /// Reductions over a leading axis with pointwise prologue.
    ColReduce,
    /// A matrix product with a fused pointwise (or narrow row-softmax) epilogue.
    Gemm,
    /// Flash-style attention.
    Attention,
}

impl Template {
    pub const ALL: [Template; 5] =
        [Template::Elementwise, Template::RowReduce, Template::ColReduce, Template::Gemm, Template::Attention];

    pub fn name(self) -> &'static str {
        match self {
            Template::Elementwise => "elementwise",
            Template::RowReduce => "rowreduce",
            Template::ColReduce => "colreduce",
            Template::Gemm => "gemm",
            Template::Attention => "attention",
        }
    }
}

/// What a kernel is, finer than its template: every kind of kernel the cost model and code
/// generation branch on. Set once, when the kernel is analysed (`cost::kernel_kind`), and carried
/// by the plan's kernel; it is not part of the plan's contract (the rendered plan shows the
/// template), so nothing needs to look into a kernel's body to learn what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A kernel its template describes alone.
    Plain,
    /// A column reduction of cross-entropy's mean over rows, which code generation runs as a
    /// row kernel with one global result (and the cost model times at the row template's rates).
    RowGlobal,
    /// Forward attention on `path`; `lse`: it writes the log-sum-exp of its scores too (code
    /// generation renders it through the backward's module, which owns that pairing).
    Attention { path: AttentionPath, lse: bool },
    /// A kernel of attention's backward composites alone (the log-sum-exp, the gradients).
    AttentionBackward,
    /// An elementwise kernel over the values of one `scatter_add` (its iteration space), which
    /// it writes alone: each value is added by an atomic at its index (`kernels/scatter.cu`).
    Scatter,
}

/// The path a forward attention kernel takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionPath {
    /// f32 operands, on CUDA cores.
    F32,
    /// 16-bit operands, the portable mma.sync path everywhere.
    Portable,
    /// 16-bit operands, with the Hopper path beside the portable one (taken on a 9.0 device).
    Hopper,
}

impl KernelKind {
    /// Whether code generation renders the kernel with the attention backward template's
    /// module: the backward's composites, and the forward writing its log-sum-exp.
    pub fn attention_backward_module(self) -> bool {
        matches!(self, KernelKind::AttentionBackward | KernelKind::Attention { lse: true, .. })
    }
}

/// How a gemm kernel runs: one cuBLASLt call (its epilogues only) or the generated tensor
/// product template with any fused epilogue. The cost model picks the faster by the profile's
/// per-implementation rates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmImpl {
    Cublaslt,
    Generated,
}

impl GemmImpl {
    pub fn name(self) -> &'static str {
        match self {
            GemmImpl::Cublaslt => "cublaslt",
            GemmImpl::Generated => "generated",
        }
    }
}

/// A tensor in device memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorRef {
    pub name: String,
    #[serde(flatten)]
    pub ty: TensorType,
}

/// One kernel of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub id: usize,
    pub template: Template,
    /// What the kernel is, finer than its template (not part of the plan's contract).
    pub kind: KernelKind,
    /// The iteration space: the shape of the largest value the kernel computes (a scatter
    /// kernel's: its scatter_add's values).
    pub domain: Vec<usize>,
    /// The operators fused into this kernel, in body order (contract field `ops`).
    pub ops: Vec<String>,
    /// Tensors read from device memory (each once).
    pub reads: Vec<TensorRef>,
    /// Tensors written to device memory.
    pub writes: Vec<TensorRef>,
    /// The computation; `Var` leaves name the tensors in `reads`.
    pub body: RecExpr<TensorLang>,
    /// For each entry of `writes`, the body node it stores.
    pub stores: Vec<Id>,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: u64,
    pub predicted_us: f64,
    /// Fusions the planner considered near this kernel and rejected, with the reason.
    pub rejected: Vec<String>,
    /// For a gemm kernel, the implementation the cost model chose.
    pub implementation: Option<GemmImpl>,
}

impl Kernel {
    /// The kernel's computation as text (the contract's `body`): the body's root as an
    /// s-expression when every value the kernel writes is part of it; otherwise (outputs computed
    /// side by side) `NAME = EXPR` for each written value no other written value contains, in
    /// `writes` order, joined by `; `, so every output's computation shows.
    pub fn body_text(&self) -> String {
        let nodes = self.body.as_ref();
        if nodes.is_empty() {
            return String::new();
        }
        let within = |top: Id| {
            let mut seen = vec![false; nodes.len()];
            let mut stack = vec![top];
            while let Some(id) = stack.pop() {
                let i = usize::from(id);
                if !std::mem::replace(&mut seen[i], true) {
                    stack.extend(egg::Language::children(&nodes[i]).iter().copied());
                }
            }
            seen
        };
        let root = Id::from(nodes.len() - 1);
        let in_root = within(root);
        if self.stores.iter().all(|&s| in_root[usize::from(s)]) {
            return expr_text(nodes, root, &in_root);
        }
        let mut parts = vec![];
        let mut shown: Vec<Id> = vec![];
        for (w, &s) in self.writes.iter().zip(&self.stores) {
            let inside_other = self.stores.iter().any(|&t| t != s && within(t)[usize::from(s)]);
            if inside_other || shown.contains(&s) {
                continue;
            }
            shown.push(s);
            parts.push(format!("{} = {}", w.name, expr_text(nodes, s, &within(s))));
        }
        parts.join("; ")
    }
}

/// Nodes past which a body is written node by node instead of as one s-expression.
const MAX_BODY_TREE: u64 = 100_000;

/// The expression of `nodes` at `root` (`used`: the nodes it reaches) as text: its s-expression,
/// or, when writing shared values out at every use would pass [`MAX_BODY_TREE`] nodes (a long
/// chain whose values are each used twice doubles at every link, and ran out of memory), the
/// nodes it uses numbered by their place in the body, `%0 = x; %1 = (exp %0); ...`, the last one
/// `root`.
fn expr_text(nodes: &[TensorLang], root: Id, used: &[bool]) -> String {
    use egg::Language;
    use std::fmt::Write;
    let last = usize::from(root);
    let mut size: Vec<u64> = Vec::with_capacity(last + 1);
    for n in &nodes[..=last] {
        size.push(n.children().iter().fold(1u64, |acc, &c| acc.saturating_add(size[usize::from(c)])));
    }
    if size[last] <= MAX_BODY_TREE {
        return n_expr(nodes, root).to_string();
    }
    let mut out = String::new();
    for (i, n) in nodes[..=last].iter().enumerate().filter(|&(i, _)| used[i]) {
        if !out.is_empty() {
            out.push_str("; ");
        }
        let _ = write!(out, "%{i} = ");
        if n.children().is_empty() {
            let _ = write!(out, "{n}");
        } else {
            let _ = write!(out, "({n}");
            for &c in n.children() {
                let _ = write!(out, " %{}", usize::from(c));
            }
            out.push(')');
        }
    }
    out
}

/// The subexpression of `nodes` at `root`.
fn n_expr(nodes: &[TensorLang], root: Id) -> RecExpr<TensorLang> {
    egg::Language::build_recexpr(&nodes[usize::from(root)], |c| nodes[usize::from(c)].clone())
}

/// Totals over a plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub kernels: usize,
    pub bytes: u64,
    pub flops: u64,
    pub predicted_us: f64,
}

/// How the search went.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SearchReport {
    pub iterations: usize,
    pub enodes: usize,
    pub eclasses: usize,
    pub stop_reason: String,
    pub saturate_ms: f64,
    pub extract_ms: f64,
    pub extractor: String,
    /// Relative distance of the chosen plan's predicted time above a proven lower bound (0 when
    /// the plan is optimal for the cost model); `null` when no bound was computed.
    pub gap: Option<f64>,
    /// The proven lower bound itself, in microseconds, when one was computed (unrounded, so that
    /// tests can check the plan never beats it).
    pub lower_bound_us: Option<f64>,
    /// Strict numerics (`--strict`): only exact rules were used, and code generation keeps the
    /// unfused plan's floating-point operations, their order and their roundings, so fused
    /// results are bit-identical to the unfused plan's on the GPU.
    pub strict: bool,
    /// `stop_reason` with the limit that stopped saturation, named and numbered (a per-stage
    /// cap says so): `node-limit: stage `algebra` reached its per-stage cap of 1030 e-nodes ...`.
    pub stop_detail: String,
    /// The planning command's time limit in seconds (`--time-limit`): saturation, extraction,
    /// the fusion search and the ILP together.
    pub time_limit_s: f64,
    /// The steps the time limit cut short, in order (empty when it cut nothing): the plan is
    /// then the best complete plan found before the limit, at worst the unfused one.
    pub time_limit_cut: Vec<String>,
}

/// The extractor's output.
#[derive(Clone, Debug, PartialEq)]
pub struct FusionPlan {
    /// The program's source name.
    pub program: String,
    /// The device profile's name.
    pub device: String,
    pub kernels: Vec<Kernel>,
    /// The program's inputs, as read by the kernels.
    pub inputs: Vec<TensorRef>,
    /// For each program output, in order, the tensor holding it.
    pub outputs: Vec<(String, String)>,
    pub total: Totals,
    /// The program as written, one kernel per primitive op (composites expanded).
    pub unfused: Totals,
    pub search: SearchReport,
    /// Peak device memory by liveness over the kernels, and the tensors saved between kernels.
    pub memory: crate::plan::memory::MemoryReport,
}

impl FusionPlan {
    /// Predicted speedup of this plan over the unfused one.
    pub fn speedup(&self) -> f64 {
        if self.total.predicted_us > 0.0 {
            self.unfused.predicted_us / self.total.predicted_us
        } else {
            1.0
        }
    }

    /// The memory report of kernels run in order over these inputs and outputs; `packed` lists
    /// the tensors stored 1 bit per element.
    pub fn memory_of(
        kernels: &[Kernel],
        inputs: &[TensorRef],
        outputs: &[(String, String)],
        packed: &std::collections::BTreeSet<String>,
    ) -> crate::plan::memory::MemoryReport {
        use std::collections::BTreeMap;
        let mut types: BTreeMap<&str, &TensorType> = inputs.iter().map(|i| (i.name.as_str(), &i.ty)).collect();
        for k in kernels {
            types.extend(k.writes.iter().map(|w| (w.name.as_str(), &w.ty)));
        }
        let io: Vec<crate::plan::memory::KernelIo> = kernels
            .iter()
            .map(|k| crate::plan::memory::KernelIo {
                reads: k.reads.iter().map(|r| r.name.as_str()).collect(),
                writes: k.writes.iter().map(|w| w.name.as_str()).collect(),
            })
            .collect();
        let ins: Vec<(&str, &TensorType)> = inputs.iter().map(|i| (i.name.as_str(), &i.ty)).collect();
        let outs: Vec<&str> = outputs.iter().map(|(_, t)| t.as_str()).collect();
        crate::plan::memory::liveness(&io, &ins, &outs, &|n| types.get(n).map(|t| (*t).clone()), &|n| {
            packed.contains(n)
        })
    }

    /// Whether a tensor of the plan is stored 1 bit per element (a saved bool mask).
    pub fn is_packed(&self, name: &str) -> bool {
        self.memory.saved.iter().any(|s| s.packed && s.name == name)
    }

    /// Recomputes `total` from the kernels.
    pub fn sum_totals(kernels: &[Kernel]) -> Totals {
        Totals {
            kernels: kernels.len(),
            bytes: kernels.iter().map(|k| k.bytes_read + k.bytes_written).sum(),
            flops: saturating_sum(kernels.iter().map(|k| k.flops)),
            // `+ 0.0`: an empty sum of floats is -0.0, shown as `-0.0 us`.
            predicted_us: kernels.iter().map(|k| k.predicted_us).sum::<f64>() + 0.0,
        }
    }
}

/// A sum of flop counts, saturating: a count beyond u64 reads as `u64::MAX`, never as a
/// wrapped small number.
pub fn saturating_sum(counts: impl Iterator<Item = u64>) -> u64 {
    counts.fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body whose values are each used twice doubles at every level as one s-expression: past
    /// the limit it is written node by node (64 levels would be 2^64 nodes as a tree).
    #[test]
    fn a_body_of_shared_values_is_written_node_by_node() {
        let small: egg::RecExpr<TensorLang> = "(+ (exp x) (exp x))".parse().unwrap();
        assert_eq!(expr_text(small.as_ref(), (small.as_ref().len() - 1).into(), &[true; 4]), "(+ (exp x) (exp x))");
        let mut body: egg::RecExpr<TensorLang> = egg::RecExpr::default();
        let mut last = body.add("x".parse::<egg::RecExpr<TensorLang>>().unwrap().as_ref()[0].clone());
        for _ in 0..64 {
            last = body.add(TensorLang::Op(
                crate::ir::lang::OpCode::of(crate::ir::lang::Kind::Binary(crate::ir::lang::Binary::Add)),
                vec![last, last],
            ));
        }
        let out = expr_text(body.as_ref(), last, &[true; 65]);
        assert!(out.starts_with("%0 = x; %1 = (+ %0 %0); %2 = (+ %1 %1)"), "{}", &out[..80]);
        assert!(out.ends_with("%64 = (+ %63 %63)"), "{out}");
    }
}
