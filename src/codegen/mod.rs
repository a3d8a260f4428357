//! Code generation: each kernel of a [`FusionPlan`] as a self-contained CUDA source.
//!
//! A kernel's file is a generated `#define` block and fused body functions (see `emit.rs`),
//! then `kernels/common.cuh` and the kernel's template (`kernels/{template}.cu`, and
//! `kernels/scatter.cu` for a scatter kernel) verbatim: the template is instantiated by macros
//! and by the functions it calls, never edited as text.
//! NVRTC compiles the file with nothing but the architecture flag.
//! Invariant: codegen never changes the plan and is a pure function of it (golden snapshots
//! in `tests/snapshots` hold the rendered CUDA of small programs).

pub mod attention;
pub mod attention_bwd;
pub mod caps;
pub mod cublaslt;
mod emit;
pub mod gemm;
pub(crate) mod lower;

use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ir::types::DType;
use crate::plan::render::{render, Format};
use crate::plan::{FusionPlan, Kernel, Template};

const COMMON: &str = include_str!("../../kernels/common.cuh");
const ELEMENTWISE: &str = include_str!("../../kernels/elementwise.cu");
const ROWREDUCE: &str = include_str!("../../kernels/rowreduce.cu");
const COLREDUCE: &str = include_str!("../../kernels/colreduce.cu");
const ATTENTION: &str = include_str!("../../kernels/attention.cu");
const GEMM: &str = include_str!("../../kernels/gemm.cu");
const ATTENTION_BWD: &str = include_str!("../../kernels/attention_bwd.cu");
const SCATTER: &str = include_str!("../../kernels/scatter.cu");

/// The template files, by name, as they are embedded (for tests that compile them alone).
pub const TEMPLATE_FILES: [(&str, &str); 8] = [
    ("common.cuh", COMMON),
    ("elementwise.cu", ELEMENTWISE),
    ("rowreduce.cu", ROWREDUCE),
    ("colreduce.cu", COLREDUCE),
    ("attention.cu", ATTENTION),
    ("gemm.cu", GEMM),
    ("attention_bwd.cu", ATTENTION_BWD),
    ("scatter.cu", SCATTER),
];

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem_bytes: u32,
    /// The kernel loops over its work, so any `grid[0]` from 1 up to the one given is valid; the
    /// runtime launches one wave of resident blocks (a persistent grid) when that is fewer.
    pub persistent: bool,
    /// The kernel is written for one wave of resident blocks (it pipelines its loop): the
    /// runtime launches one whatever its persistent-grid option says.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub wave: bool,
    /// Blocks of each thread-block cluster the kernel is compiled for (`__cluster_dims__`; 0:
    /// none): a persistent grid of such a kernel is a wave of whole resident clusters.
    #[serde(skip_serializing_if = "is_zero")]
    pub cluster: u32,
    /// The launch of the source's Hopper path: on a device of compute capability 9.0 the
    /// runtime compiles the source for `sm_90a` (whose feature macro selects that path, e.g.
    /// attention on wgmma, or a row kernel's rows spread over clusters of blocks, whose grid
    /// is whole clusters and never persistent) and launches it with this shape instead;
    /// elsewhere the source compiles to its portable path, launched as above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm90a: Option<Box<Launch>>,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// What a kernel argument is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgRole {
    /// A tensor the kernel reads.
    Read,
    /// A tensor the kernel writes.
    Write,
    /// Scratch memory owned by the kernel.
    Workspace,
}

/// One pointer argument of a kernel, in launch order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelArg {
    /// The tensor's name (or the workspace's).
    pub name: String,
    pub role: ArgRole,
    /// Element type of a tensor; `None` for workspace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<DType>,
    pub shape: Vec<usize>,
    pub bytes: u64,
    /// Workspace that must be zero before the first launch (the kernel leaves it zero).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub zeroed: bool,
}

