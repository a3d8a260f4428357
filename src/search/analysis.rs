//! `ShapeAnalysis`: the e-class analysis holding shape, dtype, constant value and sign facts.
//!
//! Rule conditions ask these facts (`positive ?x`, `same-shape ?a ?b`); the extractor asks them
//! for byte counts. Invariant: sound rewrites only merge classes of equal type, so a merge of two
//! typed classes with different types is a bug in a rule; it is recorded in `conflicts` (and the
//! first class's facts kept) rather than panicking, so that a bad user rule file is reported.

use std::collections::HashMap;

use egg::{Analysis, DidMerge, EGraph, Id, Symbol};

use crate::ir::infer::{infer, Fact};
use crate::ir::lang::{Binary, Composite, Kind, Reduce, TensorLang, Unary};
use crate::ir::program::fold;
use crate::ir::types::TensorType;

/// What is known of a value's sign, for every element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sign {
    pub positive: bool,
    pub nonneg: bool,
    pub nonzero: bool,
}

impl Sign {
    pub const UNKNOWN: Sign = Sign { positive: false, nonneg: false, nonzero: false };
    pub const POSITIVE: Sign = Sign { positive: true, nonneg: true, nonzero: true };
    pub const NONNEG: Sign = Sign { positive: false, nonneg: true, nonzero: false };
    pub const NONZERO: Sign = Sign { positive: false, nonneg: false, nonzero: true };

    pub fn of_value(v: f64) -> Sign {
        Sign { positive: v > 0.0, nonneg: v >= 0.0, nonzero: v != 0.0 }
    }

    /// Both facts hold (used when two classes merge: each side's facts are true of the value).
    fn union(self, o: Sign) -> Sign {
        let positive = self.positive || o.positive;
        Sign { positive, nonneg: positive || self.nonneg || o.nonneg, nonzero: positive || self.nonzero || o.nonzero }
    }

    /// What holds of either (used for `where`, `max`/`min` and the like).
    fn meet(self, o: Sign) -> Sign {
        Sign {
            positive: self.positive && o.positive,
            nonneg: self.nonneg && o.nonneg,
            nonzero: self.nonzero && o.nonzero,
        }
    }
}

/// The facts of one e-class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassData {
    /// `None` when no node of the class type-checks (a rule instantiated out of its domain).
    pub fact: Option<Fact>,
    pub sign: Sign,
}

impl ClassData {
    pub fn ty(&self) -> Option<&TensorType> {
        self.fact.as_ref().and_then(|f| f.ty.as_ref())
    }
    pub fn konst(&self) -> Option<f64> {
        self.fact.as_ref().and_then(|f| f.konst)
    }
}

/// The analysis; it knows the program's input types.
#[derive(Clone, Debug, Default)]
pub struct ShapeAnalysis {
    pub inputs: HashMap<Symbol, TensorType>,
    /// Merges of classes with different types (a rule that is not type-preserving).
    pub conflicts: Vec<String>,
}

pub type TensorGraph = EGraph<TensorLang, ShapeAnalysis>;

impl ShapeAnalysis {
    pub fn new(inputs: impl IntoIterator<Item = (String, TensorType)>) -> ShapeAnalysis {
        ShapeAnalysis { inputs: inputs.into_iter().map(|(n, t)| (Symbol::from(n), t)).collect(), conflicts: vec![] }
    }

    /// Types one node given its children's data; `None` if it does not type-check.
    pub fn node_fact(&self, node: &TensorLang, child: impl Fn(Id) -> Option<Fact>) -> Option<Fact> {
        match node {
            TensorLang::Num(n) => Some(Fact::constant(n.value())),
            TensorLang::Var(s) => self.inputs.get(s).map(|t| Fact::tensor(t.clone())),
            TensorLang::Dims(d) => Some(Fact::dims(d.0.clone())),
            TensorLang::Type(t) => Some(Fact::dtype(*t)),
            TensorLang::Op(code, children) => {
                let facts: Vec<Fact> = children.iter().map(|&c| child(c)).collect::<Option<_>>()?;
                let args: Vec<&Fact> = facts.iter().collect();
                let inferred = infer(*code, &args).ok()?;
                let konst = if inferred.weak { fold(*code, &args) } else { None };
                Some(Fact { ty: Some(inferred.ty), weak: inferred.weak, konst, dims: None, dtype: None })
            }
        }
    }
}

