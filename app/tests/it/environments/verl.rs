//! A verl-format Parquet file (chat `prompt`, `reward_model.ground_truth`, `data_source`,
//! `extra_info`) trains through `tandem run` with a verl-signature Python reward, and with a
//! TRL-signature one, neither changed for Tandem: the file as pyarrow writes it (a three-level
//! list of structs), the functions as those frameworks call them.

use super::*;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::sync::Arc;

const SCHEMA: &str = "message schema {
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

/// Two rows of one user message each, two data sources, snappy-compressed.
fn write_verl_parquet(path: &Path) {
    let schema = Arc::new(parse_message_type(SCHEMA).unwrap());
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, props).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let bytes = |v: &[&str]| v.iter().map(|s| ByteArray::from(*s)).collect::<Vec<_>>();
    type Leaf = (Vec<ByteArray>, Vec<i16>, Option<Vec<i16>>);
    let columns: Vec<Leaf> = vec![
        (bytes(&["user", "user"]), vec![4, 4], Some(vec![0, 0])),
        (bytes(&["2+2=?", "3+3=?"]), vec![4, 4], Some(vec![0, 0])),
        (bytes(&["4", "6"]), vec![2, 2], None),
        (bytes(&["rule", "rule"]), vec![2, 2], None),
        (bytes(&["openai/gsm8k", "lighteval/MATH"]), vec![1, 1], None),
    ];
    for (values, def, rep) in columns {
        let mut col = group.next_column().unwrap().unwrap();
        col.typed::<ByteArrayType>()
            .write_batch(&values, Some(&def), rep.as_deref())
            .unwrap();
        col.close().unwrap();
    }
    let mut col = group.next_column().unwrap().unwrap();
    col.typed::<Int64Type>()
        .write_batch(&[0, 1], Some(&[2, 2]), None)
        .unwrap();
    col.close().unwrap();
    let mut col = group.next_column().unwrap().unwrap();
    col.typed::<ByteArrayType>()
        .write_batch(&bytes(&["train", "train"]), Some(&[2, 2]), None)
        .unwrap();
    col.close().unwrap();
    group.close().unwrap();
    writer.close().unwrap();
}

/// verl's `compute_score` and a TRL reward function, as their users write them.
const REWARDS: &str = r#"
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source in ("openai/gsm8k", "lighteval/MATH"), data_source
    assert isinstance(extra_info["index"], int)
    return 1.0 if solution_str.strip() == ground_truth else 0.0

def trl_reward(prompts, completions, **kwargs):
    assert isinstance(prompts[0], list) and prompts[0][-1]["role"] == "user", prompts[0]
    assert len(kwargs["completion_ids"]) == len(completions)
    return [0.5 if c[0]["content"].strip() else 0.0 for c in completions]
"#;

/// A ChatML template for the tiny model (verl's prompts are chat messages).
const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";

fn run_verl(function: &str) -> serde_json::Value {
    let t = Scratch::new();
    write_verl_parquet(&t.dir.join("train.parquet"));
    std::fs::write(t.dir.join("rewards.py"), REWARDS).unwrap();
    std::fs::write(t.dir.join("model/chat_template.jinja"), TEMPLATE).unwrap();
    let python = std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| "python3".into());
    let o = JobOpts {
        steps: 1,
        prompts: 2,
        group: 2,
        ..JobOpts::default()
    };
    let reward = format!("{{ python = \"rewards:{function}\", interpreter = \"{python}\" }}");
    let job = dataset_job(&t, &o, &reward, "chat = true");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace(
            "path = \"data.jsonl\"\nid = \"id\"",
            "path = \"train.parquet\"",
        )
        .replace("max_seq_len = 64", "max_seq_len = 256");
    std::fs::write(&job, text).unwrap();
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{function}: {}", out.stderr_text());
    json_lines(&t.dir.join("run"), "metrics.jsonl")
        .pop()
        .unwrap()
}

#[test]
fn a_verl_parquet_file_trains_with_a_verl_reward_unchanged() {
    let m = run_verl("compute_score");
    assert_eq!(m["reward_failed"], 0, "{m}");
    let sources = m["reward_by_source"].as_object().unwrap();
    assert_eq!(sources.len(), 2, "{m}");
    assert!(sources.contains_key("openai/gsm8k") && sources.contains_key("lighteval/MATH"));
}

#[test]
fn a_trl_reward_scores_the_same_file_unchanged() {
    let m = run_verl("trl_reward");
    assert_eq!(m["reward_failed"], 0, "{m}");
}
