//! The RFC 3442 decoder never panics, and whatever it accepts re-encodes to
//! the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_dhcp_opts::rfc3442;

fuzz_target!(|data: &[u8]| {
    if let Ok(routes) = rfc3442::decode(data) {
        assert_eq!(rfc3442::encode(&routes), data);
        assert_eq!(rfc3442::encoded_len(&routes), data.len());
    }
});
