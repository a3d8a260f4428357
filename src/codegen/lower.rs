//! Lowering of one kernel's `TensorLang` body to the code generator's small typed IR.
//!
//! Views (`transpose`, `broadcast`, `reshape`) of the tensors a kernel reads become strides of
//! a memory access; composites become the stages of their decomposition (softmax: max, then
//! sum of exponentials, then the quotient; layernorm: mean, then mean of squared centred
//! values, then the normalised row). Every value is placed in the iteration space (the kernel's
//! domain) by NumPy's right-aligned broadcasting. A scatter kernel's iteration space is its
//! `scatter_add`'s values; the scatter_add itself becomes a [`Scatter`]: where each value is
//! added, not a value of the domain.
//! Invariant: lowering never changes what a kernel computes; a body it cannot express exactly
//! (a transposed view of a value computed in the same kernel, a product, an integer reduction)
//! is an error naming the op, never an approximation.

use crate::error::{Error, Result};
use crate::ir::infer::{dropout_seed, infer, norm_axis, slice_range, Fact};
use crate::ir::lang::{Binary, Composite, Kind, Reduce, TensorLang, Unary};
use crate::ir::layout::{broadcast_strides, contiguous, reshape_strides};
use crate::ir::types::{DType, TensorType};
use crate::plan::{Kernel, KernelKind, Template};

/// A load from a tensor the kernel reads: one stride per domain axis (0 where broadcast).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Index into the kernel's `reads`.
    pub read: usize,
    pub strides: Vec<usize>,
    pub dtype: DType,
}

/// An IR operation; children are indices of earlier nodes.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Const(f64),
    Load(usize),
    /// The coordinate of the element along a domain axis.
    Coord(usize),
    /// The coordinate along an axis that [`merge_axes`] merged into domain axis `axis`: that
    /// axis's coordinate divided by `inner` (the extents merged inside it), modulo `extent`.
    CoordPart {
        axis: usize,
        inner: usize,
        extent: usize,
    },
    /// A row-major flat index: the sum of coordinates times these strides.
    Flat(Vec<usize>),
    /// `iota` seen through views: the i32 sum of coordinates times these strides.
    Iota(Vec<usize>),
    Unary(Unary, usize),
    Binary(Binary, usize, usize),
    Where(usize, usize, usize),
    Cast(DType, usize),
    /// `dropout` of `x` at flat index `index` (constants from `src/reference/rng.rs`).
    Dropout {
        x: usize,
        index: usize,
        seed: Seed,
        threshold: u32,
        scale: f32,
    },
    /// A load at places computed per element (a slice at an offset, a concatenation's operand,
    /// a gather): access `access` (its strides over the domain; 0 along the axes an index
    /// replaces) from element `offset`, plus, with `index`, an i32 node's value times a stride.
    IndexLoad {
        access: usize,
        offset: usize,
        index: Option<Index>,
    },
    /// A reduction along the kernel's reduction axis.
    Reduce(Reduce, usize),
    /// A reduction of a row value over all rows (a row kernel's global result).
    Global(Reduce, usize),
}

/// Where the seed of an [`Op::Dropout`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seed {
    /// A literal seed, compiled into the kernel with its key `key0 = stream_key(seed, 0)`.
    Const { seed: u32, key0: u32 },
    /// A seed given at run time: node `node`, the i32 value of the seed tensor's one element
    /// (read as a u32), whose key the kernel computes.
    Node(usize),
}

/// The computed index of an [`Op::IndexLoad`]: node `node` (i32), taken modulo `extent` once
/// if negative (NumPy's negative indices) and then clamped into `[0, extent)`, so that no index
/// reads outside the tensor, times `stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Index {
    pub node: usize,
    pub stride: usize,
    pub extent: usize,
}

/// One IR value: its operation, element type and shape aligned to the domain's rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// A write of the kernel: the value stored and the shape (aligned to the domain) whose
/// row-major order gives the element's place in the output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Store {
    pub write: usize,
    pub node: usize,
    pub shape: Vec<usize>,
}

/// A kernel's body in IR form.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub template: Template,
    pub domain: Vec<usize>,
    /// The reduced domain axis: the last for `rowreduce`, the one leading axis for `colreduce`.
    pub axis: Option<usize>,
    pub nodes: Vec<Node>,
    pub accesses: Vec<Access>,
    pub stores: Vec<Store>,
    /// A gemm kernel's matrix product, whose value the body reads as the pseudo-tensor
    /// `product.acc` (a tile in shared memory); `None` for other templates.
    pub product: Option<Product>,
    /// Whether a sum over an axis its value is broadcast along became a product with the
    /// extent: one rounding, where the unfused plan adds the copies one by one (`--strict`
    /// refuses it, see `emit::render`).
    pub repeated_sum: bool,
    /// A scatter kernel's `scatter_add` (its one write); `None` for other kernels.
    pub scatter: Option<Scatter>,
}

/// The `scatter_add(idx, g, axis, n)` of a scatter kernel, whose iteration space is `g`'s shape:
/// node `value` (g at the element) is added at output element `offset + j * stride`, where
/// `offset` is the sum of the element's coordinates times `strides` (0 along the index axes) and
/// `j` is node `index` (i32: the index read at the element's coordinates along the index axes),
/// plus `extent` if negative; an index outside `[-extent, extent)` adds nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Scatter {
    pub value: usize,
    pub index: usize,
    pub strides: Vec<usize>,
    pub stride: usize,
    pub extent: usize,
    /// Index into the kernel's `writes`.
    pub write: usize,
    /// Whether the last axis of the iteration space is one of the output's own (the value's
    /// elements along it are added to consecutive output elements at one index), not an index
    /// axis.
    pub rows: bool,
}

/// One operand of a matrix product: a (view or slice of a) tensor the kernel reads, indexed in
/// place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operand {
    /// Index into the kernel's `reads`.
    pub read: usize,
    /// The view's shape (`[..., rows, cols]`) and its strides over the tensor's memory.
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub dtype: DType,
    /// The element of the tensor the view starts at (a slice's start; 0 otherwise).
    pub offset: usize,
}

/// The matrix product of a gemm kernel: `a [..., M, K] @ b [..., K, N]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Product {
    pub a: Operand,
    pub b: Operand,
    /// Index into the (extended) reads of the pseudo-tensor holding the product tile.
    pub acc: usize,
}

/// A view of a tensor in memory: read, shape, strides, dtype and offset.
type MappedView<'s> = (usize, &'s [usize], &'s [usize], DType, usize);

