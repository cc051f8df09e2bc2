use proptest::prelude::*;

use super::*;

/// A qcow2 header as qemu-img writes one (version 3, 64 KiB clusters, `size` bytes), with
/// `extensions` (type, data) after it, in a first cluster of zeroes.
fn qcow2(size: u64, extensions: &[(u32, &[u8])]) -> Vec<u8> {
    let mut h = vec![0u8; 1 << 16];
    h[..4].copy_from_slice(b"QFI\xfb");
    h[4..8].copy_from_slice(&3u32.to_be_bytes());
    h[20..24].copy_from_slice(&16u32.to_be_bytes());
    h[24..32].copy_from_slice(&size.to_be_bytes());
    h[36..40].copy_from_slice(&1u32.to_be_bytes());
    h[40..48].copy_from_slice(&0x30000u64.to_be_bytes());
    h[48..56].copy_from_slice(&0x10000u64.to_be_bytes());
    h[56..60].copy_from_slice(&1u32.to_be_bytes());
    h[96..100].copy_from_slice(&4u32.to_be_bytes());
    h[100..104].copy_from_slice(&112u32.to_be_bytes());
    let mut at = 112;
    for (kind, data) in extensions {
        h[at..at + 4].copy_from_slice(&kind.to_be_bytes());
        h[at + 4..at + 8].copy_from_slice(&(data.len() as u32).to_be_bytes());
        h[at + 8..at + 8 + data.len()].copy_from_slice(data);
        at += 8 + data.len().div_ceil(8) * 8;
    }
    h
}

