//! Async Rust client for Sinew, a durable message broker.
//!
//! ```no_run
//! # async fn run() -> Result<(), sinew::Error> {
//! use futures::StreamExt;
//! let client = sinew::connect("127.0.0.1:7450").await?;
//! let confirm = client.publish("orders", "hello").await?;
//! println!("stored at partition {} offset {}", confirm.partition, confirm.offset);
//! let mut sub = client.subscribe("orders").await?;
//! while let Some(msg) = sub.next().await {
//!     let msg = msg?;
//!     msg.complete().await?;
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod client;
mod error;
#[allow(missing_docs)]
pub mod wire;

pub use client::*;
pub use error::{Code, Error, Result};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