/// What a body node became.
#[derive(Clone, Debug)]
enum Slot {
    /// An attribute or a literal not used as a value.
    Attr,
    /// A (view of a) tensor read from memory, not yet loaded: strides over its own shape, from
    /// element `offset` (a slice's start; 0 otherwise).
    View { read: usize, shape: Vec<usize>, strides: Vec<usize>, dtype: DType, offset: usize },
    /// A computed value, seen through a view with shape `shape`.
    Value { node: usize, shape: Vec<usize> },
    /// `iota` (or a view of it): the i32 position `sum(coordinate * stride)`, computed per
    /// element wherever a view moves it (`reshape(iota(n), [n, 1])` is a row index).
    Iota { shape: Vec<usize>, strides: Vec<usize> },
    /// `onehot(t, n)` (or a view of it) as its two sides, views of one shape: `t` read with a
    /// class axis of stride 0 appended, and the class coordinate (an `Iota` with stride 1 on
    /// that axis alone); its value is `cast(t == class, f32)` wherever a view moves it.
    OneHot(Box<Slot>, Box<Slot>),
    /// The result of the kernel's `scatter_add`: complete only when the kernel ends, so it can
    /// only be written.
    Scatter,
}

impl Slot {
    /// The shape a value slot is seen with (None for attributes and a scatter's result).
    fn shape(&self) -> Option<&[usize]> {
        match self {
            Slot::View { shape, .. } | Slot::Value { shape, .. } | Slot::Iota { shape, .. } => Some(shape),
            Slot::OneHot(_, cls) => cls.shape(),
            Slot::Attr | Slot::Scatter => None,
        }
    }
}

/// Lowers a kernel of an elementwise, row-reduction or column-reduction template.
pub fn lower(kernel: &Kernel) -> Result<Lowered> {
    lower_with(kernel, None)
}

/// Lowers a gemm kernel whose `reads` end with the pseudo-tensor of the product tile (index
/// `acc`): the product becomes a load of that tile with row stride `tile_stride`, and the rest
/// of the body is an elementwise (or, with a reduction, a row-reduction) epilogue over it.
pub fn lower_gemm(kernel: &Kernel, acc: usize, tile_stride: usize) -> Result<Lowered> {
    lower_with(kernel, Some((acc, tile_stride)))
}

fn lower_with(kernel: &Kernel, gemm: Option<(usize, usize)>) -> Result<Lowered> {
    let mut l = Lowerer::new(kernel, gemm)?;
    let body = kernel.body.as_ref();
    let mut facts: Vec<Fact> = Vec::with_capacity(body.len());
    let mut slots: Vec<Slot> = Vec::with_capacity(body.len());
    for node in body {
        let fact = l.fact(node, &facts)?;
        let slot = l.slot(node, &fact, &facts, &slots)?;
        facts.push(fact);
        slots.push(slot);
    }
    for (w, &id) in kernel.stores.iter().enumerate() {
        if let (Slot::Scatter, Some(s)) = (&slots[usize::from(id)], l.out.scatter.as_mut()) {
            s.write = w;
            continue;
        }
        let store = l.store(w, &slots[usize::from(id)])?;
        l.out.stores.push(store);
    }
    if let Some(s) = &l.out.scatter {
        if s.write == usize::MAX || !l.out.stores.is_empty() {
            return Err(unsupported(kernel, "a scatter kernel writes its scatter_add and nothing else"));
        }
    } else if kernel.kind == KernelKind::Scatter {
        return Err(unsupported(kernel, "a scatter kernel without a scatter_add"));
    }
    // A column reduction over a unit axis reduces nothing (`reduce` passes the value through):
    // what is left is pointwise.
    if l.out.template == Template::ColReduce && l.out.axis.is_none() {
        l.out.template = Template::Elementwise;
    }
    if l.out.template == Template::Elementwise && gemm.is_none() && l.out.scatter.is_none() {
        merge_axes(&mut l.out);
    }
    Ok(l.out)
}

/// Merges adjacent axes of an elementwise kernel's iteration space wherever every access,
/// index (`Flat`, `Iota`), value and store walks the two as one axis: the outer axis's stride is
/// the inner one's times the inner extent (both 0 where broadcast), or one of the two extents
/// is 1. A coordinate of either axis becomes a part of the merged one ([`Op::CoordPart`]: a
/// quotient and a remainder). This is PyTorch's `TensorIterator::coalesce_dimensions`: it
/// changes no address, only how the flat index is split, and it lets a contiguous tensor of an
/// odd last extent (GPT-2's 50257-wide logits, ViT's 197 tokens) be read 16 bytes a lane over
/// its flat index instead of one element a lane (4-byte lanes ran at 0.79x the 16-byte ones'
/// bandwidth on an H100: 309 elementwise kernels of 20 MB or more of the held-out fidelity seed
/// 9001, 2026-11-27).
fn merge_axes(l: &mut Lowered) {
    let mut k = l.domain.len();
    while k >= 2 {
        let (a, b) = (k - 2, k - 1);
        if mergeable(l, a, b) {
            merge(l, a, b);
        }
        k -= 1;
    }
}

/// Whether axes `a` and `b = a + 1` of `l`'s iteration space can be walked as one
/// ([`merge_axes`]).
fn mergeable(l: &Lowered, a: usize, b: usize) -> bool {
    let (da, db) = (l.domain[a], l.domain[b]);
    let unit = da == 1 || db == 1;
    let strides_ok = |s: &[usize]| unit || s[a] == s[b] * db;
    // A store varies along both axes or along neither (a unit axis aside). A value may vary
    // along one only where no load or index does (a coordinate, or a value computed from one):
    // it is computed at every element of the merged axis.
    let shape_ok = |s: &[usize]| unit || (s[a] == da && s[b] == db) || (s[a] == 1 && s[b] == 1);
    l.accesses.iter().all(|acc| strides_ok(&acc.strides))
        && l.stores.iter().all(|st| shape_ok(&st.shape))
        && l.nodes.iter().all(|n| match &n.op {
            Op::Flat(s) | Op::Iota(s) => strides_ok(s),
            _ => true,
        })
}

