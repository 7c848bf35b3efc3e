//! The running kernel's BTF (`/sys/kernel/btf/vmlinux`), read for one purpose: confirming the
//! offsets at which the `iter/tcp` program reads kernel structures
//! ([`linkerd_cni_common::ITER_KERNEL_FIELDS`]). Rust eBPF code has no CO-RE field
//! relocations, so a kernel whose `struct sock_common` put `skc_state` elsewhere would make the
//! program read the wrong byte without the verifier objecting; the agent checks first and
//! refuses to run the iterator on such a kernel.
//!
//! A small reader of the BTF wire format (header, type section, string section; the format
//! is the kernel's `include/uapi/linux/btf.h`): it indexes where each type starts and walks
//! one struct's members, including the anonymous unions and structs that hold `skc_num`.

use std::{fmt, io, path::Path};

use linkerd_cni_sys::uapi::{
    BTF_KIND_ARRAY, BTF_KIND_CONST, BTF_KIND_ENUM, BTF_KIND_ENUM64, BTF_KIND_INT, BTF_KIND_PTR,
    BTF_KIND_RESTRICT, BTF_KIND_STRUCT, BTF_KIND_TYPE_TAG, BTF_KIND_TYPEDEF, BTF_KIND_UNION,
    BTF_KIND_VOLATILE, BTF_MAGIC, btf_type_trailer,
};

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why the BTF could not answer.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read { path: String, source: io::Error },
    /// Not BTF, or cut short.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
}

/// One struct member as the kernel lays it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Byte offset from the start of the struct.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

/// A field of ours that the kernel lays out differently (or lacks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub strukt: &'static str,
    pub member: &'static str,
    /// What the program assumes: offset, size.
    pub expected: (u32, u32),
    /// What the kernel's BTF says, if it has the member at all.
    pub found: Option<Field>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (offset, size) = self.expected;
        write!(
            f,
            "{}.{}: expected {size} bytes at offset {offset}, ",
            self.strukt, self.member
        )?;
        match self.found {
            Some(found) => write!(
                f,
                "the kernel has {} bytes at offset {}",
                found.size, found.offset
            ),
            None => write!(f, "the kernel has no such member"),
        }
    }
}

/// Parsed BTF: the raw bytes and where each type starts.
pub struct Btf {
    data: Vec<u8>,
    types_start: usize,
    types_end: usize,
    strings_start: usize,
    strings_end: usize,
    /// Byte offset of type `id` at index `id - 1`.
    offsets: Vec<u32>,
}

impl Btf {
    /// Reads and indexes the BTF file at `path`.
    pub fn read(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(data)
    }

