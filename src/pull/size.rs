//! How large a model is and whether this machine has the memory for it: its
//! parameter count, read without loading the weights (a safetensors file's
//! header, an ONNX graph's initializers, or the count `models/prepare.py`
//! recorded in the prepared model's manifest), the memory its weights take
//! at a precision, the memory this machine has available (`MemAvailable`,
//! or the room left under the process's cgroup limit when that is lower),
//! and the refusal, in words, when a model does not fit.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// A model's size as counted from its files.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// The numbers its weights hold (the sum of the tensors' shape products).
    pub parameters: u64,
    /// Their bytes as the file stores them, when counted from the graph itself.
    pub stored_bytes: Option<u64>,
    /// Where the count came from, in words.
    pub from: String,
}

/// Why a checkpoint's safetensors could not be found or counted; each says
/// which file is at fault, for the pull's refusal.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("no model.safetensors and no model.safetensors.index.json")]
    NoWeights,
    #[error("model.safetensors.index.json is not JSON ({0})")]
    IndexNotJson(serde_json::Error),
    #[error("model.safetensors.index.json has no weight_map")]
    NoWeightMap,
    #[error("model.safetensors.index.json names {}, which the snapshot lacks", .0.join(", "))]
    MissingShards(Vec<String>),
    #[error("model.safetensors.index.json names no shard")]
    NoShards,
    #[error("{}: {reason}", path.display())]
    Header { path: PathBuf, reason: HeaderError },
}

/// Why a file's safetensors header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("{0}")]
    Open(std::io::Error),
    #[error("no safetensors header ({0})")]
    NoLength(std::io::Error),
    #[error("a header of {0} bytes: not a safetensors file")]
    TooLong(u64),
    #[error("the header is cut short ({0})")]
    CutShort(std::io::Error),
    #[error("the header is not JSON ({0})")]
    NotJson(serde_json::Error),
    #[error("tensor {0} has no shape")]
    NoShape(String),
    #[error("tensor {0} has no data_offsets")]
    NoDataOffsets(String),
}

/// The safetensors files of a checkpoint folder, as transformers looks for
/// them: `model.safetensors`, else every shard `model.safetensors.index.json`
/// names. An index naming a shard the folder lacks is refused.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    if dir.join("model.safetensors").is_file() {
        return Ok(vec![dir.join("model.safetensors")]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read(&index).map_err(|_| CheckpointError::NoWeights)?;
    let parsed: serde_json::Value = serde_json::from_slice(&text).map_err(CheckpointError::IndexNotJson)?;
    let map = parsed["weight_map"].as_object().ok_or(CheckpointError::NoWeightMap)?;
    let mut shards: Vec<&str> = map.values().filter_map(serde_json::Value::as_str).collect();
    shards.sort_unstable();
    shards.dedup();
    let missing: Vec<String> = shards.iter().filter(|s| !dir.join(s).is_file()).map(|s| s.to_string()).collect();
    if !missing.is_empty() {
        return Err(CheckpointError::MissingShards(missing));
    }
    if shards.is_empty() {
        return Err(CheckpointError::NoShards);
    }
    Ok(shards.iter().map(|s| dir.join(s)).collect())
}

/// The parameters and data bytes of safetensors files, from their headers
/// (an 8-byte little-endian length, then that much JSON: each tensor's
/// dtype, shape and data offsets); no weight is read.
pub fn safetensors(files: &[PathBuf]) -> Result<Weights, CheckpointError> {
    let (mut parameters, mut bytes) = (0u64, 0u64);
    for path in files {
        let (p, b) = safetensors_header(path).map_err(|reason| CheckpointError::Header { path: path.clone(), reason })?;
        parameters += p;
        bytes += b;
    }
    let from = match files {
        [one] => format!("the safetensors header of {}", one.file_name().unwrap_or_default().to_string_lossy()),
        many => format!("the safetensors headers of {} shards", many.len()),
    };
    Ok(Weights { parameters, stored_bytes: Some(bytes), from })
}

