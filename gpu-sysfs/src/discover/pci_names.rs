//! Model names from the PCI ID database (`data/pci.ids`, version 2025.07.11 of the PCI ID
//! Project's list, GPL-2.0-or-later or BSD-3-Clause), as the build script lays them out: one text
//! of every name and two sorted indexes of plain integers into it.
//!
//! A table of `&'static str` would hold a pointer per name, and the loader would rewrite every
//! one of them (some 40,000, across 1.8 MB) each time a `gpuslice` process starts; these indexes
//! hold offsets, so nothing in them is relocated and a look-up reads only the pages it searches.

const NAMES: &str = include_str!(concat!(env!("OUT_DIR"), "/pci_names.txt"));
const DEVICES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pci_devices.bin"));
const SUBSYSTEMS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pci_subsystems.bin"));

/// `u32`s per record of [`DEVICES`] and of [`SUBSYSTEMS`].
const DEVICE_WORDS: usize = 5;
const SUBSYSTEM_WORDS: usize = 3;

/// Word `i` of record `r` of a table of `words`-word records.
fn word(table: &[u8], words: usize, r: usize, i: usize) -> Option<u32> {
    let at = (r * words + i) * 4;
    let bytes = table.get(at..at + 4)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

fn name(table: &[u8], words: usize, r: usize) -> Option<&'static str> {
    let off = usize::try_from(word(table, words, r, 1)?).ok()?;
    let len = usize::try_from(word(table, words, r, 2)?).ok()?;
    NAMES.get(off..off.checked_add(len)?)
}

/// The device's name and its subsystem records (first, count), by binary search.
fn device(vendor: u16, device: u16) -> Option<(&'static str, usize, usize)> {
    let key = (u32::from(vendor) << 16) | u32::from(device);
    let n = DEVICES.len() / (DEVICE_WORDS * 4);
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let k = word(DEVICES, DEVICE_WORDS, mid, 0)?;
        match k.cmp(&key) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => {
                let first = usize::try_from(word(DEVICES, DEVICE_WORDS, mid, 3)?).ok()?;
                let count = usize::try_from(word(DEVICES, DEVICE_WORDS, mid, 4)?).ok()?;
                return Some((name(DEVICES, DEVICE_WORDS, mid)?, first, count));
            }
        }
    }
    None
}

/// The database's names for a chip and, where it lists these subsystem IDs under the chip, for
/// the board: `(chip, board)`; `None` for a chip it does not list.
pub(crate) fn lookup(
    vendor: u16,
    device_id: u16,
    subsystem: Option<(u16, u16)>,
) -> Option<(&'static str, Option<&'static str>)> {
    let (chip, first, count) = device(vendor, device_id)?;
    let board = subsystem.and_then(|(sv, sd)| {
        let key = (u32::from(sv) << 16) | u32::from(sd);
        (first..first + count)
            .find(|&r| word(SUBSYSTEMS, SUBSYSTEM_WORDS, r, 0) == Some(key))
            .and_then(|r| name(SUBSYSTEMS, SUBSYSTEM_WORDS, r))
    });
    Some((chip, board))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chips_and_boards_are_found() {
        // NVIDIA A2 (GA107GL), and a board of it the database names.
        assert_eq!(
            lookup(0x10de, 0x25b6, None),
            Some(("GA107GL [A2 / A16]", None))
        );
        // Matrox G200eH on HPE iLO4: chip and board.
        assert_eq!(
            lookup(0x102b, 0x0533, Some((0x103c, 0x3381))),
            Some(("MGA G200EH", Some("iLO4")))
        );
        // A subsystem the database does not list under the chip: the chip alone.
        assert_eq!(
            lookup(0x102b, 0x0533, Some((0x1234, 0x5678))),
            Some(("MGA G200EH", None))
        );
        assert_eq!(lookup(0x10de, 0xffff, None), None);
        assert_eq!(lookup(0xfffe, 0x0710, None), Some(("Virtual SVGA", None)));
    }

    #[test]
    fn every_record_reads_back_and_the_index_is_sorted() {
        let n = DEVICES.len() / (DEVICE_WORDS * 4);
        assert!(n > 19_000, "{n} devices");
        assert_eq!(DEVICES.len() % (DEVICE_WORDS * 4), 0);
        assert_eq!(SUBSYSTEMS.len() % (SUBSYSTEM_WORDS * 4), 0);
        let mut last = None;
        for r in 0..n {
            let k = word(DEVICES, DEVICE_WORDS, r, 0);
            assert!(k > last, "record {r} out of order");
            last = k;
            assert!(name(DEVICES, DEVICE_WORDS, r).is_some(), "record {r}");
            let (vendor, device_id) = k.map(|k| ((k >> 16) as u16, k as u16)).unwrap_or_default();
            assert!(lookup(vendor, device_id, None).is_some(), "record {r}");
        }
    }
}
