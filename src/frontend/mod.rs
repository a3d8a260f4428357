//! Reading programs: `.eqf` text, JSON graphs and ONNX models, and `load_program` over them.

pub mod json;
pub mod onnx;
pub mod parse;
