//! linkerd-cni node agent library.