/// A kernel rendered as CUDA, with how to launch it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelSource {
    /// The `extern "C"` function name: `{template}_{dtype}_k{id}` (`scatter_{dtype}_k{id}` for a
    /// scatter kernel).
    pub name: String,
    /// The plan kernel's id.
    pub kernel: usize,
    pub template: Template,
    /// The file name `write_codegen_dir` gives it.
    pub file: String,
    #[serde(skip)]
    pub source: String,
    pub launch: Launch,
    pub args: Vec<KernelArg>,
    /// A gemm kernel run as one cuBLASLt call instead of generated CUDA (then `source` is
    /// empty, `file` too, and `launch` is unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cublaslt: Option<cublaslt::LtCall>,
    /// Whether the last bits of its results depend on the order its blocks run (f32 atomics:
    /// attention's query gradient beside the key and value gradients, a scatter_add of float
    /// values); never under strict numerics.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub scheduled_sums: bool,
}

impl KernelSource {
    /// Whether the launch does no work (an empty iteration space).
    pub fn is_empty(&self) -> bool {
        self.launch.grid.contains(&0)
    }
}

/// Renders every kernel of a plan, in plan order. Errors name the kernel (for example a gemm
/// kernel, whose code generation is not supported yet).
pub fn codegen_plan(plan: &FusionPlan) -> Result<Vec<KernelSource>> {
    plan.kernels.iter().map(|k| codegen_kernel(plan, k)).collect()
}

/// Whether code generation runs kernels of this template at all.
pub fn generates(t: Template) -> bool {
    matches!(
        t,
        Template::Elementwise | Template::RowReduce | Template::ColReduce | Template::Gemm | Template::Attention
    )
}

/// Whether generated kernels of this template load 1-bit masks (a saved bool tensor packed 32
/// elements to a word, `memory.rs`): every template whose reads go through the shared emitter
/// (`emit.rs`: a bit test per element). Attention reads no masks; a gemm kernel loads one only
/// in its generated implementation (its epilogue), never as a cuBLASLt call.
pub fn loads_masks(t: Template) -> bool {
    matches!(t, Template::Elementwise | Template::RowReduce | Template::ColReduce | Template::Gemm)
}

/// Whether generated kernels of this template store 1-bit masks: the elementwise template, and
/// the generated gemm's elementwise epilogue where the product's width is a multiple of 32
/// (`gemm::stores_masks_shaped`), for a mask the size of the iteration space (a warp assembles
/// its words from its lanes' bits, `eq_put_bits` in `kernels/common.cuh`). A mask written by any
/// other kernel stays one byte per element (`optimize.rs`).
pub fn stores_masks(t: Template) -> bool {
    matches!(t, Template::Elementwise | Template::Gemm)
}

/// A kernel as the 1-bit mask rule sees it: its template, whether it runs as a cuBLASLt call,
/// its iteration space, and whether a gemm kernel's epilogue reduces rows.
#[derive(Clone, Copy, Debug)]
pub struct MaskSite<'a> {
    pub template: Template,
    pub cublaslt: bool,
    pub domain: &'a [usize],
    pub reduces_rows: bool,
}

/// How a kernel touches a 1-bit mask: loads it, or stores one of this shape.
#[derive(Clone, Copy, Debug)]
pub enum MaskAccess<'a> {
    Load,
    Store(&'a [usize]),
}

/// Why a kernel cannot touch a 1-bit mask as asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskRefusal {
    /// The template (or a cuBLASLt call) does not load masks.
    Load,
    /// The template (or a cuBLASLt call) does not store masks.
    Store,
    /// The mask is not the size of the iteration space.
    Shape,
    /// The generated gemm's epilogue cannot store this one (`gemm::stores_masks_shaped`).
    Gemm(&'static str),
}

/// Whether generated kernels of `site` can touch a 1-bit mask as `access` says: loads by
/// templates that [`loads_masks`], stores by templates that [`stores_masks`] of a mask the size
/// of the iteration space (a gemm's only from an elementwise epilogue of a width that is a
/// multiple of 32), never by a cuBLASLt call. Kernels codegen does not generate touch nothing
/// it refuses. Code generation refuses a kernel by this rule ([`packed_mask_refusal`]) and the
/// planner packs a mask only where it holds (`caps::mask_refusal`).
pub fn mask_refusal(site: &MaskSite, access: MaskAccess) -> Option<MaskRefusal> {
    let t = site.template;
    if !generates(t) {
        return None;
    }
    match access {
        MaskAccess::Load => (!loads_masks(t) || site.cublaslt).then_some(MaskRefusal::Load),
        MaskAccess::Store(_) if !stores_masks(t) || site.cublaslt => Some(MaskRefusal::Store),
        MaskAccess::Store(shape) if shape != site.domain => Some(MaskRefusal::Shape),
        MaskAccess::Store(_) if t == Template::Gemm => {
            gemm::stores_masks_shaped(site.domain, site.reduces_rows).err().map(MaskRefusal::Gemm)
        }
        MaskAccess::Store(_) => None,
    }
}

