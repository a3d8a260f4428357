//! `Dag`: one chosen form of a program, as the fusion planner sees it.
//!
//! Extraction picks one e-node per needed e-class; the result is a DAG whose nodes are tensors
//! (or attribute leaves). The unfused baseline builds one straight from a `Program`.
//! Invariant: nodes are in topological order (children before parents) and every tensor node
//! carries its type; leaves (`Num` literals, shapes, dtypes) are never in device memory.

use egg::{Id, Language};

use crate::ir::infer::Fact;
use crate::ir::lang::{Kind, TensorLang};
use crate::ir::program::Program;
use crate::ir::types::TensorType;

/// How the planner may treat a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A literal or attribute: compiled into the kernel, never in memory.
    Leaf,
    /// A program input: always in device memory.
    Input,
    /// `reshape`, `broadcast`, `transpose`: index arithmetic in the consumer, never written
    /// unless it is an output.
    View,
    /// Everything else: computed by some kernel, written or kept on chip. This includes a
    /// *layout copy*: a view that a reshape above it cannot read in place (see `layout_copies`).
    Compute,
}

/// One node of the DAG; `node`'s children are DAG indices.
#[derive(Clone, Debug)]
pub struct DagNode {
    pub node: TensorLang,
    pub fact: Fact,
    /// A name from the program, if the value was bound to one.
    pub name: Option<String>,
    pub role: Role,
    /// The e-class this node was extracted from, when it came from an e-graph.
    pub class: Option<Id>,
}

impl DagNode {
    pub fn ty(&self) -> Option<&TensorType> {
        self.fact.ty.as_ref()
    }
    pub fn children(&self) -> impl Iterator<Item = usize> + '_ {
        self.node.children().iter().map(|&c| usize::from(c))
    }
    pub fn kind(&self) -> Option<Kind> {
        self.node.opcode().map(|c| c.kind())
    }
}

/// A chosen program form.
#[derive(Clone, Debug, Default)]
pub struct Dag {
    pub nodes: Vec<DagNode>,
    /// Program outputs in order: (output name, node).
    pub outputs: Vec<(String, usize)>,
    /// For each node, the nodes that use it (sorted, deduplicated).
    pub users: Vec<Vec<usize>>,
    /// For each node, whether it is a program output.
    pub is_output: Vec<bool>,
    /// For each node, whether it is stored 1 bit per element when written (a saved bool mask;
    /// see [`Dag::pack_masks`]). Empty: nothing is packed.
    pub packed: Vec<bool>,
}

impl Dag {
    /// Builds the DAG of a program's live nodes.
    pub fn from_program(p: &Program) -> Dag {
        let live = p.live();
        let mut map = vec![usize::MAX; p.len()];
        let mut nodes = Vec::new();
        for (i, node) in p.expr().as_ref().iter().enumerate() {
            if !live[i] {
                continue;
            }
            let id = Id::from(i);
            let n = node.clone().map_children(|c| Id::from(map[usize::from(c)]));
            map[i] = nodes.len();
            nodes.push(DagNode {
                role: role_of(&n),
                node: n,
                fact: p.fact(id).clone(),
                name: p.name(id).map(str::to_string),
                class: None,
            });
        }
        let outputs = p.outputs.iter().map(|o| (o.name.clone(), map[usize::from(o.id)])).collect();
        Dag::finish(nodes, outputs)
    }

    /// Completes a DAG from its nodes and outputs (computes users and output flags).
    pub fn finish(mut nodes: Vec<DagNode>, outputs: Vec<(String, usize)>) -> Dag {
        layout_copies(&mut nodes, &outputs);
        let (nodes, outputs) = attention_read_through_copies(nodes, outputs);
        let mut users = vec![Vec::new(); nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            for c in n.children() {
                if users[c].last() != Some(&i) {
                    users[c].push(i);
                }
            }
        }
        let mut is_output = vec![false; nodes.len()];
        for &(_, o) in &outputs {
            is_output[o] = true;
        }
        Dag { nodes, outputs, users, is_output, packed: vec![] }
    }

