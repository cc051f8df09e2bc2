//! What a disk image is, read from its first bytes before QEMU is given it (pure: bytes in,
//! a verdict out; the caller reads the file).
//!
//! A VM's disk image is data its owner controls, and QEMU trusts more of it than its guest
//! sees. Given a qcow2 image, QEMU opens every file the header names: a backing file
//! (`backing_file_offset`), an external data file (incompatible feature bit 2 and the `DATA`
//! header extension). Given an image without its format, it probes, so a raw disk whose guest
//! wrote a qcow2 header becomes a qcow2 image at the next start. Run as QEMU is run on a
//! node, either hands the image's owner a host file (`/dev/sda`, a key).
//!
//! So [`inspect`]:
//! - probes the format from the content and refuses an image whose content is not the format
//!   the VM declares (a raw image posing as qcow2, a qcow2 or other image declared raw);
//! - refuses a qcow2 image that names any other file (backing file, external data file), is
//!   encrypted (roam holds no image keys), is marked corrupt, sets a feature bit this check
//!   does not know, or whose header is out of QEMU's own bounds;
//! - refuses an image whose virtual size is over the node's limit ([`Limits`]).
//!
//! The caller then attaches the image with its format stated and an empty `<backingStore/>`,
//! so neither libvirt nor QEMU looks for anything beyond the one file.
//!
//! The qcow2 layout is QEMU's `docs/interop/qcow2.txt`; the bounds are QEMU's
//! (`block/qcow2.h`): an image QEMU itself would refuse is refused here with the reason.
#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

/// How many bytes of the image [`inspect`] wants: the largest qcow2 cluster (2 MiB), which
/// holds the header and every header extension. Give it `min(HEAD_LEN, file size)` bytes.
pub const HEAD_LEN: usize = 1 << 21;

/// A format roam runs disks in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// The guest's bytes as they are.
    Raw,
    /// QEMU's copy-on-write format (versions 2 and 3), without backing or data files.
    Qcow2,
}

impl Format {
    /// The name libvirt and QEMU use (`<driver type='...'/>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "raw" => Ok(Format::Raw),
            "qcow2" => Ok(Format::Qcow2),
            other => Err(Error::UnknownFormat(other.to_string())),
        }
    }
}

/// What the node allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest virtual size (the disk the guest sees), in bytes.
    pub max_virtual_size: u64,
}

impl Default for Limits {
    /// 64 TiB: larger than any disk a VM of this kind gets, small enough that QEMU's
    /// metadata for it stays in megabytes.
    fn default() -> Self {
        Limits {
            max_virtual_size: 64 << 40,
        }
    }
}

/// An image [`inspect`] accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Image {
    /// Its format (the declared one: they agree).
    pub format: Format,
    /// The size of the disk the guest sees, in bytes.
    pub virtual_size: u64,
}

