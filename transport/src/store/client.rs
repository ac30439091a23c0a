//! `StoreClient`: blocking client of the rendezvous store, safe to share between threads.

use super::proto::{self, Decoder, Encoder, op, reply};
use crate::error::{Result, TransportError};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Extra time the client waits beyond a server-side wait before giving up on the reply.
const SLACK: Duration = Duration::from_secs(10);

/// A connection to a [`StoreServer`](super::StoreServer), authenticated with the run's token.
pub struct StoreClient {
    addr: String,
    stream: Mutex<TcpStream>,
    timeout: Duration,
}

impl StoreClient {
    /// Connects to `addr` (`host:port`), retrying until `timeout` (the controller may start
    /// its store after the workers), then authenticates with `token`. `timeout` is also the
    /// default for [`get`](Self::get).
    pub fn connect(addr: &str, token: &str, timeout: Duration) -> Result<StoreClient> {
        let deadline = Instant::now() + timeout;
        let targets: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| TransportError::Store {
                addr: addr.into(),
                msg: format!("cannot resolve the store address: {e}; expected host:port"),
            })?
            .collect();
        let stream = loop {
            let mut last_err = None;
            let mut got = None;
            for t in &targets {
                match TcpStream::connect_timeout(t, Duration::from_secs(1)) {
                    Ok(s) => {
                        got = Some(s);
                        break;
                    }
                    Err(e) => last_err = Some(e),
                }
            }
            if let Some(s) = got {
                break s;
            }
            if Instant::now() >= deadline {
                let why = last_err.map_or_else(|| "no address".to_string(), |e| e.to_string());
                return Err(TransportError::Store {
                    addr: addr.into(),
                    msg: format!(
                        "cannot connect within {timeout:?}: {why}; is the controller's store \
                         running and reachable?"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = stream.set_nodelay(true);
        let client = StoreClient {
            addr: addr.into(),
            stream: Mutex::new(stream),
            timeout,
        };
        let (code, _) = client.call(Encoder::new(op::HELLO).bytes(token.as_bytes()), timeout)?;
        if code != reply::OK {
            return Err(client.err("unexpected reply to the handshake"));
        }
        Ok(client)
    }

    /// The store address this client talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The local IP address of this connection: the interface that routes to the store, used
    /// as the default address a rank advertises to its peers.
    pub fn local_ip(&self) -> Result<IpAddr> {
        let s = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        s.local_addr()
            .map(|a| a.ip())
            .map_err(|e| TransportError::io("reading the store connection's local address", e))
    }

    /// Sets `key` to `value`, replacing any previous value.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let (code, _) = self.call(
            Encoder::new(op::SET).bytes(key.as_bytes()).bytes(value),
            self.timeout,
        )?;
        self.expect(code, reply::OK)
    }

    /// Returns the value of `key` if it is set now, without waiting.
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let (code, frame) = self.call(Encoder::new(op::GET).bytes(key.as_bytes()), self.timeout)?;
        match code {
            reply::VALUE => {
                let mut d = Decoder::new(&frame).map(|x| x.1);
                let v = d
                    .as_mut()
                    .and_then(|d| d.bytes())
                    .ok_or_else(|| self.err("bad value"))?;
                Ok(Some(v.to_vec()))
            }
            reply::NOT_FOUND => Ok(None),
            _ => Err(self.err("unexpected reply to get")),
        }
    }

    /// Waits up to the client's default timeout for `key`, then returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.wait(&[key], self.timeout)?;
        self.try_get(key)?
            .ok_or_else(|| self.err(&format!("key {key} vanished between wait and get")))
    }

    /// Waits until every key in `keys` is set, or fails after `timeout` naming the missing keys.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let mut e = Encoder::new(op::WAIT).u64(proto::millis(timeout));
        for k in keys {
            e = e.bytes(k.as_bytes());
        }
        let (code, frame) = self.call(e, timeout + SLACK)?;
        match code {
            reply::OK => Ok(()),
            reply::MISSING => {
                let mut missing = Vec::new();
                if let Some((_, mut d)) = Decoder::new(&frame) {
                    while let Some(k) = d.string() {
                        missing.push(k);
                    }
                }
                Err(TransportError::StoreTimeout {
                    addr: self.addr.clone(),
                    missing,
                    timeout,
                })
            }
            _ => Err(self.err("unexpected reply to wait")),
        }
    }

    /// Adds `delta` to the integer stored at `key` (missing = 0) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let (code, frame) = self.call(
            Encoder::new(op::ADD)
                .bytes(key.as_bytes())
                .u64(delta as u64),
            self.timeout,
        )?;
        self.expect(code, reply::INT)?;
        Decoder::new(&frame)
            .and_then(|(_, mut d)| d.u64())
            .map(|v| v as i64)
            .ok_or_else(|| self.err("bad integer reply"))
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let (code, frame) =
            self.call(Encoder::new(op::DELETE).bytes(key.as_bytes()), self.timeout)?;
        self.expect(code, reply::INT)?;
        Ok(Decoder::new(&frame).and_then(|(_, mut d)| d.u64()) == Some(1))
    }

    fn call(&self, req: Encoder, timeout: Duration) -> Result<(u8, Vec<u8>)> {
        let mut s = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        proto::write_frame(&mut *s, &req.finish())
            .map_err(|e| self.err(&format!("sending a request failed: {e}")))?;
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let frame = proto::read_frame(&mut *s, Some(Instant::now() + timeout), &|| false)
            .map_err(|e| self.err(&format!("reading the reply failed: {e}")))?;
        let code = frame[0];
        if code == reply::ERR {
            let msg = Decoder::new(&frame)
                .and_then(|(_, mut d)| d.string())
                .unwrap_or_else(|| "unknown error".into());
            return Err(self.err(&msg));
        }
        Ok((code, frame))
    }

    fn expect(&self, code: u8, want: u8) -> Result<()> {
        if code == want {
            Ok(())
        } else {
            Err(self.err(&format!("unexpected reply code {code}")))
        }
    }

    fn err(&self, msg: &str) -> TransportError {
        TransportError::Store {
            addr: self.addr.clone(),
            msg: msg.into(),
        }
    }
}
