//! The HTTP side: accepting connections, recording each request, the test hooks' failures and
//! fixed routes, discovery, GET of one object and LIST (WATCH is in `watch`, the answers' shapes
//! in `response`).

use std::{
    convert::Infallible,
    net::TcpListener as StdTcpListener,
    sync::{Arc, atomic::Ordering},
};

use http_body_util::BodyExt;
use hyper::{Method, Request, Response, StatusCode, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::{
    ObjectKey, RecordedRequest, events, log, patch,
    resources::{RESOURCES, resource_by_plural, short_names},
    response::{Body, error, full, metadata_only, parse_query, wants_metadata_only},
    select::Filter,
    state::Shared,
    watch::watch_response,
};

pub(crate) async fn serve(
    listener: StdTcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fake-apiserver: cannot use listener: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

/// The path of the server's own statistics (see the module documentation).
pub const STATS_PATH: &str = "/fake/stats";

/// What `GET /fake/stats` answers.
pub(crate) fn stats(shared: &Shared) -> Value {
    let requests: Vec<Value> = shared
        .lock()
        .requests
        .iter()
        .map(|r| json!({"method": r.method, "path": r.path, "query": r.query}))
        .collect();
    json!({
        "requests": requests,
        "watchesOpen": shared.watches_open.load(Ordering::SeqCst),
        "watchesStarted": shared.watches_started.load(Ordering::SeqCst),
    })
}

pub(crate) async fn handle(
    shared: &Arc<Shared>,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    if req.uri().path() == STATS_PATH && req.method() == Method::GET {
        return full(StatusCode::OK, stats(shared));
    }
    let meta_only = wants_metadata_only(&req);
    let record = RecordedRequest {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query: parse_query(req.uri().query()),
    };
    let (failing, route) = {
        let mut state = shared.lock();
        state.requests.push(record.clone());
        let mut failing = state
            .failing_paths
            .get(&record.path)
            .copied()
            .or(state.failing);
        if failing.is_none()
            && let Some((code, left)) = state.failing_times.get_mut(&record.path)
        {
            failing = Some(*code);
            *left -= 1;
            if *left == 0 {
                state.failing_times.remove(&record.path);
            }
        }
        let mut route = state.routes.get(&record.path).cloned();
        if failing.is_none()
            && record.method == "GET"
            && let Some((bodies, served)) = state.sequences.get_mut(&record.path)
        {
            route = bodies.get(*served).or(bodies.last()).cloned();
            *served += 1;
        }
        (failing, route)
    };
    log(&format!(
        "{} {} {:?}",
        record.method, record.path, record.query
    ));
    if let Some(code) = failing {
        return error(
            code,
            "InternalError",
            "the fake API server was told to fail",
        );
    }
    if req.method() == Method::DELETE {
        return delete(shared, &record.path, req).await;
    }
    if let Some(rest) = record.path.strip_prefix(events::PREFIX) {
        let body = match read_body(req).await {
            Ok(body) => body,
            Err(response) => return response,
        };
        let mut state = shared.lock();
        let state = &mut *state;
        return events::handle(
            &mut state.events,
            &mut state.rv,
            &mut state.next_uid,
            &record.method,
            rest,
            &body,
        );
    }
    if req.method() == Method::PATCH
        && let Some(key) = object_path(&record.path)
    {
        let content_type = req
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = match read_body(req).await {
            Ok(body) => body,
            Err(response) => return response,
        };
        return patch::handle(shared, key, &content_type, &body);
    }
    if req.method() != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fake API server takes GET, PATCH of objects, and events",
        );
    }
    if let Some(body) = route {
        return full(StatusCode::OK, body);
    }
    match record.path.trim_end_matches('/') {
        "/version" => {
            return full(
                StatusCode::OK,
                json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake", "platform": "linux/amd64"}),
            );
        }
        "/api" => {
            return full(
                StatusCode::OK,
                json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
            );
        }
        "/apis" => {
            return full(
                StatusCode::OK,
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
                    "name": "events.k8s.io",
                    "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"},
                }]}),
            );
        }
        "/api/v1" => {
            let resources: Vec<Value> = RESOURCES
                .iter()
                .map(|(kind, plural, namespaced)| {
                    json!({"name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced, "shortNames": short_names(plural), "kind": kind, "verbs": ["get", "list", "watch"]})
                })
                .collect();
            return full(
                StatusCode::OK,
                json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}),
            );
        }
        _ => {}
    }
    let Some(rest) = record.path.strip_prefix("/api/v1/") else {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    // (plural, namespace scope of a collection, object name)
    let (plural, namespace, name) = match segs.as_slice() {
        [plural] => (*plural, None, None),
        ["namespaces", name] => ("namespaces", None, Some(*name)),
        ["namespaces", ns, plural] => (*plural, Some(*ns), None),
        ["namespaces", ns, plural, name] => (*plural, Some(*ns), Some(*name)),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
    };
    let Some((kind, plural, namespaced)) = resource_by_plural(plural) else {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("the server doesn't have a resource type {plural:?}"),
        );
    };
    if namespace.is_some() && !namespaced {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{plural} are not namespaced"),
        );
    }
    if let Some(name) = name {
        let key = ObjectKey {
            plural,
            namespace: namespaced.then(|| namespace.unwrap_or("default").to_string()),
            name: name.to_string(),
        };
        return match shared.lock().objects.get(&key) {
            Some(obj) if meta_only => full(StatusCode::OK, metadata_only(obj)),
            Some(obj) => full(StatusCode::OK, obj.clone()),
            None => error(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{plural} {name:?} not found"),
            ),
        };
    }
    let filter = match Filter::new(plural, namespace, &record) {
        Ok(f) => Filter { meta_only, ..f },
        Err(msg) => return error(StatusCode::BAD_REQUEST, "BadRequest", &msg),
    };
    if record.is_watch() {
        return watch_response(shared.clone(), filter, &record);
    }
    let state = shared.lock();
    let items: Vec<Value> = state
        .objects
        .iter()
        .filter(|(k, v)| filter.in_scope(k) && filter.matches(v))
        .map(|(_, v)| filter.shape(v))
        .collect();
    let (list_kind, api_version) = if meta_only {
        ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1")
    } else {
        (format!("{kind}List"), "v1")
    };
    full(
        StatusCode::OK,
        json!({"kind": list_kind, "apiVersion": api_version, "metadata": {"resourceVersion": state.rv.to_string()}, "items": items}),
    )
}

