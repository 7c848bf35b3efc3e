//! The encoder's bytes, field by field, against the layout `nf_tables.h` and `netlink.h`
//! give (the kernel's acceptance of a whole table is `tests/tests/fallback.rs`).

use super::*;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn a_batch_is_begin_messages_end() {
    let mut batch = Batch::new(100);
    batch.new_table(NFPROTO_INET, "linkerd");
    assert_eq!(batch.acks(), 1);
    assert_eq!(batch.first_seq(), 100);
    let bytes = batch.finish();
    let messages = replies(&bytes);
    let types: Vec<u16> = messages.iter().map(|m| m.ty).collect();
    assert_eq!(types, [0x10, (10 << 8), 0x11]);
    let seqs: Vec<u32> = messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [100, 101, 102]);
    // Begin: nfgenmsg AF_UNSPEC, version 0, resource id NFNL_SUBSYS_NFTABLES big-endian.
    assert_eq!(messages[0].payload, [0, 0, 0, 10]);
    // The table: nfgenmsg inet, then NFTA_TABLE_NAME "linkerd\0" (12 bytes with its header).
    let table = messages[1].payload;
    assert_eq!(&table[..4], &[NFPROTO_INET, 0, 0, 0]);
    assert_eq!(u16_at(table, 4), 12);
    assert_eq!(u16_at(table, 6), 1);
    assert_eq!(&table[8..16], b"linkerd\0");
    // Flags: request, ack, create.
    let flags = u16_at(&bytes, 20 + 6);
    assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE);
    // Every message's length is 4-byte aligned and they tile the buffer.
    let mut at = 0;
    while at < bytes.len() {
        let len = u32_at(&bytes, at) as usize;
        assert_eq!(len % 4, 0);
        at += len;
    }
    assert_eq!(at, bytes.len());
}

#[test]
fn a_chain_carries_its_hook_priority_and_type() {
    let mut batch = Batch::new(1);
    batch.new_nat_chain(
        NFPROTO_INET,
        "t",
        &Chain {
            name: "c",
            hook: Hook::Output,
            priority: PRIORITY_DSTNAT,
        },
    );
    let bytes = batch.finish();
    let chain = &replies(&bytes)[1];
    let attrs = attrs(&chain.payload[NFGENMSG_LEN..]);
    let ty: Vec<u16> = attrs.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        ty,
        [
            NFTA_CHAIN_TABLE,
            NFTA_CHAIN_NAME,
            NFTA_CHAIN_HOOK,
            NFTA_CHAIN_POLICY,
            NFTA_CHAIN_TYPE
        ]
    );
    let hook = self::attrs(attrs[2].1);
    assert_eq!(hook[0], (NFTA_HOOK_HOOKNUM, &3u32.to_be_bytes()[..]));
    assert_eq!(hook[1], (NFTA_HOOK_PRIORITY, &(-100i32).to_be_bytes()[..]));
    assert_eq!(attrs[3].1, 1u32.to_be_bytes());
    assert_eq!(attr_string(attrs[4].1), "nat");
    // The nested flag is set on the wire (and masked off when read).
    let raw = &chain.payload[NFGENMSG_LEN..];
    // After the "t\0" and "c\0" attributes, 8 bytes each with padding: the hook's type.
    assert_eq!(u16_at(raw, 16 + 2), NFTA_CHAIN_HOOK | NLA_F_NESTED);
}

#[test]
fn a_rule_lists_its_expressions_and_reads_back() {
    let rule = Rule {
        chain: "c",
        exprs: vec![
            Expr::Meta {
                key: MetaKey::SkUid,
                dreg: REG_1,
            },
            Expr::Cmp {
                sreg: REG_1,
                op: CmpOp::Eq,
                data: 2102u32.to_ne_bytes().to_vec(),
            },
            Expr::Verdict(VERDICT_RETURN),
        ],
    };
    let mut batch = Batch::new(1);
    batch.new_rule(NFPROTO_INET, "t", &rule);
    let bytes = batch.finish();
    let msg = &replies(&bytes)[1];
    assert_eq!(msg.ty, MsgKind::NewRule.nlmsg_type());
    let object = parse_object(MsgKind::GetRule, msg.payload).expect("a rule");
    assert_eq!(
        object,
        Object::Rule {
            table: "t".into(),
            chain: "c".into(),
            exprs: vec!["meta".into(), "cmp".into(), "immediate".into()],
        }
    );
    // The verdict: NFTA_IMMEDIATE_DATA > NFTA_DATA_VERDICT > NFTA_VERDICT_CODE, -5 big-endian.
    let needle = [8, 0, 1, 0, 0xff, 0xff, 0xff, 0xfb];
    assert!(bytes.windows(needle.len()).any(|w| w == needle));
}

#[test]
fn dumps_and_replies() {
    let req = dump_request(MsgKind::GetChain, NFPROTO_INET, 9);
    assert_eq!(u32_at(&req, 0) as usize, req.len());
    assert_eq!(u16_at(&req, 4), (10 << 8) | 4);
    assert_eq!(u16_at(&req, 6), NLM_F_REQUEST | NLM_F_DUMP);
    assert_eq!(reply_type(MsgKind::GetChain), (10 << 8) | 3);
    assert_eq!(reply_type(MsgKind::GetRule), (10 << 8) | 6);
    // A truncated datagram yields the whole messages before the cut, nothing more.
    let mut two = req.clone();
    two.extend_from_slice(&req[..10]);
    assert_eq!(replies(&two).len(), 1);
    assert_eq!(error_code(&(-2i32).to_ne_bytes()), Some(-2));
    assert_eq!(error_code(&[0, 0]), None);
}