/// Why an image is refused. Each message says what is wrong and what to do; the caller
/// prefixes the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A format name roam does not run.
    #[error("format {0:?} is not one roam runs: give raw or qcow2")]
    UnknownFormat(String),
    /// The content is not the declared format.
    #[error(
        "is declared {declared} but holds {found}: roam never trusts a declared format the content \
         contradicts; declare the image's real format (raw or qcow2), or convert it \
         (qemu-img convert -O raw IN OUT)"
    )]
    NotDeclared {
        /// What the VM says.
        declared: Format,
        /// What the content is.
        found: String,
    },
    /// A qcow2 image that names a backing file.
    #[error(
        "is a qcow2 image over the backing file {name:?}: a disk image may not name another file; \
         flatten it into one image (qemu-img convert -O qcow2 IN OUT)"
    )]
    BackingFile {
        /// The name in the header (cut and escaped).
        name: String,
    },
    /// A qcow2 image whose data is in another file.
    #[error(
        "is a qcow2 image whose data is in the external file {name:?}: a disk image may not name \
         another file; convert it into one image (qemu-img convert -O qcow2 IN OUT)"
    )]
    DataFile {
        /// The name in the `DATA` header extension (cut and escaped), or that there is none.
        name: String,
    },
    /// An encrypted qcow2 image.
    #[error(
        "is an encrypted qcow2 image: roam holds no image keys; decrypt it (qemu-img convert) or \
         encrypt inside the guest"
    )]
    Encrypted,
    /// A qcow2 image marked corrupt.
    #[error("is a qcow2 image marked corrupt: repair it first (qemu-img check -r all) on a copy")]
    Corrupt,
    /// A qcow2 image with feature bits this check does not know.
    #[error(
        "is a qcow2 image with incompatible features {bits:#x} that roam does not know: write it \
         with an older qemu-img (qemu-img convert -O qcow2 -o compat=1.1 IN OUT)"
    )]
    UnknownFeatures {
        /// The unknown incompatible feature bits.
        bits: u64,
    },
    /// A qcow2 version other than 2 and 3.
    #[error(
        "is a qcow2 image of version {0}: roam runs versions 2 and 3 (qemu-img amend -o compat=1.1)"
    )]
    Version(u32),
    /// A virtual size over the node's limit.
    #[error(
        "has a virtual size of {size} bytes, over this node's limit of {max} bytes: make the \
         disk smaller (qemu-img resize --shrink)"
    )]
    TooLarge {
        /// The image's virtual size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A qcow2 header QEMU itself would not open.
    #[error("is not a valid qcow2 image: {0}")]
    Malformed(&'static str),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the first bytes of an image look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probed {
    /// No header roam knows: raw data.
    Raw,
    /// A qcow2 (or older qcow) header: its version decides.
    Qcow2,
    /// Another format QEMU reads (named).
    Other(&'static str),
}

/// Magic bytes at offset 0 of the formats QEMU's probe knows, other than qcow2.
const MAGICS: &[(&[u8], &str)] = &[
    (b"QFI\0", "a qed image"),
    (b"KDMV", "a vmdk image"),
    (b"COWD", "a vmdk image"),
    (b"# Disk DescriptorFile", "a vmdk descriptor"),
    (b"<<< Oracle VM VirtualBox Disk Image >>>", "a vdi image"),
    (b"<<< Sun VirtualBox Disk Image >>>", "a vdi image"),
    (b"vhdxfile", "a vhdx image"),
    (b"conectix", "a vpc (VHD) image"),
    (b"LUKS\xba\xbe", "a LUKS image"),
    (b"WithoutFreeSpace", "a parallels image"),
    (b"WithouFreSpacExt", "a parallels image"),
    (b"Bochs Virtual HD Image", "a bochs image"),
    (b"#!/bin/sh\n#V2.0 Format\n", "a cloop image"),
];

const QCOW_MAGIC: &[u8] = b"QFI\xfb";

/// What `head` (an image's first bytes) is.
pub fn probe(head: &[u8]) -> Probed {
    if head.starts_with(QCOW_MAGIC) {
        return Probed::Qcow2;
    }
    MAGICS
        .iter()
        .find(|(magic, _)| head.starts_with(magic))
        .map_or(Probed::Raw, |(_, name)| Probed::Other(name))
}

/// Check an image: `head` is its first `min(HEAD_LEN, file_size)` bytes, `declared` the
/// format the VM gives it. `Ok`: QEMU, told the format and no backing store, opens this file
/// and nothing else.
pub fn inspect(head: &[u8], file_size: u64, declared: Format, limits: &Limits) -> Result<Image> {
    let found = probe(head);
    let image = match (declared, found) {
        (Format::Raw, Probed::Raw) => Image {
            format: Format::Raw,
            virtual_size: file_size,
        },
        (Format::Qcow2, Probed::Qcow2) => Image {
            format: Format::Qcow2,
            virtual_size: qcow2::check(head)?,
        },
        (declared, found) => {
            return Err(Error::NotDeclared {
                declared,
                found: match found {
                    Probed::Raw => "raw data (no image header)".to_string(),
                    Probed::Qcow2 => qcow2::describe(head),
                    Probed::Other(name) => name.to_string(),
                },
            });
        }
    };
    if image.virtual_size > limits.max_virtual_size {
        return Err(Error::TooLarge {
            size: image.virtual_size,
            max: limits.max_virtual_size,
        });
    }
    Ok(image)
}

/// A name from an image header, for a message: at most 256 characters, control characters
/// escaped (it is the image owner's text).
fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]);
    text.chars().flat_map(char::escape_default).collect()
}

mod qcow2 {
    //! The qcow2 header (big-endian), `docs/interop/qcow2.txt`.
    use super::{Error, Result, shown};

    const V2_HEADER_LEN: usize = 72;
    const V3_HEADER_LEN: usize = 104;
    const MIN_CLUSTER_BITS: u32 = 9;
    const MAX_CLUSTER_BITS: u32 = 21;
    /// QEMU's QCOW_MAX_L1_SIZE and QCOW_MAX_REFTABLE_SIZE (bytes), QCOW_MAX_SNAPSHOTS.
    const MAX_L1_BYTES: u64 = 32 << 20;
    const MAX_REFTABLE_BYTES: u64 = 8 << 20;
    const MAX_SNAPSHOTS: u32 = 65536;
    /// QEMU's limit on a backing file name's length.
    const MAX_BACKING_NAME: u32 = 1023;

