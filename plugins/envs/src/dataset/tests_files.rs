//! Tests of the readers: JSONL errors, a verl-shaped Parquet file written with the `parquet`
//! crate's writer (snappy, zstd, gzip, none), and a `save_to_disk`-shaped Arrow IPC stream directory.

use super::tests::{build, write_jsonl};
use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use tandem_plugin_api::sdk::EnvironmentImpl;

fn err(dir: &Path, options: Value) -> String {
    match build(dir, options) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn malformed_jsonl_names_the_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(
        d.join("bad.jsonl"),
        "{\"prompt\": \"a\", \"answer\": \"1\"}\n\n{\"prompt\": \"b\",\n",
    )
    .expect("write");
    let e = err(
        d,
        json!({"path": "bad.jsonl", "reward": {"verifier": "exact"}}),
    );
    assert!(
        e.starts_with("options.path: ") && e.contains("bad.jsonl: line 3 is not valid JSON"),
        "{e}"
    );
    assert!(e.contains("fix or remove line 3"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    std::fs::write(
        d.join("list.jsonl"),
        "{\"prompt\": \"a\", \"answer\": \"1\"}\n[1]\n",
    )
    .expect("write");
    let e = err(
        d,
        json!({"path": "list.jsonl", "reward": {"verifier": "exact"}}),
    );
    assert!(e.contains("line 2 is a list, not a JSON object"), "{e}");
    std::fs::write(
        d.join("rows.json"),
        r#"[{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]"#,
    )
    .expect("write");
    let ok = build(
        d,
        json!({"path": "rows.json", "reward": {"verifier": "exact"}}),
    )
    .expect("a JSON array");
    assert_eq!(ok.describe().expect("describe").splits[0].size, 2);
    std::fs::write(d.join("x.csv"), "a,b\n").expect("write");
    let e = err(d, json!({"path": "x.csv", "reward": {"verifier": "exact"}}));
    assert!(e.contains("not a file type the dataset reads"), "{e}");
}

const VERL_SCHEMA: &str = "message schema {
  optional group prompt (LIST) {
    repeated group list {
      optional group element {
        optional binary role (UTF8);
        optional binary content (UTF8);
      }
    }
  }
  optional group reward_model {
    optional binary ground_truth (UTF8);
    optional binary style (UTF8);
  }
  optional binary data_source (UTF8);
  optional group extra_info {
    optional int64 index;
    optional binary split (UTF8);
  }
}";

/// Writes two verl-shaped rows (pyarrow's three-level list of structs) to `path`.
fn write_verl_parquet(path: &Path, compression: Compression) {
    let schema = Arc::new(parse_message_type(VERL_SCHEMA).expect("schema"));
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(compression)
            .build(),
    );
    let file = std::fs::File::create(path).expect("create");
    let mut writer = SerializedFileWriter::new(file, schema, props).expect("writer");
    let mut group = writer.next_row_group().expect("row group");
    let bytes = |v: &[&str]| v.iter().map(|s| ByteArray::from(*s)).collect::<Vec<_>>();
    // Leaf columns in schema order: (values, definition levels, repetition levels).
    type Leaf = (Vec<ByteArray>, Vec<i16>, Option<Vec<i16>>);
    let columns: Vec<Leaf> = vec![
        (
            bytes(&["system", "user", "user"]),
            vec![4, 4, 4],
            Some(vec![0, 1, 0]),
        ),
        (
            bytes(&["Be brief.", "What is 2+2?", "What is 3+3?"]),
            vec![4, 4, 4],
            Some(vec![0, 1, 0]),
        ),
        (bytes(&["4", "6"]), vec![2, 2], None),
        (bytes(&["rule", "rule"]), vec![2, 2], None),
        (bytes(&["openai/gsm8k", "lighteval/MATH"]), vec![1, 1], None),
    ];
    for (values, def, rep) in columns {
        let mut col = group.next_column().expect("next").expect("a column");
        col.typed::<ByteArrayType>()
            .write_batch(&values, Some(&def), rep.as_deref())
            .expect("write");
        col.close().expect("close");
    }
    let mut col = group.next_column().expect("next").expect("index column");
    col.typed::<Int64Type>()
        .write_batch(&[0, 1], Some(&[2, 2]), None)
        .expect("write");
    col.close().expect("close");
    let mut col = group.next_column().expect("next").expect("split column");
    col.typed::<ByteArrayType>()
        .write_batch(&bytes(&["train", "train"]), Some(&[2, 2]), None)
        .expect("write");
    col.close().expect("close");
    group.close().expect("close group");
    writer.close().expect("close file");
}

