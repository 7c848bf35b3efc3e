//! A TCP forwarder from the node netns's loopback to the fake API server on the host's.
//!
//! libcni runs the plugin inside the node's network namespace (so the bridge plugin builds the
//! node side there), where the host's 127.0.0.1 is not reachable; on a real node the plugin
//! runs in the host's. The plugin's kubeconfig names this forwarder, so the plugin's own API
//! lookup (agent down) reaches the same server the agent uses.

use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use crate::{
    error::{IoContext, Result},
    netns::NetnsGuard,
};

/// Forwards connections to `127.0.0.1:<port>` inside a netns to `target`; stops on drop.
#[derive(Debug)]
pub struct ApiForward {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl ApiForward {
    /// Listens on an ephemeral loopback port of `netns`, forwarding to `target`.
    pub fn start(netns: &NetnsGuard, target: SocketAddr) -> Result<Self> {
        let listener = netns
            .run_in(|| TcpListener::bind("127.0.0.1:0"))?
            .ctx(|| "binding the API forwarder in the node netns")?;
        listener
            .set_nonblocking(true)
            .ctx(|| "making the API forwarder non-blocking")?;
        let addr = listener
            .local_addr()
            .ctx(|| "the API forwarder's address")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let accept = thread::Builder::new()
            .name("api-forward".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let _ = forward(client, target);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
            .ctx(|| "spawning the API forwarder")?;
        Ok(Self {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    /// The address inside the netns.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Pipes `client` and a new connection to `target` both ways, on two threads that end when
/// either side closes.
fn forward(client: TcpStream, target: SocketAddr) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
    let pipes = [(client.try_clone()?, server.try_clone()?), (server, client)];
    for (mut from, mut to) in pipes {
        thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    }
    Ok(())
}

impl Drop for ApiForward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}
