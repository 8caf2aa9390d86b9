//! The gateway as it is flashed, in system QEMU (`tern_tests::system`): real power cuts of an
//! ARM Linux gateway with its log on an ext4 SD card, with and without Kafka upstream. Not part
//! of `cargo test --workspace` (`test = false`): `tests/run system-aarch64` / `system-armv7`
//! run one architecture each, `cargo test -p tern-tests --test system -- aarch64::` by hand.
//! See docs/system-tests.md.

mod cuts;
mod field;
mod fleet;
// The firmware suite's reading checks (gap-free from 0, values of the simulated sensor).
#[path = "../firmware/readings.rs"]
mod readings;
mod upstream;

use tern_tests::system::Arch;

/// The 64-bit gateway: power cuts with their negative control, upstream to Kafka across power
/// cuts, the field in a box, and a power cut during a fleet's regional outage.
mod aarch64 {
    use super::*;

    #[test]
    fn power_cuts_lose_no_acknowledged_message() -> anyhow::Result<()> {
        cuts::power_cuts_lose_no_acknowledged_message(Arch::Aarch64)
    }

    #[test]
    fn negative_control_periodic_sync_loses_acknowledged_messages() -> anyhow::Result<()> {
        cuts::negative_control_periodic_sync_loses_acknowledged_messages(Arch::Aarch64)
    }

    /// The Kafka tests in one, so the suite starts the three-broker cluster once (about 90 s
    /// on the shared machine); each gateway forwards to its own follower topic.
    #[test]
    fn upstream_field_in_a_box_and_fleet_are_exactly_once_across_power_cuts() -> anyhow::Result<()>
    {
        let cluster = tern_tests::KafkaCluster::start()?;
        eprintln!("system aarch64: Kafka started in {:.1?}", cluster.startup);
        upstream::upstream_is_exactly_once_across_power_cuts(Arch::Aarch64, &cluster)?;
        field::field_in_a_box(Arch::Aarch64, &cluster)?;
        fleet::a_power_cut_during_a_regional_outage_rejoins_the_fleet(Arch::Aarch64, &cluster)
    }
}

/// The 32-bit ARMv7 gateway: power cuts with their negative control.
mod armv7 {
    use super::*;

    #[test]
    fn power_cuts_lose_no_acknowledged_message() -> anyhow::Result<()> {
        cuts::power_cuts_lose_no_acknowledged_message(Arch::Armv7)
    }

    #[test]
    fn negative_control_periodic_sync_loses_acknowledged_messages() -> anyhow::Result<()> {
        cuts::negative_control_periodic_sync_loses_acknowledged_messages(Arch::Armv7)
    }
}