    const INCOMPAT_CORRUPT: u64 = 1 << 1;
    const INCOMPAT_DATA_FILE: u64 = 1 << 2;
    /// dirty, corrupt, external data file, compression type, extended L2 entries.
    const INCOMPAT_KNOWN: u64 = 0b1_1111;

    const EXT_END: u32 = 0;
    const EXT_DATA_FILE: u32 = 0x4441_5441;
    const EXT_CRYPTO: u32 = 0x0537_be77;

    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
    }

    fn u64_at(b: &[u8], at: usize) -> Option<u64> {
        Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
    }

    /// What a header with qcow's magic is, in words (for a format mismatch).
    pub(super) fn describe(head: &[u8]) -> String {
        match u32_at(head, 4) {
            Some(1) => "a qcow (version 1) image".into(),
            Some(v @ (2 | 3)) => format!("a qcow2 (version {v}) image"),
            _ => "a qcow2 image".into(),
        }
    }

    /// The virtual size of a qcow2 image that names no other file, or why it is refused.
    pub(super) fn check(head: &[u8]) -> Result<u64> {
        let short = Error::Malformed("its header is cut short");
        let field32 = |at| u32_at(head, at).ok_or(short.clone());
        let field64 = |at| u64_at(head, at).ok_or(short.clone());
        let version = field32(4)?;
        if !(2..=3).contains(&version) {
            return Err(Error::Version(version));
        }
        let backing_offset = field64(8)?;
        let backing_len = field32(16)?;
        if backing_offset != 0 || backing_len != 0 {
            let name = usize::try_from(backing_offset)
                .ok()
                .filter(|_| backing_len <= MAX_BACKING_NAME)
                .and_then(|at| head.get(at..at.checked_add(backing_len as usize)?))
                .map_or_else(|| "(a name past the header)".into(), shown);
            return Err(Error::BackingFile { name });
        }
        let cluster_bits = field32(20)?;
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
            return Err(Error::Malformed("its cluster size is not 512 B to 2 MiB"));
        }
        let cluster = 1usize << cluster_bits;
        let size = field64(24)?;
        if field32(32)? != 0 {
            return Err(Error::Encrypted);
        }
        if u64::from(field32(36)?) * 8 > MAX_L1_BYTES {
            return Err(Error::Malformed("its L1 table is over 32 MiB"));
        }
        if u64::from(field32(56)?) << cluster_bits > MAX_REFTABLE_BYTES {
            return Err(Error::Malformed("its refcount table is over 8 MiB"));
        }
        if field32(60)? > MAX_SNAPSHOTS {
            return Err(Error::Malformed("it has over 65536 snapshots"));
        }
        let (header_len, incompatible) = if version == 2 {
            (V2_HEADER_LEN, 0)
        } else {
            let incompatible = field64(72)?;
            if field32(96)? > 6 {
                return Err(Error::Malformed("its refcount width is over 64 bits"));
            }
            let len = field32(100)? as usize;
            if len < V3_HEADER_LEN || len > cluster {
                return Err(Error::Malformed(
                    "its header length is under 104 bytes or over a cluster",
                ));
            }
            (len, incompatible)
        };
        if head.len() < header_len {
            return Err(short);
        }
        if incompatible & INCOMPAT_CORRUPT != 0 {
            return Err(Error::Corrupt);
        }
        let unknown = incompatible & !INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(Error::UnknownFeatures { bits: unknown });
        }
        // the header extensions, up to the end of the first cluster
        let end = cluster.min(head.len());
        let mut at = header_len;
        let mut data_file = None;
        while at + 8 <= end {
            let kind = field32(at)?;
            let len = field32(at + 4)? as usize;
            if kind == EXT_END {
                break;
            }
            let data = head
                .get(at + 8..)
                .and_then(|rest| rest.get(..len))
                .filter(|_| at + 8 + len <= end)
                .ok_or(Error::Malformed(
                    "a header extension runs past the first cluster",
                ))?;
            match kind {
                EXT_DATA_FILE => data_file = Some(shown(data)),
                EXT_CRYPTO => return Err(Error::Encrypted),
                _ => {}
            }
            at += 8 + len.div_ceil(8) * 8;
        }
        if let Some(name) = data_file {
            return Err(Error::DataFile { name });
        }
        if incompatible & INCOMPAT_DATA_FILE != 0 {
            return Err(Error::DataFile {
                name: "(named by whoever opens it)".into(),
            });
        }
        Ok(size)
    }
}

#[cfg(test)]
mod tests;