/// Why codegen cannot run kernel `k` with its packed reads and writes, if it cannot: the first
/// packed read and the first packed write, by [`mask_refusal`].
pub fn packed_mask_refusal(plan: &FusionPlan, k: &Kernel) -> Option<String> {
    if !generates(k.template) {
        return None;
    }
    let what = |t: &str, how: &str| {
        format!(
            "kernel {} ({}): `{t}` is a 1-bit mask (a bool tensor stored 32 elements to a word), which generated {} \
             kernels do not {how}",
            k.id,
            k.template.name(),
            k.template.name()
        )
    };
    let site = MaskSite {
        template: k.template,
        cublaslt: k.implementation == Some(crate::plan::GemmImpl::Cublaslt),
        domain: &k.domain,
        reduces_rows: k.template == Template::Gemm && gemm::reduces(k),
    };
    if let Some(t) = k.reads.iter().find(|t| plan.is_packed(&t.name)) {
        if mask_refusal(&site, MaskAccess::Load).is_some() {
            return Some(what(&t.name, "load"));
        }
    }
    if let Some(t) = k.writes.iter().find(|t| plan.is_packed(&t.name)) {
        match mask_refusal(&site, MaskAccess::Store(&t.ty.shape))? {
            MaskRefusal::Load | MaskRefusal::Store => return Some(what(&t.name, "store")),
            MaskRefusal::Shape => return Some(what(&t.name, "store in another shape than their iteration space")),
            MaskRefusal::Gemm(why) => {
                return Some(format!("kernel {} (gemm): cannot store the 1-bit mask `{}`: {why}", k.id, t.name))
            }
        }
    }
    None
}