#[test]
fn verl_parquet_files_read_with_each_codec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let codecs = [
        ("snappy.parquet", Compression::SNAPPY),
        ("zstd.parquet", Compression::ZSTD(ZstdLevel::default())),
        ("gzip.parquet", Compression::GZIP(GzipLevel::default())),
        ("plain.parquet", Compression::UNCOMPRESSED),
    ];
    for (name, codec) in codecs {
        write_verl_parquet(&d.join(name), codec);
        let env = build(
            d,
            json!({"path": name, "shuffle": false, "reward": {"verifier": "math"}}),
        )
        .expect("builds");
        let item = env.item("train", 0).expect("item");
        assert_eq!(item.messages.len(), 2, "{name}");
        assert_eq!(
            (
                item.messages[0].role.as_str(),
                item.messages[1].content.as_str()
            ),
            ("system", "What is 2+2?")
        );
        assert_eq!(item.answer.as_str(), "4", "reward_model.ground_truth");
        assert_eq!(item.source.as_str(), "openai/gsm8k");
        let meta: Value = serde_json::from_str(item.metadata_json.as_str()).expect("json");
        assert_eq!(meta, json!({"extra_info": {"index": 0, "split": "train"}}));
        let second = env.item("train", 1).expect("item");
        assert_eq!((second.messages.len(), second.answer.as_str()), (1, "6"));
        let info = env.describe().expect("describe");
        assert_eq!(
            info.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            ["lighteval/MATH", "openai/gsm8k"]
        );
    }
}

#[test]
fn an_unreadable_parquet_file_is_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bad.parquet"), b"PAR1 not really").expect("write");
    let e = err(
        dir.path(),
        json!({"path": "bad.parquet", "reward": {"verifier": "math"}}),
    );
    assert!(
        e.contains("bad.parquet: is not a readable Parquet file") && e.contains("help:"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
}

/// A `save_to_disk`-shaped directory: state.json and one Arrow IPC stream file.
fn write_arrow_dir(dir: &Path) {
    let message = Fields::from(vec![
        Field::new("content", DataType::Utf8, true),
        Field::new("role", DataType::Utf8, true),
    ]);
    let mut messages = ListBuilder::new(StructBuilder::from_fields(message.clone(), 4)).with_field(
        Arc::new(Field::new("item", DataType::Struct(message), true)),
    );
    for (content, role) in [("1+1?", "user"), ("2+5?", "user")] {
        let s = messages.values();
        s.field_builder::<StringBuilder>(0)
            .expect("content")
            .append_value(content);
        s.field_builder::<StringBuilder>(1)
            .expect("role")
            .append_value(role);
        s.append(true);
        messages.append(true);
    }
    let messages: ArrayRef = Arc::new(messages.finish());
    let answers: ArrayRef = Arc::new(StringArray::from(vec!["2", "7"]));
    let ids: ArrayRef = Arc::new(Int64Array::from(vec![10, 11]));
    let schema = Schema::new(vec![
        Field::new("messages", messages.data_type().clone(), true),
        Field::new("answer", DataType::Utf8, true),
        Field::new("uid", DataType::Int64, true),
    ]);
    let batch = RecordBatch::try_new(Arc::new(schema.clone()), vec![messages, answers, ids])
        .expect("batch");
    let file = std::fs::File::create(dir.join("data-00000-of-00001.arrow")).expect("create");
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(file, &schema).expect("writer");
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    std::fs::write(
        dir.join("state.json"),
        r#"{"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": null}"#,
    )
    .expect("state");
    std::fs::write(dir.join("dataset_info.json"), "{}").expect("info");
}

#[test]
fn save_to_disk_directories_read_as_arrow_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("ds");
    std::fs::create_dir(&data).expect("mkdir");
    write_arrow_dir(&data);
    let env = build(dir.path(), json!({"path": "ds", "id": "uid", "shuffle": false, "reward": {"verifier": "last_integer"}})).expect("builds");
    let item = env.item("train", 1).expect("item");
    assert_eq!(item.id.as_str(), "11");
    assert_eq!(item.messages[0].content.as_str(), "2+5?");
    assert_eq!(item.answer.as_str(), "7");
    std::fs::write(
        dir.path().join("dataset_dict.json"),
        r#"{"splits": ["train"]}"#,
    )
    .expect("write");
    let e = err(
        dir.path(),
        json!({"path": ".", "reward": {"verifier": "exact"}}),
    );
    assert!(e.contains("is a `DatasetDict`"), "{e}");
    let one = build(
        dir.path(),
        json!({"path": "ds/data-00000-of-00001.arrow", "reward": {"verifier": "exact"}}),
    )
    .expect("one stream file");
    assert_eq!(one.describe().expect("describe").splits[0].size, 2);
    write_jsonl(
        dir.path(),
        "held.jsonl",
        &[json!({"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"})],
    );
    let e = err(
        dir.path(),
        json!({"path": "ds", "held_out": "held.jsonl", "reward": {"verifier": "exact"}}),
    );
    assert!(e.contains("overlaps training") && e.contains("1+1?"), "{e}");
}