/// Merges axes `a` and `b = a + 1` of `l`'s iteration space ([`mergeable`] holds).
fn merge(l: &mut Lowered, a: usize, b: usize) {
    let (da, db) = (l.domain[a], l.domain[b]);
    let strides = |s: &mut Vec<usize>| {
        if db != 1 {
            s[a] = s[b];
        }
        s.remove(b);
    };
    // The domain's, a store's or a value's shape: one varying along either axis varies along the
    // merged one (a store along both or neither, [`mergeable`]: the same as the product).
    let shape = |s: &mut Vec<usize>| {
        s[a] = if s[a] == 1 && s[b] == 1 { 1 } else { da * db };
        s.remove(b);
    };
    shape(&mut l.domain);
    for acc in &mut l.accesses {
        strides(&mut acc.strides);
    }
    for st in &mut l.stores {
        shape(&mut st.shape);
    }
    for n in &mut l.nodes {
        shape(&mut n.shape);
        // (A part of `b` keeps its quotient and remainder: `b`'s extent is a multiple of its
        // inner extents times its own, so the remainder modulo `db` may be dropped.)
        n.op = match n.op.clone() {
            Op::Coord(c) if c == a => Op::CoordPart { axis: a, inner: db, extent: da },
            Op::Coord(c) if c == b => Op::CoordPart { axis: a, inner: 1, extent: db },
            Op::Coord(c) if c > b => Op::Coord(c - 1),
            Op::CoordPart { axis, inner, extent } if axis == a => Op::CoordPart { axis: a, inner: inner * db, extent },
            Op::CoordPart { axis, inner, extent } if axis >= b => Op::CoordPart { axis: axis - 1, inner, extent },
            Op::Flat(mut s) => {
                strides(&mut s);
                Op::Flat(s)
            }
            Op::Iota(mut s) => {
                strides(&mut s);
                Op::Iota(s)
            }
            op => op,
        };
    }
}

struct Lowerer<'a> {
    kernel: &'a Kernel,
    out: Lowered,
    /// For a gemm kernel: the product tile's read index and row stride.
    gemm: Option<(usize, usize)>,
    /// Concatenations computed in the kernel: every read in them is clamped into its tensor, so
    /// they may be evaluated past their own extent (as the first operand of another concat).
    concats: Vec<usize>,
}

fn unsupported(kernel: &Kernel, what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("kernel {} ({}): {what}", kernel.id, kernel.template.name()))
}

fn scatter_used(kernel: &Kernel) -> Error {
    unsupported(kernel, "the result of scatter_add is complete only when its kernel ends: it is only written")
}