/// Renders one kernel.
pub fn codegen_kernel(plan: &FusionPlan, k: &Kernel) -> Result<KernelSource> {
    if let Some(why) = packed_mask_refusal(plan, k) {
        return Err(Error::Invalid(why));
    }
    if k.template == Template::Attention && k.kind.attention_backward_module() {
        return attention_bwd::codegen(plan, k, ATTENTION_BWD, COMMON);
    }
    if k.template == Template::Attention {
        return attention::codegen(plan, k, None, ATTENTION, COMMON);
    }
    if k.template == Template::Gemm {
        return codegen_gemm(plan, k);
    }
    let lowered = lower::lower(k)?;
    let r = emit::render(k, &lowered, plan.search.strict, &packed_names(plan))?;
    let name = emit::kernel_name(k, lowered.template);
    let (label, template) = match lowered.template {
        _ if lowered.scatter.is_some() => ("scatter", SCATTER),
        Template::Elementwise => ("elementwise", ELEMENTWISE),
        Template::RowReduce => ("rowreduce", ROWREDUCE),
        _ => ("colreduce", COLREDUCE),
    };
    // A scatter_add of float values sums in the order its atomics land.
    let scheduled_sums = lowered.scatter.as_ref().is_some_and(|s| k.writes[s.write].ty.dtype.is_float());
    let mut source = header(plan, k, label, &name, (r.shape.grid, r.shape.block), None);
    // A Hopper path (rows over clusters) is the same kernel in another shape: its defines and
    // body where the sm_90a compile's feature macro is defined, the portable ones elsewhere.
    let hopper =
        |h: &str, portable: &str| format!("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n{h}#else\n{portable}#endif\n");
    match &r.sm90a {
        Some(h) => {
            let [gx, gy, gz] = h.shape.grid;
            let [bx, by, bz] = h.shape.block;
            source.push_str(&format!(
                "// launch for sm_90a (rows over clusters of blocks): grid ({gx}, {gy}, {gz}), block ({bx}, {by}, {bz})\n"
            ));
            source.push_str(&hopper(&h.defines, &r.defines));
        }
        None => source.push_str(&r.defines),
    }
    source.push_str("\n// ---- kernels/common.cuh ----\n");
    source.push_str(COMMON);
    source.push_str("\n// ---- generated body ----\n");
    match &r.sm90a {
        Some(h) => source.push_str(&hopper(&h.body, &r.body)),
        None => source.push_str(&r.body),
    }
    source.push_str(&format!("\n// ---- kernels/{label}.cu ----\n"));
    source.push_str(template);
    let mut args = tensor_args(k, &packed_names(plan));
    // (Both paths take the same workspaces, by name: each is the larger size.)
    args.extend(r.shape.workspace.iter().map(|(n, bytes, zeroed)| {
        let other = r.sm90a.as_ref().and_then(|h| h.shape.workspace.iter().find(|w| &w.0 == n)).map_or(0, |w| w.1);
        workspace_arg(n, (*bytes).max(other), *zeroed)
    }));
    // A cluster's blocks loop over rows together: a persistent launch of it is a wave of
    // whole resident clusters (`Launch::cluster`).
    let sm90a = r.sm90a.as_ref().map(|h| {
        Box::new(Launch {
            grid: h.shape.grid,
            block: h.shape.block,
            smem_bytes: h.shape.smem_bytes,
            persistent: h.shape.wave,
            wave: h.shape.wave,
            cluster: h.shape.cluster,
            sm90a: None,
        })
    });
    Ok(KernelSource {
        file: format!("{name}.cu"),
        name,
        kernel: k.id,
        template: lowered.template,
        source,
        launch: Launch {
            grid: r.shape.grid,
            block: r.shape.block,
            smem_bytes: r.shape.smem_bytes,
            persistent: matches!(lowered.template, Template::RowReduce | Template::Elementwise),
            wave: r.shape.wave,
            cluster: r.shape.cluster,
            sm90a,
        },
        args,
        cublaslt: None,
        scheduled_sums,
    })
}

/// A gemm kernel: generated CUDA (`kernels/gemm.cu` after the rendered epilogue), or one
/// cuBLASLt call.
fn codegen_gemm(plan: &FusionPlan, k: &Kernel) -> Result<KernelSource> {
    let r = gemm::render(k, plan.search.strict, &packed_names(plan))?;
    let name = emit::kernel_name(k, Template::Gemm);
    let (file, source) = if r.call.is_some() {
        (String::new(), String::new())
    } else {
        let mut source = header(plan, k, Template::Gemm.name(), &name, (r.grid, r.block), None);
        source.push_str(&r.defines);
        source.push_str("\n// ---- kernels/common.cuh ----\n");
        source.push_str(COMMON);
        source.push_str("\n// ---- generated body ----\n");
        source.push_str(&r.body);
        source.push_str("\n// ---- kernels/gemm.cu ----\n");
        source.push_str(GEMM);
        (format!("{name}.cu"), source)
    };
    Ok(KernelSource {
        file,
        name,
        kernel: k.id,
        template: Template::Gemm,
        source,
        launch: Launch {
            grid: r.grid,
            block: r.block,
            smem_bytes: 0,
            persistent: false,
            wave: false,
            cluster: 0,
            sm90a: None,
        },
        args: {
            let mut args = tensor_args(k, &packed_names(plan));
            args.extend(r.workspace.iter().map(|(n, bytes, zeroed)| workspace_arg(n, *bytes, *zeroed)));
            args
        },
        cublaslt: r.call,
        scheduled_sums: false,
    })
}

/// A scratch buffer passed after a kernel's tensors (`zeroed`: zero before the first launch, and
/// the kernel leaves it so).
pub(crate) fn workspace_arg(name: &str, bytes: u64, zeroed: bool) -> KernelArg {
    KernelArg { name: name.into(), role: ArgRole::Workspace, dtype: None, shape: vec![], bytes, zeroed }
}

/// The tensors the plan stores 1 bit per element.
fn packed_names(plan: &FusionPlan) -> std::collections::BTreeSet<String> {
    plan.memory.saved.iter().filter(|s| s.packed).map(|s| s.name.clone()).collect()
}

