//! BERT's tokenizer pipeline without the `tokenizers` crate's string
//! bookkeeping. For a `tokenizer.json` whose normalizer is BertNormalizer,
//! pre-tokenizer BertPreTokenizer and model WordPiece, normalization maps
//! characters (control characters dropped, whitespace to a space, Chinese
//! characters spaced, accents stripped by NFD, lowercase) and
//! pre-tokenization splits on whitespace and punctuation; the words go
//! through WordPiece (below). The crate instead tracks an alignment per
//! byte through every step (NormalizedString, PreTokenizedString): on 4,000
//! paragraphs of Python's standard library, one core of a 2-core AMD EPYC,
//! it took 148-167 µs a text, this way 16.8-17.6 (the same ids). WordPiece
//! is the crate's algorithm on the loaded model's own vocabulary
//! (`token_to_id`), without its per-token bookkeeping: the crate makes a `Token` with
//! its own `String` for every piece and formats `##` + the rest for every
//! length it tries, so that its WordPiece calls were two thirds of what
//! remained. Unicode tables are the crate's own (unicode_categories,
//! unicode-normalization-alignments), at its versions.
//!
//! A text holding an added token's string (`[CLS]` as written, a token
//! marked `normalized` in its normalized form: the crate splits those out)
//! goes the crate's whole way; so does every text of a file with a
//! normalized added token that normalizes to nothing (the crate's empty
//! pattern then splits the text character by character). Tests hold the two
//! ways to the same ids on real tokenizers, on texts built to hit every rule,
//! on many scripts, on random Unicode, and with added tokens of every kind.

use aho_corasick::AhoCorasick;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Model, Tokenizer};
use unicode_categories::UnicodeCategories;
use unicode_normalization_alignments::UnicodeNormalization;

use super::TokenizeError;

pub struct BertWordPiece {
    clean_text: bool,
    handle_chinese_chars: bool,
    strip_accents: bool,
    lowercase: bool,
    /// Added tokens' strings as written, and as normalized: a text holding
    /// one, or whose normalized form holds one, takes the crate's way.
    added_raw: Option<AhoCorasick>,
    added_normalized: Option<AhoCorasick>,
}

impl BertWordPiece {
    /// The short way, when `tokenizer` is BERT's pipeline and nothing else.
    /// Padding and truncation are not looked at: HfTokenizer drops the
    /// file's before asking.
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
        let mut way = Self {
            clean_text: normalizer.clean_text,
            handle_chinese_chars: normalizer.handle_chinese_chars,
            // BertNormalizer strips accents when lowercasing unless told otherwise.
            strip_accents: normalizer.strip_accents.unwrap_or(normalizer.lowercase),
            lowercase: normalizer.lowercase,
            added_raw: None,
            added_normalized: None,
        };
        let added: Vec<tokenizers::AddedToken> = tokenizer.get_added_tokens_decoder().into_values().collect();
        let normalized: Vec<(bool, String)> = added.iter().map(|token| (token.normalized, way.normalize(&token.content))).collect();
        if normalized.iter().any(|(marked, form)| *marked && form.is_empty()) {
            return None;
        }
        way.added_raw = matcher(added.iter().map(|token| token.content.as_str()));
        // Every token's normalized form, marked or not: a superset of what the crate matches.
        way.added_normalized = matcher(normalized.iter().map(|(_, form)| form.as_str()));
        Some(way)
    }

    /// `text`'s content ids, or `None` where the crate's whole way must take it.
    /// `model` is the tokenizer's own (`find` took only a WordPiece one).
    pub fn content(&self, text: &str, model: &ModelWrapper) -> Option<Result<Vec<u32>, TokenizeError>> {
        let ModelWrapper::WordPiece(model) = model else {
            return None;
        };
        let holds = |matcher: &Option<AhoCorasick>, text: &str| matcher.as_ref().is_some_and(|m| m.is_match(text));
        if holds(&self.added_raw, text) {
            return None;
        }
        let normalized = self.normalize(text);
        if holds(&self.added_normalized, &normalized) {
            return None;
        }
        Some(words(&normalized, model))
    }

    /// BertNormalizer's steps in its order, on the whole text.
    fn normalize(&self, text: &str) -> String {
        let ascii = text.is_ascii();
        let mut out = String::with_capacity(text.len() + 8);
        for c in text.chars() {
            let c = match self.clean_text {
                true if c == '\u{fffd}' || is_control(c) => continue,
                // BertNormalizer's whitespace (tab, newline, carriage return and
                // Unicode's White_Space) is Rust's.
                true if c.is_whitespace() => ' ',
                _ => c,
            };
            if self.handle_chinese_chars && !c.is_ascii() && is_chinese_char(c) {
                out.extend([' ', c, ' ']);
            } else {
                out.push(c);
            }
        }
        // NFD and nonspacing marks change nothing in ASCII.
        if self.strip_accents && !ascii {
            out = out.as_str().nfd().map(|(c, _)| c).filter(|c| !c.is_mark_nonspacing()).collect();
        }
        if self.lowercase {
            if ascii {
                out.make_ascii_lowercase();
            } else {
                out = out.chars().flat_map(char::to_lowercase).collect();
            }
        }
        out
    }
}

