//! The bytes of a TensorBoard event file: the TFRecord framing (length, masked CRC-32C of the
//! length, data, masked CRC-32C of the data) around `tensorflow.Event` messages, encoded by
//! hand — four small messages (`Event`, `Summary.Value`, `SummaryMetadata`, a string
//! `TensorProto`, `SessionLog`) do not justify a protobuf code generator in the build.
//!
//! Field numbers are those of TensorFlow's `event.proto`, `summary.proto` and `tensor.proto`.

/// `SessionLog.SessionStatus.START`: a reader drops the events of this step and later, written
/// before (a resumed run's steps replace the first attempt's).
const SESSION_START: u64 = 1;
/// `DataType.DT_STRING`.
const DT_STRING: u64 = 7;
/// `DataClass.DATA_CLASS_TENSOR`.
const DATA_CLASS_TENSOR: u64 = 2;

/// One record: `data` framed for a TFRecord file.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// TFRecord's checksum: CRC-32C rotated right by 15 and offset.
fn masked_crc(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The first event of a file: its format version.
pub fn file_version(wall_time: f64) -> Vec<u8> {
    let mut e = Msg::default();
    e.double(1, wall_time);
    e.bytes(3, b"brain.Event:2");
    e.0
}

/// An event of scalars (`simple_value`) at `step`.
pub fn scalars(wall_time: f64, step: u32, values: &[(String, f64)]) -> Vec<u8> {
    let mut summary = Msg::default();
    for (tag, v) in values {
        let mut value = Msg::default();
        value.bytes(1, tag.as_bytes());
        value.float(2, *v as f32);
        summary.bytes(1, &value.0);
    }
    event(wall_time, step, 5, &summary.0)
}

/// An event of one text (the `text` plugin's string tensor) at `step`.
pub fn text(wall_time: f64, step: u32, tag: &str, body: &str) -> Vec<u8> {
    let mut plugin = Msg::default();
    plugin.bytes(1, b"text");
    let mut meta = Msg::default();
    meta.bytes(1, &plugin.0);
    meta.varint(4, DATA_CLASS_TENSOR);
    let mut shape = Msg::default();
    let mut dim = Msg::default();
    dim.varint(1, 1);
    shape.bytes(2, &dim.0);
    let mut tensor = Msg::default();
    tensor.varint(1, DT_STRING);
    tensor.bytes(2, &shape.0);
    tensor.bytes(8, body.as_bytes());
    let mut value = Msg::default();
    value.bytes(1, tag.as_bytes());
    value.bytes(9, &meta.0);
    value.bytes(8, &tensor.0);
    let mut summary = Msg::default();
    summary.bytes(1, &value.0);
    event(wall_time, step, 5, &summary.0)
}

/// A `SessionLog` START at `step`: readers purge what earlier files hold for `step` and later.
pub fn session_start(wall_time: f64, step: u32) -> Vec<u8> {
    let mut log = Msg::default();
    log.varint(1, SESSION_START);
    event(wall_time, step, 7, &log.0)
}

fn event(wall_time: f64, step: u32, field: u32, body: &[u8]) -> Vec<u8> {
    let mut e = Msg::default();
    e.double(1, wall_time);
    e.varint(2, u64::from(step));
    e.bytes(field, body);
    e.0
}

/// A protobuf message being written (wire types 0, 1, 2 and 5).
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn key(&mut self, field: u32, wire: u8) {
        self.raw_varint((u64::from(field) << 3) | u64::from(wire));
    }

    fn raw_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn varint(&mut self, field: u32, v: u64) {
        self.key(field, 0);
        self.raw_varint(v);
    }

    fn double(&mut self, field: u32, v: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, 2);
        self.raw_varint(v.len() as u64);
        self.0.extend_from_slice(v);
    }

    fn float(&mut self, field: u32, v: f32) {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_framing_checksums_are_tensorflows() {
        // CRC-32C of "123456789" is 0xE3069283 (the standard check value); the record's
        // length is 9 as a little-endian u64, then the masked checksums.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let r = record(b"123456789");
        assert_eq!(&r[..8], &9u64.to_le_bytes());
        assert_eq!(r.len(), 8 + 4 + 9 + 4);
        let tail = u32::from_le_bytes([r[21], r[22], r[23], r[24]]);
        let c = 0xE306_9283u32;
        assert_eq!(tail, c.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn varints_and_keys_follow_the_wire_format() {
        let mut m = Msg::default();
        m.varint(2, 300);
        assert_eq!(m.0, [0x10, 0xAC, 0x02]);
        let mut m = Msg::default();
        m.bytes(1, b"ab");
        assert_eq!(m.0, [0x0A, 2, b'a', b'b']);
    }
}