    /// Stores every computed bool tensor that is not a program output 1 bit per element when a
    /// kernel writes it for another ([`crate::plan::memory::packed_bytes`]): a mask saved for the
    /// backward (ReLU's `y > 0`) then moves 1/8 of its bytes, and the search weighs saving it
    /// against re-reading what it was computed from. Outputs keep their declared layout.
    pub fn pack_masks(mut self) -> Dag {
        self.packed = (0..self.nodes.len())
            .map(|i| {
                self.nodes[i].role == Role::Compute
                    && !self.is_output[i]
                    && self.nodes[i].ty().is_some_and(crate::plan::memory::packable)
            })
            .collect();
        self
    }

    /// Whether a node is stored 1 bit per element when written.
    pub fn is_packed(&self, i: usize) -> bool {
        self.packed.get(i).copied().unwrap_or(false)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Bytes of a node's tensor in device memory (0 for leaves; a packed mask's words).
    pub fn bytes(&self, i: usize) -> u64 {
        match self.nodes[i].ty() {
            Some(t) if self.is_packed(i) => crate::plan::memory::packed_bytes(t.numel()),
            Some(t) => t.bytes(),
            None => 0,
        }
    }

    /// Whether the node must be in device memory whatever the plan: inputs, and outputs that are
    /// not inputs.
    pub fn must_materialize(&self, i: usize) -> bool {
        self.nodes[i].role == Role::Input || self.is_output[i]
    }

    /// Whether the planner ever keeps this node only on chip (leaves and views are free unless
    /// they are outputs).
    pub fn is_free(&self, i: usize) -> bool {
        !self.is_output[i] && matches!(self.nodes[i].role, Role::Leaf | Role::View)
    }
}

/// The role a node plays, from its operator.
pub fn role_of(n: &TensorLang) -> Role {
    match n {
        TensorLang::Num(_) | TensorLang::Dims(_) | TensorLang::Type(_) => Role::Leaf,
        TensorLang::Var(_) => Role::Input,
        TensorLang::Op(code, _) => match code.kind() {
            Kind::Reshape | Kind::Broadcast | Kind::Transpose => Role::View,
            _ => Role::Compute,
        },
    }
}

