//! The receiving loop of a `TensorBuckets` update, double-buffered: a receiver thread takes
//! bucket `k + 1` off the transport group into one buffer while the caller checks and copies
//! bucket `k` out of the other. The two buffers are the engine's (kept across syncs), handed
//! back and forth over channels, so the receive never waits for the copy of the bucket
//! before it, and a sync holds two buckets beside the weights, never more.

use std::sync::mpsc;

use tandem_plugin_api::sdk::buckets::TRAILER_BYTES;
use tandem_plugin_api::{HostBox, PluginError, RSliceMut, RStr, TensorBucket};

/// One bucket as received: its index, the buffer holding its data, and its trailer.
pub(super) struct Received<'a> {
    /// Bucket index.
    pub k: usize,
    /// Its data (exactly the manifest's `bytes`).
    pub data: &'a [u8],
    /// Its trailer, as the sender sent it.
    pub trailer: &'a [u8; TRAILER_BYTES],
    /// The same data as f32 words (the buffer's element type; the tail past `data` is stale).
    pub words: &'a [f32],
}

/// A transport failure: the bucket it happened on and the error.
pub(super) type StreamError = (usize, PluginError);

/// Receives every bucket of `manifest` on `group` (root 0) into `bufs` (each at least as large
/// as the largest bucket) and calls `each` with every one in order; stops at the first
/// transport error. Returns the bytes received.
pub(super) fn receive(
    host: &HostBox,
    group: &str,
    manifest: &[TensorBucket],
    bufs: &mut [Vec<f32>; 2],
    mut each: impl FnMut(Received<'_>),
) -> Result<u64, StreamError> {
    let (free_tx, free_rx) = mpsc::channel::<Vec<f32>>();
    let (full_tx, full_rx) =
        mpsc::sync_channel::<(usize, Vec<f32>, [u8; TRAILER_BYTES], Option<PluginError>)>(2);
    for b in bufs.iter_mut() {
        // Cannot fail: `free_rx` is alive.
        let _ = free_tx.send(std::mem::take(b));
    }
    let mut received = 0u64;
    let mut failure = None;
    let mut back = Vec::with_capacity(2);
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            for (k, bucket) in manifest.iter().enumerate() {
                // The caller hands every buffer back until it stops; none left: stop too.
                let Ok(mut buf) = free_rx.recv() else { break };
                let n = bucket.bytes as usize;
                let mut trailer = [0u8; TRAILER_BYTES];
                let data = &mut bytemuck::cast_slice_mut::<f32, u8>(&mut buf[..])[..n];
                let group = RStr::from(group);
                let got = host
                    .broadcast(group, 0, RSliceMut::from_mut_slice(data))
                    .into_result()
                    .and_then(|()| {
                        host.broadcast(group, 0, RSliceMut::from_mut_slice(&mut trailer))
                            .into_result()
                    });
                let failed = got.err();
                let stop = failed.is_some();
                if full_tx.send((k, buf, trailer, failed)).is_err() || stop {
                    break;
                }
            }
            // The buffers still queued go back with the thread.
            free_rx
        });
        for (k, buf, trailer, failed) in full_rx.iter() {
            if let Some(e) = failed {
                failure = Some((k, e));
                back.push(buf);
                break;
            }
            let n = manifest[k].bytes as usize;
            let data = &bytemuck::cast_slice::<f32, u8>(&buf[..])[..n];
            each(Received {
                k,
                data,
                trailer: &trailer,
                words: &buf[..],
            });
            received += n as u64;
            if let Err(mpsc::SendError(buf)) = free_tx.send(buf) {
                back.push(buf);
            }
        }
        drop(free_tx);
        // Unblocks a receiver waiting to hand over a bucket after a failure was taken.
        drop(full_rx);
        if let Ok(free_rx) = receiver.join() {
            back.extend(free_rx.try_iter());
        }
    });
    for (slot, buf) in bufs.iter_mut().zip(back) {
        *slot = buf;
    }
    match failure {
        Some(f) => Err(f),
        None => Ok(received),
    }
}
