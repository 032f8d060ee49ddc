//! SentencePiece in eeane (the `sentencepiece` crate) against Python's
//! `sentencepiece` on the same `.model` files, in both id conventions, over
//! tests/fixtures/spm_corpus.json (code, English and Portuguese prose, many
//! scripts, emoji, control characters, empty and 10,000-character strings).

mod common;

use std::path::{Path, PathBuf};

use common::{e5_dir, run_reference};
use eeane::config::TokenIds;
use eeane::tokenize::{Inputs, Split, TextTokenizer};
use serde_json::json;

fn corpus() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spm_corpus.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn eeane_ids(model: &Path, ids: TokenIds, max_tokens: usize, texts: &[String]) -> Vec<Vec<i64>> {
    let tokenizer = TextTokenizer::load(model, ids, Split::Truncate { max_tokens }).unwrap();
    let groups = tokenizer.encode(&Inputs::Texts(texts.to_vec())).unwrap();
    groups
        .into_iter()
        .map(|g| {
            assert_eq!(g.len(), 1);
            assert!(g[0].type_ids.iter().all(|&t| t == 0));
            g[0].ids.clone()
        })
        .collect()
}

#[test]
fn sentencepiece_ids_equal_python_in_both_conventions() {
    let texts = corpus();
    assert!(texts.len() >= 1000);
    assert!(texts.iter().any(String::is_empty) && texts.iter().any(|t| t.chars().count() >= 10_000));
    assert!(texts.iter().any(|t| t.chars().any(|c| c.is_control())));
    let dir = e5_dir("e5-small-enpt");
    let mut full = Vec::new();
    for (convention, file, ids) in [("raw", "sentencepiece.model", TokenIds::Raw), ("fairseq", "sentencepiece-xlmr.model", TokenIds::Fairseq)] {
        let model = dir.join(file);
        for max_tokens in [1_000_000, 128] {
            let want =
                run_reference("spm_reference.py", &json!({"mode": "ids", "model": model, "convention": convention, "max_tokens": max_tokens, "texts": texts}));
            let want: Vec<Vec<i64>> = want["ids"].as_array().unwrap().iter().map(|v| common::f64s(v).into_iter().map(|x| x as i64).collect()).collect();
            let got = eeane_ids(&model, ids, max_tokens, &texts);
            let differ: Vec<usize> = (0..texts.len()).filter(|&i| got[i] != want[i]).collect();
            for &i in differ.iter().take(5) {
                eprintln!("{convention}, max {max_tokens}: text {i} {:?}\n  eeane  {:?}\n  python {:?}", texts[i], got[i], want[i]);
            }
            assert!(differ.is_empty(), "{convention}, max_tokens {max_tokens}: {} of {} texts differ", differ.len(), texts.len());
            let tokens: usize = got.iter().map(Vec::len).sum();
            println!("{convention}, max_tokens {max_tokens}: {} texts, {tokens} tokens, ids identical to Python sentencepiece", texts.len());
            if max_tokens > 128 {
                full.push(got);
            }
        }
    }
    // The two files number the same pieces: raw ids equal fairseq ids except the
    // specials (raw <pad>=0 <unk>=1 <s>=2 </s>=3, fairseq <s>=0 <pad>=1 </s>=2 <unk>=3).
    let fairseq_of_raw = |id: i64| match id {
        0 => 1,
        1 => 3,
        2 => 0,
        3 => 2,
        other => other,
    };
    let (raw, fairseq) = (&full[0], &full[1]);
    assert!(raw.iter().zip(fairseq).all(|(r, f)| r.iter().map(|&i| fairseq_of_raw(i)).eq(f.iter().copied())));
    let unknowns = raw.iter().flatten().filter(|&&i| i == 1).count();
    assert!(unknowns > 0, "the corpus should reach <unk>");
    println!("raw and fairseq numberings agree piece for piece ({unknowns} <unk> tokens in the corpus)");
}

