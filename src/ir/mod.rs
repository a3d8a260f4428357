//! The program IR: operators, types and shape inference, programs, scalars, tensors and strided views.

pub mod index;
pub mod infer;
pub mod lang;
pub mod layout;
pub mod program;
pub mod scalar;
pub mod tensor;
pub mod types;
