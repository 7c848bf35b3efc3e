//! The agent's side of the wire protocol: any bytes on its socket, read as the agent reads a
//! request frame. A frame that decodes must encode again and decode to the same request (the
//! plugin and the agent agree on every message either can express), and its budget must
//! never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use linkerd_cni_proto::wire::{self, Envelope};

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = wire::read_frame::<Envelope>(&mut &data[..]) else {
        return;
    };
    let _ = envelope.agent_budget();
    // Defaults left out of the input are written out: near the limit, the frame may grow
    // past it, which the sender then refuses (never a panic).
    let bytes = match wire::encode(&envelope) {
        Ok(bytes) => bytes,
        Err(wire::FrameError::TooLarge(_)) => return,
        Err(e) => panic!("a decoded request encodes: {e}"),
    };
    let again: Envelope = wire::read_frame(&mut &bytes[..]).expect("an encoded request decodes");
    assert_eq!(again, envelope, "the request survives a round trip");
});
