//! Routing of publishes to log topics: the `[[route]]` rules in order (first match wins), else
//! the default log topic keyed by MQTT topic. Decides the log topic and the record key only; the
//! partition comes from the key through the log's partitioner. Also names a log partition
//! ([`PartitionId`]) for every module that reads one. Never touches storage.

use super::config::{RouteConfig, RouteKey};
pub use super::message::Key;
use super::topic;

/// A log partition: (log topic, partition).
pub type PartitionId = (String, u32);

/// Where one publish goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination<'a> {
    pub log_topic: &'a str,
    pub key: Key,
}

/// The compiled routing table.
#[derive(Debug, Clone)]
pub struct Router {
    routes: Vec<RouteConfig>,
    default_topic: String,
    /// Log topics no publish goes to that every subscription reads (the downstream's commands).
    read_only: Vec<String>,
}

impl Router {
    pub fn new(routes: Vec<RouteConfig>, default_topic: String) -> Self {
        Self {
            routes,
            default_topic,
            read_only: Vec::new(),
        }
    }

    /// The table with `topics` read by every subscription too (records land there from
    /// elsewhere than a publish: the downstream's commands).
    pub fn reading(mut self, topics: Vec<String>) -> Self {
        self.read_only = topics;
        self
    }

    /// The destination of a publish on `mqtt_topic` by `client_id`.
    pub fn route(&self, mqtt_topic: &str) -> Destination<'_> {
        let rule = self
            .routes
            .iter()
            .find(|r| topic::matches(&r.filter, mqtt_topic));
        let (log_topic, key) = match rule {
            Some(rule) => (rule.topic.as_str(), rule.key),
            None => (self.default_topic.as_str(), RouteKey::MqttTopic),
        };
        let key = match key {
            RouteKey::MqttTopic => Key::Topic,
            RouteKey::ClientId => Key::ClientId,
            // `level` returns a slice of `mqtt_topic` itself: its offset is its place there.
            RouteKey::Level(n) => topic::level(mqtt_topic, n).map_or(Key::Topic, |level| {
                let start = (level.as_ptr() as usize).saturating_sub(mqtt_topic.as_ptr() as usize);
                Key::TopicPart(start..start + level.len())
            }),
        };
        Destination { log_topic, key }
    }

    /// Every log topic a publish can land in (subscriptions read these), without duplicates.
    pub fn log_topics(&self) -> Vec<String> {
        let mut topics = vec![self.default_topic.clone()];
        let routed = self.routes.iter().map(|r| &r.topic);
        for topic in routed.chain(&self.read_only) {
            if !topics.contains(topic) {
                topics.push(topic.clone());
            }
        }
        topics
    }

    /// The log topics whose records a subscription `filter` may match.
    pub fn log_topics_for(&self, filter: &str) -> Vec<String> {
        self.log_topics()
            .into_iter()
            .filter(|t| {
                *t == self.default_topic
                    || self.read_only.contains(t)
                    || self
                        .routes
                        .iter()
                        .any(|r| r.topic == *t && overlaps(&r.filter, filter))
            })
            .collect()
    }
}

/// Whether some topic name could match both filters.
fn overlaps(a: &str, b: &str) -> bool {
    let mut left = a.split('/');
    let mut right = b.split('/');
    loop {
        match (left.next(), right.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            (Some(x), Some(y)) if x == "+" || y == "+" || x == y => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn route(filter: &str, topic: &str, key: RouteKey) -> RouteConfig {
        RouteConfig {
            filter: filter.to_owned(),
            topic: topic.to_owned(),
            key,
        }
    }

    fn router() -> Router {
        Router::new(
            vec![
                route("site/+/temp", "temperature", RouteKey::Level(1)),
                route("cmd/#", "commands", RouteKey::ClientId),
                route("site/#", "site", RouteKey::MqttTopic),
            ],
            "mqtt".to_owned(),
        )
    }

    #[test]
    fn first_matching_route_wins_and_picks_the_key() {
        let router = router();
        let key = |topic: &str, client: &str| {
            let d = router.route(topic);
            let taken = d.key.take(Bytes::from(topic.to_owned()), || {
                Bytes::from(client.to_owned())
            });
            assert_eq!(d.key.of(topic.as_bytes(), client.as_bytes()), &taken[..]);
            (d.log_topic, taken)
        };
        assert_eq!(
            key("site/dev-7/temp", "c1"),
            ("temperature", Bytes::from("dev-7"))
        );
        assert_eq!(
            key("site/dev-7/hum", "c1"),
            ("site", Bytes::from("site/dev-7/hum"))
        );
        assert_eq!(key("cmd/x", "c9"), ("commands", Bytes::from("c9")));
    }

    #[test]
    fn unmatched_publishes_go_to_the_default_topic_keyed_by_topic() {
        let router = router();
        let d = router.route("other/x");
        assert_eq!((d.log_topic, d.key), ("mqtt", Key::Topic));
    }

    #[test]
    fn subscriptions_read_only_overlapping_log_topics() {
        let router = router();
        assert_eq!(
            router.log_topics(),
            ["mqtt", "temperature", "commands", "site"]
        );
        assert_eq!(router.log_topics_for("cmd/+"), ["mqtt", "commands"]);
        assert_eq!(
            router.log_topics_for("site/a/temp"),
            ["mqtt", "temperature", "site"]
        );
        assert_eq!(router.log_topics_for("#"), router.log_topics());
    }

    #[test]
    fn every_subscription_reads_the_downstreams_topics_and_no_publish_lands_there() {
        let router = router().reading(vec!["downstream".to_owned(), "commands".to_owned()]);
        assert_eq!(
            router.log_topics(),
            ["mqtt", "temperature", "commands", "site", "downstream"]
        );
        assert_eq!(
            router.log_topics_for("devices/7/cmd"),
            ["mqtt", "commands", "downstream"]
        );
        assert_eq!(router.route("downstream").log_topic, "mqtt");
    }
}
