//! Checks of built binaries' ELF headers: static (no `PT_INTERP`), not position-independent,
//! for the right architecture. Every shipped binary passes through them before it is copied
//! anywhere (`dist.rs`, `release.rs`).

use std::path::Path;

use anyhow::{Context, bail};

use crate::build::target::Arch;

/// Fails unless `path` is an ELF executable that is not position-independent (`ET_EXEC`) and
/// asks for no dynamic loader (no `PT_INTERP`).
pub fn check_static(path: &Path) -> anyhow::Result<()> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    // 64-bit little-endian ELF only (the targets this project builds for).
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        bail!("{} is not a 64-bit little-endian ELF file", path.display());
    }
    const ET_EXEC: u16 = 2;
    if u16_at(16) != Some(ET_EXEC) {
        bail!(
            "{} is position-independent: build it with `cargo xtask dist`",
            path.display()
        );
    }
    if has_interp(&elf) {
        bail!(
            "{} is dynamically linked: build it with `cargo xtask dist`",
            path.display()
        );
    }
    Ok(())
}

/// Fails unless `path` is an ELF file for `arch` that asks for no dynamic loader (no
/// `PT_INTERP`): a static executable, position-independent or not.
pub fn check_static_for(path: &Path, arch: Arch) -> anyhow::Result<()> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let machine = elf.get(18..20).map(|b| u16::from_le_bytes([b[0], b[1]]));
    const EM_X86_64: u16 = 62;
    const EM_AARCH64: u16 = 183;
    let want = match arch {
        Arch::Amd64 => EM_X86_64,
        Arch::Arm64 => EM_AARCH64,
    };
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) || machine != Some(want) {
        bail!("{} is not a 64-bit ELF file for {arch}", path.display());
    }
    if has_interp(&elf) {
        bail!("{} is dynamically linked", path.display());
    }
    Ok(())
}

/// Whether a 64-bit little-endian ELF file asks for a dynamic loader (has a `PT_INTERP`
/// program header).
pub fn has_interp(elf: &[u8]) -> bool {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    const PT_INTERP: u32 = 3;
    let (phoff, phentsize, phnum) = (
        u64_at(32).unwrap_or(0) as usize,
        u16_at(54).unwrap_or(0) as usize,
        u16_at(56).unwrap_or(0) as usize,
    );
    (0..phnum).any(|i| u32_at(phoff + i * phentsize) == Some(PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_not_static() {
        // Test binaries are built PIE and dynamically linked: the check must say so.
        let me = std::env::current_exe().unwrap();
        assert!(check_static(&me).is_err());
    }

    #[test]
    fn this_test_binary_is_not_static_for_its_architecture() {
        // Test binaries are dynamically linked: the check must say so.
        let me = std::env::current_exe().unwrap();
        let host = Arch::host().unwrap();
        let err = check_static_for(&me, host).unwrap_err();
        assert!(err.to_string().contains("dynamically linked"), "{err}");
        // And the architecture is checked.
        let other = if host == Arch::Amd64 {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        let err = check_static_for(&me, other).unwrap_err();
        assert!(err.to_string().contains("not a 64-bit ELF"), "{err}");
    }
}
