//! Sagüin: an MQTT 5 and 3.1.1 broker for edge gateways, with durable channels.
#![warn(missing_docs)]

pub mod acl;
pub mod auth;
pub mod bridge;
pub mod broker;
pub mod codec;
pub mod config;
pub mod licenses;
pub mod ops;
pub mod routing;
pub mod server;
pub mod startup;
pub mod storage;
