#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| roam_fuzz::dhcp_rfc3442(data));