impl<'a> Lowerer<'a> {
    fn new(kernel: &'a Kernel, gemm: Option<(usize, usize)>) -> Result<Lowerer<'a>> {
        let template = match kernel.template {
            Template::Gemm if gemm.is_some() => epilogue_template(kernel),
            Template::Gemm | Template::Attention => {
                return Err(unsupported(
                    kernel,
                    "code generation for the attention template is not supported yet (issue 6)",
                ));
            }
            t => t,
        };
        let out = Lowered {
            template,
            domain: kernel.domain.clone(),
            axis: None,
            nodes: vec![],
            accesses: vec![],
            stores: vec![],
            product: None,
            repeated_sum: false,
            scatter: None,
        };
        Ok(Lowerer { kernel, out, gemm, concats: vec![] })
    }

    /// `a @ b` in a gemm kernel: both operands must be views (or slices) of reads; the value is
    /// the tile.
    fn product(&mut self, ch: &[usize], ty: &TensorType, slots: &[Slot]) -> Result<Slot> {
        let Some((acc, ts)) = self.gemm else {
            return Err(unsupported(self.kernel, "`@` cannot be generated by this template"));
        };
        if self.out.product.is_some() {
            return Err(unsupported(self.kernel, "two matrix products in one kernel"));
        }
        let operand = |s: &Slot| match s {
            Slot::View { read, shape, strides, dtype, offset } if shape.len() >= 2 => Ok(Operand {
                read: *read,
                shape: shape.clone(),
                strides: strides.clone(),
                dtype: *dtype,
                offset: *offset,
            }),
            _ => {
                Err(unsupported(self.kernel, "a matrix product's operands must be views or slices of tensors it reads"))
            }
        };
        let (a, b) = (operand(&slots[ch[0]])?, operand(&slots[ch[1]])?);
        self.out.product = Some(Product { a, b, acc });
        let r = ty.shape.len();
        let mut tile = ty.shape.clone();
        tile[r - 1] = ts;
        let mut strides = contiguous(&tile);
        strides[r - 1] = 1;
        Ok(Slot::View { read: acc, shape: ty.shape.clone(), strides, dtype: DType::F32, offset: 0 })
    }

    fn rank(&self) -> usize {
        self.out.domain.len()
    }

    /// The type of a body node, from its children's facts.
    fn fact(&self, node: &TensorLang, facts: &[Fact]) -> Result<Fact> {
        Ok(match node {
            TensorLang::Num(n) => Fact::constant(n.value()),
            TensorLang::Dims(d) => Fact::dims(d.0.clone()),
            TensorLang::Type(t) => Fact::dtype(*t),
            TensorLang::Var(s) => Fact::tensor(self.read_of(s.as_str())?.1.clone()),
            TensorLang::Op(code, ch) => {
                let args: Vec<&Fact> = ch.iter().map(|&c| &facts[usize::from(c)]).collect();
                let inferred = infer(*code, &args).map_err(|e| unsupported(self.kernel, e))?;
                Fact { ty: Some(inferred.ty), weak: inferred.weak, konst: None, dims: None, dtype: None }
            }
        })
    }

    fn read_of(&self, name: &str) -> Result<(usize, &TensorType)> {
        self.kernel
            .reads
            .iter()
            .position(|r| r.name == name)
            .map(|i| (i, &self.kernel.reads[i].ty))
            .ok_or_else(|| unsupported(self.kernel, format!("the body uses `{name}`, which the kernel does not read")))
    }

    /// Right-aligns a shape to the domain's rank.
    fn align(&self, shape: &[usize]) -> Result<Vec<usize>> {
        let r = self.rank();
        if shape.len() > r {
            return Err(unsupported(
                self.kernel,
                format!("a value of shape {} does not fit the iteration space", crate::ir::lang::Dims(shape.to_vec())),
            ));
        }
        let mut out = vec![1; r - shape.len()];
        out.extend_from_slice(shape);
        Ok(out)
    }

    fn push(&mut self, op: Op, dtype: DType, shape: Vec<usize>) -> usize {
        if let Some(i) = self.out.nodes.iter().position(|n| n.op == op && n.dtype == dtype && n.shape == shape) {
            return i;
        }
        self.out.nodes.push(Node { op, dtype, shape });
        self.out.nodes.len() - 1
    }

    fn slot(&mut self, node: &TensorLang, fact: &Fact, facts: &[Fact], slots: &[Slot]) -> Result<Slot> {
        match node {
            TensorLang::Num(n) => {
                let id = self.push(Op::Const(n.value()), DType::F32, vec![1; self.rank()]);
                Ok(Slot::Value { node: id, shape: vec![] })
            }
            TensorLang::Dims(_) | TensorLang::Type(_) => Ok(Slot::Attr),
            TensorLang::Var(s) => {
                let (read, ty) = self.read_of(s.as_str())?;
                let (shape, strides) = (ty.shape.clone(), contiguous(&ty.shape));
                Ok(Slot::View { read, shape, strides, dtype: ty.dtype, offset: 0 })
            }
            TensorLang::Op(code, ch) => {
                let ch: Vec<usize> = ch.iter().map(|&c| usize::from(c)).collect();
                let ty = fact.ty.clone().ok_or_else(|| unsupported(self.kernel, "an operator without a type"))?;
                self.op(code.kind(), code.name(), &ch, &ty, facts, slots)
            }
        }
    }

    fn konst(&self, facts: &[Fact], c: usize, what: &str) -> Result<f64> {
        facts[c].konst.ok_or_else(|| unsupported(self.kernel, format!("{what} must be a constant")))
    }

    fn op(
        &mut self,
        kind: Kind,
        name: &str,
        ch: &[usize],
        ty: &TensorType,
        facts: &[Fact],
        slots: &[Slot],
    ) -> Result<Slot> {
        // Views come first: a matrix product's operand may be a view of higher rank than the
        // iteration space (heads split off before the product folds them back).
        if let Kind::Transpose | Kind::Reshape | Kind::Broadcast = kind {
            return self.view(kind, ch, ty, facts, &slots[ch[0]]);
        }
        if kind == Kind::Slice {
            return self.slice(ch, ty, facts, &slots[ch[0]]);
        }
        // A scatter_add iterates over its values, and its output may have one axis more than
        // they have (a scalar index): it places itself (`scatter`), unaligned.
        if kind == Kind::ScatterAdd {
            return self.scatter(ch, ty, facts, slots);
        }
        let shape = self.align(&ty.shape)?;
        let value = |node: usize| Slot::Value { node, shape: ty.shape.clone() };
        let node = match kind {
            Kind::Unary(u) => {
                let a = self.value(&slots[ch[0]])?;
                self.push(Op::Unary(u, a), ty.dtype, shape)
            }
            Kind::Binary(b) => {
                let (a, c) = (self.value(&slots[ch[0]])?, self.value(&slots[ch[1]])?);
                self.push(Op::Binary(b, a, c), ty.dtype, shape)
            }
            Kind::Where => {
                let (c, a, b) = (self.value(&slots[ch[0]])?, self.value(&slots[ch[1]])?, self.value(&slots[ch[2]])?);
                self.push(Op::Where(c, a, b), ty.dtype, shape)
            }
            Kind::Cast => {
                let a = self.value(&slots[ch[0]])?;
                self.push(Op::Cast(ty.dtype, a), ty.dtype, shape)
            }
            Kind::Reduce(r) => {
                let axis = self.konst(facts, ch[1], "the axis of a reduction")? as i64;
                return self.reduce(r, &slots[ch[0]], axis, ty);
            }
            Kind::Iota => return Ok(Slot::Iota { shape: shape.clone(), strides: contiguous(&shape) }),
            Kind::OneHot => return self.onehot(&slots[ch[0]], ty),
            Kind::Dropout => {
                let p = self.konst(facts, ch[1], "the probability of dropout")?;
                let seed = self.seed(&facts[ch[2]], &slots[ch[2]])?;
                let x = self.value(&slots[ch[0]])?;
                let index = self.push(Op::Flat(self.flat_strides(&shape)), DType::I32, shape.clone());
                let op = Op::Dropout {
                    x,
                    index,
                    seed,
                    threshold: crate::reference::rng::dropout_threshold(p),
                    scale: crate::reference::rng::dropout_scale(p),
                };
                self.push(op, ty.dtype, shape)
            }
            Kind::Composite(c) => self.composite(c, ch, ty, facts, slots)?,
            Kind::MatMul => return self.product(ch, ty, slots),
            Kind::Transpose | Kind::Reshape | Kind::Broadcast => unreachable!("views are handled above"),
            Kind::Concat => self.concat(ch, ty, facts, slots)?,
            Kind::Gather => self.gather(ch, ty, facts, slots)?,
            Kind::ScatterAdd => unreachable!("scatter_add is handled above"),
            Kind::Slice => unreachable!("slices are handled above"),
            Kind::Grad => {
                return Err(unsupported(self.kernel, format!("`{name}` cannot be generated by this template")))
            }
        };
        Ok(value(node))
    }

    /// The seed of `dropout`: a literal, or the one element of an i32 tensor of shape `[]` or
    /// `[1]`, loaded at the same place for every element (so also into a domain of rank 0).
    fn seed(&mut self, fact: &Fact, slot: &Slot) -> Result<Seed> {
        if let Some(seed) = dropout_seed(fact).map_err(|e| unsupported(self.kernel, e))? {
            return Ok(Seed::Const { seed, key0: crate::reference::rng::stream_key(seed, 0) });
        }
        let node = match slot {
            Slot::View { read, dtype, offset, .. } => self.load(*read, &[], &[], *dtype, *offset)?,
            _ => self.value(slot)?,
        };
        Ok(Seed::Node(node))
    }

    /// Strides that give the row-major index of an element of `shape` (aligned) from domain
    /// coordinates.
    fn flat_strides(&self, shape: &[usize]) -> Vec<usize> {
        contiguous(shape).into_iter().zip(shape).map(|(s, &d)| if d == 1 { 0 } else { s }).collect()
    }

    /// The coordinate along the last axis of an aligned shape (0 when that extent is 1).
    fn coord_of(&mut self, shape: Vec<usize>, dtype: DType) -> usize {
        let r = self.rank();
        if r == 0 || shape[r - 1] == 1 {
            return self.push(Op::Const(0.0), dtype, shape);
        }
        self.push(Op::Coord(r - 1), dtype, shape)
    }

    /// `onehot(t, n)`: `t` read at the element's coordinates without the last one, compared
    /// with the last coordinate (kept as its two sides while views may move it).
    fn onehot(&mut self, t: &Slot, ty: &TensorType) -> Result<Slot> {
        let Slot::View { read, shape, strides, dtype, offset } = t else {
            return Err(unsupported(self.kernel, "onehot of a value computed in the same kernel"));
        };
        let mut s = shape.clone();
        s.push(*ty.shape.last().unwrap_or(&1));
        let mut st = strides.clone();
        st.push(0);
        let idx = Slot::View { read: *read, shape: s.clone(), strides: st, dtype: *dtype, offset: *offset };
        let mut cls = vec![0; s.len()];
        if let Some(last) = cls.last_mut() {
            *last = 1;
        }
        Ok(Slot::OneHot(Box::new(idx), Box::new(Slot::Iota { shape: s, strides: cls })))
    }

    /// A view of a view stays a view; a view of a computed value must keep every element where
    /// the kernel computes it.
    fn view(&mut self, kind: Kind, ch: &[usize], ty: &TensorType, facts: &[Fact], child: &Slot) -> Result<Slot> {
        match child {
            Slot::View { read, shape, strides, dtype, offset } => {
                let strides = self.view_strides(kind, ch, ty, facts, shape, strides, "input")?;
                Ok(Slot::View { read: *read, shape: ty.shape.clone(), strides, dtype: *dtype, offset: *offset })
            }
            Slot::Value { node, .. } => Ok(Slot::Value { node: *node, shape: ty.shape.clone() }),
            Slot::Iota { shape, strides } => {
                let strides = self.view_strides(kind, ch, ty, facts, shape, strides, "iota")?;
                Ok(Slot::Iota { shape: ty.shape.clone(), strides })
            }
            Slot::OneHot(idx, cls) => Ok(Slot::OneHot(
                Box::new(self.view(kind, ch, ty, facts, idx)?),
                Box::new(self.view(kind, ch, ty, facts, cls)?),
            )),
            Slot::Attr => Err(unsupported(self.kernel, "a view of an attribute")),
            Slot::Scatter => Err(scatter_used(self.kernel)),
        }
    }

    /// The strides of view `kind` (to `ty`'s shape) of something strided as `strides` over `shape`.
    #[allow(clippy::too_many_arguments)]
    fn view_strides(
        &self,
        kind: Kind,
        ch: &[usize],
        ty: &TensorType,
        facts: &[Fact],
        shape: &[usize],
        strides: &[usize],
        what: &str,
    ) -> Result<Vec<usize>> {
        Ok(match kind {
            Kind::Transpose => {
                let a = norm_axis(self.konst(facts, ch[1], "a transpose axis")? as i64, shape.len());
                let b = norm_axis(self.konst(facts, ch[2], "a transpose axis")? as i64, shape.len());
                let (a, b) = (a.map_err(Error::Invalid)?, b.map_err(Error::Invalid)?);
                let mut s = strides.to_vec();
                s.swap(a, b);
                s
            }
            Kind::Broadcast => broadcast_strides(shape, strides, &ty.shape),
            _ => reshape_strides(shape, strides, &ty.shape).ok_or_else(|| {
                unsupported(self.kernel, format!("a reshape of a transposed or broadcast {what} is not supported yet"))
            })?,
        })
    }

    /// The IR node holding a slot's value at each element of the domain.
    fn value(&mut self, slot: &Slot) -> Result<usize> {
        match slot {
            Slot::View { read, shape, strides, dtype, offset } => self.load(*read, shape, strides, *dtype, *offset),
            Slot::Value { node, shape } => {
                let seen = self.align(shape)?;
                if !same_places(&self.out.nodes[*node].shape, &seen) {
                    return Err(unsupported(
                        self.kernel,
                        "a reshape or transpose of a value computed in the same kernel moves its elements",
                    ));
                }
                Ok(*node)
            }
            Slot::Iota { shape, strides } => {
                let aligned = self.align(shape)?;
                let pad = aligned.len() - shape.len();
                let dom: Vec<usize> =
                    (0..aligned.len()).map(|k| if k < pad || aligned[k] == 1 { 0 } else { strides[k - pad] }).collect();
                if dom.iter().all(|&s| s == 0) {
                    return Ok(self.push(Op::Const(0.0), DType::I32, aligned));
                }
                // One axis of stride 1: that coordinate (as the row template's one-hot pick knows it).
                let moving: Vec<usize> = (0..dom.len()).filter(|&k| dom[k] != 0).collect();
                if let [d] = moving[..] {
                    if dom[d] == 1 {
                        return Ok(self.push(Op::Coord(d), DType::I32, aligned));
                    }
                }
                Ok(self.push(Op::Iota(dom), DType::I32, aligned))
            }
            Slot::OneHot(idx, cls) => {
                let (i, c) = (self.value(idx)?, self.value(cls)?);
                let shape = self.out.nodes[c].shape.clone();
                let eq = self.push(Op::Binary(Binary::Eq, i, c), DType::Bool, shape.clone());
                Ok(self.push(Op::Cast(DType::F32, eq), DType::F32, shape))
            }
            Slot::Attr => Err(unsupported(self.kernel, "an attribute used as a value")),
            Slot::Scatter => Err(scatter_used(self.kernel)),
        }
    }

    /// A load of a view; one at an offset (a slice) is an [`Op::IndexLoad`].
    fn load(&mut self, read: usize, shape: &[usize], strides: &[usize], dtype: DType, offset: usize) -> Result<usize> {
        let (a, aligned) = self.access(read, shape, strides, dtype)?;
        if offset > 0 {
            return Ok(self.push(Op::IndexLoad { access: a, offset, index: None }, dtype, aligned));
        }
        Ok(self.push(Op::Load(a), dtype, aligned))
    }

    /// The access of a view (strides over the domain) and the view's aligned shape.
    fn access(&mut self, read: usize, shape: &[usize], strides: &[usize], dtype: DType) -> Result<(usize, Vec<usize>)> {
        let aligned = self.align(shape)?;
        let pad = aligned.len() - shape.len();
        let dom: Vec<usize> =
            (0..aligned.len()).map(|k| if k < pad || aligned[k] == 1 { 0 } else { strides[k - pad] }).collect();
        let access = Access { read, strides: dom, dtype };
        let a = match self.out.accesses.iter().position(|x| *x == access) {
            Some(a) => a,
            None => {
                self.out.accesses.push(access);
                self.out.accesses.len() - 1
            }
        };
        Ok((a, aligned))
    }

    /// The node of a value that is the same at every element (a broadcast literal), if it is one.
    fn uniform(&self, slot: &Slot) -> Option<usize> {
        match slot {
            Slot::Value { node, .. } if self.out.nodes[*node].shape.iter().all(|&d| d == 1) => Some(*node),
            _ => None,
        }
    }

    /// The view of operand `k` of an index map, which must be a tensor in memory.
    fn mapped<'s>(&self, slot: &'s Slot, name: &str) -> Result<MappedView<'s>> {
        match slot {
            Slot::View { read, shape, strides, dtype, offset } => Ok((*read, shape, strides, *dtype, *offset)),
            _ => Err(unsupported(
                self.kernel,
                format!("`{name}` of a value computed in the same kernel (it needs the value in device memory)"),
            )),
        }
    }

    /// `slice(x, axis, start, stop, step)` of a view: the same tensor from a later element,
    /// with the axis' stride times the step.
    fn slice(&mut self, ch: &[usize], ty: &TensorType, facts: &[Fact], x: &Slot) -> Result<Slot> {
        if let Some(node) = self.uniform(x) {
            return Ok(Slot::Value { node, shape: ty.shape.clone() });
        }
        let (read, shape, strides, dtype, offset) = self.mapped(x, "slice")?;
        let k = |l: &Self, i: usize| l.konst(facts, ch[i], "a bound of slice").map(|v| v as i64);
        let axis = norm_axis(k(self, 1)?, shape.len()).map_err(Error::Invalid)?;
        let step = k(self, 4)?;
        let (start, _) = slice_range(shape[axis], k(self, 2)?, k(self, 3)?, step).map_err(Error::Invalid)?;
        let mut st = strides.to_vec();
        st[axis] *= step as usize;
        let offset = offset + start * strides[axis];
        Ok(Slot::View { read, shape: ty.shape.clone(), strides: st, dtype, offset })
    }

    /// The domain axis of axis `axis` of a value of rank `rank`, and its coordinate node.
    fn coord_axis(&mut self, axis: usize, rank: usize) -> usize {
        let d = axis + self.rank() - rank;
        let mut shape = vec![1; self.rank()];
        shape[d] = self.out.domain[d];
        self.push(Op::Coord(d), DType::I32, shape)
    }

    /// `concat(a, b, axis)` of two views: per element, `a` below `a`'s extent along the axis,
    /// else `b` at the coordinate less that extent (each read with its index clamped into its
    /// own extent, so the operand not chosen reads in bounds too).
    fn concat(&mut self, ch: &[usize], ty: &TensorType, facts: &[Fact], slots: &[Slot]) -> Result<usize> {
        let axis = self.konst(facts, ch[2], "the axis of concat")? as i64;
        let axis = norm_axis(axis, ty.rank()).map_err(Error::Invalid)?;
        let aligned = self.align(&ty.shape)?;
        let coord = self.coord_axis(axis, ty.rank());
        let na = facts[ch[0]].ty.as_ref().map_or(0, |t| t.shape[axis]);
        let mut loads = [0; 2];
        for (j, slot) in [&slots[ch[0]], &slots[ch[1]]].into_iter().enumerate() {
            // A value the same everywhere (a broadcast literal: the zeros a slice's gradient is
            // padded with) is used as it is.
            if let Some(node) = self.uniform(slot) {
                loads[j] = node;
                continue;
            }
            // A concat as the first operand: its elements sit at the same coordinates, and past
            // its extent it still reads in bounds (the select here never takes those values).
            if let Slot::Value { node, .. } = slot {
                if j == 0 && self.concats.contains(node) {
                    loads[j] = *node;
                    continue;
                }
            }
            let (read, shape, strides, dtype, offset) = self.mapped(slot, "concat")?;
            let mut s = strides.to_vec();
            let stride = std::mem::replace(&mut s[axis], 0);
            let (a, _) = self.access(read, &ty.shape, &s, dtype)?;
            let node = if j == 0 {
                coord
            } else {
                let c = self.push(Op::Const(na as f64), DType::I32, vec![1; self.rank()]);
                self.push(Op::Binary(Binary::Sub, coord, c), DType::I32, self.out.nodes[coord].shape.clone())
            };
            let index = Some(Index { node, stride, extent: shape[axis] });
            loads[j] = self.push(Op::IndexLoad { access: a, offset, index }, dtype, aligned.clone());
        }
        let c = self.push(Op::Const(na as f64), DType::I32, vec![1; self.rank()]);
        let first = self.push(Op::Binary(Binary::Lt, coord, c), DType::Bool, self.out.nodes[coord].shape.clone());
        let node = self.push(Op::Where(first, loads[0], loads[1]), ty.dtype, aligned);
        self.concats.push(node);
        Ok(node)
    }

    /// `gather(x, idx, axis)` of two views: the index is read at the element's coordinates
    /// along the index axes, and `x` at that index (clamped into `x`'s extent: an index out of
    /// range reads a wrong element, never outside the tensor; the CPU reference reports it).
    fn gather(&mut self, ch: &[usize], ty: &TensorType, facts: &[Fact], slots: &[Slot]) -> Result<usize> {
        if let Some(node) = self.uniform(&slots[ch[0]]) {
            return Ok(node);
        }
        let (xr, xs, xst, xd, xo) = self.mapped(&slots[ch[0]], "gather")?;
        let (xs, xst) = (xs.to_vec(), xst.to_vec());
        let idx_rank = facts[ch[1]].ty.as_ref().map_or(0, |t| t.rank());
        let axis =
            norm_axis(self.konst(facts, ch[2], "the axis of gather")? as i64, xs.len()).map_err(Error::Invalid)?;
        let zeros = |n: usize| std::iter::repeat_n(0, n);
        let index = match self.uniform(&slots[ch[1]]) {
            Some(node) => node,
            None => {
                let (ir, _, ist, id, io) = self.mapped(&slots[ch[1]], "gather")?;
                let (before, after) = (axis, xs.len() - axis - 1);
                let idx_strides: Vec<usize> = zeros(before).chain(ist.iter().copied()).chain(zeros(after)).collect();
                self.load(ir, &ty.shape, &idx_strides, id, io)?
            }
        };
        let x_strides: Vec<usize> =
            xst[..axis].iter().copied().chain(zeros(idx_rank)).chain(xst[axis + 1..].iter().copied()).collect();
        let (a, aligned) = self.access(xr, &ty.shape, &x_strides, xd)?;
        let index = Some(Index { node: index, stride: xst[axis], extent: xs[axis] });
        Ok(self.push(Op::IndexLoad { access: a, offset: xo, index }, xd, aligned))
    }

    /// `scatter_add(idx, g, axis, n)` in a scatter kernel, whose iteration space is `g`'s
    /// shape: `g`'s value at the element, the index read at the element's coordinates along the
    /// index axes (as `gather` reads it), and the output's strides over the iteration space.
    fn scatter(&mut self, ch: &[usize], ty: &TensorType, facts: &[Fact], slots: &[Slot]) -> Result<Slot> {
        if self.kernel.kind != KernelKind::Scatter || self.out.template != Template::Elementwise {
            return Err(unsupported(self.kernel, "scatter_add runs in a scatter kernel over its values"));
        }
        if self.out.scatter.is_some() {
            return Err(unsupported(self.kernel, "two scatter_adds in one kernel"));
        }
        let g = facts[ch[1]].ty.clone().ok_or_else(|| unsupported(self.kernel, "scatter_add of an attribute"))?;
        if g.shape != self.out.domain {
            return Err(unsupported(
                self.kernel,
                format!("the values {} of scatter_add are not the iteration space", crate::ir::lang::Dims(g.shape)),
            ));
        }
        let idx_rank = facts[ch[0]].ty.as_ref().map_or(0, |t| t.rank());
        let axis = norm_axis(self.konst(facts, ch[2], "the axis of scatter_add")? as i64, ty.rank())
            .map_err(Error::Invalid)?;
        let index = match self.uniform(&slots[ch[0]]) {
            Some(node) => node,
            None => {
                let (ir, _, ist, id, io) = self.mapped(&slots[ch[0]], "scatter_add")?;
                let zeros = |n: usize| std::iter::repeat_n(0, n);
                let after = g.rank() - axis - idx_rank;
                let strides: Vec<usize> = zeros(axis).chain(ist.iter().copied()).chain(zeros(after)).collect();
                self.load(ir, &g.shape, &strides, id, io)?
            }
        };
        let value = self.value(&slots[ch[1]])?;
        let out = contiguous(&ty.shape);
        let strides: Vec<usize> = (0..g.rank())
            .map(|k| match k {
                _ if g.shape[k] == 1 => 0,
                _ if k < axis => out[k],
                _ if k < axis + idx_rank => 0,
                _ => out[k + 1 - idx_rank],
            })
            .collect();
        self.out.scatter = Some(Scatter {
            value,
            index,
            strides,
            stride: out[axis],
            extent: ty.shape[axis],
            write: usize::MAX,
            rows: axis + idx_rank < g.rank(),
        });
        Ok(Slot::Scatter)
    }

    fn reduce(&mut self, r: Reduce, x: &Slot, axis: i64, ty: &TensorType) -> Result<Slot> {
        let xv = self.value(x)?;
        let xshape = self.out.nodes[xv].shape.clone();
        let in_rank = x.shape().map_or(0, <[usize]>::len);
        let a = norm_axis(axis, in_rank).map_err(Error::Invalid)? + self.rank() - in_rank;
        if xshape[a] == 1 {
            // The value is the same all along the axis (it is broadcast there, or the axis has
            // one element): its max, min and mean are the value, its sum the value times the
            // axis' extent.
            let n = x.shape().map_or(1, |shape| shape[a + in_rank - self.rank()]);
            if r == Reduce::Sum && n > 1 {
                let dtype = self.out.nodes[xv].dtype;
                let c = self.push(Op::Const(n as f64), DType::F32, vec![1; self.rank()]);
                let node = self.push(Op::Binary(Binary::Mul, xv, c), dtype, xshape);
                self.out.repeated_sum = true;
                return Ok(Slot::Value { node, shape: ty.shape.clone() });
            }
            return Ok(Slot::Value { node: xv, shape: ty.shape.clone() });
        }
        let node = self.reduction(r, xv, a)?;
        Ok(Slot::Value { node, shape: ty.shape.clone() })
    }

    /// A reduction of node `x` along domain axis `a` (which has extent above 1).
    fn reduction(&mut self, r: Reduce, x: usize, a: usize) -> Result<usize> {
        let dtype = self.out.nodes[x].dtype;
        if !dtype.is_float() {
            return Err(unsupported(self.kernel, format!("a reduction of {dtype} values is not supported yet")));
        }
        let want = match self.out.template {
            Template::RowReduce => self.rank() - 1,
            Template::ColReduce => *self.out.axis.get_or_insert(a),
            _ => return Err(unsupported(self.kernel, "a reduction in an elementwise kernel")),
        };
        if a != want {
            return Err(unsupported(
                self.kernel,
                format!("a reduction along axis {a} in a kernel that reduces along axis {want}"),
            ));
        }
        // The template reduces along the iteration space's own extent: a value whose extent
        // there differs (a gemm epilogue summing a read of another shape, such as a transposed
        // read over the product's K) has no loop to run on.
        let (have, span) = (self.out.nodes[x].shape[a], self.out.domain[a]);
        if have != span {
            return Err(unsupported(
                self.kernel,
                format!("a reduction over {have} elements along an axis of the iteration space with {span}"),
            ));
        }
        self.out.axis = Some(want);
        let mut shape = self.out.nodes[x].shape.clone();
        shape[a] = 1;
        Ok(self.push(Op::Reduce(r, x), dtype, shape))
    }

    fn composite(
        &mut self,
        c: Composite,
        ch: &[usize],
        ty: &TensorType,
        facts: &[Fact],
        slots: &[Slot],
    ) -> Result<usize> {
        let x = self.value(&slots[ch[0]])?;
        let last = self.rank().checked_sub(1).ok_or_else(|| unsupported(self.kernel, "a composite of a scalar"))?;
        if let Composite::Softmax | Composite::LogSoftmax = c {
            let axis = self.konst(facts, ch[1], "the axis of softmax")? as i64;
            let a = norm_axis(axis, ty.rank()).map_err(Error::Invalid)? + self.rank() - ty.rank();
            if a != last {
                return Err(unsupported(self.kernel, "softmax over an axis other than the last is not supported yet"));
            }
        }
        let full = self.out.nodes[x].shape.clone();
        let mut b = Builder { l: self, dtype: ty.dtype, full };
        match c {
            Composite::Softmax | Composite::LogSoftmax => {
                let m = b.reduce(Reduce::Amax, x, last)?;
                let d = b.bin(Binary::Sub, x, m);
                let e = b.un(Unary::Exp, d);
                let s = b.reduce(Reduce::Sum, e, last)?;
                Ok(if c == Composite::Softmax {
                    b.bin(Binary::Div, e, s)
                } else {
                    let ls = b.un(Unary::Log, s);
                    b.bin(Binary::Sub, d, ls)
                })
            }
            Composite::LayerNorm => {
                let (g, beta) = (b.l.value(&slots[ch[1]])?, b.l.value(&slots[ch[2]])?);
                let eps = b.l.konst(facts, ch[3], "the epsilon of layernorm")?;
                let mu = b.reduce(Reduce::Mean, x, last)?;
                let xc = b.bin(Binary::Sub, x, mu);
                let sq = b.bin(Binary::Mul, xc, xc);
                let var = b.reduce(Reduce::Mean, sq, last)?;
                let rstd = b.rsqrt_plus(var, eps);
                let n = b.bin(Binary::Mul, xc, rstd);
                let s = b.bin(Binary::Mul, n, g);
                Ok(b.bin(Binary::Add, s, beta))
            }
            Composite::RmsNorm => {
                let g = b.l.value(&slots[ch[1]])?;
                let eps = b.l.konst(facts, ch[2], "the epsilon of rmsnorm")?;
                let sq = b.bin(Binary::Mul, x, x);
                let ms = b.reduce(Reduce::Mean, sq, last)?;
                let rstd = b.rsqrt_plus(ms, eps);
                let n = b.bin(Binary::Mul, x, rstd);
                Ok(b.bin(Binary::Mul, n, g))
            }
            Composite::CrossEntropy => b.cross_entropy(x, &slots[ch[1]]),
            Composite::Attention
            | Composite::AttentionBias
            | Composite::AttentionLse
            | Composite::AttentionGrad(_)
            | Composite::AttentionBiasLse
            | Composite::AttentionBiasGrad(_)
            | Composite::AttentionDropout
            | Composite::AttentionBiasDropout
            | Composite::AttentionDropoutGrad(_)
            | Composite::AttentionBiasDropoutGrad(_) => {
                Err(unsupported(b.l.kernel, "attention is generated by its own template (issue 6)"))
            }
        }
    }

    /// A write of a slot: loads are materialized; a computed value is stored in the row-major
    /// order of its own shape when a reshape moved it, else of the shape it is seen with.
    fn store(&mut self, write: usize, slot: &Slot) -> Result<Store> {
        let (node, seen) = match slot {
            Slot::View { .. } | Slot::Iota { .. } | Slot::OneHot(..) => {
                (self.value(slot)?, slot.shape().unwrap_or_default().to_vec())
            }
            Slot::Value { node, shape } => (*node, shape.clone()),
            Slot::Attr => return Err(unsupported(self.kernel, "a write of an attribute")),
            Slot::Scatter => return Err(scatter_used(self.kernel)),
        };
        let seen = self.align(&seen)?;
        let own = self.out.nodes[node].shape.clone();
        let shape = if same_places(&own, &seen) { seen } else { own };
        let numel: usize = shape.iter().product();
        if numel != self.kernel.writes[write].ty.numel() {
            return Err(unsupported(
                self.kernel,
                format!("write `{}` does not match its value", self.kernel.writes[write].name),
            ));
        }
        Ok(Store { write, node, shape })
    }
}

