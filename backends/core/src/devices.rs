//! The devices a model entry names, as a typed list from the config to the
//! engine: `device = "cpu"`, or `device = ["GPU", "CPU"]` in order of
//! preference. eeane starts one engine per listed device, and each engine is
//! given one `DeviceName` (`EngineSpec::device`).

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A device list or a device name that a model entry cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDevice {
    #[error("the device list is empty: name at least one device, e.g. device = \"cpu\"")]
    NoDevice,
    #[error("a device name is empty: name a device, e.g. device = \"cpu\"")]
    EmptyName,
    #[error("device {0:?} holds a comma: write several devices as a list, e.g. device = [\"GPU\", \"CPU\"]")]
    Comma(String),
}

/// One device: "cpu", "cuda:H200", "vulkan:GTX 1080", "GPU.1". Each engine
/// reads its own forms; the name is never empty, holds no comma and no
/// surrounding spaces.
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct DeviceName(String);

impl DeviceName {
    /// `name` without its surrounding spaces; an empty name, or one that holds
    /// a comma (a list written as one string), is refused.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidDevice> {
        let name = name.into();
        let trimmed = name.trim();
        if trimmed.is_empty() {
            return Err(InvalidDevice::EmptyName);
        }
        if trimmed.contains(',') {
            return Err(InvalidDevice::Comma(name));
        }
        Ok(Self(if trimmed.len() == name.len() { name } else { trimmed.to_string() }))
    }

    /// "cpu".
    pub fn cpu() -> Self {
        Self("cpu".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it names the CPU ("cpu" or "CPU", as engines write it).
    pub fn is_cpu(&self) -> bool {
        self.0.eq_ignore_ascii_case("cpu")
    }
}

impl Default for DeviceName {
    fn default() -> Self {
        Self::cpu()
    }
}

impl AsRef<str> for DeviceName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for DeviceName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for DeviceName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// As the string it is: `"cuda:H200"`, so that messages quote it as written.
impl fmt::Debug for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for DeviceName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        DeviceName::new(String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A model entry's devices, in order of preference: never empty. Written as
/// one string when it holds one device, as a list otherwise, so that a
/// printed config reads back the same.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Devices(Vec<DeviceName>);

impl Devices {
    /// The devices named, in order; an empty list or name is refused.
    pub fn new<I>(names: I) -> Result<Self, InvalidDevice>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let names = names.into_iter().map(DeviceName::new).collect::<Result<Vec<_>, _>>()?;
        if names.is_empty() {
            return Err(InvalidDevice::NoDevice);
        }
        Ok(Self(names))
    }

    /// One device.
    pub fn one(name: DeviceName) -> Self {
        Self(vec![name])
    }

    /// The CPU alone, a model entry's default.
    pub fn cpu() -> Self {
        Self::one(DeviceName::cpu())
    }

    pub fn iter(&self) -> std::slice::Iter<'_, DeviceName> {
        self.0.iter()
    }

    /// The first, most preferred, device.
    pub fn first(&self) -> &DeviceName {
        &self.0[0]
    }

    /// How many devices: one engine each. Never 0.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The device, when the list holds just one.
    pub fn single(&self) -> Option<&DeviceName> {
        match &self.0[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Whether every device is the CPU.
    pub fn all_cpu(&self) -> bool {
        self.0.iter().all(DeviceName::is_cpu)
    }

    /// Whether any device's name starts with `prefix` ("cuda:", "vulkan").
    pub fn any_starts_with(&self, prefix: &str) -> bool {
        self.0.iter().any(|d| d.as_str().starts_with(prefix))
    }

    /// The list `n` times over (at least once): `["cpu"]` repeated 3 times is
    /// three engines on the CPU.
    pub fn repeated(&self, n: usize) -> Self {
        Self(self.0.iter().cloned().cycle().take(self.0.len() * n.max(1)).collect())
    }
}

impl Default for Devices {
    fn default() -> Self {
        Self::cpu()
    }
}

impl From<DeviceName> for Devices {
    fn from(name: DeviceName) -> Self {
        Self::one(name)
    }
}

impl<'a> IntoIterator for &'a Devices {
    type Item = &'a DeviceName;
    type IntoIter = std::slice::Iter<'a, DeviceName>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// As a config writes it: `"cpu"` for one device, `["GPU", "CPU"]` for several.
impl fmt::Debug for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.single() {
            Some(one) => fmt::Debug::fmt(one, f),
            None => f.debug_list().entries(&self.0).finish(),
        }
    }
}

/// The names joined by ", ", for messages: "GPU, CPU".
impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, name) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name.as_str())?;
        }
        Ok(())
    }
}