fn safetensors_header(path: &Path) -> Result<(u64, u64), HeaderError> {
    let mut file = File::open(path).map_err(HeaderError::Open)?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length).map_err(HeaderError::NoLength)?;
    let length = u64::from_le_bytes(length);
    if length > 100 << 20 {
        return Err(HeaderError::TooLong(length));
    }
    let mut header = vec![0u8; length as usize];
    file.read_exact(&mut header).map_err(HeaderError::CutShort)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header).map_err(HeaderError::NotJson)?;
    let (mut parameters, mut bytes) = (0u64, 0u64);
    for (name, tensor) in header.iter().filter(|(name, _)| *name != "__metadata__") {
        let shape = tensor["shape"].as_array().ok_or_else(|| HeaderError::NoShape(name.clone()))?;
        parameters += shape.iter().map(|d| d.as_u64().unwrap_or(0)).product::<u64>();
        let offsets = tensor["data_offsets"].as_array().ok_or_else(|| HeaderError::NoDataOffsets(name.clone()))?;
        if let [start, end] = offsets.as_slice() {
            bytes += end.as_u64().unwrap_or(0).saturating_sub(start.as_u64().unwrap_or(0));
        }
    }
    Ok((parameters, bytes))
}

/// The parameters of an ONNX graph: its initializers' shapes and element
/// types, read by walking the protobuf and skipping over every tensor's
/// data (inline or external), so that a graph of any size is read in
/// kilobytes. Initializers inside subgraphs are not counted.
pub fn onnx(path: &Path) -> std::io::Result<Weights> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut proto = Proto { reader: BufReader::new(file), pos: 0 };
    let (mut parameters, mut bytes) = (0u64, 0u64);
    // ModelProto.graph = 7; GraphProto.initializer = 5; TensorProto.dims = 1, data_type = 2.
    while let Some((field, wire)) = proto.field(len)? {
        if (field, wire) != (7, 2) {
            proto.skip(wire)?;
            continue;
        }
        let graph_end = proto.end()?;
        while let Some((field, wire)) = proto.field(graph_end)? {
            if (field, wire) != (5, 2) {
                proto.skip(wire)?;
                continue;
            }
            let tensor_end = proto.end()?;
            let (mut count, mut data_type) = (1u64, 0u64);
            while let Some((field, wire)) = proto.field(tensor_end)? {
                match (field, wire) {
                    (1, 0) => count = count.saturating_mul(proto.varint()?),
                    (1, 2) => {
                        let end = proto.end()?;
                        while proto.pos < end {
                            count = count.saturating_mul(proto.varint()?);
                        }
                    }
                    (2, 0) => data_type = proto.varint()?,
                    _ => proto.skip(wire)?,
                }
            }
            parameters += count;
            bytes += count.saturating_mul(onnx_element_bits(data_type)) / 8;
        }
    }
    if proto.pos != len {
        return Err(invalid("the file ends inside a field"));
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    Ok(Weights { parameters, stored_bytes: Some(bytes), from: format!("the initializers of {name}") })
}

/// Bits per element of an ONNX TensorProto.DataType.
fn onnx_element_bits(data_type: u64) -> u64 {
    match data_type {
        2 | 3 | 9 | 17..=20 => 8, // uint8, int8, bool, the float8 types
        4 | 5 | 10 | 16 => 16,    // uint16, int16, float16, bfloat16
        1 | 6 | 12 => 32,         // float, int32, uint32
        7 | 11 | 13 | 14 => 64,   // int64, double, uint64, complex64
        15 => 128,                // complex128
        21..=23 => 4,             // uint4, int4, float4
        _ => 0,                   // strings, undefined
    }
}

/// A protobuf stream read field by field; `pos` counts the bytes consumed.
struct Proto {
    reader: BufReader<File>,
    pos: u64,
}

