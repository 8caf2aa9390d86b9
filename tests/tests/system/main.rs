//! The gateway as it is flashed, in system QEMU (`tern_tests::system`): real power cuts of an
//! ARM Linux gateway with its log on an ext4 SD card, with and without Kafka upstream. Not part
//! of `cargo test --workspace` (`test = false`): `tests/run system-aarch64` / `system-armv7`
//! run one architecture each, `cargo test -p tern-tests --test system -- aarch64::` by hand.
//! See docs/system-tests.md.

mod cuts;
mod upstream;

use tern_tests::system::Arch;

/// The 64-bit gateway: power cuts with their negative control, and upstream to Kafka across
/// power cuts.
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

    #[test]
    fn upstream_is_exactly_once_across_power_cuts() -> anyhow::Result<()> {
        upstream::upstream_is_exactly_once_across_power_cuts(Arch::Aarch64)
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
