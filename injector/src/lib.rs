//! Proxy injection.
