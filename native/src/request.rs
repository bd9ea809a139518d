//! `StreamRequest`: the one description of a stream that every face reads.
//!
//! A Flight command (`get_flight_info`) and a ticket (`do_get`) are the same JSON
//! object; a ticket adds `rank` and `offset`. Clients build it, the server parses
//! it, and the engine serves it, all through this type. The keys and their rules
//! live in the struct below, once: serde rejects unknown keys and wrong types,
//! `NonZeroU64` and the newtypes reject out-of-range values, and `check` holds the
//! rules that relate two keys. `docs/flight-protocol.md` documents every key.

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
pub use crate::ids::PopulationId;
use crate::ids::RunId;
use crate::sampling::{Partition, ShuffleMode, StreamWindow};
pub(crate) use crate::wire::{decode, deserialize};

pub use crate::wire::MAX_MESSAGE_BYTES;

/// An epoch of a seed's stream, split into `world_size` ranks; as a ticket, one
/// rank's partition from `offset` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamRequest {
    /// The dataset's name on the server.
    pub dataset: String,
    pub seed: u64,
    pub epoch: u64,
    /// Positions per epoch (default: the active epoch length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_len: Option<NonZeroU64>,
    /// Weighted draws with replacement (`true`), the rows in order (`false`) or
    /// every row once per cycle in a fresh order (`"permutation"`).
    #[serde(default = "weighted")]
    pub shuffle: ShuffleMode,
    /// Ranks the epoch is split into, `1..=MAX_WORLD_SIZE` (see `Partition`).
    #[serde(default = "one")]
    pub world_size: u64,
    /// Epoch-relative position where partitioning begins, `0..=stop`.
    #[serde(default)]
    pub start: u64,
    /// Epoch-relative position where partitioning ends, `start..=epoch_len`
    /// (default: the epoch length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<u64>,
    /// The partition unit, in consecutive positions.
    #[serde(default = "one_block")]
    pub block: NonZeroU64,
    /// The population id to stream (default: the active one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<PopulationId>,
    /// Population columns to add to every batch.
    #[serde(default)]
    pub columns: Vec<String>,
    /// Whether batches carry the records' bytes (`false`: ids and columns only,
    /// no record read).
    #[serde(default = "yes")]
    pub payload: bool,
    /// Ticket only: which partition, `0 <= rank < world_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Ticket only: samples of the partition to skip (a resume point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// The training run reading (with `generation`): a stream of an older
    /// generation than the run's newest stops (`run::fence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

fn yes() -> bool {
    true
}

fn weighted() -> ShuffleMode {
    ShuffleMode::Weighted
}

fn one() -> u64 {
    1
}

fn one_block() -> NonZeroU64 {
    NonZeroU64::MIN
}

/// What a `do_get` ticket asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticket {
    Stream(StreamRequest),
    Metadata(MetadataRequest),
}

/// A population's metadata table: `{"dataset", "metadata": true,
/// "population"?, "columns"?}`. `columns` names the columns to send, in that
/// order (a reader that needs a few columns of a wide table is sent those
/// only); without it, every column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataRequest {
    pub dataset: String,
    pub metadata: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<PopulationId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
}

impl MetadataRequest {
    /// The column list is not empty and names no column twice (whether the
    /// population has them is known once it is opened).
    fn check(self) -> Result<Self> {
        if let Some(columns) = &self.columns {
            if columns.is_empty() {
                return Err(Error::invalid(
                    "'columns' in the ticket names no column; name at least one, \
                     or leave 'columns' out for every column",
                ));
            }
            for (i, name) in columns.iter().enumerate() {
                if columns[..i].contains(name) {
                    return Err(Error::invalid(format!(
                        "'columns' in the ticket names '{name}' twice; name each column once"
                    )));
                }
            }
        }
        Ok(self)
    }
}

impl StreamRequest {
    /// Parse a `get_flight_info` command (no `rank` or `offset`).
    pub fn from_command(raw: &[u8]) -> Result<Self> {
        Self::from_value(decode(raw, "command")?, "command")
    }

    /// Build from already decoded JSON (keyword arguments arrive this way), with
    /// the same rules as a ticket.
    pub fn from_value(value: Value, what: &str) -> Result<Self> {
        let request: StreamRequest = deserialize(value, what)?;
        request.check(what)?;
        Ok(request)
    }

