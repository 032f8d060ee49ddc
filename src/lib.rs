//! eeane: many text-embedding models, each bound through a TOML registry to a
//! pluggable engine, served over an OpenAI-compatible HTTP API.

pub mod allocator;
pub mod batcher;
pub mod bench;
pub mod config;
pub mod corpus;
pub mod cpu_sets;
pub mod engine_host;
pub mod engines;
pub mod http;
pub mod integrity;
pub mod manifest;
pub mod model;
pub mod pooling;
pub mod pull;
pub mod registry;
pub mod rerank_template;
pub mod serving;
pub mod sync;
pub mod tokenize;
pub mod variants;
