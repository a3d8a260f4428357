//! Evaluating a plan on the CPU reference, kernel by kernel, and checking it against the program.
//!
//! Each kernel's body is a small program whose inputs are the tensors it reads; running the
//! kernels in plan order over a map of named tensors gives the plan's outputs, which must equal
//! the program's. Invariant: this is the oracle for plans; it shares no code with the planner
//! beyond the plan data itself.

use std::collections::HashMap;

use egg::Language;

use crate::error::{Error, Result};
use crate::ir::infer::broadcast_shapes;
use crate::ir::program::Program;
use crate::ir::tensor::{tolerance, Comparison, Tensor};
use crate::plan::{FusionPlan, Kernel, KernelKind, Template};
use crate::reference::Precision;

/// The program of one kernel: its reads as inputs, its body, its writes as outputs.
pub fn kernel_program(k: &Kernel) -> Result<Program> {
    let mut p = Program::new(format!("kernel {}", k.id));
    let err = |e: String| Error::Invalid(format!("kernel {}: {e}", k.id));
    for r in &k.reads {
        p.add_input(&r.name, r.ty.clone()).map_err(err)?;
    }
    let mut map = Vec::with_capacity(k.body.len());
    for node in k.body.as_ref() {
        let n = node.clone().map_children(|c| map[usize::from(c)]);
        map.push(p.add(n).map_err(err)?);
    }
    for (w, &s) in k.writes.iter().zip(&k.stores) {
        let id = map[usize::from(s)];
        if p.ty(id) != Some(&w.ty) {
            return Err(err(format!("stores {:?} into `{}` of type {}", p.ty(id), w.name, w.ty)));
        }
        // An elementwise kernel stores each output at its iteration space's indices (an output
        // smaller than the space at the indices its broadcast reaches): one that does not
        // broadcast to the space would be partly unwritten on the GPU, whatever the body says.
        let shape = w.ty.shape.as_slice();
        if k.template == Template::Elementwise
            && k.kind == KernelKind::Plain
            && shape != k.domain.as_slice()
            && broadcast_shapes(shape, &k.domain).ok().as_deref() != Some(k.domain.as_slice())
        {
            return Err(err(format!(
                "writes `{}` of shape {:?}, which its iteration space {:?} does not cover",
                w.name, shape, k.domain
            )));
        }
        p.add_output(&w.name, id).map_err(err)?;
    }
    Ok(p)
}

/// Runs a plan's kernels in order on the reference; returns its outputs in program order.
pub fn eval_plan(plan: &FusionPlan, inputs: &HashMap<String, Tensor>) -> Result<Vec<Tensor>> {
    eval_plan_with(plan, inputs, Precision::Declared)
}

/// As [`eval_plan`], with each kernel evaluated at `precision` (see [`Precision`]).
pub fn eval_plan_with(
    plan: &FusionPlan,
    inputs: &HashMap<String, Tensor>,
    precision: Precision,
) -> Result<Vec<Tensor>> {
    let mut env: HashMap<String, Tensor> = inputs.clone();
    for k in &plan.kernels {
        let p = kernel_program(k)?;
        let args: HashMap<String, Tensor> = k
            .reads
            .iter()
            .map(|r| {
                env.get(&r.name).cloned().map(|t| (r.name.clone(), t)).ok_or_else(|| {
                    Error::Invalid(format!("kernel {} reads `{}` before anything wrote it", k.id, r.name))
                })
            })
            .collect::<Result<_>>()?;
        let outs = crate::reference::eval_with(&p, &args, precision)?;
        for (w, t) in k.writes.iter().zip(outs) {
            // A packed mask goes through its words (memory.rs), as on the GPU.
            let t = if plan.is_packed(&w.name) {
                crate::plan::memory::pack_mask(&t)
                    .and_then(|words| crate::plan::memory::unpack_mask(&words, &w.ty))
                    .ok_or_else(|| {
                        Error::Invalid(format!("kernel {} stores `{}` packed, but it is not a bool mask", k.id, w.name))
                    })?
            } else {
                t
            };
            env.insert(w.name.clone(), t);
        }
    }
    plan.outputs
        .iter()
        .map(|(o, t)| env.get(t).cloned().ok_or_else(|| Error::Invalid(format!("no kernel writes output `{o}` ({t})"))))
        .collect()
}

/// Compares a plan's outputs with the program's on the same inputs, with dtype tolerances.
pub fn check_plan(
    program: &Program,
    plan: &FusionPlan,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Comparison)>> {
    let want = crate::reference::eval(program, inputs)?;
    let got = eval_plan(plan, inputs)?;
    Ok(program
        .outputs
        .iter()
        .zip(want.iter().zip(&got))
        .map(|(o, (w, g))| {
            let (rtol, atol) = tolerance(w.dtype);
            (o.name.clone(), g.compare(w, rtol, atol))
        })
        .collect())
}