/// `DELETE` of one pod (`/api/v1/namespaces/<ns>/pods/<name>`), as the API server answers it
/// for a pod without finalizers or grace: the object goes at once (a watch sees `DELETED`), the
/// answer is its last state. `preconditions.uid` in the body is honoured (`409 Conflict` when
/// another pod holds the name). Other kinds stay read-only.
async fn delete(
    shared: &Arc<Shared>,
    path: &str,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let ["api", "v1", "namespaces", namespace, "pods", name] = segs.as_slice() else {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fake API server deletes pods only",
        );
    };
    let body = match read_body(req).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let options: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return error(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
        }
    };
    let key = ObjectKey {
        plural: "pods",
        namespace: Some(namespace.to_string()),
        name: name.to_string(),
    };
    let response = {
        let mut state = shared.lock();
        let Some(current) = state.objects.get(&key).cloned() else {
            return error(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("pods {name:?} not found"),
            );
        };
        let uid = current
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if let Some(wanted) = options
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            && wanted != uid
        {
            return error(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "Precondition failed: UID in precondition: {wanted}, UID in object meta: {uid}"
                ),
            );
        }
        state.delete(&key);
        state.deleted_uids.insert(uid);
        current
    };
    shared.wake();
    full(StatusCode::OK, response)
}

/// The key of the core `v1` object a URL names (`/api/v1/nodes/{name}`,
/// `/api/v1/namespaces/{ns}/{plural}/{name}`), if it names one.
/// A request's whole body, or the 400 answer when it cannot be read.
async fn read_body(
    req: Request<hyper::body::Incoming>,
) -> Result<hyper::body::Bytes, Response<Body>> {
    match req.into_body().collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("reading the body failed: {e}"),
        )),
    }
}

fn object_path(path: &str) -> Option<ObjectKey> {
    let rest = path.strip_prefix("/api/v1/")?;
    let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    let (plural, namespace, name) = match segs.as_slice() {
        ["namespaces", name] => ("namespaces", None, *name),
        [plural, name] => (*plural, None, *name),
        ["namespaces", ns, plural, name] => (*plural, Some(*ns), *name),
        _ => return None,
    };
    let (_, plural, namespaced) = resource_by_plural(plural)?;
    if namespaced != namespace.is_some() {
        return None;
    }
    Some(ObjectKey {
        plural,
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    })
}
