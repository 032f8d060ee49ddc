//! Which device a pin names, among those a runtime lists. Never an index
//! (indices move when cards are added, and a desktop's own card must not be
//! taken by accident); instead, one of:
//! - a unique part of its name (`H200`);
//! - its UUID, or a unique prefix of it (NVML's `GPU-8a1f...`);
//! - its PCI bus id (`0000:41:00.0`, or `41:00.0` in the first domain).
//!
//! The last two tell identical cards apart. A pattern ending in `*`
//! (`H200*`) stands for every device whose name holds the rest: an engine
//! expands it into one pin per card, by bus id.

use crate::EngineError;

/// What ends a pattern that takes every matching device.
pub const EVERY: char = '*';

/// A device as its runtime lists it: its name, and the ids that tell
/// identical cards apart where the runtime gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedDevice {
    pub name: String,
    pub uuid: Option<String>,
    /// As the runtime writes it (NVML: "00000000:41:00.0").
    pub bus_id: Option<String>,
}

impl ListedDevice {
    /// A device known by its name only.
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into(), uuid: None, bus_id: None }
    }

    /// A GPU as NVML lists it: name, UUID and PCI bus id.
    pub fn identified(name: impl Into<String>, uuid: impl Into<String>, bus_id: impl Into<String>) -> Self {
        Self { name: name.into(), uuid: Some(uuid.into()), bus_id: Some(bus_id.into()) }
    }

    /// `"NVIDIA H200" (GPU-8a1f..., 00000000:41:00.0)`: how errors list it.
    pub fn describe(&self) -> String {
        let ids: Vec<&str> = [self.uuid.as_deref(), self.bus_id.as_deref()].into_iter().flatten().collect();
        if ids.is_empty() {
            format!("{:?}", self.name)
        } else {
            format!("{:?} ({})", self.name, ids.join(", "))
        }
    }

    fn answers_to(&self, pin: &Pin) -> bool {
        match pin {
            Pin::Name(part) => self.name.to_lowercase().contains(&part.to_lowercase()),
            Pin::Uuid(prefix) => self.uuid.as_deref().is_some_and(|u| u.to_lowercase().starts_with(&prefix.to_lowercase())),
            Pin::Bus(bus) => self.bus_id.as_deref().and_then(BusId::parse).is_some_and(|b| b == *bus),
        }
    }

    /// On the server's `forbidden_devices` list, which names devices by any
    /// of the forms a pin takes.
    pub fn is_forbidden(&self, forbidden: &[String]) -> bool {
        forbidden.iter().map(|f| f.trim()).filter(|f| !f.is_empty()).any(|f| self.answers_to(&Pin::parse(f)))
    }
}

/// A PCI address, compared by value: "00000000:41:00.0" and "41:00.0" are one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BusId {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

impl BusId {
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (domain, rest) = match text.split(':').collect::<Vec<_>>()[..] {
            [domain, bus, slot] => (u32::from_str_radix(domain, 16).ok().filter(|_| domain.len() <= 8)?, (bus, slot)),
            [bus, slot] => (0, (bus, slot)),
            _ => return None,
        };
        let (bus, slot) = rest;
        let (device, function) = slot.split_once('.')?;
        let hex2 = |s: &str| (s.len() == 2).then(|| u8::from_str_radix(s, 16).ok()).flatten();
        let function = function.parse::<u8>().ok().filter(|f| *f < 8 && function.len() == 1)?;
        Some(Self { domain, bus: hex2(bus)?, device: hex2(device)?, function })
    }
}