/// One matcher for the non-empty strings of `patterns`, if any.
fn matcher<'p>(patterns: impl Iterator<Item = &'p str>) -> Option<AhoCorasick> {
    let patterns: Vec<&str> = patterns.filter(|p| !p.is_empty()).collect();
    (!patterns.is_empty()).then(|| AhoCorasick::new(patterns).expect("added tokens are short strings"))
}

/// `word`'s ids after `ids`, as the crate's `WordPiece::tokenize` splits it
/// and on its vocabulary: the longest piece in the vocabulary from the
/// start, then the longest `##` piece from where it ended, and so on; a word
/// longer than `max_input_chars_per_word` characters, or with a rest that no
/// piece starts, is one `[UNK]`. `piece` is a buffer for the `##` pieces tried.
fn split(model: &WordPiece, word: &str, ids: &mut Vec<u32>, piece: &mut String) -> Result<(), TokenizeError> {
    let unknown = |ids: &mut Vec<u32>| match model.token_to_id(&model.unk_token) {
        Some(id) => {
            ids.push(id);
            Ok(())
        }
        None => Err(TokenizeError::Tokenizer(format!("WordPiece's unknown token {:?} is not in its vocabulary", model.unk_token))),
    };
    // Characters are at most bytes: only a long word needs counting.
    let max_chars = model.max_input_chars_per_word;
    if word.len() > max_chars && word.chars().count() > max_chars {
        return unknown(ids);
    }
    let first = ids.len();
    let mut start = 0;
    while start < word.len() {
        let mut end = word.len();
        let found = loop {
            if start == end {
                break None;
            }
            let rest = &word[start..end];
            let id = if start == 0 {
                model.token_to_id(rest)
            } else {
                piece.clear();
                piece.push_str(&model.continuing_subword_prefix);
                piece.push_str(rest);
                model.token_to_id(piece)
            };
            if id.is_some() {
                break id;
            }
            end -= rest.chars().next_back().map_or(1, char::len_utf8);
        };
        let Some(id) = found else {
            ids.truncate(first);
            return unknown(ids);
        };
        ids.push(id);
        start = end;
    }
    Ok(())
}

/// BertPreTokenizer (whitespace removed, each punctuation character a word
/// of its own), then WordPiece word by word.
fn words(normalized: &str, model: &WordPiece) -> Result<Vec<u32>, TokenizeError> {
    let mut ids = Vec::with_capacity(normalized.len() / 3);
    let mut piece = String::new();
    let mut emit = |word: &str| split(model, word, &mut ids, &mut piece);
    let mut start = 0;
    for (i, c) in normalized.char_indices() {
        let space = c.is_whitespace();
        // Every punctuation character of ASCII is ASCII punctuation; the table is for the rest.
        let punctuation = if c.is_ascii() { c.is_ascii_punctuation() } else { c.is_punctuation() };
        if space || punctuation {
            if start < i {
                emit(&normalized[start..i])?;
            }
            let end = i + c.len_utf8();
            if !space {
                emit(&normalized[i..end])?;
            }
            start = end;
        }
    }
    if start < normalized.len() {
        emit(&normalized[start..])?;
    }
    Ok(ids)
}

/// BertNormalizer's control characters: unicode_categories' "other" (Cc,
/// Cf, Co) but tab, newline and carriage return.
fn is_control(c: char) -> bool {
    match c {
        '\t' | '\n' | '\r' => false,
        // ASCII's other characters are its controls, Cc.
        '\0'..='\x1f' | '\x7f' => true,
        _ => !c.is_ascii() && c.is_other(),
    }
}

