//! Unit tests of the recorder's pure parts: the reasons' names and types, note cutting, the
//! disabled recorder. The writer against an API server is in `tests/events.rs`.

use super::*;

#[test]
fn reasons_are_named_once_and_read_back() {
    for reason in Reason::ALL {
        assert!(reason.as_str().starts_with("LinkerdCNI"), "{reason:?}");
        assert!(reason.as_str().len() <= 128);
        assert_eq!(Reason::from_reason(reason.as_str()), Some(reason));
        assert_eq!(
            reason.event_type() == "Normal",
            reason.redirected(),
            "{reason:?}: only the redirected outcomes are Normal"
        );
    }
    assert_eq!(Reason::from_reason("Scheduled"), None);
    assert_eq!(Reason::Refused.as_str(), "LinkerdCNIRefused");
    assert_eq!(Reason::Unredirected.event_type(), "Warning");
}

#[test]
fn notes_are_cut_on_a_character_boundary() {
    let mut s = "é".repeat(600); // 1200 bytes
    truncate(&mut s, MAX_NOTE);
    assert!(s.len() <= MAX_NOTE);
    assert_eq!(s.len(), 1024);
    let mut s = format!("a{}", "é".repeat(600));
    truncate(&mut s, MAX_NOTE);
    assert_eq!(s.len(), 1023, "cut before the split character");
}

#[test]
fn a_disabled_recorder_counts_every_event_as_dropped() {
    let recorder = EventRecorder::disabled();
    let pod = PodRef::new("ns", "p", None);
    recorder.record(&pod, Reason::Redirected, "x");
    recorder.record(&pod, Reason::Refused, "y");
    assert_eq!(recorder.stats().recorded.load(Ordering::Relaxed), 2);
    assert_eq!(recorder.stats().dropped.load(Ordering::Relaxed), 2);
}
