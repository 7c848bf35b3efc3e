//! Node installer.