fn set_u32(h: &mut [u8], at: usize, v: u32) {
    h[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn set_u64(h: &mut [u8], at: usize, v: u64) {
    h[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

fn check(head: &[u8], declared: Format) -> Result<Image> {
    inspect(head, head.len() as u64, declared, &Limits::default())
}

#[test]
fn a_plain_qcow2_image_is_accepted_with_its_virtual_size() {
    let h = qcow2(1 << 30, &[(0x6803_f857, b"feature table")]);
    assert_eq!(
        check(&h, Format::Qcow2),
        Ok(Image {
            format: Format::Qcow2,
            virtual_size: 1 << 30
        })
    );
    // version 2: 72-byte header, no feature fields
    let mut v2 = qcow2(1 << 20, &[]);
    set_u32(&mut v2, 4, 2);
    v2[72..112].fill(0);
    assert_eq!(
        check(&v2, Format::Qcow2).map(|i| i.virtual_size),
        Ok(1 << 20)
    );
}

#[test]
fn raw_data_is_raw_and_its_size_is_the_files() {
    let data = vec![0xabu8; 4096];
    assert_eq!(
        inspect(&data, 10 << 20, Format::Raw, &Limits::default()),
        Ok(Image {
            format: Format::Raw,
            virtual_size: 10 << 20
        })
    );
    // an empty file is an empty raw disk
    assert_eq!(check(&[], Format::Raw).map(|i| i.virtual_size), Ok(0));
}

#[test]
fn a_backing_file_is_refused_and_named() {
    let mut h = qcow2(1 << 20, &[(0xe279_2aca, b"raw")]);
    let name = b"/dev/sda";
    h[0x200..0x200 + name.len()].copy_from_slice(name);
    set_u64(&mut h, 8, 0x200);
    set_u32(&mut h, 16, name.len() as u32);
    let e = check(&h, Format::Qcow2).unwrap_err();
    assert_eq!(
        e,
        Error::BackingFile {
            name: "/dev/sda".into()
        }
    );
    assert!(e.to_string().contains("\"/dev/sda\""), "{e}");
    // a name the header cannot hold is still a backing file
    set_u64(&mut h, 8, u64::MAX);
    assert!(matches!(
        check(&h, Format::Qcow2),
        Err(Error::BackingFile { .. })
    ));
    // only the length set
    let mut h = qcow2(1 << 20, &[]);
    set_u32(&mut h, 16, 4);
    assert!(matches!(
        check(&h, Format::Qcow2),
        Err(Error::BackingFile { .. })
    ));
}

#[test]
fn an_external_data_file_is_refused_with_or_without_its_name() {
    let mut h = qcow2(1 << 20, &[(0x4441_5441, b"/etc/libvirt/qemu.conf")]);
    set_u64(&mut h, 72, 1 << 2);
    assert_eq!(
        check(&h, Format::Qcow2),
        Err(Error::DataFile {
            name: "/etc/libvirt/qemu.conf".into()
        })
    );
    // the bit alone: QEMU would ask its user for the file
    let mut h = qcow2(1 << 20, &[]);
    set_u64(&mut h, 72, 1 << 2);
    assert!(matches!(
        check(&h, Format::Qcow2),
        Err(Error::DataFile { .. })
    ));
    // the extension alone
    let h = qcow2(1 << 20, &[(0x4441_5441, b"/x")]);
    assert!(matches!(
        check(&h, Format::Qcow2),
        Err(Error::DataFile { .. })
    ));
}

#[test]
fn a_name_in_a_message_is_escaped_and_cut() {
    let mut h = qcow2(1 << 20, &[]);
    let name = [b"a\nb\x1b[31m".as_slice(), &[b'x'; 900]].concat();
    h[0x200..0x200 + name.len()].copy_from_slice(&name);
    set_u64(&mut h, 8, 0x200);
    set_u32(&mut h, 16, name.len() as u32);
    let Err(Error::BackingFile { name }) = check(&h, Format::Qcow2) else {
        panic!("refused for its backing file");
    };
    assert!(name.starts_with("a\\nb\\u{1b}[31m"), "{name}");
    assert!(name.len() < 300, "{}", name.len());
}

#[test]
fn content_that_is_not_the_declared_format_is_refused() {
    // a raw image posing as qcow2
    let e = check(&[0u8; 4096], Format::Qcow2).unwrap_err();
    assert!(
        matches!(&e, Error::NotDeclared { declared: Format::Qcow2, found } if found.contains("raw")),
        "{e}"
    );
    // a qcow2 image declared raw (or a raw disk whose guest wrote a qcow2 header)
    let e = check(&qcow2(1 << 20, &[]), Format::Raw).unwrap_err();
    assert!(
        matches!(&e, Error::NotDeclared { declared: Format::Raw, found } if found.contains("qcow2 (version 3)")),
        "{e}"
    );
    // other formats QEMU would read, either way
    for (head, name) in [
        (b"QFI\0rest".as_slice(), "qed"),
        (b"KDMVxxxx", "vmdk"),
        (b"# Disk DescriptorFile\nRW 100 FLAT \"/dev/sda\" 0", "vmdk"),
        (b"LUKS\xba\xbe\0\x01", "LUKS"),
        (b"vhdxfile", "vhdx"),
    ] {
        for declared in [Format::Raw, Format::Qcow2] {
            let e = check(head, declared).unwrap_err();
            assert!(e.to_string().contains(name), "{name}: {e}");
        }
    }
    // qcow version 1
    let mut h = qcow2(1 << 20, &[]);
    set_u32(&mut h, 4, 1);
    assert!(
        check(&h, Format::Raw)
            .unwrap_err()
            .to_string()
            .contains("qcow (version 1)")
    );
    assert_eq!(check(&h, Format::Qcow2), Err(Error::Version(1)));
}

#[test]
fn a_virtual_size_over_the_limit_is_refused() {
    let huge = qcow2(1 << 60, &[]);
    assert_eq!(
        check(&huge, Format::Qcow2),
        Err(Error::TooLarge {
            size: 1 << 60,
            max: 64 << 40
        })
    );
    let small = Limits {
        max_virtual_size: 1 << 20,
    };
    assert!(inspect(&[0; 16], 2 << 20, Format::Raw, &small).is_err());
    assert!(inspect(&[0; 16], 1 << 20, Format::Raw, &small).is_ok());
}

#[test]
fn encrypted_corrupt_and_unknown_features_are_refused() {
    let mut h = qcow2(1 << 20, &[]);
    set_u32(&mut h, 32, 2);
    assert_eq!(check(&h, Format::Qcow2), Err(Error::Encrypted));
    let h = qcow2(1 << 20, &[(0x0537_be77, &[0; 16])]);
    assert_eq!(check(&h, Format::Qcow2), Err(Error::Encrypted));
    let mut h = qcow2(1 << 20, &[]);
    set_u64(&mut h, 72, 1 << 1);
    assert_eq!(check(&h, Format::Qcow2), Err(Error::Corrupt));
    set_u64(&mut h, 72, 1 | 1 << 3 | 1 << 4 | 1 << 9);
    assert_eq!(
        check(&h, Format::Qcow2),
        Err(Error::UnknownFeatures { bits: 1 << 9 })
    );
    // dirty, zstd and extended L2 are features QEMU handles within the one file
    set_u64(&mut h, 72, 1 | 1 << 3 | 1 << 4);
    assert!(check(&h, Format::Qcow2).is_ok());
}

#[test]
fn headers_out_of_qemus_bounds_are_refused() {
    let cases: [(usize, u32, &str); 6] = [
        (20, 8, "cluster size"),
        (20, 22, "cluster size"),
        (36, (32 << 20) / 8 + 1, "L1"),
        (56, 129, "refcount table"),
        (60, 65537, "snapshots"),
        (100, 96, "header length"),
    ];
    for (at, value, what) in cases {
        let mut h = qcow2(1 << 20, &[]);
        set_u32(&mut h, at, value);
        let e = check(&h, Format::Qcow2).unwrap_err();
        assert!(
            matches!(e, Error::Malformed(m) if m.contains(what)),
            "{what}: {e}"
        );
    }
    // cut short
    let h = qcow2(1 << 20, &[]);
    assert_eq!(
        check(&h[..80], Format::Qcow2),
        Err(Error::Malformed("its header is cut short"))
    );
    // an extension that runs past the cluster
    let mut h = qcow2(1 << 20, &[]);
    set_u32(&mut h, 112, 0x1234);
    set_u32(&mut h, 116, 1 << 16);
    assert!(matches!(
        check(&h, Format::Qcow2),
        Err(Error::Malformed(m)) if m.contains("extension")
    ));
}

#[test]
fn formats_parse_from_their_names_only() {
    assert_eq!("raw".parse(), Ok(Format::Raw));
    assert_eq!("qcow2".parse(), Ok(Format::Qcow2));
    let e = "vmdk".parse::<Format>().unwrap_err();
    assert!(e.to_string().contains("raw or qcow2"), "{e}");
    assert!("QCOW2".parse::<Format>().is_err());
}

proptest! {
    /// Whatever the bytes, inspect answers (no panic), and what it accepts names no other
    /// file: a qcow2 image it accepts has no backing file offset, no data file bit.
    #[test]
    fn any_bytes_get_an_answer(
        mut head in proptest::collection::vec(any::<u8>(), 0..600),
        qcow in any::<bool>(),
        v3 in any::<bool>(),
        size in any::<u64>(),
    ) {
        if qcow && head.len() >= 8 {
            head[..4].copy_from_slice(b"QFI\xfb");
            head[4..8].copy_from_slice(&(if v3 { 3u32 } else { 2 }).to_be_bytes());
        }
        for declared in [Format::Raw, Format::Qcow2] {
            if let Ok(image) = inspect(&head, size, declared, &Limits::default()) {
                prop_assert!(image.virtual_size <= Limits::default().max_virtual_size);
                if image.format == Format::Qcow2 {
                    prop_assert_eq!(&head[8..20], &[0u8; 12][..]);
                    if v3 {
                        prop_assert_eq!(head[79] & 0b100, 0);
                    }
                } else {
                    prop_assert_eq!(probe(&head), Probed::Raw);
                }
            }
        }
    }

    /// A well-formed header with mutated fields: still an answer, never a panic.
    #[test]
    fn mutated_headers_get_an_answer(at in 0usize..200, byte in any::<u8>(), size in any::<u64>()) {
        let mut h = qcow2(size, &[(0x4441_5441, b"x")]);
        h[at] = byte;
        let _ = check(&h, Format::Qcow2);
        let mut h = qcow2(size, &[]);
        h[at] = byte;
        let _ = check(&h, Format::Qcow2);
    }
}
