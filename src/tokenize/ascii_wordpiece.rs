//! BERT's tokenizer on ASCII text without the `tokenizers` crate's string
//! bookkeeping. For a `tokenizer.json` whose normalizer is BertNormalizer,
//! pre-tokenizer BertPreTokenizer and model WordPiece, an ASCII text's
//! normalization is a per-byte map (drop control bytes, whitespace to a
//! space, lowercase) and its pre-tokenization a split on spaces and ASCII
//! punctuation; only the words go to the crate's own WordPiece model. The
//! crate tracks an alignment per byte through every step (NormalizedString,
//! PreTokenizedString): on 4,000 paragraphs of Python's standard library,
//! one core of a 2-core AMD EPYC, it took 157-188 µs a text, this way 34-40
//! (the same ids on all 3,992 ASCII ones); the WordPiece calls are most of
//! what remains.
//!
//! Anything else goes the crate's whole way: a text with a non-ASCII byte,
//! or one holding an added token's string (`[CLS]`, `[MASK]`: the crate
//! splits those out before normalizing). Tests hold the two ways to the same
//! ids on real tokenizers and on texts built to hit every rule.

use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Model, Tokenizer};

use super::TokenizeError;

pub struct AsciiWordPiece {
    clean_text: bool,
    lowercase: bool,
    /// Added tokens' strings, as written and lowercased: a text holding one
    /// in either form takes the crate's way.
    added: Vec<(String, String)>,
}

impl AsciiWordPiece {
    /// The fast way, when `tokenizer` is BERT's pipeline and nothing else.
    pub fn find(tokenizer: &Tokenizer) -> Option<Self> {
        let Some(NormalizerWrapper::BertNormalizer(normalizer)) = tokenizer.get_normalizer() else {
            return None;
        };
        if !matches!(tokenizer.get_pre_tokenizer(), Some(PreTokenizerWrapper::BertPreTokenizer(_))) {
            return None;
        }
        if !matches!(tokenizer.get_model(), ModelWrapper::WordPiece(_)) {
            return None;
        }
        let added = tokenizer
            .get_added_tokens_decoder()
            .values()
            .filter(|token| !token.content.is_empty())
            .map(|token| (token.content.clone(), token.content.to_lowercase()))
            .collect();
        // Accents and Chinese characters are outside ASCII: those two options change nothing here.
        Some(Self { clean_text: normalizer.clean_text, lowercase: normalizer.lowercase, added })
    }

    /// `text`'s content ids, or `None` where the crate's whole way must take it.
    pub fn content(&self, text: &str, model: &ModelWrapper) -> Option<Result<Vec<u32>, TokenizeError>> {
        if !text.is_ascii() {
            return None;
        }
        let normalized: Vec<u8> = text.bytes().filter_map(|b| self.normalize(b)).collect();
        // Lowercased whole, so that an added token matches in any case (the crate
        // matches some as written, some after normalizing).
        let folded = normalized.to_ascii_lowercase();
        let raw = text.as_bytes();
        if self.added.iter().any(|(token, lower)| contains(raw, token.as_bytes()) || contains(&folded, lower.as_bytes())) {
            return None;
        }
        Some(self.words(&normalized, model))
    }

    /// BertNormalizer on one ASCII byte: `None` drops it.
    fn normalize(&self, b: u8) -> Option<u8> {
        let mut b = b;
        if self.clean_text {
            // NUL and control characters go, except tab, newline and carriage
            // return, which are whitespace and become a space.
            match b {
                b'\t' | b'\n' | b'\r' => b = b' ',
                0x00..=0x1f | 0x7f => return None,
                _ => {}
            }
        }
        if self.lowercase {
            b = b.to_ascii_lowercase();
        }
        Some(b)
    }

    /// BertPreTokenizer (whitespace removed, each punctuation character a
    /// word of its own), then WordPiece word by word.
    fn words(&self, normalized: &[u8], model: &ModelWrapper) -> Result<Vec<u32>, TokenizeError> {
        let mut ids = Vec::with_capacity(normalized.len() / 3);
        let emit = |word: &[u8], ids: &mut Vec<u32>| -> Result<(), TokenizeError> {
            // ASCII bytes are UTF-8.
            let word = std::str::from_utf8(word).expect("ASCII");
            let tokens = model.tokenize(word).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
            ids.extend(tokens.iter().map(|t| t.id));
            Ok(())
        };
        let mut start = 0;
        for (i, &b) in normalized.iter().enumerate() {
            // char::is_whitespace on ASCII: tab, newline, vertical tab, form feed, carriage return, space.
            let space = matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ');
            if space || b.is_ascii_punctuation() {
                if start < i {
                    emit(&normalized[start..i], &mut ids)?;
                }
                if !space {
                    emit(&normalized[i..i + 1], &mut ids)?;
                }
                start = i + 1;
            }
        }
        if start < normalized.len() {
            emit(&normalized[start..], &mut ids)?;
        }
        Ok(ids)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use tokenizers::Tokenizer;

    use super::AsciiWordPiece;

    fn crate_ids(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
        tokenizer.encode_fast(text, false).unwrap().get_ids().to_vec()
    }

    /// A BERT tokenizer.json: all-MiniLM-L6-v2's, prepared by `bash tests/run.sh`.
    fn minilm() -> Option<Tokenizer> {
        let home =
            std::env::var_os("EEANE_CACHE_DIR").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/eeane")))?;
        let mut tokenizer = Tokenizer::from_file(home.join("models/all-minilm-l6-v2/tokenizer.json")).ok()?;
        // As HfTokenizer reads it: the file pads to 128 and truncates.
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).unwrap();
        Some(tokenizer)
    }

