#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| roam_fuzz::vm_spec(data));
