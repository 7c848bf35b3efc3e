//! A fake Kubernetes API server: serves fixed JSON objects by URL path over plain HTTP/1.1 on
//! loopback, answers 404 with a `Status` like the real server, and records the paths asked.
//! The client under test is the production one, pointed at it through a kubeconfig.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
};

use serde_json::{Value as Json, json};

/// A running fake API server; stops accepting on drop.
pub struct FakeApi {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

fn not_found(path: &str) -> Json {
    let name = path.rsplit('/').next().unwrap_or_default();
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("\"{name}\" not found"), "reason": "NotFound",
        "details": { "name": name }, "code": 404
    })
}

fn serve(
    stream: TcpStream,
    routes: &BTreeMap<String, Json>,
    requests: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        // Headers up to the blank line; a GET has no body.
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
                break;
            }
        }
        let target = request_line.split_whitespace().nth(1).unwrap_or("/");
        let path = target.split('?').next().unwrap_or(target).to_string();
        requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.clone());
        let (status, body) = match routes.get(&path) {
            Some(obj) => ("200 OK", obj.to_string()),
            None => ("404 Not Found", not_found(&path).to_string()),
        };
        write!(
            writer,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        writer.flush()?;
    }
}

impl FakeApi {
    /// Starts a server answering `routes` (URL path -> JSON body).
    pub fn start(routes: BTreeMap<String, Json>) -> Self {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("binding the fake API server on loopback");
        let addr = listener.local_addr().expect("local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let (stop2, requests2) = (stop.clone(), requests.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (routes, requests) = (routes.clone(), requests2.clone());
                thread::spawn(move || {
                    let _ = serve(stream, &routes, &requests);
                });
            }
        });
        Self {
            addr,
            requests,
            stop,
        }
    }

    /// A kubeconfig pointing at this server, written to a temp file.
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: not-a-secret\n",
            self.addr
        );
        super::temp_file(name, &text)
    }

    pub fn requested(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so its thread ends.
        let _ = TcpStream::connect(self.addr);
    }
}