    /// Indexes BTF bytes (native byte order, as the kernel exposes its own).
    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        let short = BtfError::Malformed("cut short");
        let u16_at = |o: usize| -> Option<u16> {
            Some(u16::from_ne_bytes(data.get(o..o + 2)?.try_into().ok()?))
        };
        if u16_at(0) != Some(BTF_MAGIC) {
            return Err(BtfError::Malformed("no BTF magic"));
        }
        let word = |o: usize| read_u32(&data, o).ok_or(BtfError::Malformed("cut short"));
        let hdr_len = word(4)? as usize;
        let (type_off, type_len) = (word(8)? as usize, word(12)? as usize);
        let (str_off, str_len) = (word(16)? as usize, word(20)? as usize);
        let types_start = hdr_len + type_off;
        let types_end = types_start + type_len;
        let strings_start = hdr_len + str_off;
        let strings_end = strings_start + str_len;
        if types_end > data.len() || strings_end > data.len() {
            return Err(short);
        }
        let mut offsets = Vec::new();
        let mut at = types_start;
        while at < types_end {
            offsets.push(u32::try_from(at).map_err(|_| BtfError::Malformed("too large"))?);
            let info = word(at + 4)?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra =
                btf_type_trailer(kind, vlen).ok_or(BtfError::Malformed("unknown type kind"))?;
            at += 12 + extra;
        }
        Ok(Self {
            data,
            types_start,
            types_end,
            strings_start,
            strings_end,
            offsets,
        })
    }

    fn word(&self, o: usize) -> u32 {
        read_u32(&self.data, o).unwrap_or(0)
    }

    fn name(&self, name_off: u32) -> &[u8] {
        let start = self.strings_start + name_off as usize;
        if start >= self.strings_end {
            return b"";
        }
        let rest = &self.data[start..self.strings_end];
        let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    /// `(offset of the type record, kind, vlen, kind_flag)` of type `id`.
    fn record(&self, id: u32) -> Option<(usize, u32, usize, bool)> {
        let at = *self.offsets.get((id as usize).checked_sub(1)?)? as usize;
        debug_assert!(at >= self.types_start && at < self.types_end);
        let info = self.word(at + 4);
        Some((
            at,
            (info >> 24) & 0x1f,
            (info & 0xffff) as usize,
            info >> 31 == 1,
        ))
    }

    /// Size in bytes of type `id`, through typedefs and qualifiers.
    fn size_of(&self, id: u32, depth: u32) -> Option<u32> {
        if depth > 32 {
            return None;
        }
        let (at, kind, _, _) = self.record(id)?;
        let size_or_type = self.word(at + 8);
        match kind {
            BTF_KIND_INT | BTF_KIND_STRUCT | BTF_KIND_UNION | BTF_KIND_ENUM | BTF_KIND_ENUM64 => {
                Some(size_or_type)
            }
            BTF_KIND_PTR => Some(8),
            BTF_KIND_ARRAY => {
                let (elem, nelems) = (self.word(at + 12), self.word(at + 20));
                self.size_of(elem, depth + 1)?.checked_mul(nelems)
            }
            BTF_KIND_TYPEDEF | BTF_KIND_VOLATILE | BTF_KIND_CONST | BTF_KIND_RESTRICT
            | BTF_KIND_TYPE_TAG => self.size_of(size_or_type, depth + 1),
            _ => None,
        }
    }

    /// The struct or union that `id` names, through typedefs and qualifiers.
    fn composite(&self, id: u32, depth: u32) -> Option<u32> {
        if depth > 32 {
            return None;
        }
        let (at, kind, _, _) = self.record(id)?;
        match kind {
            BTF_KIND_STRUCT | BTF_KIND_UNION => Some(id),
            BTF_KIND_TYPEDEF | BTF_KIND_VOLATILE | BTF_KIND_CONST | BTF_KIND_RESTRICT
            | BTF_KIND_TYPE_TAG => self.composite(self.word(at + 8), depth + 1),
            _ => None,
        }
    }

    /// The member `member` of the struct named `strukt`, looking inside anonymous unions and
    /// structs as C does.
    pub fn field(&self, strukt: &str, member: &str) -> Option<Field> {
        self.member_in(self.struct_ids(&[strukt])[0]?, member, 0, 0)
    }

    /// The type ids of the structs named `names`, in one pass over the types (vmlinux has
    /// over 100,000).
    fn struct_ids(&self, names: &[&str]) -> Vec<Option<u32>> {
        let mut ids = vec![None; names.len()];
        for id in 1..=self.offsets.len() as u32 {
            let Some((at, BTF_KIND_STRUCT, _, _)) = self.record(id) else {
                continue;
            };
            let name = self.name(self.word(at));
            for (i, wanted) in names.iter().enumerate() {
                if ids[i].is_none() && name == wanted.as_bytes() {
                    ids[i] = Some(id);
                }
            }
            if ids.iter().all(Option::is_some) {
                break;
            }
        }
        ids
    }

    fn member_in(&self, id: u32, member: &str, base_bits: u32, depth: u32) -> Option<Field> {
        if depth > 8 {
            return None;
        }
        let (at, _, vlen, kind_flag) = self.record(id)?;
        for i in 0..vlen {
            let m = at + 12 + 12 * i;
            let (name_off, ty, raw) = (self.word(m), self.word(m + 4), self.word(m + 8));
            // With kind_flag, the top 8 bits are a bitfield's size: the offset is the rest.
            let bits = base_bits + if kind_flag { raw & 0x00ff_ffff } else { raw };
            let name = self.name(name_off);
            if name == member.as_bytes() {
                if !bits.is_multiple_of(8) {
                    return None;
                }
                return Some(Field {
                    offset: bits / 8,
                    size: self.size_of(ty, 0)?,
                });
            }
            if name.is_empty()
                && let Some(inner) = self.composite(ty, 0)
                && let Some(found) = self.member_in(inner, member, bits, depth + 1)
            {
                return Some(found);
            }
        }
        None
    }

    /// Every field of `fields` (struct, member, offset, size) that this BTF lays out otherwise.
    pub fn mismatches(&self, fields: &[(&'static str, &'static str, u32, u32)]) -> Vec<Mismatch> {
        let structs: Vec<&str> = fields.iter().map(|f| f.0).collect();
        let ids = self.struct_ids(&structs);
        fields
            .iter()
            .zip(ids)
            .filter_map(|(&(strukt, member, offset, size), id)| {
                let found = id.and_then(|id| self.member_in(id, member, 0, 0));
                (found != Some(Field { offset, size })).then_some(Mismatch {
                    strukt,
                    member,
                    expected: (offset, size),
                    found,
                })
            })
            .collect()
    }
}

fn read_u32(data: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(o..o + 4)?.try_into().ok()?))
}

