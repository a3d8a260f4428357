//! Tools over the pipeline: calibration, benchmarks and random program generators.

pub mod bench;
pub mod calibrate;
pub mod gen_program;
pub mod generate;