/// The template whose functions run a gemm kernel's epilogue: row reduction when the body
/// reduces (a row softmax of a narrow product), elementwise otherwise.
pub fn epilogue_template(kernel: &Kernel) -> Template {
    let reduces = kernel.body.as_ref().iter().any(|n| match n {
        TensorLang::Op(code, _) => reduces_rows_op(code.kind()),
        _ => false,
    });
    if reduces {
        Template::RowReduce
    } else {
        Template::Elementwise
    }
}

/// Whether an operator in a gemm kernel's body makes its epilogue the row form: a reduction or
/// a composite (which lowers to reductions along the last axis).
pub fn reduces_rows_op(kind: Kind) -> bool {
    matches!(kind, Kind::Reduce(_) | Kind::Composite(_))
}

/// Whether a value of aligned shape `own`, seen with aligned shape `seen`, keeps each element
/// at the same domain coordinates (true for broadcasts and for reshapes that only add or drop
/// size-1 axes in place).
fn same_places(own: &[usize], seen: &[usize]) -> bool {
    own.iter().zip(seen).all(|(&a, &b)| a == b || a == 1)
}

/// Helpers for expanding composites into IR nodes of one dtype.
struct Builder<'l, 'a> {
    l: &'l mut Lowerer<'a>,
    dtype: DType,
    full: Vec<usize>,
}

