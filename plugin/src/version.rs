//! The CNI spec versions this plugin speaks and what each of them allows, and the verbs.

use std::fmt;

/// A CNI spec version the plugin supports. Ordered: later versions compare greater.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpecVersion {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl SpecVersion {
    /// Every supported version, oldest first (the `supportedVersions` answer to VERSION).
    pub const ALL: [SpecVersion; 5] = [
        SpecVersion::V0_3_0,
        SpecVersion::V0_3_1,
        SpecVersion::V0_4_0,
        SpecVersion::V1_0_0,
        SpecVersion::V1_1_0,
    ];

    /// The newest supported version: used when a request names none (VERSION) or an
    /// unusable one (in error replies).
    pub const LATEST: SpecVersion = SpecVersion::V1_1_0;

    /// Parses a `cniVersion` string; `None` for versions this plugin does not speak.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The version as it appears in JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            SpecVersion::V0_3_0 => "0.3.0",
            SpecVersion::V0_3_1 => "0.3.1",
            SpecVersion::V0_4_0 => "0.4.0",
            SpecVersion::V1_0_0 => "1.0.0",
            SpecVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Whether results in this version carry `ips[].version` (`"4"`/`"6"`): the 0.3.x and
    /// 0.4.0 result format. 1.x results do not.
    pub const fn ip_version_field(self) -> bool {
        matches!(
            self,
            SpecVersion::V0_3_0 | SpecVersion::V0_3_1 | SpecVersion::V0_4_0
        )
    }

    /// The supported versions joined for messages: `0.3.0, 0.3.1, ...`.
    pub fn supported_list() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

impl fmt::Display for SpecVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A CNI verb (`CNI_COMMAND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

impl Command {
    /// Every verb.
    pub const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Version,
        Command::Gc,
        Command::Status,
    ];

    /// Parses `CNI_COMMAND` (upper case, as the spec writes it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The verb as the runtime spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Gc => "GC",
            Command::Status => "STATUS",
        }
    }

    /// The first spec version that has this verb.
    pub const fn since(self) -> SpecVersion {
        match self {
            Command::Add | Command::Del | Command::Version => SpecVersion::V0_3_0,
            Command::Check => SpecVersion::V0_4_0,
            Command::Gc | Command::Status => SpecVersion::V1_1_0,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_every_version_and_rejects_others() {
        for v in SpecVersion::ALL {
            assert_eq!(SpecVersion::parse(v.as_str()), Some(v), "round trip of {v}");
        }
        for bad in ["", "0.1.0", "0.2.0", "1.0", "1.2.0", " 1.0.0", "v1.0.0"] {
            assert_eq!(SpecVersion::parse(bad), None, "{bad:?} must not parse");
        }
    }

    #[test]
    fn ordering_and_result_format() {
        let mut sorted = SpecVersion::ALL;
        sorted.sort();
        assert_eq!(sorted, SpecVersion::ALL, "ALL is oldest first");
        assert_eq!(SpecVersion::ALL.last(), Some(&SpecVersion::LATEST));
        let legacy: Vec<_> = SpecVersion::ALL
            .into_iter()
            .filter(|v| v.ip_version_field())
            .collect();
        assert_eq!(
            legacy,
            [
                SpecVersion::V0_3_0,
                SpecVersion::V0_3_1,
                SpecVersion::V0_4_0
            ]
        );
    }
}
