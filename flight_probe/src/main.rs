//! `flight_probe`: a client of the DatasetRT Flight service written against the protocol alone
//! (docs/flight-protocol.md) with the Rust `arrow-flight` crate. It lists the datasets, asks
//! `get_flight_info` for an epoch split into ranks, streams one rank with `do_get` and ends with
//! `datasets: A,B`, `rows: N`, `checksum: 16 hex`: FNV-1a 64 over, per row in stream order, the
//! 8 little-endian bytes of `cache_id` then of `sample_id` (recomputable in any language).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Array, PrimitiveArray, RecordBatch};
use arrow_flight::error::FlightError;
use arrow_flight::{FlightClient, FlightDescriptor, FlightInfo};
use futures::TryStreamExt;
use tonic::transport::Endpoint;

const USAGE: &str = "usage: flight_probe --location grpc://HOST:PORT --dataset NAME --seed S \
--epoch E [--world-size W] [--rank R] [--epoch-len L]";

struct Args {
    location: String,
    dataset: String,
    seed: u64,
    epoch: u64,
    world_size: usize,
    rank: usize,
    epoch_len: Option<u64>,
}

/// `Ok(None)` asks for the usage text (`--help`).
fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let (mut location, mut dataset, mut seed, mut epoch) = (None, None, None, None);
    let (mut world_size, mut rank, mut epoch_len) = (1, 0, None);
    while let Some(flag) = argv.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let (flag, value) = match flag.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), value.to_owned()),
            None => {
                let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
                (flag, value)
            }
        };
        match flag.as_str() {
            "--location" => location = Some(value.clone()),
            "--dataset" => dataset = Some(value.clone()),
            "--seed" => seed = Some(number(&flag, &value)?),
            "--epoch" => epoch = Some(number(&flag, &value)?),
            "--world-size" => world_size = number(&flag, &value)?,
            "--rank" => rank = number(&flag, &value)?,
            "--epoch-len" => epoch_len = Some(number(&flag, &value)?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    let missing = |name: &str| format!("{name} is required");
    if world_size == 0 || epoch_len == Some(0) {
        return Err("--world-size and --epoch-len must be at least 1".into());
    }
    if rank >= world_size {
        return Err(format!(
            "--rank {rank} is not below --world-size {world_size}"
        ));
    }
    Ok(Some(Args {
        location: location.ok_or_else(|| missing("--location"))?,
        dataset: dataset.ok_or_else(|| missing("--dataset"))?,
        seed: seed.ok_or_else(|| missing("--seed"))?,
        epoch: epoch.ok_or_else(|| missing("--epoch"))?,
        world_size,
        rank,
        epoch_len,
    }))
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} must be a non-negative integer, got {value:?}"))
}

/// FNV-1a, 64 bits.
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn update(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(Self::PRIME);
        }
    }
}

/// A readable message for an error and its causes.
fn describe(error: &(dyn Error + 'static)) -> String {
    if let Some(FlightError::Tonic(status)) = error.downcast_ref::<FlightError>() {
        return format!("{:?}: {}", status.code(), status.message());
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn context<E: Error + 'static>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |error| format!("{what} failed: {}", describe(&error))
}

/// A client for a `grpc://` (or `grpc+tcp://`) location; TLS is not built in.
async fn connect(location: &str) -> Result<FlightClient, String> {
    let address = location
        .strip_prefix("grpc://")
        .or_else(|| location.strip_prefix("grpc+tcp://"))
        .ok_or_else(|| format!("unsupported location {location:?}: expected grpc://HOST:PORT"))?;
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|error| format!("bad location {location:?}: {}", describe(&error)))?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|error| format!("cannot connect to {location}: {}", describe(&error)))?;
    Ok(FlightClient::new(channel))
}

/// The column `name` of `batch` as a uint64 array without nulls.
fn ids<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a PrimitiveArray<UInt64Type>, String> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| format!("the stream has no '{name}' column: {}", batch.schema()))?;
    let array = column
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| format!("'{name}' is {}, expected uint64", column.data_type()))?;
    if array.null_count() > 0 {
        return Err(format!("'{name}' has {} nulls", array.null_count()));
    }
    Ok(array)
}

/// The probe: its closing lines, or what went wrong.
async fn run(args: &Args) -> Result<String, String> {
    let mut client = connect(&args.location).await?;
    let flights: Vec<FlightInfo> = client
        .list_flights(Vec::new())
        .await
        .map_err(context("list_flights"))?
        .try_collect()
        .await
        .map_err(context("list_flights"))?;
    let mut datasets = Vec::with_capacity(flights.len());
    for info in &flights {
        let name = info
            .flight_descriptor
            .as_ref()
            .and_then(|descriptor| descriptor.path.first())
            .ok_or("list_flights answered a flight without a path descriptor [NAME]")?;
        println!("dataset {name}: {} rows", info.total_records);
        datasets.push(name.clone());
    }

    let mut command = serde_json::json!({
        "dataset": args.dataset,
        "seed": args.seed,
        "epoch": args.epoch,
        "world_size": args.world_size,
    });
    if let Some(epoch_len) = args.epoch_len {
        command["epoch_len"] = epoch_len.into();
    }
    let info = client
        .get_flight_info(FlightDescriptor::new_cmd(command.to_string()))
        .await
        .map_err(context("get_flight_info"))?;
    let (endpoints, rank, total) = (info.endpoint.len(), args.rank, info.total_records);
    println!("epoch: {total} records, {endpoints} endpoints");
    let endpoint = (info.endpoint.get(rank))
        .ok_or_else(|| format!("get_flight_info answered {endpoints} endpoints, no rank {rank}"))?;
    let ticket = endpoint
        .ticket
        .clone()
        .ok_or_else(|| format!("the endpoint of rank {rank} has no ticket"))?;

    // Stream from the endpoint's first reachable location, else from --location.
    let mut found = None;
    for location in &endpoint.location {
        match connect(&location.uri).await {
            Ok(client) => found = Some((client, location.uri.as_str())),
            Err(error) => eprintln!("flight_probe: {error}; trying the next location"),
        }
        if found.is_some() {
            break;
        }
    }
    let (mut reader, source) = found.unwrap_or((client, args.location.as_str()));
    println!("rank {rank} from {source}");

    let mut stream = reader.do_get(ticket).await.map_err(context("do_get"))?;
    let (mut rows, mut hash) = (0u64, Fnv1a(Fnv1a::OFFSET_BASIS));
    while let Some(batch) = stream.try_next().await.map_err(context("do_get stream"))? {
        let (cache_ids, sample_ids) = (ids(&batch, "cache_id")?, ids(&batch, "sample_id")?);
        for (cache_id, sample_id) in cache_ids.values().iter().zip(sample_ids.values().iter()) {
            hash.update(&cache_id.to_le_bytes());
            hash.update(&sample_id.to_le_bytes());
        }
        rows += batch.num_rows() as u64;
    }
    let datasets = datasets.join(",");
    Ok(format!(
        "datasets: {datasets}\nrows: {rows}\nchecksum: {:016x}",
        hash.0
    ))
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("flight_probe: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the async runtime: {error}"))
        .and_then(|runtime| runtime.block_on(run(&args)));
    match outcome {
        Ok(closing) => {
            println!("{closing}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("flight_probe: {error}");
            ExitCode::FAILURE
        }
    }
}
