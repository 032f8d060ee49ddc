//! Shared tokenization: text or caller-supplied token ids become the exact
//! sequence the model sees, special tokens and truncation included.

use std::path::Path;

use tokenizers::{Encoding, Token, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

/// One sequence ready for an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenizeError {
    #[error("token id {id} (input {input}, position {position}) is outside the model's vocabulary (0..{vocab_size})")]
    OutOfVocabulary { input: usize, position: usize, id: i64, vocab_size: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

pub struct TextTokenizer {
    inner: Tokenizer,
    vocab_size: usize,
    pad_id: i64,
}

impl TextTokenizer {
    /// Loads a HF tokenizer.json. Padding baked into the file is dropped (the
    /// batcher pads) and truncation is set to `max_tokens`, special tokens included.
    pub fn from_file(path: &Path, max_tokens: usize) -> Result<Self, TokenizeError> {
        let mut inner = Tokenizer::from_file(path).map_err(|e| TokenizeError::Tokenizer(format!("{}: {e}", path.display())))?;
        let pad_id = inner.get_padding().map(|p| p.pad_id as i64).unwrap_or(0);
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let vocab_size = inner.get_vocab_size(true);
        Ok(Self { inner, vocab_size, pad_id })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn pad_id(&self) -> i64 {
        self.pad_id
    }

    pub fn encode_texts(&self, texts: &[String]) -> Result<Vec<Encoded>, TokenizeError> {
        texts
            .iter()
            .map(|t| self.inner.encode(t.as_str(), true).map(to_encoded).map_err(|e| TokenizeError::Tokenizer(e.to_string())))
            .collect()
    }

    /// Token ids are content tokens in the model's own vocabulary: the model's
    /// special tokens are added and truncation applied exactly as for text, so
    /// `encode(text, add_special_tokens=False).ids` gives the text's vector.
    pub fn encode_ids(&self, inputs: &[Vec<i64>]) -> Result<Vec<Encoded>, TokenizeError> {
        inputs
            .iter()
            .enumerate()
            .map(|(input, ids)| {
                let tokens = ids
                    .iter()
                    .enumerate()
                    .map(|(position, &id)| {
                        let token = u32::try_from(id).ok().and_then(|id32| self.inner.id_to_token(id32).map(|t| (id32, t)));
                        match token {
                            Some((id32, value)) if (id as usize) < self.vocab_size => Ok(Token::new(id32, value, (0, 0))),
                            _ => Err(TokenizeError::OutOfVocabulary { input, position, id, vocab_size: self.vocab_size }),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.inner
                    .post_process(Encoding::from_tokens(tokens, 0), None, true)
                    .map(to_encoded)
                    .map_err(|e| TokenizeError::Tokenizer(e.to_string()))
            })
            .collect()
    }
}

fn to_encoded(e: Encoding) -> Encoded {
    Encoded {
        ids: e.get_ids().iter().map(|&i| i as i64).collect(),
        type_ids: e.get_type_ids().iter().map(|&i| i as i64).collect(),
    }
}