    /// The rules that relate keys to each other.
    fn check(&self, what: &str) -> Result<()> {
        if what == "command" {
            for (key, present) in [
                ("rank", self.rank.is_some()),
                ("offset", self.offset.is_some()),
            ] {
                if present {
                    return Err(Error::invalid(format!(
                        "unknown key '{key}' in the command; '{key}' belongs to a ticket \
                         (each endpoint of the FlightInfo has one)"
                    )));
                }
            }
        }
        if self.run.is_some() != self.generation.is_some() {
            return Err(Error::invalid(format!(
                "'run' and 'generation' in the {what} come together (a training run's id \
                 and its generation), got only '{}'",
                if self.run.is_some() {
                    "run"
                } else {
                    "generation"
                }
            )));
        }
        self.partition()?
            .check_range(self.epoch_len.map(NonZeroU64::get))
    }

    /// This request's rank partition (rank 0 and offset 0 unless given).
    pub fn partition(&self) -> Result<Partition> {
        Ok(Partition::new(
            self.rank.unwrap_or(0),
            self.world_size,
            self.offset.unwrap_or(0),
        )?
        .range(self.start, self.stop)
        .blocks(self.block))
    }

    /// The positions this (pinned) request reads: its partition of the epoch.
    pub fn window(&self) -> Result<StreamWindow> {
        let epoch_len = self
            .epoch_len
            .ok_or_else(|| Error::internal("the request's epoch length is not pinned"))?;
        self.partition()?
            .of(&StreamWindow::epoch(self.epoch, epoch_len)?)
    }

    /// The ticket of rank `rank`.
    pub fn for_rank(&self, rank: u64) -> Result<Self> {
        let ticket = StreamRequest {
            rank: Some(rank),
            offset: Some(self.offset.unwrap_or(0)),
            ..self.clone()
        };
        ticket.check("ticket")?;
        Ok(ticket)
    }

    /// The same ticket resumed `offset` samples into its partition.
    pub fn resumed(&self, offset: u64) -> Self {
        StreamRequest {
            offset: Some(offset),
            rank: Some(self.rank.unwrap_or(0)),
            ..self.clone()
        }
    }

    /// The request with its population and epoch length fixed, so that every
    /// replica serves the same stream whatever becomes active later.
    pub fn pinned(&self, population: &PopulationId, epoch_len: NonZeroU64) -> Self {
        StreamRequest {
            population: Some(
                self.population
                    .clone()
                    .unwrap_or_else(|| population.clone()),
            ),
            epoch_len: Some(self.epoch_len.unwrap_or(epoch_len)),
            ..self.clone()
        }
    }

    /// Compact JSON with the keys in declaration order.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self)
            .map_err(|e| Error::internal(format!("cannot encode the request: {e}")))
    }
}