impl Proto {
    fn varint(&mut self) -> std::io::Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let mut byte = [0u8];
            self.reader.read_exact(&mut byte)?;
            self.pos += 1;
            value |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(invalid("a varint longer than 10 bytes"))
    }

    /// The next field's number and wire type, or `None` at `end`.
    fn field(&mut self, end: u64) -> std::io::Result<Option<(u64, u8)>> {
        if self.pos >= end {
            return Ok(None);
        }
        let key = self.varint()?;
        Ok(Some((key >> 3, (key & 7) as u8)))
    }

    /// Where a length-delimited value that starts here ends.
    fn end(&mut self) -> std::io::Result<u64> {
        let length = self.varint()?;
        Ok(self.pos + length)
    }

    fn forward(&mut self, bytes: u64) -> std::io::Result<()> {
        self.reader.seek_relative(i64::try_from(bytes).map_err(|_| invalid("a length past any file"))?)?;
        self.pos += bytes;
        Ok(())
    }

    fn skip(&mut self, wire: u8) -> std::io::Result<()> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.forward(8),
            2 => {
                let length = self.varint()?;
                self.forward(length)
            }
            5 => self.forward(4),
            other => Err(invalid(&format!("wire type {other}"))),
        }
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an ONNX protobuf: {what}"))
}

/// A prepared model's size: the count `models/prepare.py` recorded in the
/// manifest beside it (from the repository's safetensors headers), else its
/// ONNX graph's initializers; `None` for a graph of another format or a
/// file that cannot be read.
pub fn prepared(model: &Path) -> Option<Weights> {
    if let Some(parameters) = crate::manifest::Manifest::beside(model).and_then(|m| m.parameters) {
        let from = parameters.from.as_deref().unwrap_or("the repository's weights");
        return Some(Weights { parameters: parameters.count, stored_bytes: None, from: format!("{from}, recorded in manifest.json") });
    }
    if model.extension().is_some_and(|e| e == "onnx") {
        return onnx(model).ok();
    }
    None
}

/// Bytes a parameter takes at a precision, as the engines name them.
pub fn bytes_per_parameter(precision: &str) -> Option<u64> {
    match precision.to_ascii_lowercase().as_str() {
        "fp32" | "f32" | "float32" => Some(4),
        "bf16" | "fp16" | "f16" | "float16" | "bfloat16" => Some(2),
        "int8" | "i8" | "u8" => Some(1),
        _ => None,
    }
}

/// The memory a process can still take, and what says so.
#[derive(Debug, Clone, PartialEq)]
pub struct Available {
    pub bytes: u64,
    pub from: String,
}

