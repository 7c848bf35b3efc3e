//! The application server every mode talks to (`linkerd-cni-bench server`).
//!
//! A client opens with a [`REQ_LEN`]-byte request. `R...`: request/response, the server
//! answers [`REQ_LEN`] bytes and closes once the client has closed. `B...`: bulk, the server
//! writes 256 KiB blocks until the client goes away. `P...`: request/response over a
//! persistent connection, the server answers every [`MSG_LEN`]-byte request with as many bytes
//! until the client closes.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::Arc,
    time::Duration,
};

use linkerd_cni_tests::pool::Pool;

use crate::workload::proxy::listen;

/// Size of a request and of a response.
pub const REQ_LEN: usize = 64;
/// First byte of a request/response exchange.
pub const RR: u8 = b'R';
/// First byte of a bulk download.
pub const BULK: u8 = b'B';
/// First byte of a persistent request/response connection.
pub const PERSISTENT: u8 = b'P';
/// Size of a request and of a response on a persistent connection.
pub const MSG_LEN: usize = 1024;

/// Serves on `addr` until killed; prints `ready` once listening.
pub fn run(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = listen(addr)?;
    let pool = Arc::new(Pool::new());
    println!("ready");
    loop {
        let Ok((conn, _)) = listener.accept() else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        pool.execute(move || {
            let _ = serve(conn);
        });
    }
}

fn serve(mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut req = [0u8; REQ_LEN];
    conn.read_exact(&mut req)?;
    match req[0] {
        RR => {
            conn.write_all(&[b'r'; REQ_LEN])?;
            // Wait for the client's close, so that the client side closes first.
            let mut sink = [0u8; 64];
            while conn.read(&mut sink)? > 0 {}
        }
        PERSISTENT => {
            let mut msg = [0u8; MSG_LEN];
            loop {
                match conn.read_exact(&mut msg) {
                    Ok(()) => conn.write_all(&msg)?,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e),
                }
            }
        }
        BULK => {
            let block = vec![b'b'; 256 * 1024];
            loop {
                conn.write_all(&block)?;
            }
        }
        _ => {}
    }
    Ok(())
}