/// A kernel's tensor arguments: its reads, then its writes (a packed mask takes its words' bytes).
pub(crate) fn tensor_args(k: &Kernel, packed: &std::collections::BTreeSet<String>) -> Vec<KernelArg> {
    let mut args = Vec::new();
    for (t, role) in k.reads.iter().map(|t| (t, ArgRole::Read)).chain(k.writes.iter().map(|t| (t, ArgRole::Write))) {
        args.push(KernelArg {
            name: t.name.clone(),
            role,
            dtype: Some(t.ty.dtype),
            shape: t.ty.shape.clone(),
            bytes: if packed.contains(&t.name) {
                crate::plan::memory::packed_bytes(t.ty.numel())
            } else {
                t.ty.bytes()
            },
            zeroed: false,
        });
    }
    args
}

/// The opening comment of a generated file: its kernel, template (`label`), tensors and launch
/// (`smem`: the dynamic shared memory, where the template takes some).
pub(crate) fn header(
    plan: &FusionPlan,
    k: &Kernel,
    label: &str,
    name: &str,
    (grid, block): ([u32; 3], [u32; 3]),
    smem: Option<u32>,
) -> String {
    let tensors = |ts: &[crate::plan::TensorRef]| {
        ts.iter().map(|t| format!("{} {}", t.name, t.ty)).collect::<Vec<_>>().join(", ")
    };
    let mut h = String::new();
    h.push_str(&format!(
        "// {name}: kernel {} of `{}`, generated by eqfuse codegen; do not edit.\n",
        k.id, plan.program
    ));
    h.push_str(&format!("// template: {label}; iteration space {}\n", crate::ir::lang::Dims(k.domain.clone())));
    h.push_str(&format!("// ops: {}\n", k.ops.join(" ")));
    h.push_str(&format!("// reads: {}\n", tensors(&k.reads)));
    h.push_str(&format!("// writes: {}\n", tensors(&k.writes)));
    let smem = smem.map_or(String::new(), |b| format!(", dynamic shared memory {b} bytes"));
    h.push_str(&format!(
        "// launch: grid ({}, {}, {}), block ({}, {}, {}){smem}\n",
        grid[0], grid[1], grid[2], block[0], block[1], block[2]
    ));
    h
}

/// The launch manifest of a plan: kernels in launch order with their arguments.
#[derive(Serialize)]
struct Manifest<'a> {
    schema: &'static str,
    program: &'a str,
    device: &'a str,
    arch: &'static str,
    inputs: Vec<(&'a str, String)>,
    outputs: &'a [(String, String)],
    kernels: &'a [KernelSource],
}

/// The launch manifest as JSON text.
pub fn manifest_json(plan: &FusionPlan, sources: &[KernelSource]) -> String {
    let m = Manifest {
        schema: "eqfuse.launch/1",
        program: &plan.program,
        device: &plan.device,
        arch: "sm_90",
        inputs: plan.inputs.iter().map(|t| (t.name.as_str(), t.ty.to_string())).collect(),
        outputs: &plan.outputs,
        kernels: sources,
    };
    serde_json::to_string_pretty(&m).unwrap_or_default() + "\n"
}

/// Writes one `.cu` per kernel, `plan.json` and `launch.json` into `dir` (created if needed).
/// Nothing is written if any kernel fails to render.
pub fn write_codegen_dir(plan: &FusionPlan, dir: &Path) -> Result<Vec<KernelSource>> {
    let sources = codegen_plan(plan)?;
    let io = |p: &Path, e| Error::io(p.display().to_string(), e);
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    for s in sources.iter().filter(|s| s.cublaslt.is_none()) {
        let p = dir.join(&s.file);
        std::fs::write(&p, &s.source).map_err(|e| io(&p, e))?;
    }
    let p = dir.join("plan.json");
    std::fs::write(&p, render(plan, Format::Json)).map_err(|e| io(&p, e))?;
    let p = dir.join("launch.json");
    std::fs::write(&p, manifest_json(plan, &sources)).map_err(|e| io(&p, e))?;
    Ok(sources)
}
