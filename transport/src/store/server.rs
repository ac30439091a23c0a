//! `StoreServer`: the rendezvous key-value server the controller hosts (like torchrun's
//! TCPStore). One thread accepts, one thread serves each client. Every client must first
//! present the run's token; a wrong token gets one error reply and the connection is closed.

use super::proto::{self, Decoder, Encoder, op, reply};
use crate::error::{Result, TransportError};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often idle server threads look at the shutdown flag.
const POLL: Duration = Duration::from_millis(200);

#[derive(Default)]
struct State {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stop: AtomicBool,
}

/// A running rendezvous store. Dropping it stops the server.
pub struct StoreServer {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `bind` (e.g. `"127.0.0.1:0"` for an ephemeral port) and starts serving clients
    /// that present `token`.
    pub fn start(bind: &str, token: &str) -> Result<StoreServer> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| TransportError::io(format!("binding rendezvous store on {bind}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| TransportError::io("reading the store's bound address", e))?;
        let state = Arc::new(State::default());
        let st = Arc::clone(&state);
        let token = token.as_bytes().to_vec();
        let accept = std::thread::Builder::new()
            .name("tandem-store-accept".into())
            .spawn(move || accept_loop(listener, st, token))
            .map_err(|e| TransportError::io("spawning the store accept thread", e))?;
        Ok(StoreServer {
            addr,
            state,
            accept: Some(accept),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Number of keys currently stored (for diagnostics and tests).
    pub fn len(&self) -> usize {
        self.state
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.state.changed.notify_all();
        // Wake the blocking accept with a throwaway connection.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, st: Arc<State>, token: Vec<u8>) {
    for conn in listener.incoming() {
        if st.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let st = Arc::clone(&st);
        let token = token.clone();
        let _ = std::thread::Builder::new()
            .name("tandem-store-conn".into())
            .spawn(move || serve(stream, &st, &token));
    }
}

fn serve(mut s: TcpStream, st: &State, token: &[u8]) {
    let _ = s.set_nodelay(true);
    if s.set_read_timeout(Some(POLL)).is_err() {
        return;
    }
    let stopped = || st.stop.load(Ordering::SeqCst);
    let mut authed = false;
    loop {
        let Ok(frame) = proto::read_frame(&mut s, None, &stopped) else {
            return;
        };
        let Some((code, mut d)) = Decoder::new(&frame) else {
            return;
        };
        let answer = if !authed {
            match (code, d.bytes()) {
                (op::HELLO, Some(t)) if proto::token_eq(t, token) => {
                    authed = true;
                    Encoder::new(reply::OK).finish()
                }
                _ => {
                    let msg = "authentication failed: wrong run token (a stray peer from another \
                               run?); start every rank with this run's token";
                    let _ = proto::write_frame(
                        &mut s,
                        &Encoder::new(reply::ERR).bytes(msg.as_bytes()).finish(),
                    );
                    return;
                }
            }
        } else {
            handle(code, &mut d, st)
        };
        if proto::write_frame(&mut s, &answer).is_err() {
            return;
        }
    }
}

fn handle(code: u8, d: &mut Decoder<'_>, st: &State) -> Vec<u8> {
    let bad = || {
        Encoder::new(reply::ERR)
            .bytes(b"malformed request")
            .finish()
    };
    let mut map = st.map.lock().unwrap_or_else(PoisonError::into_inner);
    match code {
        op::SET => {
            let (Some(k), Some(v)) = (d.string(), d.bytes()) else {
                return bad();
            };
            map.insert(k, v.to_vec());
            st.changed.notify_all();
            Encoder::new(reply::OK).finish()
        }
        op::GET => {
            let Some(k) = d.string() else { return bad() };
            match map.get(&k) {
                Some(v) => Encoder::new(reply::VALUE).bytes(v).finish(),
                None => Encoder::new(reply::NOT_FOUND).finish(),
            }
        }
        op::DELETE => {
            let Some(k) = d.string() else { return bad() };
            let existed = map.remove(&k).is_some();
            Encoder::new(reply::INT).u64(u64::from(existed)).finish()
        }
        op::ADD => {
            let (Some(k), Some(delta)) = (d.string(), d.u64()) else {
                return bad();
            };
            let cur = map
                .get(&k)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                .unwrap_or(0);
            let new = cur.wrapping_add(delta as i64);
            map.insert(k, new.to_string().into_bytes());
            st.changed.notify_all();
            Encoder::new(reply::INT).u64(new as u64).finish()
        }
        op::WAIT => {
            let Some(ms) = d.u64() else { return bad() };
            let mut keys = Vec::new();
            while let Some(k) = d.string() {
                keys.push(k);
            }
            let deadline = Instant::now() + Duration::from_millis(ms);
            loop {
                let missing: Vec<&String> = keys.iter().filter(|k| !map.contains_key(*k)).collect();
                if missing.is_empty() {
                    return Encoder::new(reply::OK).finish();
                }
                let now = Instant::now();
                if now >= deadline || st.stop.load(Ordering::SeqCst) {
                    let mut e = Encoder::new(reply::MISSING);
                    for k in missing {
                        e = e.bytes(k.as_bytes());
                    }
                    return e.finish();
                }
                let slice = (deadline - now).min(POLL);
                map = st
                    .changed
                    .wait_timeout(map, slice)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        _ => bad(),
    }
}
