//! WATCH: a chunked stream of JSON event lines, resumed from a resourceVersion (or synthetic
//! `ADDED` events first), `410 Gone` before the compacted history, ended by its timeout.

use std::{
    convert::Infallible,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::{Response, StatusCode, body::Frame};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::{
    RecordedRequest,
    response::{Body, error, status_object},
    select::Filter,
    state::Shared,
};

/// Longest watch the server keeps open, whatever `timeoutSeconds` asks.
const MAX_WATCH: Duration = Duration::from_secs(3600);

pub(crate) fn watch_response(
    shared: Arc<Shared>,
    filter: Filter,
    req: &RecordedRequest,
) -> Response<Body> {
    let from = match req.param("resourceVersion") {
        None | Some("" | "0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("invalid resourceVersion {rv:?}"),
                );
            }
        },
    };
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(MAX_WATCH, |t| Duration::from_secs(t).min(MAX_WATCH));
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    shared.watches_started.fetch_add(1, Ordering::SeqCst);
    shared.watches_open.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(timeout, stream_events(&shared, &filter, from, &tx)).await;
        shared.watches_open.fetch_sub(1, Ordering::SeqCst);
    });
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    }));
    let mut resp = Response::new(BodyExt::boxed(body));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Sends events until the client goes away, the server is told to fail, or (outside) the
/// timeout ends the watch.
pub(crate) async fn stream_events(
    shared: &Shared,
    filter: &Filter,
    from: Option<u64>,
    tx: &mpsc::Sender<Bytes>,
) {
    let mut notified = shared.notify.subscribe();
    // Synthetic ADDED events for a watch without a starting point.
    let mut cursor = match from {
        Some(rv) => rv,
        None => {
            let (rv, initial): (u64, Vec<Value>) = {
                let state = shared.lock();
                let objs = state
                    .objects
                    .iter()
                    .filter(|(k, v)| filter.in_scope(k) && filter.matches(v))
                    .map(|(_, v)| json!({"type": "ADDED", "object": filter.shape(v)}))
                    .collect();
                (state.rv, objs)
            };
            for ev in initial {
                if tx.send(line(&ev)).await.is_err() {
                    return;
                }
            }
            rv
        }
    };
    loop {
        let batch: Result<Vec<Value>, ()> = {
            let state = shared.lock();
            if state.failing.is_some() {
                return;
            }
            if state.paused {
                Ok(Vec::new())
            } else if cursor < state.compacted {
                Err(())
            } else {
                // The history is in resourceVersion order: skip what this watch has seen
                // without scanning it (many watches over a long history, as in the
                // benchmark's API-load scenario).
                let unseen = state.history.partition_point(|c| c.rv <= cursor);
                let events = state.history[unseen..]
                    .iter()
                    .filter_map(|c| filter.event(c))
                    .collect();
                cursor = cursor.max(state.rv);
                Ok(events)
            }
        };
        match batch {
            Err(()) => {
                let gone = status_object(StatusCode::GONE, "Expired", "too old resource version");
                let _ = tx
                    .send(line(&json!({"type": "ERROR", "object": gone})))
                    .await;
                return;
            }
            Ok(events) => {
                for ev in events {
                    if tx.send(line(&ev)).await.is_err() {
                        return;
                    }
                }
            }
        }
        tokio::select! {
            changed = notified.changed() => if changed.is_err() { return },
            _ = tx.closed() => return,
        }
    }
}
