//! The fuzz targets' bodies, shared by the cargo fuzz binaries (nightly) and by
//! tests/fuzz_regressions.rs, which replays the seeds and every input a run
//! ever crashed on, on stable, in the ordinary suite.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use eeane::config::{CliOverrides, Config, TokenIds};
use eeane::tokenize::{Inputs, Split, TextTokenizer};

/// Arbitrary bytes as the body of every POST route, through the handlers' own
/// parsing (JSON, input shapes, token-id arrays, documents, top_n,
/// keep_alive; TEI's embed, rerank, tokenize and decode; Ollama's embed): an
/// error is fine, a panic is a finding.
pub fn request_bodies(data: &[u8]) {
    use eeane::http::{ollama, openai, rerank, tei};
    let _ = openai::parse_embeddings(data, 2048);
    let _ = rerank::parse_rerank(data, 2048);
    let _ = tei::is_tei_rerank(data);
    let _ = tei::parse_embed(data, 2048);
    let _ = tei::parse_rerank(data, 2048);
    let _ = tei::parse_tokenize(data, 2048);
    let _ = tei::parse_decode(data, 2048);
    let _ = ollama::parse_embed(data, 2048);
}

fn tokenizers_from_cache() -> &'static Vec<TextTokenizer> {
    static ALL: OnceLock<Vec<TextTokenizer>> = OnceLock::new();
    ALL.get_or_init(|| {
        let cache: PathBuf = eeane::config::cache_dir_from_env();
        let hf = cache.join("models/all-minilm-l6-v2/tokenizer.json");
        let sp = cache.join("models/e5-small-enpt/sentencepiece.model");
        let mut all = Vec::new();
        for split in [Split::Truncate { max_tokens: 16 }, Split::Window { window: 8, stride: 3 }, Split::Truncate { max_tokens: 256 }] {
            all.push(TextTokenizer::load(&hf, TokenIds::default(), split).expect("tokenizer.json (bash tests/run.sh)"));
            all.push(TextTokenizer::load(&sp, TokenIds::Raw, split).expect("sentencepiece.model (bash tests/run.sh)"));
            all.push(TextTokenizer::load(&sp, TokenIds::Fairseq, split).expect("sentencepiece.model"));
        }
        all
    })
}

/// Arbitrary bytes and unicode through both tokenizer kinds (the default
/// model's tokenizer.json and e5-small-enpt's SentencePiece model, from the
/// cache), truncated and in windows, as text, token ids and rerank pairs. The
/// first byte picks the form.
pub fn tokenizers(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest).into_owned();
    let ids: Vec<i64> = rest.chunks(3).map(|c| c.iter().fold(0i64, |a, &b| a * 256 + b as i64) - 1000).collect();
    for tokenizer in tokenizers_from_cache() {
        let inputs = match mode % 4 {
            0 => Inputs::Texts(vec![text.clone()]),
            1 => Inputs::Texts(text.split('\n').map(String::from).collect()),
            2 => Inputs::TokenIds(vec![ids.clone()]),
            _ => {
                let half = text.char_indices().nth(text.chars().count() / 2).map_or(0, |(i, _)| i);
                let (query, document) = text.split_at(half);
                Inputs::Pairs { query: query.to_string(), documents: vec![document.to_string()], instruction: None }
            }
        };
        // /tokenize and /decode: every token's offsets lie inside the text.
        if let Ok(tokens) = tokenizer.tokens(&text, mode % 2 == 0) {
            for t in tokens.iter().filter(|t| !t.special) {
                assert!(t.start.zip(t.stop).is_some_and(|(a, b)| a <= b && b <= text.len()), "offsets {t:?} outside {} bytes", text.len());
            }
        }
        let _ = tokenizer.decode(&ids, mode % 2 == 1);
        if let Ok(all) = tokenizer.encode(&inputs) {
            for sequences in all {
                for s in sequences {
                    assert_eq!(s.ids.len(), s.type_ids.len(), "ids and token types differ in length");
                }
            }
        }
    }
}

/// Arbitrary bytes as the TOML config file, through the whole loader
/// (defaults, the file, environment, validation) and back out as TOML.
pub fn config(data: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eeane.toml");
    std::fs::write(&path, data).unwrap();
    if let Ok(config) = Config::load(Some(&path), &CliOverrides::default()) {
        let _ = toml::to_string_pretty(&config);
    }
}