/// This machine's available memory: /proc/meminfo's MemAvailable, or the
/// room under the process's cgroup memory limit when that is less (its
/// limit less its use, page cache that can be dropped not counted as use).
/// `EEANE_MEMORY_LIMIT_MIB` caps it, for a machine shared with other
/// services that no cgroup limit tells of. `None` where neither can be read
/// (not Linux).
pub fn available() -> Option<Available> {
    let host = meminfo_available(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
    let mut best = Available { bytes: host, from: "MemAvailable in /proc/meminfo".into() };
    let limit = std::env::var("EEANE_MEMORY_LIMIT_MIB").ok().and_then(|mib| {
        let parsed = mib.trim().parse::<u64>().ok();
        if parsed.is_none() {
            // Said once: this is read at every memory check.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| tracing::warn!("EEANE_MEMORY_LIMIT_MIB={mib:?} is not a whole number of MiB (e.g. 8192); it is ignored"));
        }
        parsed
    });
    let capped = limit.map(|mib| Available { bytes: mib << 20, from: format!("EEANE_MEMORY_LIMIT_MIB={mib}") });
    for room in [cgroup_room(), capped].into_iter().flatten() {
        if room.bytes < best.bytes {
            best = room;
        }
    }
    Some(best)
}

/// MemAvailable in bytes, from /proc/meminfo's text.
pub fn meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A cgroup's room: `limit` less `usage` less the inactive page cache
/// (`memory.stat`'s inactive_file, which the kernel reclaims before failing
/// an allocation). `None` without a limit ("max", or cgroup v1's near-2^63).
pub fn cgroup_room_of(limit: &str, usage: &str, stat: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok().filter(|&l| l < 1 << 62)?;
    let usage: u64 = usage.trim().parse().ok()?;
    let inactive = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file ").or_else(|| l.strip_prefix("inactive_file ")))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(inactive)))
}

/// The least room under this process's cgroup and its ancestors (cgroup v2),
/// or its v1 memory cgroup's.
fn cgroup_room() -> Option<Available> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut best: Option<Available> = None;
    let mut consider = |dir: &Path, limit: &str, usage: &str| {
        let (Some(l), Some(u)) = (read(&dir.join(limit)), read(&dir.join(usage))) else { return };
        let stat = read(&dir.join("memory.stat")).unwrap_or_default();
        if let Some(bytes) = cgroup_room_of(&l, &u, &stat) {
            if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                best = Some(Available { bytes, from: format!("the room under the cgroup limit in {}", dir.join(limit).display()) });
            }
        }
    };
    for line in membership.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2: the limit may sit on any ancestor.
            let root = Path::new("/sys/fs/cgroup");
            let mut dir = root.join(path);
            if !dir.is_dir() {
                dir = root.to_path_buf();
            }
            loop {
                consider(&dir, "memory.max", "memory.current");
                if dir == root || !dir.pop() || !dir.starts_with(root) {
                    break;
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let root = Path::new("/sys/fs/cgroup/memory");
            let dir = if root.join(path).is_dir() { root.join(path) } else { root.to_path_buf() };
            consider(&dir, "memory.limit_in_bytes", "memory.usage_in_bytes");
        }
    }
    best
}

/// Bytes in binary units: "512 KiB", "86.6 MiB", "28.2 GiB".
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else if bytes >= 1 << 20 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}

/// A count with thousands separated: "7,567,295,488".
fn grouped(count: u64) -> String {
    let digits = count.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    grouped
}

/// A count in words from a million on: "7.57 billion", "22.7 million".
fn in_words(count: u64) -> Option<String> {
    match count {
        c if c >= 1_000_000_000_000 => Some(format!("{:.2} trillion", c as f64 / 1e12)),
        c if c >= 1_000_000_000 => Some(format!("{:.2} billion", c as f64 / 1e9)),
        c if c >= 1_000_000 => Some(format!("{:.1} million", c as f64 / 1e6)),
        _ => None,
    }
}

/// "106,880 parameters", "22,713,216 parameters (22.7 million)".
pub fn human_parameters(count: u64) -> String {
    match in_words(count) {
        Some(words) => format!("{} parameters ({words})", grouped(count)),
        None => format!("{} parameters", grouped(count)),
    }
}

/// What loading or preparing a model takes in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    pub weights: Weights,
    /// The precision its weights are held in, as named to the user.
    pub precision: String,
    pub bytes_per_parameter: u64,
    /// Copies of the weights held at once (one per engine of the model).
    pub copies: u64,
}

impl Need {
    pub fn bytes(&self) -> u64 {
        self.weights.parameters.saturating_mul(self.bytes_per_parameter).saturating_mul(self.copies.max(1))
    }

    /// How the bytes were counted: "7,567,295,488 parameters, 7.57 billion,
    /// from ..., x 4 bytes in fp32, x 2 engines".
    pub fn explained(&self) -> String {
        let count = self.weights.parameters;
        let words = in_words(count).map(|w| format!(", {w}")).unwrap_or_default();
        let copies = if self.copies > 1 { format!(", x {} engines", self.copies) } else { String::new() };
        format!("{} parameters{words}, from {}, x {} bytes in {}{copies}", grouped(count), self.weights.from, self.bytes_per_parameter, self.precision)
    }