/// Checks the fields the `iter/tcp` program reads against the running kernel's BTF at `path`
/// ([`VMLINUX_BTF`]): `Ok` when every one is where the program reads it, otherwise why not,
/// in one line.
pub fn check_iter_fields(path: &Path) -> Result<(), String> {
    let btf = Btf::read(path).map_err(|e| e.to_string())?;
    let wrong = btf.mismatches(&linkerd_cni_common::ITER_KERNEL_FIELDS);
    if wrong.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the kernel lays out what the iter/tcp program reads differently: {}",
        wrong
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One type record: name offset, kind, vlen, kind_flag, size or type, trailing words.
    type Record<'a> = (u32, u32, u32, bool, u32, &'a [u32]);

    /// A BTF blob of the given types and strings.
    fn blob(strings: &[u8], types: &[Record]) -> Vec<u8> {
        let mut t = Vec::new();
        for (name, kind, vlen, kflag, size, rest) in types {
            let info = (u32::from(*kflag) << 31) | (kind << 24) | vlen;
            for w in [*name, info, *size].iter().chain(rest.iter()) {
                t.extend_from_slice(&w.to_ne_bytes());
            }
        }
        linkerd_cni_sys::bpf::raw_btf(&t, strings)
    }

    /// `struct s { int a; union { struct { u16 x; u16 y; }; u32 z; }; volatile u8 st; }`, with
    /// the members of the inner struct laid out through an anonymous union as in
    /// `sock_common`.
    #[test]
    fn members_are_found_through_anonymous_unions_and_qualifiers() {
        //             0   2      6     8    10 12 14   17
        let strings = b"\0int\0u16\0u8\0s\0a\0x\0y\0z\0st\0";
        let (int, u16_, u8_, s, a, x, y, z, st) = (1, 5, 9, 12, 14, 16, 18, 20, 22);
        let types: &[Record] = &[
            (int, BTF_KIND_INT, 0, false, 4, &[32]),  // [1] int
            (u16_, BTF_KIND_INT, 0, false, 2, &[16]), // [2] u16
            (u8_, BTF_KIND_INT, 0, false, 1, &[8]),   // [3] u8
            (0, BTF_KIND_VOLATILE, 0, false, 3, &[]), // [4] volatile u8
            (0, BTF_KIND_STRUCT, 2, false, 4, &[x, 2, 0, y, 2, 16]), // [5] { x; y; }
            (0, BTF_KIND_UNION, 2, false, 4, &[0, 5, 0, z, 1, 0]), // [6] union { [5]; z; }
            (
                s,
                BTF_KIND_STRUCT,
                3,
                true,
                12,
                &[a, 1, 0, 0, 6, 32, st, 4, 64],
            ), // [7]
        ];
        let btf = Btf::parse(blob(strings, types)).expect("parses");
        let _ = (int, u16_, u8_);
        assert_eq!(btf.field("s", "a"), Some(Field { offset: 0, size: 4 }));
        assert_eq!(btf.field("s", "y"), Some(Field { offset: 6, size: 2 }));
        assert_eq!(btf.field("s", "z"), Some(Field { offset: 4, size: 4 }));
        assert_eq!(btf.field("s", "st"), Some(Field { offset: 8, size: 1 }));
        assert_eq!(btf.field("s", "nope"), None);
        assert_eq!(btf.field("t", "a"), None);
        let wrong = btf.mismatches(&[("s", "y", 6, 2), ("s", "st", 9, 1), ("s", "w", 0, 1)]);
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert_eq!(
            wrong[0].to_string(),
            "s.st: expected 1 bytes at offset 9, the kernel has 1 bytes at offset 8"
        );
        assert_eq!(
            wrong[1].to_string(),
            "s.w: expected 1 bytes at offset 0, the kernel has no such member"
        );
    }

    #[test]
    fn not_btf_is_an_error() {
        assert!(Btf::parse(vec![0; 64]).is_err());
        let mut cut = blob(b"\0", &[(0, BTF_KIND_INT, 0, false, 4, &[32])]);
        cut.truncate(30);
        assert!(Btf::parse(cut).is_err());
    }

    /// The running kernel lays out `sock_common`, `bpf_iter_meta` and `bpf_iter__tcp` as the
    /// program reads them (every kernel the suite runs on: the host here, 6.1 and 6.12 in
    /// `cargo xtask vmtest`).
    #[test]
    fn running_kernel_has_the_iterator_offsets() {
        let btf = Btf::read(Path::new(VMLINUX_BTF)).expect("the kernel's BTF");
        assert_eq!(
            btf.field("sock_common", "skc_num"),
            Some(Field {
                offset: 14,
                size: 2
            })
        );
        assert_eq!(
            btf.mismatches(&linkerd_cni_common::ITER_KERNEL_FIELDS),
            vec![]
        );
        check_iter_fields(Path::new(VMLINUX_BTF)).expect("offsets");
    }
}
