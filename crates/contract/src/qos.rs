//! RFC 4594 service classes and the DSCP each one marks.
//!
//! An interface names its class (`service_class` in the interface declaration); roam sets the
//! DSCP of the interface's traffic with an OVN `QoS` row (`action: dscp=N`). The class table
//! is the RFC's (section 3), with two aliases: `lowlatency` marks 22 and `bulk` marks 14.
//! Those are the third drop precedence of low-latency data (AF2x) and high-throughput data
//! (AF1x), so every Assured Forwarding class marks its `AFx3` codepoint unless a drop
//! precedence is given (`low-latency-data:1` marks AF21 = 18). An unknown class is an error, never silently DSCP 0.

use std::fmt;
use std::str::FromStr;

/// One of RFC 4594's twelve service classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceClass {
    /// CS6 (48): routing and network control.
    NetworkControl,
    /// EF (46): IP telephony bearer.
    Telephony,
    /// CS5 (40): IP telephony signaling.
    Signaling,
    /// AF4x: H.323/V2 video conferencing.
    MultimediaConferencing,
    /// CS4 (32): video conferencing and interactive gaming.
    RealTimeInteractive,
    /// AF3x: streaming video and audio on demand.
    MultimediaStreaming,
    /// CS3 (24): broadcast TV and live events.
    BroadcastVideo,
    /// AF2x: client/server transactions, web-based ordering (alias `lowlatency`).
    LowLatencyData,
    /// CS2 (16): operations, administration and management.
    Oam,
    /// AF1x: store and forward applications (alias `bulk`).
    HighThroughputData,
    /// DF (0): undifferentiated applications.
    Standard,
    /// CS1 (8): any flow that has no bandwidth assurance.
    LowPriorityData,
}

/// Assured Forwarding drop precedence (RFC 2597): 1 low, 2 medium, 3 high.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropPrecedence(u8);

impl DropPrecedence {
    /// The precedence the aliases `lowlatency` = 22 and `bulk` = 14 imply.
    pub const DEFAULT: DropPrecedence = DropPrecedence(3);

    /// 1, 2 or 3.
    pub fn new(p: u8) -> Option<Self> {
        (1..=3).contains(&p).then_some(DropPrecedence(p))
    }
}

/// A service class with, for the Assured Forwarding classes, its drop precedence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Marking {
    /// The class.
    pub class: ServiceClass,
    /// The drop precedence; only meaningful for AF classes.
    pub drop_precedence: DropPrecedence,
}

/// A `service_class` that roam does not know: bad input, the spec's writer must fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown service class {given:?}: use one of RFC 4594's classes ({}) or the aliases lowlatency and bulk; \
     AF classes take an optional drop precedence, e.g. low-latency-data:1",
    ServiceClass::ALL.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
)]
pub struct UnknownServiceClass {
    /// What was given.
    pub given: String,
}

impl ServiceClass {
    /// All twelve classes, in the RFC's order.
    pub const ALL: [ServiceClass; 12] = [
        ServiceClass::NetworkControl,
        ServiceClass::Telephony,
        ServiceClass::Signaling,
        ServiceClass::MultimediaConferencing,
        ServiceClass::RealTimeInteractive,
        ServiceClass::MultimediaStreaming,
        ServiceClass::BroadcastVideo,
        ServiceClass::LowLatencyData,
        ServiceClass::Oam,
        ServiceClass::HighThroughputData,
        ServiceClass::Standard,
        ServiceClass::LowPriorityData,
    ];

    /// The RFC's name, lower-case and hyphenated.
    pub fn name(self) -> &'static str {
        match self {
            ServiceClass::NetworkControl => "network-control",
            ServiceClass::Telephony => "telephony",
            ServiceClass::Signaling => "signaling",
            ServiceClass::MultimediaConferencing => "multimedia-conferencing",
            ServiceClass::RealTimeInteractive => "real-time-interactive",
            ServiceClass::MultimediaStreaming => "multimedia-streaming",
            ServiceClass::BroadcastVideo => "broadcast-video",
            ServiceClass::LowLatencyData => "low-latency-data",
            ServiceClass::Oam => "oam",
            ServiceClass::HighThroughputData => "high-throughput-data",
            ServiceClass::Standard => "standard",
            ServiceClass::LowPriorityData => "low-priority-data",
        }
    }

    /// For an Assured Forwarding class, its AF class number (AFxy: x).
    pub fn af_class(self) -> Option<u8> {
        match self {
            ServiceClass::MultimediaConferencing => Some(4),
            ServiceClass::MultimediaStreaming => Some(3),
            ServiceClass::LowLatencyData => Some(2),
            ServiceClass::HighThroughputData => Some(1),
            _ => None,
        }
    }

    fn fixed_dscp(self) -> Option<u8> {
        match self {
            ServiceClass::NetworkControl => Some(48),
            ServiceClass::Telephony => Some(46),
            ServiceClass::Signaling => Some(40),
            ServiceClass::RealTimeInteractive => Some(32),
            ServiceClass::BroadcastVideo => Some(24),
            ServiceClass::Oam => Some(16),
            ServiceClass::Standard => Some(0),
            ServiceClass::LowPriorityData => Some(8),
            _ => None,
        }
    }
}