    /// The same weights at fewer bytes a parameter, for the fix a refusal names.
    fn at(&self, bytes_per_parameter: u64) -> String {
        human_bytes(self.weights.parameters.saturating_mul(bytes_per_parameter).saturating_mul(self.copies.max(1)))
    }

    /// "bf16 or fp16: 14.1 GiB, int8: 7.0 GiB": the reduced precisions below this one.
    pub fn reduced(&self) -> String {
        let mut parts = Vec::new();
        if self.bytes_per_parameter > 2 {
            parts.push(format!("bf16 or fp16: {}", self.at(2)));
        }
        if self.bytes_per_parameter > 1 {
            parts.push(format!("int8: {}", self.at(1)));
        }
        parts.join(", ")
    }
}

/// Why `what` cannot be had in memory, or `None` when `need` fits in
/// `available`: the memory needed and how it was counted, the memory
/// available and what says so, then `fix`.
pub fn refusal(what: &str, need: &Need, available: &Available, fix: &str) -> Option<String> {
    (need.bytes() > available.bytes).then(|| {
        format!(
            "{what} needs about {} of memory for its weights ({}), and this machine has {} available ({}); {fix}",
            human_bytes(need.bytes()),
            need.explained(),
            human_bytes(available.bytes),
            available.from
        )
    })
}

/// Preparing a Hub model builds its fp32 graph and checks it by running
/// it: the weights in fp32 once. Why `snapshot` cannot be prepared here, or
/// `None` when it fits or its size cannot be told. `weights` is the size
/// counted from the repository's files (`repository_weights`).
pub fn prepare_refusal(source: &str, weights: Weights, bytes_per_parameter: u64, available: &Available, prepared: &Path) -> Option<String> {
    let need = Need { weights, precision: "fp32".into(), bytes_per_parameter, copies: 1 };
    let fix = format!(
        "preparing it builds and runs its fp32 graph, whatever precision serves it: use a smaller model, or prepare it on a machine with more \
         memory and copy {} here, to serve it at a reduced precision ({})",
        prepared.display(),
        need.reduced()
    );
    refusal(&format!("preparing {source}"), &need, available, &fix)
}

/// The size of a downloaded snapshot's weights and the bytes a parameter
/// takes while it is prepared: the repository's own ONNX as stored (it is
/// run as it is), else its safetensors in fp32 (the graph eeane builds).
pub fn repository_weights(snapshot: &Path, onnx_graph: Option<&str>) -> Option<(Weights, u64)> {
    match onnx_graph {
        Some(graph) => {
            let weights = onnx(&snapshot.join(graph)).ok()?;
            let stored = weights.stored_bytes?;
            let per = stored.checked_div(weights.parameters)?.max(1);
            Some((weights, per))
        }
        None => safetensors(&checkpoint_files(snapshot).ok()?).ok().map(|w| (w, 4)),
    }
}

