//! Who may do what on tern's listeners, shared by the MQTT and the Kafka listener: the
//! password file (argon2 hashes for MQTT and SASL PLAIN, SCRAM credentials for SASL
//! SCRAM-SHA-256/512) and `tern passwd`, the verifier thread and failed-login backoff, the
//! server side of SCRAM (and the key derivation tern-upstream's client shares), and the topic
//! ACL with Mosquitto's semantics, and the TLS server settings every listener loads the same
//! way. Knows no protocol's packets: each listener maps its refusals
//! to its own codes.

mod acl;
mod backoff;
pub mod passwd;
pub mod scram;
mod security;
pub mod tls;
mod users;
mod verifier;

pub use acl::{Access, AclConfig, Want, invalid_topic_name, topic_matches};
pub use security::{Anonymous, Security};
pub use users::{AuthError, Refusal, Users};
