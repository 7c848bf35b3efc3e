//! The processes the benchmark places in pods, each a subcommand of this binary: the
//! forwarding [`proxy`], the application [`server`], the [`load`] generator and the
//! redirection [`probe`].

pub mod load;
pub mod probe;
pub mod proxy;
pub mod server;
