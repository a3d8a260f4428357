//! Running a plan on the GPU: NVRTC, the CUDA context, cuBLASLt, memory plans and timed runs.

pub mod cublas;
pub mod gpu;
pub mod memplan;
pub mod nvrtc;
pub mod run_gpu;
