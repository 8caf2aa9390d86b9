//! Inbound Receive Maximum (MQTT 5): the packet ids of the client's QoS 1 and 2 publishes that
//! tern has not finished acknowledging on this connection. A publish is counted when it arrives
//! and released when its PUBACK, its PUBCOMP, or a PUBREC with a reason code of 0x80 or above
//! goes out. A client with more outstanding than tern announced in CONNACK is disconnected
//! with 0x93 by the caller. Per connection only (the spec resets the quota on reconnect); it
//! never sends anything itself.

use std::collections::HashSet;

/// Outstanding incoming QoS 1/2 publishes of one connection.
#[derive(Debug, Default)]
pub(super) struct InboundQuota {
    /// Most outstanding publishes; `None` does not enforce (MQTT 3.1.1).
    max: Option<usize>,
    outstanding: HashSet<u16>,
}

impl InboundQuota {
    pub(super) fn new(max: Option<usize>) -> Self {
        Self {
            max,
            outstanding: HashSet::new(),
        }
    }

    /// Counts an incoming QoS 1/2 publish; false if it exceeds the Receive Maximum. A re-sent
    /// packet id that is still outstanding is not counted twice.
    pub(super) fn admit(&mut self, pkid: u16) -> bool {
        let Some(max) = self.max else {
            return true;
        };
        if self.outstanding.contains(&pkid) {
            return true;
        }
        if self.outstanding.len() >= max {
            return false;
        }
        self.outstanding.insert(pkid);
        true
    }

    /// Releases a publish whose final acknowledgement went out. Nothing is outstanding when
    /// the maximum is not enforced (MQTT 3.1.1): no hash of the id for every ack then.
    pub(super) fn release(&mut self, pkid: u16) {
        if !self.outstanding.is_empty() {
            self.outstanding.remove(&pkid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_the_maximum_outstanding_is_refused() {
        let mut quota = InboundQuota::new(Some(2));
        assert!(quota.admit(1));
        assert!(quota.admit(2));
        assert!(
            quota.admit(2),
            "a re-sent outstanding id is not counted twice"
        );
        assert!(!quota.admit(3));
        quota.release(1);
        assert!(quota.admit(3));
        quota.release(42);
        assert!(!quota.admit(4));
    }

    #[test]
    fn mqtt_311_is_not_limited() {
        let mut quota = InboundQuota::new(None);
        assert!((0..1000u16).all(|pkid| quota.admit(pkid)));
    }
}
