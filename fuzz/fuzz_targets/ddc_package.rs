//! Arbitrary bytes through the package reader (`application/x-ue-cbpkg`): any result is fine
//! except a panic, and a package that parses writes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tickwire_ddc::cb::Package;

fuzz_target!(|data: &[u8]| {
    if let Ok(package) = Package::parse(data) {
        assert_eq!(package.to_bytes(), data);
    }
});
