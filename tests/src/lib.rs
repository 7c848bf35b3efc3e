//! Test support for linkerd-cni's tests and demos.

pub mod fake_apiserver;