/// A sharded checkpoint's parameters before its shards are downloaded: its
/// index's `metadata.total_size` over the bytes of config.json's dtype
/// (`torch_dtype`, or `dtype` from transformers 5 on; float32 when unnamed).
pub fn index_estimate(configs: &Path) -> Option<Weights> {
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(configs.join("model.safetensors.index.json")).ok()?).ok()?;
    let total = index["metadata"]["total_size"].as_u64()?;
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(configs.join("config.json")).ok()?).unwrap_or_default();
    let dtype = config["torch_dtype"].as_str().or_else(|| config["dtype"].as_str()).unwrap_or("float32");
    let per = bytes_per_parameter(dtype).unwrap_or(4);
    Some(Weights {
        parameters: total / per,
        stored_bytes: Some(total),
        from: format!("model.safetensors.index.json's total_size of {} in {dtype}", human_bytes(total)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn eight_billion() -> Weights {
        Weights { parameters: 7_567_295_488, stored_bytes: None, from: "the safetensors headers of 4 shards".into() }
    }

    #[test]
    fn an_8b_model_in_fp32_is_refused_on_24_gib_naming_need_room_and_fix() {
        let need = Need { weights: eight_billion(), precision: "fp32".into(), bytes_per_parameter: 4, copies: 1 };
        assert_eq!(need.bytes(), 30_269_181_952);
        let available = Available { bytes: 24 * GIB, from: "MemAvailable in /proc/meminfo".into() };
        let message = refusal("model \"qwen3-8b\"", &need, &available, "serve a smaller model").unwrap();
        assert_eq!(
            message,
            "model \"qwen3-8b\" needs about 28.2 GiB of memory for its weights (7,567,295,488 parameters, 7.57 billion, from the safetensors \
             headers of 4 shards, x 4 bytes in fp32), and this machine has 24.0 GiB available (MemAvailable in /proc/meminfo); serve a smaller model"
        );
        assert_eq!(need.reduced(), "bf16 or fp16: 14.1 GiB, int8: 7.0 GiB");
        // bf16 halves it: it fits.
        let half = Need { precision: "bf16".into(), bytes_per_parameter: 2, ..need.clone() };
        assert_eq!(refusal("m", &half, &available, ""), None);
        // Two engines hold two copies.
        let two = Need { copies: 2, ..half };
        assert!(refusal("m", &two, &available, "").unwrap().contains("x 2 bytes in bf16, x 2 engines"));
        let prepare =
            prepare_refusal("hf:Qwen/Qwen3-Embedding-8B", eight_billion(), 4, &available, Path::new("/c/models/hf--Qwen--Qwen3-Embedding-8B")).unwrap();
        assert!(prepare.starts_with("preparing hf:Qwen/Qwen3-Embedding-8B needs about 28.2 GiB"), "{prepare}");
        assert!(prepare.contains("24.0 GiB available") && prepare.contains("use a smaller model") && prepare.contains("bf16 or fp16: 14.1 GiB"), "{prepare}");
    }

    #[test]
    fn precisions_bytes_and_numbers_in_words() {
        for (precision, bytes) in [("fp32", 4), ("f32", 4), ("bf16", 2), ("fp16", 2), ("f16", 2), ("int8", 1), ("bfloat16", 2), ("float32", 4)] {
            assert_eq!(bytes_per_parameter(precision), Some(bytes), "{precision}");
        }
        assert_eq!(bytes_per_parameter("as-graph"), None);
        assert_eq!(human_parameters(106_880), "106,880 parameters");
        assert_eq!(human_parameters(22_713_216), "22,713,216 parameters (22.7 million)");
        assert_eq!(human_parameters(7_567_295_488), "7,567,295,488 parameters (7.57 billion)");
        assert_eq!(human_bytes(427_520), "418 KiB");
        assert_eq!(human_bytes(90_852_864), "86.6 MiB");
    }

    #[test]
    fn available_memory_is_the_least_of_meminfo_and_the_cgroup_room() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   23750644 kB\n";
        assert_eq!(meminfo_available(meminfo), Some(23_750_644 * 1024));
        assert_eq!(meminfo_available("MemTotal: 1 kB\n"), None);
        // cgroup v2: 8 GiB limit, 3 GiB used of which 1 GiB is inactive page cache.
        assert_eq!(cgroup_room_of("8589934592\n", "3221225472\n", "anon 1\ninactive_file 1073741824\n"), Some(6 * GIB));
        assert_eq!(cgroup_room_of("max\n", "3221225472\n", ""), None);
        // cgroup v1 without a limit, and with one.
        assert_eq!(cgroup_room_of("9223372036854771712\n", "14020567040\n", ""), None);
        assert_eq!(cgroup_room_of("4294967296", "5368709120", "total_inactive_file 0\n"), Some(0));
        let here = available().expect("Linux has /proc/meminfo");
        assert!(here.bytes > 0, "{here:?}");
    }

    #[test]
    fn the_tiny_fixture_is_counted_from_its_header_and_its_graph() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hub/fixtures/qwen3-tiny");
        let files = checkpoint_files(&fixture).unwrap();
        let weights = safetensors(&files).unwrap();
        assert_eq!(weights.parameters, 106_880);
        assert_eq!(weights.stored_bytes, Some(106_880 * 4));
        assert_eq!(weights.from, "the safetensors header of model.safetensors");
        let available = Available { bytes: 100 << 10, from: "a test".into() };
        let refused = prepare_refusal("hf:eeane-test/qwen3-tiny", weights, 4, &available, Path::new("/c/models/x")).unwrap();
        assert!(
            refused.contains("418 KiB")
                && refused.contains("106,880 parameters, from the safetensors header of model.safetensors, x 4 bytes in fp32")
                && refused.contains("100 KiB available (a test)"),
            "{refused}"
        );
        // A sharded checkpoint's index says its size before its shards come.
        let index = tempfile::tempdir().unwrap();
        std::fs::write(index.path().join("config.json"), r#"{"dtype": "bfloat16"}"#).unwrap();
        std::fs::write(index.path().join("model.safetensors.index.json"), r#"{"metadata": {"total_size": 15134590976}, "weight_map": {}}"#).unwrap();
        let estimate = index_estimate(index.path()).unwrap();
        assert_eq!(estimate.parameters, 7_567_295_488);
        assert_eq!(estimate.from, "model.safetensors.index.json's total_size of 14.1 GiB in bfloat16");
        // No weights at all: a clear reason.
        let empty = tempfile::tempdir().unwrap();
        assert!(checkpoint_files(empty.path()).unwrap_err().to_string().contains("no model.safetensors and no model.safetensors.index.json"));
        std::fs::write(empty.path().join("model.safetensors.index.json"), r#"{"weight_map": {"a": "model-00001-of-00002.safetensors"}}"#).unwrap();
        assert!(checkpoint_files(empty.path()).unwrap_err().to_string().contains("model-00001-of-00002.safetensors, which the snapshot lacks"));
    }

    #[test]
    fn an_onnx_graphs_initializers_are_counted_without_reading_their_data() {
        // A ModelProto by hand: graph (7) { initializer (5) { dims 3, dims 4 (packed), data_type 1, raw_data 48 bytes },
        // initializer { dims 2, data_type 3 (int8), raw_data 2 bytes } }, with a producer name (2) before it.
        fn varint(mut v: u64, out: &mut Vec<u8>) {
            while v >= 0x80 {
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        fn field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
            varint(number << 3 | 2, out);
            varint(payload.len() as u64, out);
            out.extend_from_slice(payload);
        }
        let mut first = Vec::new();
        field(1, &[3, 4], &mut first);
        varint(2 << 3, &mut first);
        varint(1, &mut first);
        field(9, &[0u8; 48], &mut first);
        let mut second = Vec::new();
        varint(1 << 3, &mut second);
        varint(2, &mut second);
        varint(2 << 3, &mut second);
        varint(3, &mut second);
        field(9, &[0u8; 2], &mut second);
        let mut graph = Vec::new();
        field(1, b"a node we skip", &mut graph);
        field(5, &first, &mut graph);
        field(5, &second, &mut graph);
        let mut model = Vec::new();
        varint(1 << 3, &mut model);
        varint(8, &mut model);
        field(2, b"eeane-test", &mut model);
        field(7, &graph, &mut model);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, &model).unwrap();
        let weights = onnx(&path).unwrap();
        assert_eq!((weights.parameters, weights.stored_bytes), (14, Some(50)));
        assert_eq!(weights.from, "the initializers of model.onnx");
        std::fs::write(&path, &model[..model.len() - 5]).unwrap();
        assert!(onnx(&path).is_err(), "a graph cut short is an error");
    }
}