impl Ticket {
    /// Parse a `do_get` ticket: a stream partition or a metadata table.
    pub fn parse(raw: &[u8]) -> Result<Self> {
        let mut value = decode(raw, "ticket")?;
        let metadata = match value.as_object_mut().and_then(|o| o.remove("metadata")) {
            None => false,
            Some(Value::Bool(flag)) => flag,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "'metadata' must be true or false, got {other}"
                )))
            }
        };
        if metadata {
            if let Some(object) = value.as_object_mut() {
                object.insert("metadata".into(), Value::Bool(true));
            }
            return deserialize::<MetadataRequest>(value, "ticket")
                .and_then(MetadataRequest::check)
                .map(Ticket::Metadata);
        }
        StreamRequest::from_value(value, "ticket").map(Ticket::Stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(raw: &str) -> String {
        Ticket::parse(raw.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn defaults_and_round_trip() {
        let raw = br#"{"dataset":"toy","seed":1,"epoch":2}"#;
        let request = StreamRequest::from_command(raw).unwrap();
        assert_eq!(request.shuffle, ShuffleMode::Weighted);
        assert_eq!(request.world_size, 1);
        let ticket = request.for_rank(0).unwrap();
        let parsed = Ticket::parse(&ticket.to_json().unwrap()).unwrap();
        assert_eq!(parsed, Ticket::Stream(ticket));
    }

    #[test]
    fn errors_name_the_key() {
        assert!(error(r#"{"dataset":"t","seed":"1","epoch":0}"#).contains("'seed'"));
        assert!(error(r#"{"dataset":"t","sead":1,"seed":1,"epoch":0}"#).contains("'sead'"));
        assert!(error(r#"{"seed":1,"epoch":0}"#).contains("'dataset'"));
        assert!(error(r#"{"dataset":"t","seed":1,"epoch":2.0}"#).contains("'epoch'"));
        assert!(
            error(r#"{"dataset":"t","seed":1,"epoch":0,"epoch_len":0}"#).contains("'epoch_len'")
        );
        assert!(
            error(r#"{"dataset":"t","seed":1,"epoch":0,"world_size":0}"#).contains("'world_size'")
        );
        assert!(error(r#"{"dataset":"t","seed":1,"epoch":0,"rank":1}"#).contains("'rank'"));
        assert!(
            error(r#"{"dataset":"t","seed":1,"epoch":0,"population":"ab"}"#).contains("\"ab\"")
        );
        assert!(error(r#"{"dataset":"t","metadata":"yes"}"#).contains("'metadata'"));
        assert!(error(r#"{"dataset":"t","metadata":true,"seed":1}"#).contains("'seed'"));
        assert!(error("[1]").contains("list"));
        assert!(error("\u{7f}").contains("JSON"));
    }

    #[test]
    fn partition_keys() {
        let raw = br#"{"dataset":"t","seed":1,"epoch":0,"start":4,"stop":10,"block":3}"#;
        let request = StreamRequest::from_command(raw).unwrap();
        assert_eq!(
            (request.start, request.stop, request.block.get()),
            (4, Some(10), 3)
        );
        assert!(error(r#"{"dataset":"t","seed":1,"epoch":0,"block":0}"#).contains("'block'"));
        assert!(error(r#"{"dataset":"t","seed":1,"epoch":0,"start":-1}"#).contains("'start'"));
        let late = error(r#"{"dataset":"t","seed":1,"epoch":0,"epoch_len":5,"start":6}"#);
        assert!(
            late.contains("start=6") && late.contains("epoch_len=5"),
            "{late}"
        );
        let crossed = error(r#"{"dataset":"t","seed":1,"epoch":0,"start":6,"stop":5}"#);
        assert!(crossed.contains("stop=5"), "{crossed}");
    }

    #[test]
    fn commands_refuse_ticket_keys() {
        let raw = br#"{"dataset":"t","seed":1,"epoch":0,"offset":3}"#;
        let message = StreamRequest::from_command(raw).unwrap_err().to_string();
        assert!(message.contains("'offset'"), "{message}");
    }

    #[test]
    fn metadata_tickets() {
        let parsed = Ticket::parse(br#"{"dataset":"t","metadata":true}"#).unwrap();
        assert!(matches!(
            parsed,
            Ticket::Metadata(MetadataRequest {
                population: None,
                ..
            })
        ));
        let stream = Ticket::parse(br#"{"dataset":"t","metadata":false,"seed":1,"epoch":0}"#);
        assert!(matches!(stream.unwrap(), Ticket::Stream(_)));
    }

    #[test]
    fn metadata_tickets_name_their_columns_once() {
        let parsed = Ticket::parse(br#"{"dataset":"t","metadata":true,"columns":["b","a"]}"#);
        let Ticket::Metadata(request) = parsed.unwrap() else {
            panic!("a metadata ticket");
        };
        assert_eq!(
            request.columns,
            Some(vec!["b".to_string(), "a".to_string()])
        );
        let error = |raw: &[u8]| Ticket::parse(raw).unwrap_err().to_string();
        let empty = error(br#"{"dataset":"t","metadata":true,"columns":[]}"#);
        assert!(empty.contains("names no column"), "{empty}");
        let twice = error(br#"{"dataset":"t","metadata":true,"columns":["a","b","a"]}"#);
        assert!(twice.contains("'a' twice"), "{twice}");
        let not_text = error(br#"{"dataset":"t","metadata":true,"columns":["a",3]}"#);
        assert!(not_text.contains("'columns'"), "{not_text}");
    }
}