/// BertNormalizer's Chinese characters: the CJK Unified Ideographs blocks and
/// their extensions A-E, and the compatibility ideographs.
fn is_chinese_char(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use tokenizers::Tokenizer;

    use super::BertWordPiece;

    fn crate_ids(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
        tokenizer.encode_fast(text, false).unwrap().get_ids().to_vec()
    }

    /// A BERT tokenizer.json in the repository: a 512-entry vocabulary
    /// (tests/hub/fixtures/bert-bin-tiny), BERT's normalizer and
    /// pre-tokenizer, uncased.
    fn bert() -> Tokenizer {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/hub/fixtures/bert-bin-tiny/tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(path).unwrap();
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).unwrap();
        tokenizer
    }

    /// all-MiniLM-L6-v2's tokenizer.json (a real vocabulary), prepared by `bash tests/run.sh`.
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
        let tokenizer = bert();
        let fast = BertWordPiece::find(&tokenizer).expect("BERT's pipeline");
        let long_word = "x".repeat(101);
        // WordPiece's limit is 100 characters: at it, over it in bytes only, over it.
        let (at_limit, long_in_bytes, long_cyrillic) = ("xyz".repeat(33) + "q", "ир".repeat(50), "и".repeat(101));
        let texts = [
            &at_limit,
            &long_in_bytes,
            &long_cyrillic,
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
            if text.contains("[CLS]") {
                assert!(got.is_none(), "{text:?} holds an added token as written: the crate's way");
                continue;
            }
            // "[mask]" goes the crate's way too: its normalized form is an added token's.
            let Some(got) = got else { continue };
            assert_eq!(got.unwrap(), crate_ids(&tokenizer, text), "{text:?}");
        }
        for text in ["café Ñandú İstanbul straße ﬁne", "中文字符和English混合", "Ελληνικά Кириллица", "a\u{200b}b\u{feff}c\u{fffd}d\u{e000}e"]
        {
            assert_eq!(fast.content(text, tokenizer.get_model()).expect("no added token").unwrap(), crate_ids(&tokenizer, text), "{text:?}");
        }
    }

    #[test]
    fn every_ascii_byte_in_every_position_gives_the_crates_ids() {
        let tokenizer = bert();
        let fast = BertWordPiece::find(&tokenizer).unwrap();
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
        use tokenizers::normalizers::{BertNormalizer, Lowercase, Sequence};
        let mut tokenizer = bert();
        tokenizer.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
        assert!(BertWordPiece::find(&tokenizer).is_none(), "another pre-tokenizer");
        let mut tokenizer = bert();
        tokenizer.with_normalizer(Some(Sequence::new(vec![BertNormalizer::default().into(), Lowercase.into()])));
        assert!(BertWordPiece::find(&tokenizer).is_none(), "a sequence of normalizers");
        let mut tokenizer = bert();
        tokenizer.with_normalizer(None::<BertNormalizer>);
        assert!(BertWordPiece::find(&tokenizer).is_none(), "no normalizer");
    }

    /// Added tokens of every kind: marked normalized (the default for a
    /// non-special token) or not, special, single-word, stripping spaces on
    /// either side, with an accent, added after the normalizer was set.
    #[test]
    fn added_tokens_of_every_kind_give_the_crates_ids() {
        use tokenizers::normalizers::BertNormalizer;
        use tokenizers::AddedToken;
        for lowercase in [true, false] {
            let mut tokenizer = bert();
            tokenizer.with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)));
            tokenizer.add_tokens(&[
                AddedToken::from("FOO", false),
                AddedToken::from("Bär", false).single_word(true),
                AddedToken::from("<x>", true),
                AddedToken::from("lst", false).lstrip(true).rstrip(true),
                AddedToken::from("raw", false).normalized(false),
            ]);
            let fast = BertWordPiece::find(&tokenizer).expect("BERT's pipeline");
            let texts = ["foo bar", "FOO bar", "xFOOx", "bär Bär BAR bar", "a<x>b <X>", "a lst b", "alstb", "raw RAW Raw", "none of them here", "Ba\u{308}r"];
            let randoms = random_texts(500, 13);
            let mut taken = 0;
            for text in texts.into_iter().chain(randoms.iter().map(String::as_str)) {
                let Some(got) = fast.content(text, tokenizer.get_model()) else { continue };
                taken += 1;
                assert_eq!(got.unwrap(), crate_ids(&tokenizer, text), "lowercase {lowercase}: {text:?}");
            }
            assert!(taken > 400, "{taken} texts taken");
            assert!(fast.content("a <x> b", tokenizer.get_model()).is_none(), "a special token as written");
        }
    }

    /// A normalized added token that BertNormalizer deletes entirely (a
    /// zero-width joiner) makes the crate split every text into characters.
    #[test]
    fn a_token_that_normalizes_to_nothing_keeps_the_crates_way() {
        let mut tokenizer = bert();
        tokenizer.add_tokens(&[tokenizers::AddedToken::from("\u{200d}", false)]);
        assert!(BertWordPiece::find(&tokenizer).is_none());
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
        let fast = BertWordPiece::find(&tokenizer).unwrap();
        let texts = paragraphs();
        let taken: Vec<&String> = texts.iter().filter(|t| fast.content(t, tokenizer.get_model()).is_some()).collect();
        assert!(taken.len() * 10 > texts.len() * 9, "only {} of {} texts were without added tokens", taken.len(), texts.len());
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
            "{} paragraphs, {} of them the short way with the crate's ids; one thread: {:.1} µs a text against the crate's {:.1} ({:.1}x)",
            texts.len(),
            taken.len(),
            per_text(fast_time),
            per_text(crate_time),
            crate_time / fast_time
        );
    }

    /// Characters from the ranges where BERT's rules differ: Latin with
    /// accents and combining marks, Turkish dotted I, ligatures, Greek,
    /// Cyrillic, Devanagari's marks, Hangul, CJK and its compatibility
    /// ideographs, zero-width and format characters, private use, the
    /// replacement character, emoji, fullwidth forms, Unicode's spaces.
    #[test]
    fn random_unicode_gives_the_crates_ids() {
        let tokenizer = bert();
        let fast = BertWordPiece::find(&tokenizer).unwrap();
        let mut taken = 0;
        for text in random_texts(20_000, 11) {
            let Some(got) = fast.content(&text, tokenizer.get_model()) else { continue };
            taken += 1;
            assert_eq!(got.unwrap(), crate_ids(&tokenizer, &text), "{text:?} {:?}", text.chars().map(|c| c as u32).collect::<Vec<_>>());
        }
        assert!(taken > 19_000, "{taken} of 20,000 random texts taken");
    }

    /// `n` texts of up to 23 characters from the ranges where BERT's rules
    /// differ (see `random_unicode_gives_the_crates_ids`).
    fn random_texts(n: usize, seed: u64) -> Vec<String> {
        use rand::{Rng, SeedableRng};
        let ranges: &[(u32, u32)] = &[
            (0x00, 0x7f),
            (0x80, 0x24f),
            (0x300, 0x36f),
            (0x130, 0x131),
            (0x370, 0x3ff),
            (0x400, 0x4ff),
            (0x900, 0x97f),
            (0x1e00, 0x1eff),
            (0x2000, 0x206f),
            (0x3000, 0x303f),
            (0x3400, 0x3410),
            (0x4e00, 0x4e80),
            (0xac00, 0xac80),
            (0xe000, 0xe010),
            (0xf900, 0xf920),
            (0xfb00, 0xfb06),
            (0xfe00, 0xfe0f),
            (0xfeff, 0xfeff),
            (0xff00, 0xff60),
            (0xfffd, 0xfffd),
            (0x1f300, 0x1f64f),
            (0x20000, 0x20010),
            (0x2f800, 0x2f810),
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let len = rng.random_range(0..24);
                (0..len)
                    .filter_map(|_| {
                        let (lo, hi) = ranges[rng.random_range(0..ranges.len())];
                        char::from_u32(rng.random_range(lo..=hi))
                    })
                    .collect()
            })
            .collect()
    }

    /// Cased models, and files that switch a step off: each of the 24
    /// settings of BertNormalizer on random Unicode and this repository's
    /// paragraphs. (The file's added tokens are all marked not normalized,
    /// so the normalizer set here does not change how they are matched.)
    #[test]
    fn every_normalizer_setting_gives_the_crates_ids() {
        use tokenizers::normalizers::BertNormalizer;
        let mut tokenizer = bert();
        let mut texts = random_texts(2_000, 12);
        texts.extend(paragraphs().into_iter().take(500));
        for setting in 0..24 {
            let strip_accents = [None, Some(false), Some(true)][setting / 8];
            let (clean_text, handle_chinese_chars, lowercase) = (setting & 1 == 1, setting & 2 == 2, setting & 4 == 4);
            tokenizer.with_normalizer(Some(BertNormalizer::new(clean_text, handle_chinese_chars, strip_accents, lowercase)));
            let fast = BertWordPiece::find(&tokenizer).expect("still BERT's pipeline");
            for text in &texts {
                let Some(got) = fast.content(text, tokenizer.get_model()) else { continue };
                assert_eq!(
                    got.unwrap(),
                    crate_ids(&tokenizer, text),
                    "clean_text {clean_text}, chinese {handle_chinese_chars}, strip_accents {strip_accents:?}, lowercase {lowercase}: {text:?}"
                );
            }
        }
    }
}
