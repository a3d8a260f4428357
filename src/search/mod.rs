//! Finding a plan: the e-graph analysis, rules and conditions, saturation, extraction, fusion, the ILP and budgets.

pub mod analysis;
pub mod causal;
pub mod conditions;
pub mod deadline;
pub mod explain;
pub mod extract;
pub mod fuse;
pub mod ilp;
pub mod memory_fit;
pub mod native;
pub mod optimize;
pub mod residency;
pub mod rules;
pub mod saturate;
pub mod soundness;
