//! Pod-setup scale pieces: the machine's exec floor (a minimal static binary spawned exactly
//! as the plugin is) and where the agent's memory goes (`/proc/<pid>/smaps`).

use std::{
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::Context;
use linkerd_cni_tests::names::TempDir;
use serde::{Deserialize, Serialize};

/// Pods the full run fills the node with (the agent gets maps for them: `--max-pods`).
pub const FULL_PODS: usize = 10_000;
/// The agent's `--max-pods` in the benchmark: room for [`FULL_PODS`] and the samples.
pub const BENCH_MAX_PODS: u32 = 12_288;

/// An x86-64 ELF executable of 151 bytes that reads its stdin to the end and exits 0, as the
/// least a CNI plugin must do: no dynamic loader, no libc, one page. Spawning it as the plugin
/// is spawned is the least any plugin can cost on this machine.
fn minimal_elf() -> Option<Vec<u8>> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    const BASE: u64 = 0x40_0000;
    const CODE: [u8; 31] = [
        0x31, 0xc0, // again: xor eax, eax (read)
        0x31, 0xff, // xor edi, edi (stdin)
        0x48, 0x89, 0xe6, // mov rsi, rsp (into the stack: argv and env are not used)
        0xba, 0x00, 0x02, 0, 0, // mov edx, 512
        0x0f, 0x05, // syscall
        0x48, 0x85, 0xc0, // test rax, rax
        0x7f, 0xed, // jg again
        0xb8, 0x3c, 0, 0, 0, // mov eax, 60 (exit)
        0x31, 0xff, // xor edi, edi
        0x0f, 0x05, // syscall
        0x90, 0x90, 0x90, // (padding)
    ];
    let size = (64 + 56 + CODE.len()) as u64;
    let mut e = Vec::with_capacity(size as usize);
    e.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&(BASE + 120).to_le_bytes()); // entry
    e.extend_from_slice(&64u64.to_le_bytes()); // program headers
    e.extend_from_slice(&0u64.to_le_bytes()); // no sections
    e.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 1, 0, 0, 0] {
        e.extend_from_slice(&v.to_le_bytes());
    }
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // R+X
    for v in [0, BASE, BASE, size, size, 0x1000] {
        e.extend_from_slice(&v.to_le_bytes());
    }
    e.extend_from_slice(&CODE);
    Some(e)
}

/// The minimal binary, written to a scratch directory.
pub struct ExecFloor {
    path: PathBuf,
    _dir: TempDir,
}

impl ExecFloor {
    /// `None` on architectures without the hand-made binary.
    pub fn new() -> anyhow::Result<Option<Self>> {
        let Some(elf) = minimal_elf() else {
            return Ok(None);
        };
        let dir = TempDir::new()?;
        let path = dir.path().join("exit0");
        std::fs::write(&path, elf)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(Some(Self { path, _dir: dir }))
    }

    /// Spawn to exit, as [`crate::node::Cni::invoke`] runs the plugin: cleared environment
    /// with the CNI variables, the network configuration (`stdin`, as many bytes) written to
    /// a pipe, stdout and stderr read to the end. ms.
    pub fn once(&self, stdin: &[u8]) -> anyhow::Result<f64> {
        let t0 = Instant::now();
        let mut child = Command::new(&self.path)
            .env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "exec-floor")
            .env("CNI_NETNS", "/run/netns/exec-floor")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env("CNI_ARGS", "IgnoreUnknown=1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {}", self.path.display()))?;
        if let Some(mut s) = child.stdin.take() {
            s.write_all(stdin)?;
        }
        let out = child.wait_with_output()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(
            out.status.success(),
            "the minimal binary failed: {}",
            out.status
        );
        Ok(ms)
    }
}

/// Where a process's resident memory is, from `/proc/<pid>/smaps`, KiB.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemBreakdown {
    pub rss_kib: u64,
    /// `[heap]` (the main malloc arena).
    pub heap_kib: u64,
    /// Anonymous mappings: other malloc arenas, thread stacks, runtime buffers.
    pub anon_mmap_kib: u64,
    /// The agent binary's pages (text, read-only data with the embedded eBPF object).
    pub binary_kib: u64,
    /// Shared libraries and other files.
    pub libs_kib: u64,
    /// `[stack]`, `[vdso]` and the like.
    pub other_kib: u64,
    pub threads: u64,
}

impl MemBreakdown {
    pub fn of(pid: u32) -> anyhow::Result<Self> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
        let mut m = Self::default();
        let mut name = String::new();
        for line in smaps.lines() {
            let mut parts = line.split_whitespace();
            let first = parts.next().unwrap_or_default();
            if first.contains('-') && !first.ends_with(':') {
                // A mapping header: range perms offset dev inode [name].
                name = parts.nth(4).unwrap_or_default().to_string();
                continue;
            }
            if first != "Rss:" {
                continue;
            }
            let kib: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            m.rss_kib += kib;
            let slot = if name == "[heap]" {
                &mut m.heap_kib
            } else if name.is_empty() {
                &mut m.anon_mmap_kib
            } else if Path::new(&name) == exe {
                &mut m.binary_kib
            } else if name.starts_with('/') {
                &mut m.libs_kib
            } else {
                &mut m.other_kib
            };
            *slot += kib;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        m.threads = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimal_binary_runs_and_exits_0() {
        let Some(floor) = ExecFloor::new().expect("write") else {
            return;
        };
        let ms = floor.once(b"{}").expect("spawn");
        assert!(ms > 0.0 && ms < 1000.0, "{ms}");
    }

    #[test]
    fn smaps_of_this_process_adds_up() {
        let m = MemBreakdown::of(std::process::id()).expect("smaps");
        assert!(m.rss_kib > 0 && m.binary_kib > 0 && m.threads >= 1, "{m:?}");
        assert_eq!(
            m.rss_kib,
            m.heap_kib + m.anon_mmap_kib + m.binary_kib + m.libs_kib + m.other_kib
        );
    }
}
