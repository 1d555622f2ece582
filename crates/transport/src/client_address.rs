//! Which clients count as one in per-address connection limits (the gateway's admission, the
//! DDC's HTTP server): one IPv4 address, or one IPv6 block, so that a host cannot pass a limit
//! by changing the low bits of its IPv6 address; and the counts those limits keep.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address a client counts under in per-address connection limits: an IPv4 address as it
/// is (also when it arrives mapped into IPv6, `::ffff:a.b.c.d`, or translated by NAT64,
/// `64:ff9b::a.b.c.d`), an IPv6 one by its first `v6_prefix` bits (64: the block a single site
/// is usually given, so that a host cannot pass a limit by changing the low bits of its
/// address; 128: each address on its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientAddress {
    /// The address, its bits past the prefix cleared.
    ip: IpAddr,
    /// 32 for IPv4.
    prefix: u8,
}

/// The NAT64 well-known prefix, `64:ff9b::/96` (RFC 6052).
const NAT64: u128 = 0x0064_ff9b << 96;

impl ClientAddress {
    /// The address a connection from `ip` counts under; `v6_prefix` is clamped to 128.
    pub fn of(ip: IpAddr, v6_prefix: u8) -> ClientAddress {
        match ip.to_canonical() {
            IpAddr::V6(v6) if v6.to_bits() >> 32 == NAT64 >> 32 => {
                ClientAddress { ip: IpAddr::from(Ipv4Addr::from(v6.to_bits() as u32)), prefix: 32 }
            }
            IpAddr::V6(v6) => {
                let prefix = v6_prefix.min(128);
                let mask = u128::MAX.checked_shl(u32::from(128 - prefix)).unwrap_or(0);
                ClientAddress { ip: IpAddr::V6(Ipv6Addr::from(v6.to_bits() & mask)), prefix }
            }
            v4 => ClientAddress { ip: v4, prefix: 32 },
        }
    }
}

impl std::fmt::Display for ClientAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ip {
            IpAddr::V6(_) if self.prefix < 128 => write!(f, "{}/{}", self.ip, self.prefix),
            ip => write!(f, "{ip}"),
        }
    }
}

/// Connections counted per [`ClientAddress`], an address forgotten when its count falls to
/// zero, so the map holds only addresses with something counted.
#[derive(Debug, Default)]
pub struct AddressCounts(HashMap<ClientAddress, usize>);

impl AddressCounts {
    /// `address`'s count (0 if none): looked up, not inserted, so an address refused on it
    /// leaves nothing behind.
    pub fn get(&self, address: &ClientAddress) -> usize {
        self.0.get(address).copied().unwrap_or(0)
    }

    /// Counts one more for `address`.
    pub fn add(&mut self, address: ClientAddress) {
        *self.0.entry(address).or_insert(0) += 1;
    }

    /// Counts one less for `address`, forgetting it at zero.
    pub fn remove(&mut self, address: &ClientAddress) {
        if let Some(n) = self.0.get_mut(address) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(address);
            }
        }
    }

    /// Whether no address has anything counted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ip: &str, prefix: u8) -> String {
        ClientAddress::of(ip.parse().unwrap(), prefix).to_string()
    }

    #[test]
    fn addresses_count_as_their_ipv4_address_or_ipv6_block() {
        assert_eq!(of("10.1.2.3", 64), "10.1.2.3");
        assert_eq!(of("::ffff:10.1.2.3", 64), "10.1.2.3", "mapped into IPv6");
        assert_eq!(of("64:ff9b::a01:203", 64), "10.1.2.3", "translated by NAT64");
        assert_eq!(of("2001:db8:1:2:3:4:5:6", 64), "2001:db8:1:2::/64");
        assert_eq!(of("2001:db8:1:2:3:4:5:6", 56), "2001:db8:1::/56");
        assert_eq!(of("2001:db8:1:2:3:4:5:6", 128), "2001:db8:1:2:3:4:5:6");
        assert_eq!(of("2001:db8:1:2:3:4:5:6", 200), "2001:db8:1:2:3:4:5:6", "clamped to 128");
        assert_eq!(of("2001:db8::1", 0), "::/0");
        let one = |a: &str, b: &str| {
            ClientAddress::of(a.parse().unwrap(), 64) == ClientAddress::of(b.parse().unwrap(), 64)
        };
        assert!(one("2001:db8::1", "2001:db8::ffff:1"));
        assert!(!one("2001:db8::1", "2001:db8:0:1::1"));
        assert!(!one("10.0.0.1", "10.0.0.2"));
    }

    #[test]
    fn counts_forget_an_address_at_zero() {
        let a = ClientAddress::of("10.0.0.1".parse().unwrap(), 64);
        let mut counts = AddressCounts::default();
        assert_eq!(counts.get(&a), 0);
        assert!(counts.is_empty(), "a look-up inserts nothing");
        counts.add(a);
        counts.add(a);
        assert_eq!(counts.get(&a), 2);
        counts.remove(&a);
        assert_eq!(counts.get(&a), 1);
        counts.remove(&a);
        assert!(counts.is_empty());
        counts.remove(&a);
        assert!(counts.is_empty(), "a remove past zero does nothing");
    }
}
