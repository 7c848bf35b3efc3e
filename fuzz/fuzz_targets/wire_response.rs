//! The plugin's side of the wire protocol: any bytes from the agent's socket, read as the
//! plugin reads a response frame. A frame that decodes must encode again and decode to the
//! same response, and the plugin's handling of it is exercised by `plugin_cni`
//! (`FUZZ_AGENT`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use linkerd_cni_proto::wire::{self, Response};

fuzz_target!(|data: &[u8]| {
    let Ok(response) = wire::read_frame::<Response>(&mut &data[..]) else {
        return;
    };
    // Defaults left out of the input are written out: near the limit, the frame may grow
    // past it, which the sender then refuses (never a panic).
    let bytes = match wire::encode(&response) {
        Ok(bytes) => bytes,
        Err(wire::FrameError::TooLarge(_)) => return,
        Err(e) => panic!("a decoded response encodes: {e}"),
    };
    let again: Response = wire::read_frame(&mut &bytes[..]).expect("an encoded response decodes");
    assert_eq!(again, response, "the response survives a round trip");
});