impl Builder<'_, '_> {
    fn shape_of(&self, a: usize, b: usize) -> Vec<usize> {
        let (x, y) = (&self.l.out.nodes[a].shape, &self.l.out.nodes[b].shape);
        x.iter().zip(y).map(|(&p, &q)| p.max(q)).collect()
    }
    fn bin(&mut self, op: Binary, a: usize, b: usize) -> usize {
        let shape = self.shape_of(a, b);
        self.l.push(Op::Binary(op, a, b), self.dtype, shape)
    }
    fn un(&mut self, op: Unary, a: usize) -> usize {
        let shape = self.l.out.nodes[a].shape.clone();
        self.l.push(Op::Unary(op, a), self.dtype, shape)
    }
    fn reduce(&mut self, r: Reduce, x: usize, axis: usize) -> Result<usize> {
        if self.full[axis] == 1 {
            return Ok(x);
        }
        self.l.reduction(r, x, axis)
    }
    /// `cross_entropy(x, t)`: per row `log(sum(exp(x - max))) + max - x[t]`, then the mean over
    /// rows. The kernel becomes a row kernel with one global result.
    fn cross_entropy(&mut self, x: usize, t: &Slot) -> Result<usize> {
        let Slot::View { read, shape, strides, dtype, offset } = t else {
            return Err(unsupported(self.l.kernel, "cross_entropy targets computed in the same kernel"));
        };
        let last = self.full.len() - 1;
        self.l.out.template = Template::RowReduce;
        let (mut ts, mut tst) = (shape.clone(), strides.clone());
        ts.push(1);
        tst.push(0);
        let target = self.l.load(*read, &ts, &tst, *dtype, *offset)?;
        let col = self.l.coord_of(self.full.clone(), DType::I32);
        let hit = self.l.push(Op::Binary(Binary::Eq, col, target), DType::Bool, self.full.clone());
        let zero = self.l.push(Op::Const(0.0), DType::F32, vec![1; self.full.len()]);
        let x_at_t = self.l.push(Op::Where(hit, x, zero), self.dtype, self.full.clone());
        let picked = self.reduce(Reduce::Sum, x_at_t, last)?;
        let m = self.reduce(Reduce::Amax, x, last)?;
        let d = self.bin(Binary::Sub, x, m);
        let e = self.un(Unary::Exp, d);
        let s = self.reduce(Reduce::Sum, e, last)?;
        let ls = self.un(Unary::Log, s);
        let lse = self.bin(Binary::Add, ls, m);
        let loss = self.bin(Binary::Sub, lse, picked);
        Ok(self.l.push(Op::Global(Reduce::Mean, loss), self.dtype, vec![1; self.full.len()]))
    }

    fn rsqrt_plus(&mut self, v: usize, eps: f64) -> usize {
        let e = self.l.push(Op::Const(eps), DType::F32, vec![1; self.full.len()]);
        let s = self.bin(Binary::Add, v, e);
        self.un(Unary::Rsqrt, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_strides_of_contiguous_and_transposed_views() {
        assert_eq!(reshape_strides(&[4, 6], &[6, 1], &[2, 2, 6]), Some(vec![12, 6, 1]));
        assert_eq!(reshape_strides(&[4, 6], &[6, 1], &[24]), Some(vec![1]));
        // A transposed [6, 4] view of a contiguous [4, 6] tensor cannot be flattened by strides.
        assert_eq!(reshape_strides(&[6, 4], &[1, 6], &[24]), None);
        // Adding a unit axis to a transposed view works.
        assert_eq!(reshape_strides(&[6, 4], &[1, 6], &[6, 1, 4]).map(|s| (s[0], s[2])), Some((1, 6)));
    }

    #[test]
    fn broadcast_of_a_view() {
        assert_eq!(broadcast_strides(&[1, 5], &[5, 1], &[3, 4, 5]), vec![0, 0, 1]);
    }
}