    #[test]
    fn every_rule_gives_the_crates_ids() {
        let Some(tokenizer) = minilm() else {
            panic!("all-MiniLM-L6-v2's tokenizer.json is missing: run `bash tests/run.sh`");
        };
        let fast = AsciiWordPiece::find(&tokenizer).expect("MiniLM's tokenizer is BERT's pipeline");
        let long_word = "x".repeat(101);
        let texts = [
            "",
            "   ",
            "Hello, World! How's it going?",
            "def f(x):\n\treturn x**2  # squared\r\n",
            "tabs\tand\nnewlines\rand\x0bvertical\x0cform feeds",
            "nul\0and\x01control\x1fbytes\x7fdeleted",
            "UPPER lower MiXeD CaSe",
            "punctuation!!!...???---___***@@@###$$$%%%^^^&&&(((]]]{{{}}}|||\\\\\\~~~```'''\"\"\"<<<>>>///",
            "unknownwordpiecesqqqzzzxxyy and ##hashes",
            &long_word,
            "numbers 12345 3.14159 1e-10 0xdeadbeef",
            "a [CLS] token inside",
            "a [mask] token lowercased",
            "an almost [CL S] token",
            "snake_case_name and camelCaseName and kebab-case-name",
        ];
        for text in texts {
            let got = fast.content(text, tokenizer.get_model());
            if text.to_lowercase().contains("[cls]") || text.to_lowercase().contains("[mask]") {
                assert!(got.is_none(), "{text:?} holds an added token: the crate's way");
                continue;
            }
            assert_eq!(got.expect("ASCII").unwrap(), crate_ids(&tokenizer, text), "{text:?}");
        }
        assert!(fast.content("café", tokenizer.get_model()).is_none(), "non-ASCII goes the crate's way");
    }

    #[test]
    fn every_ascii_byte_in_every_position_gives_the_crates_ids() {
        let Some(tokenizer) = minilm() else {
            panic!("all-MiniLM-L6-v2's tokenizer.json is missing: run `bash tests/run.sh`");
        };
        let fast = AsciiWordPiece::find(&tokenizer).unwrap();
        for b in 0u8..0x80 {
            let c = b as char;
            for text in [format!("{c}"), format!("ab{c}cd"), format!("{c}word {c}"), format!("x{c}{c}y z")] {
                let Some(got) = fast.content(&text, tokenizer.get_model()) else { continue };
                assert_eq!(got.unwrap(), crate_ids(&tokenizer, &text), "byte {b:#04x} in {text:?}");
            }
        }
    }

    #[test]
    fn a_pipeline_that_is_not_berts_is_not_taken() {
        let Some(mut tokenizer) = minilm() else {
            panic!("all-MiniLM-L6-v2's tokenizer.json is missing: run `bash tests/run.sh`");
        };
        tokenizer.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
        assert!(AsciiWordPiece::find(&tokenizer).is_none());
    }

    /// Paragraphs of this repository's code and docs, and the bench corpus:
    /// code and prose as a coding tool indexes them.
    fn paragraphs() -> Vec<String> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in ["src", "src/tokenize", "src/batcher", "src/http", "docs", "tests"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs" || e == "md" || e == "py") {
                    files.push(path);
                }
            }
        }
        files.sort();
        let mut texts: Vec<String> =
            files.iter().flat_map(|f| std::fs::read_to_string(f).unwrap().split("\n\n").map(str::to_string).collect::<Vec<_>>()).collect();
        texts.extend(crate::corpus::corpus(2000, 7));
        texts
    }

    #[test]
    fn this_repositorys_paragraphs_give_the_crates_ids() {
        let Some(tokenizer) = minilm() else {
            panic!("all-MiniLM-L6-v2's tokenizer.json is missing: run `bash tests/run.sh`");
        };
        let fast = AsciiWordPiece::find(&tokenizer).unwrap();
        let texts = paragraphs();
        let taken: Vec<&String> = texts.iter().filter(|t| fast.content(t, tokenizer.get_model()).is_some()).collect();
        assert!(taken.len() * 10 > texts.len() * 9, "only {} of {} texts were ASCII without added tokens", taken.len(), texts.len());
        let started = std::time::Instant::now();
        let fast_ids: Vec<Vec<u32>> = taken.iter().map(|t| fast.content(t, tokenizer.get_model()).unwrap().unwrap()).collect();
        let fast_time = started.elapsed().as_secs_f64();
        let started = std::time::Instant::now();
        let crate_all: Vec<Vec<u32>> = taken.iter().map(|t| crate_ids(&tokenizer, t)).collect();
        let crate_time = started.elapsed().as_secs_f64();
        for ((text, fast), crate_ids) in taken.iter().zip(&fast_ids).zip(&crate_all) {
            assert_eq!(fast, crate_ids, "{text:?}");
        }
        let per_text = |seconds: f64| seconds * 1e6 / taken.len() as f64;
        println!(
            "{} paragraphs, {} of them the fast way with the crate's ids; one thread: {:.1} µs a text against the crate's {:.1} ({:.1}x)",
            texts.len(),
            taken.len(),
            per_text(fast_time),
            per_text(crate_time),
            crate_time / fast_time
        );
    }
}