#[test]
fn token_id_inputs_are_checked_and_wrapped() {
    let dir = e5_dir("e5-small-enpt");
    let tokenizer = TextTokenizer::load(&dir.join("sentencepiece.model"), TokenIds::Raw, Split::Truncate { max_tokens: 5 }).unwrap();
    let got = tokenizer.encode(&Inputs::TokenIds(vec![vec![100, 200, 300, 400], vec![]])).unwrap();
    assert_eq!(got[0][0].ids, vec![2, 100, 200, 300, 3]);
    assert_eq!(got[1][0].ids, vec![2, 3]);
    let vocab = tokenizer.vocab_size() as i64;
    assert!(tokenizer.encode(&Inputs::TokenIds(vec![vec![5, vocab]])).is_err());
    assert!(tokenizer.encode(&Inputs::TokenIds(vec![vec![-1]])).is_err());
    let windowed = TextTokenizer::load(&dir.join("sentencepiece.model"), TokenIds::Raw, Split::Window { window: 6, stride: 3 }).unwrap();
    let got = windowed.encode(&Inputs::TokenIds(vec![(10..20).collect()])).unwrap();
    let ids: Vec<Vec<i64>> = got[0].iter().map(|e| e.ids.clone()).collect();
    assert_eq!(ids, vec![vec![2, 10, 11, 12, 13, 3], vec![2, 13, 14, 15, 16, 3], vec![2, 16, 17, 18, 19, 3]]);
}

/// A request of many texts is tokenized on all cores: the sequences must be
/// those of each text tokenized alone, in the request's order, windows
/// included.
#[test]
fn many_texts_at_once_equal_each_text_alone() {
    let path = common::minilm_dir().join("tokenizer.json");
    let mut texts = corpus();
    texts.extend(common::fixture_texts());
    texts.extend((0..200).map(|i| format!("def f_{i}(x):\n    return x * {i}  # line {i}")));
    for split in [Split::Truncate { max_tokens: 32 }, Split::Window { window: 24, stride: 16 }] {
        let tokenizer = TextTokenizer::load(&path, TokenIds::Raw, split).unwrap();
        let together = tokenizer.encode(&Inputs::Texts(texts.clone())).unwrap();
        let alone: Vec<_> = texts.iter().map(|t| tokenizer.encode(&Inputs::Texts(vec![t.clone()])).unwrap().remove(0)).collect();
        assert_eq!(together.len(), texts.len());
        assert!(together == alone, "{split:?}: a text tokenized with others differs from the same text alone");
        if let Split::Window { .. } = split {
            assert!(together.iter().any(|g| g.len() > 1), "the corpus should have inputs long enough for several windows");
        }
    }
}

/// Paragraphs of this repository's Rust code and docs: code and prose, the
/// texts BERT's short way in eeane (src/tokenize/bert_wordpiece.rs) takes.
fn repository_paragraphs() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = ["src", "src/tokenize", "src/http", "docs"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(root.join(dir)).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| p.extension().is_some_and(|e| e == "rs" || e == "md"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| std::fs::read_to_string(f).unwrap().split("\n\n").map(str::to_string).collect::<Vec<_>>()).collect()
}

/// tokenizer.json in eeane (the `tokenizers` crate, BERT's short way, special
/// tokens added by the frame found at load) against Python's `tokenizers` on
/// the same file.
#[test]
fn tokenizer_json_ids_equal_python() {
    let path = common::minilm_dir().join("tokenizer.json");
    let mut texts = corpus();
    texts.extend(repository_paragraphs());
    for max_tokens in [1_000_000, 128] {
        let want = run_reference("hf_ids.py", &json!({"tokenizer": path, "max_tokens": max_tokens, "texts": texts}));
        let column =
            |key: &str| -> Vec<Vec<i64>> { want[key].as_array().unwrap().iter().map(|v| common::f64s(v).into_iter().map(|x| x as i64).collect()).collect() };
        let (ids, type_ids) = (column("ids"), column("type_ids"));
        let tokenizer = TextTokenizer::load(&path, TokenIds::Raw, Split::Truncate { max_tokens }).unwrap();
        let got = tokenizer.encode(&Inputs::Texts(texts.clone())).unwrap();
        let differ: Vec<usize> = (0..texts.len()).filter(|&i| got[i][0].ids != ids[i] || got[i][0].type_ids != type_ids[i]).collect();
        for &i in differ.iter().take(5) {
            eprintln!("max {max_tokens}: text {i} {:?}\n  eeane  {:?}\n  python {:?}", texts[i], got[i][0].ids, ids[i]);
        }
        assert!(differ.is_empty(), "max_tokens {max_tokens}: {} of {} texts differ", differ.len(), texts.len());
        println!("tokenizer.json, max_tokens {max_tokens}: {} texts, ids and type ids identical to Python tokenizers", texts.len());
    }
}