/// What a pin names a device by.
enum Pin<'a> {
    Name(&'a str),
    Uuid(&'a str),
    Bus(BusId),
}

impl<'a> Pin<'a> {
    fn parse(wanted: &'a str) -> Self {
        let lower = wanted.to_lowercase();
        if let Some(bus) = BusId::parse(wanted) {
            Pin::Bus(bus)
        } else if lower.starts_with("gpu-") || lower.starts_with("mig-") || is_uuid_prefix(&lower) {
            Pin::Uuid(wanted)
        } else {
            Pin::Name(wanted)
        }
    }
}

/// A prefix of a UUID as 8-4-4-4-12 hex digits (Vulkan's deviceUUID) that
/// reaches past its first group, so that no name is taken for one.
fn is_uuid_prefix(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() >= 2 && groups[0].len() == 8 && groups.iter().all(|g| !g.is_empty() && g.len() <= 12 && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The devices `visible`, each with its ids, for an error.
fn listing(visible: &[ListedDevice]) -> String {
    if visible.is_empty() {
        "none".into()
    } else {
        visible.iter().map(ListedDevice::describe).collect::<Vec<_>>().join(", ")
    }
}

/// An empty name or an index in place of a device name is refused, before
/// anything is asked of the driver.
pub fn refuse_index(api: &str, wanted: &str) -> Result<(), EngineError> {
    if wanted.trim().is_empty() || wanted.trim().parse::<i64>().is_ok() {
        return Err(EngineError::Device(format!("pin a {api} device by its name, UUID or PCI bus id, not by an index ({wanted:?})")));
    }
    Ok(())
}

/// The one device `wanted` names among `visible` (by a unique part of its
/// name, its UUID or a unique prefix of it, or its PCI bus id). An index, a
/// pin that names no device or several, a pattern (`H200*`, which an engine
/// expands before it picks), or a device on `forbidden` is refused, the
/// error listing every visible device with its ids. `api` names the device
/// kind in messages.
pub fn pick_device(api: &str, wanted: &str, visible: &[ListedDevice], forbidden: &[String]) -> Result<usize, EngineError> {
    let wanted = wanted.trim();
    refuse_index(api, wanted)?;
    if wanted.ends_with(EVERY) {
        return Err(EngineError::Device(format!(
            "{wanted:?} stands for every matching {api} device, which this engine does not expand; name one of: {}",
            listing(visible)
        )));
    }
    let pin = Pin::parse(wanted);
    let hits: Vec<usize> = (0..visible.len()).filter(|&i| visible[i].answers_to(&pin)).collect();
    match hits[..] {
        [index] if visible[index].is_forbidden(forbidden) => {
            Err(EngineError::Device(format!("{api} device {} is on the server's forbidden list", visible[index].describe())))
        }
        [index] => Ok(index),
        [] => Err(EngineError::Device(format!("no {api} device matches {wanted:?}; visible: {}", listing(visible)))),
        _ => Err(EngineError::Device(format!(
            "{wanted:?} matches several {api} devices; name one by its UUID or PCI bus id, or take every one with \"{wanted}{EVERY}\": {}",
            listing(visible)
        ))),
    }
}

/// Every device of `visible` whose name holds `pattern` (a pin's text
/// without its `*`), in the runtime's order, those on `forbidden` left out.
/// None is an error listing what is visible.
pub fn every_device(api: &str, pattern: &str, visible: &[ListedDevice], forbidden: &[String]) -> Result<Vec<usize>, EngineError> {
    let part = pattern.trim().trim_end_matches(EVERY).trim();
    refuse_index(api, part)?;
    let pin = Pin::Name(part);
    let matching: Vec<usize> = (0..visible.len()).filter(|&i| visible[i].answers_to(&pin)).collect();
    let allowed: Vec<usize> = matching.iter().copied().filter(|&i| !visible[i].is_forbidden(forbidden)).collect();
    if allowed.is_empty() {
        let why = if matching.is_empty() { "no" } else { "only forbidden" };
        return Err(EngineError::Device(format!("{why} {api} devices match \"{part}{EVERY}\"; visible: {}", listing(visible))));
    }
    Ok(allowed)
}

/// The pin that names `device` alone for good: its bus id, else its UUID,
/// else its name (a runtime that gives no ids).
pub fn lasting_pin(device: &ListedDevice) -> &str {
    device.bus_id.as_deref().or(device.uuid.as_deref()).unwrap_or(&device.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four identical cards and one other, as NVML lists them on an 8-way host's half.
    fn host() -> Vec<ListedDevice> {
        [
            ("NVIDIA H200", "GPU-8a1f0c2e-1111-2222-3333-444455556666", "00000000:18:00.0"),
            ("NVIDIA H200", "GPU-8a2b9d01-aaaa-bbbb-cccc-ddddeeeeffff", "00000000:2A:00.0"),
            ("NVIDIA H200", "GPU-c03e7f55-0000-1111-2222-333344445555", "00000000:3A:00.0"),
            ("NVIDIA H200", "GPU-d4f1a6b2-9999-8888-7777-666655554444", "00000000:5D:00.0"),
            ("NVIDIA RTX A2000", "GPU-77aa11bb-1234-5678-9abc-def012345678", "00000000:AB:00.0"),
        ]
        .into_iter()
        .map(|(name, uuid, bus)| ListedDevice::identified(name, uuid, bus))
        .collect()
    }

    fn message(r: Result<impl std::fmt::Debug, EngineError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn identical_cards_are_pinned_by_uuid_or_bus_id() {
        let visible = host();
        assert_eq!(pick_device("CUDA", "GPU-8a2b", &visible, &[]), Ok(1));
        assert_eq!(pick_device("CUDA", "gpu-c03e7f55-0000-1111-2222-333344445555", &visible, &[]), Ok(2));
        assert_eq!(pick_device("CUDA", "0000:5d:00.0", &visible, &[]), Ok(3));
        assert_eq!(pick_device("CUDA", "2a:00.0", &visible, &[]), Ok(1));
        assert_eq!(pick_device("CUDA", "00000000:18:00.0", &visible, &[]), Ok(0));
        assert_eq!(pick_device("CUDA", "A2000", &visible, &[]), Ok(4));
        // A UUID prefix shared by two cards names neither.
        assert!(message(pick_device("CUDA", "GPU-8a", &visible, &[])).contains("matches several"));
        // A Vulkan-style UUID (no "GPU-"), by a prefix past its first group.
        let vulkan = vec![ListedDevice { uuid: Some("8a1f0c2e-1111-2222-3333-444455556666".into()), ..ListedDevice::named("H200") }];
        assert_eq!(pick_device("Vulkan", "8a1f0c2e-1111", &vulkan, &[]), Ok(0));
    }

    #[test]
    fn a_refusal_lists_every_card_with_its_ids() {
        let visible = host();
        let ambiguous = message(pick_device("CUDA", "H200", &visible, &[]));
        assert!(ambiguous.contains("matches several") && ambiguous.contains("\"H200*\""), "{ambiguous}");
        for device in &visible {
            assert!(ambiguous.contains(&device.describe()), "{ambiguous} lacks {}", device.describe());
        }
        let wrong = message(pick_device("CUDA", "GPU-ffff", &visible, &[]));
        assert!(wrong.contains("no CUDA device matches") && wrong.contains("00000000:AB:00.0") && wrong.contains("GPU-d4f1a6b2"), "{wrong}");
        assert!(message(pick_device("CUDA", "3", &visible, &[])).contains("not by an index"));
        assert!(message(pick_device("CUDA", "H200*", &visible, &[])).contains("does not expand"));
    }

    #[test]
    fn a_pattern_takes_every_matching_card() {
        let visible = host();
        assert_eq!(every_device("CUDA", "H200*", &visible, &[]), Ok(vec![0, 1, 2, 3]));
        assert_eq!(every_device("CUDA", "NVIDIA*", &visible, &[]), Ok(vec![0, 1, 2, 3, 4]));
        assert_eq!(lasting_pin(&visible[2]), "00000000:3A:00.0");
        assert!(message(every_device("CUDA", "V100*", &visible, &[])).contains("no CUDA devices match \"V100*\""));
        assert!(message(every_device("CUDA", "*", &visible, &[])).contains("not by an index"));
    }

    #[test]
    fn forbidden_devices_are_named_by_any_pin_and_left_out() {
        let visible = host();
        // The desktop's card by name; one H200 by bus id, one by UUID prefix.
        let forbidden = vec!["A2000".to_string(), "3a:00.0".to_string(), "GPU-d4f1".to_string()];
        assert_eq!(every_device("CUDA", "NVIDIA*", &visible, &forbidden), Ok(vec![0, 1]));
        assert!(message(pick_device("CUDA", "A2000", &visible, &forbidden)).contains("forbidden list"));
        assert!(message(pick_device("CUDA", "GPU-c03e", &visible, &forbidden)).contains("forbidden list"));
        assert_eq!(pick_device("CUDA", "GPU-8a1f", &visible, &forbidden), Ok(0));
        assert!(message(every_device("CUDA", "A2000*", &visible, &forbidden)).contains("only forbidden"));
    }
}