impl Marking {
    /// The DSCP value (0–63) this marking sets.
    pub fn dscp(self) -> u8 {
        match (self.class.fixed_dscp(), self.class.af_class()) {
            (Some(d), _) => d,
            // RFC 2597: AFxy = 8x + 2y
            (None, Some(x)) => 8 * x + 2 * self.drop_precedence.0,
            (None, None) => unreachable!("every class is fixed or AF"),
        }
    }
}

impl FromStr for ServiceClass {
    type Err = UnknownServiceClass;

    /// A class by its RFC name (`telephony`, `low-latency-data`) or an alias (`lowlatency`,
    /// `bulk`); no drop precedence. Case and `_` vs `-` do not matter.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        match norm.as_str() {
            "lowlatency" => Ok(ServiceClass::LowLatencyData),
            "bulk" => Ok(ServiceClass::HighThroughputData),
            n => ServiceClass::ALL
                .iter()
                .find(|c| c.name() == n)
                .copied()
                .ok_or_else(|| UnknownServiceClass {
                    given: s.to_string(),
                }),
        }
    }
}

impl FromStr for Marking {
    type Err = UnknownServiceClass;

    /// `telephony`, `low-latency-data`, `low-latency-data:1`, or the aliases `lowlatency` /
    /// `bulk`. Case and `_` vs `-` do not matter.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || UnknownServiceClass {
            given: s.to_string(),
        };
        let (name, precedence) = match s.split_once(':') {
            Some((n, p)) => (
                n,
                Some(
                    p.trim()
                        .parse::<u8>()
                        .ok()
                        .and_then(DropPrecedence::new)
                        .ok_or_else(unknown)?,
                ),
            ),
            None => (s, None),
        };
        let class: ServiceClass = name.parse().map_err(|_| unknown())?;
        if precedence.is_some() && class.af_class().is_none() {
            return Err(unknown());
        }
        Ok(Marking {
            class,
            drop_precedence: precedence.unwrap_or(DropPrecedence::DEFAULT),
        })
    }
}

impl fmt::Display for Marking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.class.name())?;
        if self.class.af_class().is_some() && self.drop_precedence != DropPrecedence::DEFAULT {
            write!(f, ":{}", self.drop_precedence.0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dscp(s: &str) -> u8 {
        s.parse::<Marking>().unwrap().dscp()
    }

    #[test]
    fn the_aliases_mark_lowlatency_22_and_bulk_14() {
        assert_eq!(dscp("lowlatency"), 22);
        assert_eq!(dscp("bulk"), 14);
        assert_eq!(dscp("low-latency-data"), 22);
        assert_eq!(dscp("high-throughput-data"), 14);
    }

    #[test]
    fn rfc4594_table() {
        let table = [
            ("network-control", 48),
            ("telephony", 46),
            ("signaling", 40),
            ("multimedia-conferencing", 38),
            ("real-time-interactive", 32),
            ("multimedia-streaming", 30),
            ("broadcast-video", 24),
            ("low-latency-data", 22),
            ("oam", 16),
            ("high-throughput-data", 14),
            ("standard", 0),
            ("low-priority-data", 8),
        ];
        for (name, want) in table {
            assert_eq!(dscp(name), want, "{name}");
        }
        assert_eq!(table.len(), ServiceClass::ALL.len());
    }

    #[test]
    fn af_drop_precedence() {
        assert_eq!(dscp("low-latency-data:1"), 18); // AF21
        assert_eq!(dscp("low-latency-data:2"), 20); // AF22
        assert_eq!(dscp("multimedia-conferencing:1"), 34); // AF41
        assert_eq!(dscp("high-throughput-data:2"), 12); // AF12
        assert_eq!(dscp("Multimedia_Streaming:1"), 26); // AF31
    }

    #[test]
    fn unknown_classes_are_errors_not_dscp_0() {
        for bad in [
            "",
            "gold",
            "voice",
            "telephony:1",
            "low-latency-data:0",
            "low-latency-data:4",
            "bulk:x",
            "ef",
        ] {
            let err = bad.parse::<Marking>().unwrap_err();
            assert!(
                err.to_string().contains("unknown service class"),
                "{bad}: {err}"
            );
            assert!(
                err.to_string().contains("network-control"),
                "the error lists the valid classes"
            );
        }
    }

    #[test]
    fn a_class_alone_is_its_name_or_an_alias_without_a_drop_precedence() {
        for c in ServiceClass::ALL {
            assert_eq!(c.name().parse::<ServiceClass>(), Ok(c));
            assert_eq!(c.name().to_uppercase().parse::<ServiceClass>(), Ok(c));
        }
        assert_eq!("lowlatency".parse(), Ok(ServiceClass::LowLatencyData));
        assert_eq!("bulk".parse(), Ok(ServiceClass::HighThroughputData));
        assert_eq!("Network_Control".parse(), Ok(ServiceClass::NetworkControl));
        for bad in ["", "gold", "low-latency-data:1", "cs6", "ef"] {
            assert!(bad.parse::<ServiceClass>().is_err(), "{bad}");
        }
    }

    #[test]
    fn display_round_trips() {
        for c in ServiceClass::ALL {
            for p in 1..=3 {
                let m = Marking {
                    class: c,
                    drop_precedence: DropPrecedence::new(p).unwrap(),
                };
                let back: Marking = m.to_string().parse().unwrap();
                assert_eq!(back.dscp(), m.dscp(), "{m}");
            }
        }
    }
}
