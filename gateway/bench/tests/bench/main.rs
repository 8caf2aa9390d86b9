//! The benches end to end: each module runs the built `tern-bench` binary (beside the `tern` it
//! starts) as a user would and checks that every figure is printed and sane: present, positive,
//! finite, and consistent with the bench's own arithmetic. They never assert how fast anything
//! is. One test binary, a module per bench (`log`, `mqtt`, `upstream`); the helpers that build
//! the binaries and start the Kafka cluster are tern-tests'.

mod log;
mod mqtt;
mod upstream;