fn sign_of(egraph: &TensorGraph, node: &TensorLang) -> Sign {
    let s = |i: usize| egraph[node.children_at(i)].data.sign;
    match node {
        TensorLang::Num(n) => Sign::of_value(n.value()),
        TensorLang::Op(code, ch) => match code.kind() {
            Kind::Unary(u) => match u {
                Unary::Exp | Unary::Rsqrt | Unary::Sigmoid => Sign::POSITIVE,
                Unary::Sqrt => Sign { positive: s(0).positive, ..Sign::NONNEG },
                Unary::Abs | Unary::Square => Sign { positive: s(0).nonzero, nonneg: true, nonzero: s(0).nonzero },
                Unary::Relu => Sign { positive: s(0).positive, ..Sign::NONNEG },
                Unary::Recip | Unary::Tanh | Unary::Erf => s(0),
                Unary::Neg => Sign { positive: false, nonneg: false, nonzero: s(0).nonzero },
                _ => Sign::UNKNOWN,
            },
            Kind::Binary(b) => {
                let (a, c) = (s(0), s(1));
                match b {
                    Binary::Add => Sign {
                        positive: (a.positive && c.nonneg) || (a.nonneg && c.positive),
                        nonneg: a.nonneg && c.nonneg,
                        nonzero: (a.positive && c.nonneg) || (a.nonneg && c.positive),
                    },
                    Binary::Mul if ch[0] == ch[1] => Sign { positive: a.nonzero, nonneg: true, nonzero: a.nonzero },
                    Binary::Mul | Binary::Div => Sign {
                        positive: a.positive && c.positive,
                        nonneg: a.nonneg && c.nonneg,
                        nonzero: a.nonzero && c.nonzero,
                    },
                    Binary::Pow if a.positive => Sign::POSITIVE,
                    Binary::Max => Sign {
                        positive: a.positive || c.positive,
                        nonneg: a.nonneg || c.nonneg,
                        nonzero: a.positive || c.positive,
                    },
                    Binary::Min => a.meet(c),
                    _ => Sign::UNKNOWN,
                }
            }
            Kind::Reduce(Reduce::Sum | Reduce::Mean) => Sign { nonzero: s(0).positive, ..s(0) },
            Kind::Reduce(_) => s(0),
            Kind::Where => s(1).meet(s(2)),
            Kind::Transpose | Kind::Reshape | Kind::Broadcast | Kind::Slice | Kind::Gather => s(0),
            Kind::Concat => s(0).meet(s(1)),
            Kind::Composite(Composite::Softmax) => Sign::POSITIVE,
            Kind::Dropout => Sign { positive: false, nonneg: s(0).nonneg, nonzero: false },
            _ => Sign::UNKNOWN,
        },
        _ => Sign::UNKNOWN,
    }
}

trait ChildAt {
    fn children_at(&self, i: usize) -> Id;
}

impl ChildAt for TensorLang {
    fn children_at(&self, i: usize) -> Id {
        egg::Language::children(self)[i]
    }
}

impl Analysis<TensorLang> for ShapeAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut TensorGraph, enode: &TensorLang, _id: Id) -> ClassData {
        let fact = egraph.analysis.node_fact(enode, |c| egraph[c].data.fact.clone());
        let sign = match fact.as_ref().and_then(|f| f.konst) {
            Some(v) => Sign::of_value(v),
            None if fact.is_some() => sign_of(egraph, enode),
            None => Sign::UNKNOWN,
        };
        ClassData { fact, sign }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let mut changed_a = false;
        let changed_b;
        match (&mut a.fact, b.fact) {
            (None, Some(fb)) => {
                a.fact = Some(fb);
                changed_a = true;
                changed_b = false;
            }
            (Some(_), None) => changed_b = true,
            (None, None) => changed_b = false,
            (Some(fa), Some(fb)) => {
                let differ = fa.ty != fb.ty || fa.dims != fb.dims || fa.dtype != fb.dtype;
                if differ && self.conflicts.len() < 16 {
                    self.conflicts.push(format!("{:?} merged with {:?}", fa.ty, fb.ty));
                }
                if fa.konst.is_none() && fb.konst.is_some() {
                    fa.konst = fb.konst;
                    changed_a = true;
                }
                changed_b = fb.konst.is_none() && fa.konst.is_some();
            }
        }
        let sign = a.sign.union(b.sign);
        changed_a |= sign != a.sign;
        let changed_b = changed_b || sign != b.sign;
        a.sign = sign;
        DidMerge(changed_a, changed_b)
    }

    fn modify(egraph: &mut TensorGraph, id: Id) {
        // A weak scalar constant gets its literal as a node, so `(+ 1 2)` and `3` are one class.
        let data = &egraph[id].data;
        if let Some(f) = &data.fact {
            if let (true, Some(v)) = (f.weak, f.konst) {
                let n = egraph.add(TensorLang::num(v));
                egraph.union(id, n);
            }
        }
    }
}
