//! Hugging Face `tokenizer.json` (WordPiece, BPE, Unigram as HF serialises them).

use std::path::Path;

use tokenizers::{Encoding, PostProcessor, Token, Tokenizer};

use super::{Encoded, TokenizeError, Vocabulary};

pub struct HfTokenizer {
    inner: Tokenizer,
    vocab_size: usize,
    pad_id: i64,
    specials: usize,
    pair_specials: usize,
}

impl HfTokenizer {
    /// Padding and truncation baked into the file are dropped: the batcher pads,
    /// and the shared layer truncates or windows the content ids.
    pub fn from_file(path: &Path) -> Result<Self, TokenizeError> {
        let mut inner = Tokenizer::from_file(path).map_err(|e| TokenizeError::Tokenizer(format!("{}: {e}", path.display())))?;
        let pad_id = inner.get_padding().map(|p| p.pad_id as i64).unwrap_or(0);
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let vocab_size = inner.get_vocab_size(true);
        let specials = inner.get_post_processor().map(|p| p.added_tokens(false)).unwrap_or(0);
        let pair_specials = inner.get_post_processor().map(|p| p.added_tokens(true)).unwrap_or(0);
        Ok(Self { inner, vocab_size, pad_id, specials, pair_specials })
    }

    /// Special tokens the post-processor adds to a pair of sequences.
    pub fn pair_specials(&self) -> usize {
        self.pair_specials
    }

    fn encoding(&self, content: &[u32], type_id: u32) -> Encoding {
        let tokens = content.iter().map(|&id| Token::new(id, self.inner.id_to_token(id).unwrap_or_default(), (0, 0))).collect();
        Encoding::from_tokens(tokens, type_id)
    }

    /// A pair as the model's template joins two sequences (BERT: `[CLS] a
    /// [SEP] b [SEP]`, type ids 0 then 1).
    pub fn wrap_pair(&self, first: &[u32], second: &[u32]) -> Result<Encoded, TokenizeError> {
        self.post_process(self.encoding(first, 0), Some(self.encoding(second, 1)))
    }

    fn post_process(&self, first: Encoding, second: Option<Encoding>) -> Result<Encoded, TokenizeError> {
        let encoding = self.inner.post_process(first, second, true).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        Ok(Encoded { ids: encoding.get_ids().iter().map(|&i| i as i64).collect(), type_ids: encoding.get_type_ids().iter().map(|&i| i as i64).collect() })
    }
}

impl Vocabulary for HfTokenizer {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn pad_id(&self) -> i64 {
        self.pad_id
    }

    /// Special tokens the post-processor adds to one sequence.
    fn specials(&self) -> usize {
        self.specials
    }

    fn content(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self.inner.encode(text, false).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn check_id(&self, id: i64) -> Option<u32> {
        u32::try_from(id).ok().filter(|&id32| (id32 as usize) < self.vocab_size && self.inner.id_to_token(id32).is_some())
    }

    /// The model's special tokens around `content`, with its type ids.
    fn wrap(&self, content: &[u32]) -> Result<Encoded, TokenizeError> {
        self.post_process(self.encoding(content, 0), None)
    }

    fn pairs(&self) -> Option<&HfTokenizer> {
        Some(self)
    }
}