/// Marks the views that must be written in their own layout before a reshape can read them.
///
/// Every tensor in device memory is row-major, so a chain of views over one is a set of strides,
/// except a reshape that merges or splits axes a transpose or broadcast below it has separated
/// (`reshape(transpose(o, 1, 2), [B, S, E])`): no strides describe it, and no template can
/// read it in place. The view below such a reshape becomes a computed tensor (role `Compute`):
/// the planner writes it, from a copy kernel of its own or from the kernel that computes its
/// operand where that template can store a view (attention), and charges the traffic; the
/// reshape then reads a row-major tensor. The one exception is a reshape read only as an
/// operand of attention (forward or backward), whose templates index batch axes made of several
/// factors (`ir::layout::Factored`; grouped-query keys and values). The backward kernels
/// (`attention_lse`, `attention_grad_*` and their bias forms) read a view in place where its rows
/// and columns are one stride each and (q, k, v, g) its head is contiguous with strides of
/// multiples of 8 elements; any other view they read is written first. The layouts are the code
/// generator's own, so the planner never keeps a view that codegen cannot index.
fn layout_copies(nodes: &mut [DagNode], outputs: &[(String, usize)]) {
    // Whether a node is used, and every use reads it as a tensor operand of attention (queries,
    // keys, values, bias; the backward's output gradient and statistics too), whose templates
    // index its batch axes by factors (grouped-query keys: a broadcast head axis merged with the
    // heads). An output is stored row-major, so it is not.
    let mut used = vec![false; nodes.len()];
    let mut attention_only = vec![true; nodes.len()];
    for n in nodes.iter() {
        let operands = match n.kind() {
            Some(Kind::Composite(c)) => c
                .attention_slots()
                .map(|s| s.scale)
                .or_else(|| c.attention_backward_slots().map(|s| s.tensors))
                .unwrap_or(0),
            _ => 0,
        };
        for (j, c) in n.children().enumerate() {
            used[c] = true;
            attention_only[c] &= j < operands;
        }
    }
    for &(_, o) in outputs {
        attention_only[o] = false;
    }
    let attention_only: Vec<bool> = attention_only.iter().zip(&used).map(|(&a, &u)| a && u).collect();
    loop {
        let layouts = view_layouts(nodes, &attention_only);
        // The backward kernels' operands they cannot read in place are written first.
        let mut changed = false;
        for i in 0..nodes.len() {
            let Some(slots) = (match nodes[i].kind() {
                Some(Kind::Composite(c)) => c.attention_backward_slots(),
                _ => None,
            }) else {
                continue;
            };
            let tiles = if slots.grad.is_some() { 4 } else { 2 };
            let ch: Vec<usize> = nodes[i].children().take(slots.tensors).collect();
            for (j, c) in ch.into_iter().enumerate() {
                if nodes[c].role != Role::View || layouts[c].as_ref().is_some_and(|l| backward_reads(l, j < tiles)) {
                    continue;
                }
                nodes[c].role = Role::Compute;
                changed = true;
                // The kernel writing a reshape reads its operand row-major: a transpose or
                // broadcast below it is written first as well.
                let below = nodes[c].children().next();
                if let (Some(Kind::Reshape), Some(b)) = (nodes[c].kind(), below) {
                    if nodes[b].role == Role::View && nodes[b].kind() != Some(Kind::Reshape) {
                        nodes[b].role = Role::Compute;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
}

/// Lets the attention kernel write its output once, in the layout a merge of heads needs.
///
/// Attention's output `o` (`[B, H, S, D]`) is read by the output projection as
/// `reshape(transpose(o, 1, 2), [B, S, E])`, whose transpose is a layout copy (`layout_copies`),
/// and in training by the backward's `delta` too. The attention kernel can store the copy
/// itself (its template writes through a view), but not `o` beside it: every other reader of
/// `o` would need a second kernel copying it. So the other readers read the copy back through
/// the same transpose instead (`transpose(transpose(o, 1, 2), 1, 2)` is `o`, a strided view):
/// `o` is then read only by its copy, and one kernel computes and writes both. An output `o`
/// keeps its row-major layout.
fn attention_read_through_copies(
    nodes: Vec<DagNode>,
    outputs: Vec<(String, usize)>,
) -> (Vec<DagNode>, Vec<(String, usize)>) {
    let is_output = |i: usize| outputs.iter().any(|&(_, o)| o == i);
    // (the copy, attention) pairs, each attention once.
    let mut copies: Vec<(usize, usize)> = Vec::new();
    for (t, n) in nodes.iter().enumerate() {
        let Some(x) = n.children().next() else { continue };
        let attention = matches!(nodes[x].kind(), Some(Kind::Composite(c)) if c.attention_slots().is_some());
        if n.role != Role::Compute || n.kind() != Some(Kind::Transpose) || !attention || is_output(x) {
            continue;
        }
        // (Only where no other reader is a view: those views' layouts are decided already.)
        let others: Vec<&DagNode> =
            nodes.iter().enumerate().filter(|&(u, m)| u != t && m.children().any(|c| c == x)).map(|(_, m)| m).collect();
        if !others.is_empty() && others.iter().all(|m| m.role == Role::Compute) && !copies.iter().any(|&(_, a)| a == x)
        {
            copies.push((t, x));
        }
    }
    if copies.is_empty() {
        return (nodes, outputs);
    }
    // New order: each copy (its axis literals first) and the view reading it back right after
    // its attention, so every reader that follows sees them (children before parents).
    let n = nodes.len();
    let mut map = vec![usize::MAX; n];
    let mut order: Vec<DagNode> = Vec::with_capacity(n + copies.len());
    let mut back = vec![usize::MAX; n]; // attention -> the new index of its read-back view
    let moved: Vec<usize> = copies.iter().map(|&(t, _)| t).collect();
    let push = |order: &mut Vec<DagNode>, map: &mut Vec<usize>, i: usize| {
        let node = nodes[i].node.clone().map_children(|c| Id::from(map[usize::from(c)]));
        map[i] = order.len();
        order.push(DagNode { node, ..nodes[i].clone() });
    };
    for i in 0..n {
        if moved.contains(&i) || map[i] != usize::MAX {
            continue;
        }
        // Readers of an attention with a copy read the view instead (not the copy itself).
        let node = nodes[i].node.clone().map_children(|c| {
            let c = usize::from(c);
            Id::from(if back[c] != usize::MAX && !moved.contains(&i) { back[c] } else { map[c] })
        });
        map[i] = order.len();
        order.push(DagNode { node, ..nodes[i].clone() });
        if let Some(&(t, x)) = copies.iter().find(|&&(_, x)| x == i) {
            let axes: Vec<usize> = nodes[t].children().skip(1).collect();
            for &a in &axes {
                if map[a] == usize::MAX {
                    push(&mut order, &mut map, a);
                }
            }
            push(&mut order, &mut map, t);
            let view = TensorLang::Op(
                nodes[t].node.opcode().expect("a transpose is an operator"),
                std::iter::once(map[t]).chain(axes.iter().map(|&a| map[a])).map(Id::from).collect(),
            );
            back[x] = order.len();
            order.push(DagNode { node: view, fact: nodes[x].fact.clone(), name: None, role: Role::View, class: None });
        }
    }
    let outputs = outputs.into_iter().map(|(name, o)| (name, map[o])).collect();
    (order, outputs)
}

/// Whether attention's backward kernels read a tensor of layout `l` in place: its rows and its
/// columns one stride each (a bias of lower rank broadcasts); for a tile (q, k, v, g), the head
/// contiguous and every other stride a multiple of 8 elements (16-byte loads).
/// `codegen::attention_bwd` checks the same.
fn backward_reads(l: &crate::ir::layout::Factored, tile: bool) -> bool {
    let r = l.axes.len();
    if l.axes[r.saturating_sub(2)..].iter().any(|a| a.len() > 1) {
        return false;
    }
    !tile
        || (r >= 2
            && l.axes[r - 1].iter().all(|&(_, s)| s == 1)
            && l.axes[..r - 1].iter().flatten().all(|&(_, s)| s % 8 == 0))
}

/// The layout of each view over the row-major memory of the nearest non-view node below it
/// (`None` for a node of no tensor type, or a view no layout describes); a view below a reshape
/// no layout describes is marked computed (see [`layout_copies`]), except under a reshape read
/// only by attention (`attention_only`).
fn view_layouts(nodes: &mut [DagNode], attention_only: &[bool]) -> Vec<Option<crate::ir::layout::Factored>> {
    use crate::ir::layout::Factored;
    // The layout of each view over the row-major memory of the nearest non-view node below it.
    let mut layouts: Vec<Option<Factored>> = vec![None; nodes.len()];
    for i in 0..nodes.len() {
        let Some(shape) = nodes[i].ty().map(|t| t.shape.clone()) else { continue };
        if nodes[i].role != Role::View {
            layouts[i] = Some(Factored::contiguous(&shape));
            continue;
        }
        let ch: Vec<usize> = nodes[i].children().collect();
        let Some(below) = nodes[ch[0]].ty().map(|t| t.shape.clone()) else { continue };
        let Some(base) = layouts[ch[0]].clone() else { continue };
        let konst =
            |k: usize| nodes[ch[k]].fact.konst.and_then(|v| crate::ir::infer::norm_axis(v as i64, below.len()).ok());
        layouts[i] = match nodes[i].kind() {
            Some(Kind::Transpose) => match (konst(1), konst(2)) {
                (Some(a), Some(b)) => Some(base.transpose(a, b)),
                _ => None,
            },
            Some(Kind::Broadcast) => Some(base.broadcast(&shape)),
            Some(Kind::Reshape) => match base.reshape(&shape) {
                Some(l) if l.strides().is_some() || attention_only[i] => Some(l),
                _ if nodes[ch[0]].role == Role::View => {
                    nodes[ch[0]].role = Role::Compute;
                    Factored::contiguous(&below).reshape(&shape)
                }
                _ => None,
            },
            _ => None,
        };
    }
    layouts
}