impl Serialize for Devices {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.single() {
            Some(one) => one.serialize(s),
            None => self.0.serialize(s),
        }
    }
}

/// A string or a list of strings; needs a self-describing format (TOML, JSON).
impl<'de> Deserialize<'de> for Devices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OneOrMany;

        impl<'de> Visitor<'de> for OneOrMany {
            type Value = Devices;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a device name or a list of device names")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Devices, E> {
                Devices::new([name]).map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Devices, A::Error> {
                let mut names: Vec<String> = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(name) = seq.next_element()? {
                    names.push(name);
                }
                Devices::new(names).map_err(de::Error::custom)
            }
        }

        d.deserialize_any(OneOrMany)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Entry {
        device: Devices,
    }

    fn parse(toml: &str) -> Result<Devices, toml::de::Error> {
        toml::from_str::<Entry>(toml).map(|e| e.device)
    }

    #[test]
    fn one_device_or_a_list_parses_in_order() {
        assert_eq!(parse("device = \"cpu\"").unwrap(), Devices::cpu());
        let two = parse("device = [\"cpu\", \"cpu\"]").unwrap();
        assert_eq!(two.len(), 2);
        assert!(two.all_cpu());
        assert_eq!(two.single(), None);
        let ov = parse("device = [\"GPU\", \" CPU \"]").unwrap();
        assert_eq!(ov.iter().map(DeviceName::as_str).collect::<Vec<_>>(), ["GPU", "CPU"]);
        assert_eq!(ov.first(), "GPU");
        assert!(!ov.all_cpu());
        assert_eq!(ov.to_string(), "GPU, CPU");
        assert_eq!(format!("{ov:?}"), r#"["GPU", "CPU"]"#);
        assert_eq!(format!("{:?}", parse("device = \"cuda:H200\"").unwrap()), r#""cuda:H200""#);
        assert!(parse("device = [\"vulkan:H200\", \"cpu\"]").unwrap().any_starts_with("vulkan"));
        assert!(!Devices::cpu().any_starts_with("cuda:"));
    }

    #[test]
    fn an_empty_list_or_name_is_refused() {
        for (toml, words) in [
            ("device = []", "the device list is empty"),
            ("device = \"\"", "a device name is empty"),
            ("device = [\"GPU\", \" \"]", "a device name is empty"),
            ("device = \"GPU,CPU\"", "write several devices as a list"),
            ("device = 3", "a device name or a list of device names"),
        ] {
            let error = parse(toml).unwrap_err().to_string();
            assert!(error.contains(words), "{toml}: {error}");
        }
        assert_eq!(Devices::new(Vec::<String>::new()), Err(InvalidDevice::NoDevice));
        assert_eq!(DeviceName::new(""), Err(InvalidDevice::EmptyName));
    }

    #[test]
    fn a_printed_list_reads_back_the_same() {
        for toml in ["device = \"cpu\"\n", "device = [\"cpu\", \"cpu\"]\n", "device = [\"GPU\", \"CPU\"]\n", "device = \"vulkan:GTX 1080\"\n"] {
            let entry: Entry = toml::from_str(toml).unwrap();
            let printed = toml::to_string(&entry).unwrap();
            assert_eq!(printed, toml);
            assert_eq!(toml::from_str::<Entry>(&printed).unwrap(), entry);
        }
    }

    #[test]
    fn repeated_lists_the_devices_n_times() {
        assert_eq!(Devices::cpu().repeated(3), Devices::new(["cpu"; 3]).unwrap());
        let two = Devices::new(["GPU", "CPU"]).unwrap();
        assert_eq!(two.repeated(2), Devices::new(["GPU", "CPU", "GPU", "CPU"]).unwrap());
        assert_eq!(two.repeated(0), two);
    }

    #[test]
    fn a_device_name_crosses_the_engine_pipe() {
        // EngineSpec goes to an engine process in postcard frames.
        let name = DeviceName::new("cuda:H200").unwrap();
        let frame = postcard::to_stdvec(&name).unwrap();
        assert_eq!(postcard::from_bytes::<DeviceName>(&frame).unwrap(), name);
        assert!(postcard::from_bytes::<DeviceName>(&postcard::to_stdvec("a,b").unwrap()).is_err());
        assert_eq!(serde_json::to_string(&name).unwrap(), r#""cuda:H200""#);
    }
}
