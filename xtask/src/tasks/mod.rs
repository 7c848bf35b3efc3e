//! The tasks that compose the layers below them: the whole test suite, lint, the demo, the
//! benchmark, fuzzing. (`setup` and `release` are tasks too, at this layer: see the layers
//! test, `xtask/tests/layers.rs`.)

pub mod bench;
pub mod demo;
pub mod fuzz;
pub mod lint;
pub mod test;
